"""keras_context: the training model is found from an optimizer call, and only then; no data is read."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from keras_dyndp import keras_context
from keras_dyndp.tf_backend import keras_compat

keras = keras_compat.keras


class _Recorder(keras.optimizers.SGD):
    """Records the model keras_context finds each time Keras hands it gradients: from any caller, from ``fit``,
    from ``evaluate``.

    Keras 2's train step calls ``minimize`` (then ``apply_gradients``), Keras 3's ``apply_gradients`` (then
    ``apply``); a LossScaleOptimizer calls the inner optimizer's ``apply_gradients`` (Keras 2) or ``apply``
    (Keras 3). The outermost of these calls records.
    """

    def __init__(self, **kwargs):
        super().__init__(name="recorder", **kwargs)  # Keras 3 refuses a scope name from "_Recorder".
        self.seen = []
        self._inside = False

    def _record(self, method, *args):
        if self._inside:
            return method(*args)
        self._inside = True
        try:
            self.seen.append(
                tuple(keras_context.calling_model(self, keras.Model, caller) for caller in (None, "fit", "evaluate"))
            )
            return method(*args)
        finally:
            self._inside = False

    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        return self._record(lambda: super(_Recorder, self).apply_gradients(grads_and_vars, *args, **kwargs))

    def apply(self, grads, trainable_variables=None):  # Keras 3 only.
        return self._record(lambda: super(_Recorder, self).apply(grads, trainable_variables))


def _model(optimizer: keras.optimizers.Optimizer, run_eagerly: bool = False) -> keras.Model:
    model = keras.Sequential([keras.layers.Input(shape=(3,)), keras.layers.Dense(2)])
    model.compile(optimizer=optimizer, loss="mse", run_eagerly=run_eagerly)
    return model


def test_finds_the_model_when_traced_and_eager_and_in_a_named_caller_only():
    x, y = np.zeros((4, 3), np.float32), np.zeros((4, 2), np.float32)
    for run_eagerly in (False, True):
        optimizer = _Recorder()
        model = _model(optimizer, run_eagerly)
        model.fit(x, y, batch_size=2, epochs=1, verbose=0)
        assert optimizer.seen
        assert optimizer.seen[0] == (model, model, None)  # Its train step, the fit below it, and no evaluate.


def test_does_not_confuse_another_model_sharing_the_stack():
    optimizer = _Recorder()
    other = _model(keras.optimizers.SGD())  # A model whose optimizer is not ours is never returned.
    model = _model(optimizer)
    dataset = tf.data.Dataset.from_tensor_slices((np.zeros((4, 3), np.float32), np.zeros((4, 2), np.float32)))
    model.fit(dataset.batch(2), verbose=0, shuffle=False)
    found = optimizer.seen[0][0]
    assert found is model and found is not other


def test_finds_the_model_whose_loss_scale_optimizer_wraps_the_optimizer():
    optimizer = _Recorder()
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = _model(optimizer)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert model.optimizer is not optimizer  # compile wrapped it in a LossScaleOptimizer.
    x = np.zeros((4, 3), np.float32)
    model.fit(x, np.zeros((4, 2), np.float32), batch_size=2, verbose=0)
    assert optimizer.seen[0] == (model, model, None)


def test_custom_training_loop_finds_nothing():
    optimizer = _Recorder()
    model = _model(optimizer)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(np.ones((2, 3), np.float32)))
    variables = model.trainable_variables
    optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
    assert optimizer.seen == [(None, None, None)]
