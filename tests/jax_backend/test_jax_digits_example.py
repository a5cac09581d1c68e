"""Tests for examples/jax_digits.py: the JAX backend end to end, run as a user runs it (both ways)."""

import os
import re
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("jax")
pytest.importorskip("sklearn")

import keras  # noqa: E402

import keras_dyndp  # noqa: E402
from examples import jax_digits  # noqa: E402
from keras_dyndp import jax_backend  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULT = re.compile(
    r"dynamic: test accuracy (\S+) after (\d+) of (\d+) DP steps; epsilon at delta=\S+: PLD (\S+), RDP (\S+), "
    r"GDP-CLT (\S+) \(Keras \S+ on jax\)"
)


@pytest.mark.parametrize(
    "command, training_metrics",
    [(["-m", "examples.jax_digits"], False), ([os.path.join("examples", "jax_digits.py"), "--training_metrics"], True)],
)
def test_a_short_run_spends_the_calibrated_budget_in_the_epochs_asked_for(command, training_metrics):
    result = subprocess.run(
        [sys.executable, *command, "--epochs=3", "--verbose=2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        env={key: value for key, value in os.environ.items() if key != "KERAS_BACKEND"},  # it sets jax itself
    )
    assert result.returncode == 0, result.stderr[-3000:]
    match = RESULT.search(result.stdout)
    assert match, result.stdout[-2000:]
    accuracy, steps, num_steps, pld, rdp, gdp_clt = match.groups()
    assert int(steps) == int(num_steps) == 34  # ceil(3 * 1437 / 128): the schedule's every step, no more
    assert 2.9 < float(pld) <= 3.0  # calibrated to epsilon 3 under PLD
    assert float(rdp) > float(pld) and float(gdp_clt) > 0
    assert float(accuracy) > 0.3  # 10 classes: chance is 0.1
    # 34 steps in the 3 epochs asked for (12, 11 and 11 steps), not a 4th epoch of the remainder.
    assert re.findall(r"^Epoch \d+/\d+$", result.stdout, re.MULTILINE) == ["Epoch 1/3", "Epoch 2/3", "Epoch 3/3"]
    assert re.findall(r"^(\d+)/\1 ", result.stdout, re.MULTILINE) == ["12", "11", "11"]
    # Training-batch loss and accuracy only when asked for, and then flagged as outside the guarantee.
    assert (" - accuracy: " in result.stdout) == training_metrics
    assert (" - loss: " in result.stdout) == training_metrics
    assert ("OUTSIDE the DP guarantee" in result.stdout) == training_metrics


@pytest.mark.parametrize("num_steps, epochs, expected", [(337, 30, [(0, 7, 12), (7, 30, 11)]), (33, 3, [(0, 3, 11)])])
def test_epoch_segments_take_every_step_in_the_epochs_asked_for(num_steps, epochs, expected):
    segments = jax_digits.epoch_segments(num_steps, epochs)
    assert segments == expected
    assert sum((end - start) * steps for start, end, steps in segments) == num_steps


def test_training_accuracy_does_not_count_the_padding_rows():
    """Every real example labelled wrong: its accuracy is 0. The padding rows (x = 0, y = 0, weight 0) that
    PoissonBatches adds would be right (zero input, zero bias: every logit 0, argmax class 0) and, counted, would
    show their share of the batch as accuracy."""
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
    model = jax_digits.compile_model(model, optimizer, training_metrics=True)
    batches = jax_backend.PoissonBatches(x, y, sampling_probability=16 / 64, steps_per_epoch=4, seed=0)
    assert batches.max_batch_size > 16  # there are padding rows
    history = model.fit(batches, epochs=1, verbose=0)
    assert history.history["accuracy"] == [0.0]
