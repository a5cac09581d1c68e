"""registration: ``import keras_dyndp`` makes ``load_model`` find the DP optimizers, on the backend in use.

Backend-neutral module: it imports no Keras at collection; the round trip uses the stack's Keras (JAX, or
TensorFlow's Keras 2 or 3) and loads in a fresh process, where nothing else could have registered the classes.
"""

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import keras_dyndp
from keras_dyndp import registration
from keras_dyndp import schedules
from keras_dyndp.batch_sizes import SamplingWarning

# What a user runs in a fresh process: Keras, then keras_dyndp, then load_model; one more training step.
_LOAD_AND_TRAIN = """
import json, sys, warnings
import numpy as np
{import_keras}
import keras_dyndp
warnings.simplefilter("ignore")
model = keras.models.load_model(sys.argv[1])
from keras_dyndp.{train_step} import is_private
private, before = is_private(model), int(model.optimizer.dp_step.numpy())
model.train_on_batch(np.zeros((4, 3), "float32"), np.zeros(4, "int32"))
print(json.dumps([type(model.optimizer).__name__, private, before, int(model.optimizer.dp_step.numpy())]))
"""


def _stack_keras():
    """The Keras keras_dyndp trains with here, how a script imports it, and the module of `is_private`."""
    if keras_dyndp.keras_backend() == "jax":
        import keras  # pylint: disable=import-outside-toplevel

        return keras, "import keras", "jax_backend.train_step"
    from keras_dyndp.tf_backend import keras_compat  # pylint: disable=import-outside-toplevel

    if keras_compat.KERAS_MAJOR_VERSION == 3:
        return keras_compat.keras, "import keras", "tf_backend.train_step"
    return keras_compat.keras, "import tensorflow as tf\nkeras = tf.keras", "tf_backend.train_step"


def test_load_model_in_a_fresh_process_finds_the_optimizer_and_the_private_step(tmp_path):
    keras, import_keras, train_step = _stack_keras()
    model = keras_dyndp.make_private(keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]))
    schedule = schedules.DPSchedule(np.full(10, 1.0), np.full(10, 1.0), 0.5)
    model.compile(
        optimizer=keras_dyndp.DynamicDPKerasSGD(schedule=schedule, public_batch_size=True, learning_rate=0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none"),
    )
    with pytest.warns(SamplingWarning, match="Poisson sampling"):
        model.train_on_batch(np.ones((4, 3), "float32"), np.ones(4, "int32"))
    path = str(tmp_path / "model.keras")
    model.save(path)
    code = _LOAD_AND_TRAIN.format(import_keras=import_keras, train_step=train_step)
    result = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    # The reloaded model trains through make_private's step, from the saved counter on.
    assert json.loads(result.stdout.strip().splitlines()[-1]) == ["DynamicDPKerasSGD", True, 1, 2]


def _write_module(folder, name: str, source: str) -> None:
    (folder / f"{name}.py").write_text(textwrap.dedent(source))


def test_registers_once_every_keras_import_in_progress_has_finished(tmp_path, monkeypatch):
    # Stand-ins for TensorFlow (which probes for Keras, then imports it) and Keras (which imports TensorFlow back).
    _write_module(
        tmp_path,
        "fake_tf",
        """
        import importlib.util
        assert importlib.util.find_spec("fake_keras") is not None
        import fake_keras
        """,
    )
    _write_module(tmp_path, "fake_keras", "import fake_tf\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registration, "_KERAS_MODULES", ("fake_tf", "fake_keras"))
    registered = []
    monkeypatch.setattr(
        registration, "_register", lambda: registered.append(sorted(set(sys.modules) & {"fake_tf", "fake_keras"}))
    )
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    for name in ("fake_tf", "fake_keras"):
        monkeypatch.delitem(sys.modules, name, raising=False)

    registration.register_with_keras()
    assert not registered  # Neither is imported yet: nothing to register with.
    import fake_tf  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import

    assert registered == [["fake_keras", "fake_tf"]]  # Once, after both had finished.
    assert not any(isinstance(finder, registration._RegisterAfterKerasImport) for finder in sys.meta_path)
    registration.register_with_keras()  # Keras imported: registers at once.
    assert len(registered) == 2
