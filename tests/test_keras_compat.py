"""keras_compat: the Keras-version-dependent helpers behave as the rest of the package expects."""

import numpy as np
import tensorflow as tf

from keras_dyndp import keras_compat


def test_the_keras_in_use_is_tf_keras_and_its_version_is_known():
    assert keras_compat.keras.Model is tf.keras.Model
    assert keras_compat.KERAS_MAJOR_VERSION == 2


def test_per_example_losses_are_told_from_reduced_ones():
    loss_class = tf.keras.losses.SparseCategoricalCrossentropy
    assert keras_compat.is_per_example_loss(loss_class(reduction="none"))
    assert not keras_compat.is_per_example_loss(loss_class())
    assert not keras_compat.is_per_example_loss(loss_class(reduction="sum"))


def test_apply_base_update_applies_the_update_rule_and_counts_the_step():
    optimizer = tf.keras.optimizers.SGD(learning_rate=0.5)
    variable = tf.Variable([1.0, 2.0])
    keras_compat.apply_base_update(optimizer, [(tf.constant([2.0, -2.0]), variable)])
    np.testing.assert_allclose(variable.numpy(), [0.0, 3.0])
    assert int(optimizer.iterations.numpy()) == 1


def test_model_helpers():
    model = tf.keras.Sequential([tf.keras.layers.Dense(2), tf.keras.Sequential([tf.keras.layers.Dense(1)])])
    assert keras_compat.input_signature(model) is None  # Never built.
    model(tf.zeros([3, 4]))
    assert keras_compat.input_signature(model).shape.as_list() == [None, 4]
    layers = list(keras_compat.flatten_layers(model))
    assert model not in layers and sum(isinstance(layer, tf.keras.layers.Dense) for layer in layers) == 2  # Nested.
    x, y, sample_weight = keras_compat.unpack_x_y_sample_weight((tf.zeros([3, 4]), tf.ones([3])))
    assert y.shape == [3] and sample_weight is None
    assert keras_compat.steps_per_execution(model) is None  # Not compiled.
    model.compile(loss="mse", steps_per_execution=3)
    assert keras_compat.steps_per_execution(model) == 3
    keras_compat.set_steps_per_execution(model, 1)
    assert keras_compat.steps_per_execution(model) == 1
    model.train_function = lambda iterator: None
    keras_compat.reset_train_function(model)
    assert model.train_function is None
