"""examples/jax_digits.py: the JAX backend end to end, run as a user runs it (both ways), with a clean stderr; and,
where JAX is missing (the TensorFlow stacks), one line that says what to install, no traceback."""

import importlib.util
import os
import re
import subprocess
import sys

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_HAS_JAX = importlib.util.find_spec("jax") is not None
needs_jax = pytest.mark.skipif(
    not _HAS_JAX or importlib.util.find_spec("sklearn") is None or os.environ.get("KERAS_BACKEND") != "jax",
    reason="runs on the JAX stack (KERAS_BACKEND=jax, JAX and scikit-learn installed)",
)
ACCURACY = re.compile(r"^Test accuracy: (\S+) \(360 test images; Keras \S+ on jax\)$", re.MULTILINE)
PRIVACY = re.compile(
    r"steps taken (\d+) of the schedule's (\d+)\n.*GDP-CLT \(.*\): (\S+)\n.*PLD \(rigorous upper bound\): (\S+)\n",
    re.DOTALL,
)


@pytest.mark.skipif(_HAS_JAX, reason="JAX is installed: the example runs")
@pytest.mark.parametrize("argument", ["--help", "--epochs=1"])
def test_without_jax_it_says_what_to_install_in_one_line(argument):
    completed = subprocess.run(
        [sys.executable, os.path.join("examples", "jax_digits.py"), argument],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert completed.returncode == 2
    assert "Traceback" not in completed.stderr
    (line,) = completed.stderr.strip().splitlines()
    assert line.startswith("jax_digits.py: error: this example runs Keras on JAX, which this Python")
    assert "install the [jax] extra (pip install -e '.[jax,test]'" in line  # the README's JAX command


@needs_jax
@pytest.mark.parametrize(
    "command, training_metrics",
    [(["-m", "examples.jax_digits"], False), ([os.path.join("examples", "jax_digits.py"), "--training_metrics"], True)],
)
def test_a_short_run_spends_the_calibrated_budget_in_the_epochs_asked_for(command, training_metrics):
    result = subprocess.run(
        [sys.executable, *command, "--epochs=3", "--verbose=2"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        env={key: value for key, value in os.environ.items() if key != "KERAS_BACKEND"},  # it sets jax itself
    )
    assert result.returncode == 0, result.stderr[-3000:]
    accuracy, privacy = ACCURACY.search(result.stdout), PRIVACY.search(result.stdout)
    assert accuracy and privacy, result.stdout[-2000:]
    steps, num_steps, gdp_clt, pld = privacy.groups()
    assert int(steps) == int(num_steps) == 34  # ceil(3 * 1437 / 128): the schedule's every step, no more
    assert 2.9 < float(pld) <= 3.0 and float(gdp_clt) > 0  # calibrated to epsilon 3 under PLD
    assert float(accuracy.group(1)) > 0.3  # 10 classes: chance is 0.1
    # 34 steps in the 3 epochs asked for (12, 11 and 11 steps), not a 4th epoch of the remainder.
    assert re.findall(r"^Epoch \d+/\d+$", result.stdout, re.MULTILINE) == ["Epoch 1/3", "Epoch 2/3", "Epoch 3/3"]
    assert re.findall(r"^(\d+)/\1 ", result.stdout, re.MULTILINE) == ["12", "11", "11"]
    # Training-batch loss and accuracy only when asked for, and then flagged as outside the guarantee.
    assert (" - accuracy: " in result.stdout) == training_metrics
    assert (" - loss: " in result.stdout) == training_metrics
    assert ("OUTSIDE the DP guarantee" in result.stdout) == training_metrics
    # A clean stderr: no JAX platform probing ('Unable to initialize backend'), no int64 truncation warning, no INFO
    # line repeating the progress bar.
    assert result.stderr.strip() == "", result.stderr[-3000:]


@needs_jax
@pytest.mark.parametrize("num_steps, epochs, expected", [(337, 30, [(0, 7, 12), (7, 30, 11)]), (33, 3, [(0, 3, 11)])])
def test_epoch_segments_take_every_step_in_the_epochs_asked_for(num_steps, epochs, expected):
    from examples import jax_digits  # pylint: disable=import-outside-toplevel  (sets KERAS_BACKEND=jax)

    segments = jax_digits.epoch_segments(num_steps, epochs)
    assert segments == expected
    assert sum((end - start) * steps for start, end, steps in segments) == num_steps


@needs_jax
def test_training_accuracy_does_not_count_the_padding_rows():
    """Every real example labelled wrong: its accuracy is 0. The padding rows (x = 0, y = 0, weight 0) that
    PoissonBatches adds would be right (zero input, zero bias: every logit 0, argmax class 0) and, counted, would
    show their share of the batch as accuracy."""
    import keras  # pylint: disable=import-outside-toplevel

    import keras_dyndp  # pylint: disable=import-outside-toplevel
    from keras_dyndp import jax_backend  # pylint: disable=import-outside-toplevel

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(10)])
    x = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)
    y = ((np.argmax(model.predict(x, verbose=0), axis=1) + 1) % 10).astype(np.int32)
    optimizer = keras_dyndp.DynamicDPKerasSGD(
        target_epsilon=10.0,
        target_delta=1e-3,
        num_examples=64,
        batch_size=16,
        steps=4,
        method="vanilla",
        initial_clip=1.0,
        learning_rate=1e-9,
    )
    model = keras_dyndp.make_private(model, training_metrics=True)
    model.compile(  # as examples.jax_digits compiles
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none"),
        weighted_metrics=["accuracy"],
    )
    batches = jax_backend.PoissonBatches(x, y, sampling_probability=16 / 64, steps_per_epoch=4, seed=0)
    assert batches.max_batch_size > 16  # there are padding rows
    history = model.fit(batches, epochs=1, verbose=0)
    assert history.history["accuracy"] == [0.0]
