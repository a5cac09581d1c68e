"""registration: ``import keras_dyndp`` makes ``load_model`` find the DP optimizers, on the backend in use; the model
whose ``fit`` or ``compile_from_config`` calls an optimizer is found from that call only (`keras_model_calling`).

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
from keras_dyndp import schedules
from keras_dyndp.core.batch_sizes import SamplingWarning
from keras_dyndp.keras_glue import registration

# What a user runs in a fresh process: Keras, then keras_dyndp, then load_model; one more training step.
_LOAD_AND_TRAIN = """
import json, sys, warnings
import numpy as np
{import_keras}
import keras_dyndp
warnings.simplefilter("ignore")
model = keras.models.load_model(sys.argv[1])
from keras_dyndp.keras_glue.private_model import is_private
private, before = is_private(model), int(model.optimizer.dp_step.numpy())
model.train_on_batch(np.zeros((4, 3), "float32"), np.zeros(4, "int32"))
print(json.dumps([type(model.optimizer).__name__, private, before, int(model.optimizer.dp_step.numpy())]))
"""


def _stack_keras():
    """The Keras keras_dyndp trains with here and how a script imports it."""
    if keras_dyndp.keras_backend() == "jax":
        import keras  # pylint: disable=import-outside-toplevel

        return keras, "import keras"
    from keras_dyndp.tf_backend import keras_compat  # pylint: disable=import-outside-toplevel

    if keras_compat.KERAS_MAJOR_VERSION == 3:
        return keras_compat.keras, "import keras"
    return keras_compat.keras, "import tensorflow as tf\nkeras = tf.keras"


def _private_model_after_one_step(keras, **optimizer_kwargs):
    """A private model after one ``train_on_batch`` with a DynamicDPKerasSGD of ``optimizer_kwargs``."""
    model = keras_dyndp.make_private(keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]))
    schedule = schedules.DPSchedule(np.full(10, 1.0), np.full(10, 1.0), 0.5)
    model.compile(
        optimizer=keras_dyndp.DynamicDPKerasSGD(schedule=schedule, public_batch_size=True, **optimizer_kwargs),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none"),
    )
    with pytest.warns(SamplingWarning, match="Poisson sampling"):
        model.train_on_batch(np.ones((4, 3), "float32"), np.ones(4, "int32"))
    return model


def test_load_model_in_a_fresh_process_finds_the_optimizer_and_the_private_step(tmp_path):
    keras, import_keras = _stack_keras()
    model = _private_model_after_one_step(keras, learning_rate=0.1)
    path = str(tmp_path / "model.keras")
    model.save(path)
    code = _LOAD_AND_TRAIN.format(import_keras=import_keras)
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


def _recorder(keras):
    """An SGD recording the model `keras_model_calling` finds each time Keras builds it or hands it gradients: from
    any caller, from ``fit``, from ``evaluate``.

    Keras 3 builds it in ``fit`` (TensorFlow's step then calls ``apply_gradients``, then ``apply``; JAX's
    ``stateless_apply``), Keras 2's step calls ``minimize`` (then ``apply_gradients``, which builds it); a
    LossScaleOptimizer builds the inner optimizer and calls its ``apply_gradients`` (Keras 2) or ``apply`` (Keras 3).
    The outermost of these calls records.
    """

    class Recorder(keras.optimizers.SGD):
        def __init__(self, **kwargs):
            super().__init__(name="recorder", **kwargs)
            self.seen = []
            self._inside = False

        def _record(self, method, *args):
            if self._inside:
                return method(*args)
            self._inside = True
            try:
                self.seen.append(
                    tuple(
                        registration.keras_model_calling(self, keras.Model, caller)
                        for caller in (None, "fit", "evaluate")
                    )
                )
                return method(*args)
            finally:
                self._inside = False

        def build(self, var_list):
            return self._record(lambda: super(Recorder, self).build(var_list))

        def apply_gradients(self, grads_and_vars, *args, **kwargs):
            return self._record(lambda: super(Recorder, self).apply_gradients(grads_and_vars, *args, **kwargs))

        def apply(self, grads, trainable_variables=None):  # Keras 3 only.
            return self._record(lambda: super(Recorder, self).apply(grads, trainable_variables))

    return Recorder()


def _compiled(keras, optimizer, run_eagerly: bool = False):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer=optimizer, loss="mse", run_eagerly=run_eagerly)
    return model


_X, _Y = np.zeros((4, 3), np.float32), np.zeros((4, 2), np.float32)


def test_finds_the_model_when_traced_and_eager_and_in_a_named_caller_only():
    keras = _stack_keras()[0]
    for run_eagerly in (False, True):
        optimizer = _recorder(keras)
        model = _compiled(keras, optimizer, run_eagerly)
        model.fit(_X, _Y, batch_size=2, epochs=1, verbose=0)
        assert optimizer.seen
        assert optimizer.seen[0] == (model, model, None)  # Its train step, the fit below it, and no evaluate.


def test_does_not_confuse_another_model_sharing_the_stack():
    keras = _stack_keras()[0]
    optimizer = _recorder(keras)
    other = _compiled(keras, keras.optimizers.SGD())  # A model whose optimizer is not ours is never returned.
    model = _compiled(keras, optimizer)
    model.fit(_X, _Y, batch_size=2, verbose=0, shuffle=False)
    found = optimizer.seen[0][0]
    assert found is model and found is not other


def test_finds_the_model_whose_loss_scale_optimizer_wraps_the_optimizer():
    keras = _stack_keras()[0]
    optimizer = _recorder(keras)
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = _compiled(keras, optimizer)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert model.optimizer is not optimizer  # compile wrapped it in a LossScaleOptimizer.
    model.fit(_X, _Y, batch_size=2, verbose=0)
    assert optimizer.seen[0] == (model, model, None)


def test_custom_training_loop_finds_nothing():
    keras = _stack_keras()[0]
    optimizer = _recorder(keras)
    model = _compiled(keras, optimizer)
    variables = model.trainable_variables
    optimizer.apply_gradients(zip([np.zeros(v.shape, np.float32) for v in variables], variables))
    assert optimizer.seen == [(None, None, None)]


def test_a_private_model_trains_without_reading_the_call_stack(monkeypatch):
    keras = _stack_keras()[0]

    def refused(*args, **kwargs):
        raise AssertionError("the call stack was read for a model made private")

    monkeypatch.setattr(registration, "keras_model_calling", refused)
    for optimizer_kwargs in ({}, {"num_microbatches": 2}):  # the clipped-sum path, the optimizer's own
        model = _private_model_after_one_step(keras, **optimizer_kwargs)
        assert int(model.optimizer.dp_step.numpy()) == 1


class _Model:
    """Stands for a model: `registration.keras_entry_data` compares the entry's ``self`` by identity."""


def test_the_entry_points_data_is_read_from_its_frame_only():
    """The data of the entry point that called in (Keras 2's unbound ``fit``), for its own model only; nothing from a
    frame of another function (a custom loop calling ``make_train_function``)."""
    model, x = _Model(), np.arange(3)
    namespace = {"registration": registration, "__name__": "keras_dyndp.tf_backend.train_step"}
    exec(  # pylint: disable=exec-used  # a function of the package's own: its frame is skipped
        "def hook(model, entries):\n    return registration.keras_entry_data(model, entries)\n", namespace
    )

    def entry_point(self, x):
        return namespace["hook"](model, {entry_point.__code__: "model.fit"})

    found = entry_point(model, x)
    assert found[0] == "model.fit" and found[1] is x
    assert entry_point(_Model(), x) is None  # another model's entry point
    assert namespace["hook"](model, {entry_point.__code__: "model.fit"}) is None  # called from elsewhere
