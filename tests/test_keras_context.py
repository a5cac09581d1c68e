"""keras_context: the training model and its fit arguments are found from an optimizer call, and only then."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from keras_dyndp import keras_context


class _Recorder(tf.keras.optimizers.SGD):
    """Records what keras_context finds each time Keras asks it for gradients."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.seen = []

    def compute_gradients(self, loss, var_list, tape=None):
        model = keras_context.calling_model(self)
        call = None if model is None else keras_context.fit_call(model)
        self.seen.append((model, call))
        return super().compute_gradients(loss, var_list, tape)


def _model(optimizer: tf.keras.optimizers.Optimizer, run_eagerly: bool = False) -> tf.keras.Model:
    model = tf.keras.Sequential([tf.keras.layers.Input(shape=(3,)), tf.keras.layers.Dense(2)])
    model.compile(optimizer=optimizer, loss="mse", run_eagerly=run_eagerly)
    return model


def test_finds_the_model_and_fit_arguments_when_traced_and_eager():
    x, y = np.zeros((4, 3), np.float32), np.zeros((4, 2), np.float32)
    for run_eagerly in (False, True):
        optimizer = _Recorder()
        model = _model(optimizer, run_eagerly)
        model.fit(x, y, batch_size=2, epochs=1, verbose=0)
        assert optimizer.seen
        found, call = optimizer.seen[0]
        assert found is model
        assert call.x is x and call.batch_size == 2


def test_does_not_confuse_another_model_sharing_the_stack():
    optimizer = _Recorder()
    other = _model(tf.keras.optimizers.SGD())  # A model whose optimizer is not ours is never returned.
    model = _model(optimizer)
    dataset = tf.data.Dataset.from_tensor_slices((np.zeros((4, 3), np.float32), np.zeros((4, 2), np.float32)))
    model.fit(dataset.batch(2), verbose=0)
    found, call = optimizer.seen[0]
    assert found is model and found is not other
    assert isinstance(call.x, tf.data.Dataset)


def test_custom_training_loop_finds_nothing():
    optimizer = _Recorder()
    model = _model(optimizer)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(np.ones((2, 3), np.float32)))
    optimizer.minimize(loss, model.trainable_variables, tape=tape)
    assert optimizer.seen == [(None, None)]
