"""per_example_layers: only models whose every layer and op is known to act per example take the batched (ghost)
path; a layer that reads across the batch goes to the vectorized path (neighbour distance C), and the example
trainers' models keep the ghost path."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from brute_force import LOSS

from keras_dyndp import datasets
from keras_dyndp.rules import registry
from keras_dyndp.tf_backend import keras_compat
from keras_dyndp.tf_backend import per_example
from keras_dyndp.tf_backend.keras_compat import keras
from keras_dyndp.tf_backend.per_example import ghost
from keras_dyndp.tf_backend.per_example import per_example_layers
from research import chest_xray
from research import digits
from research import federated_mnist
from research import imdb
from research import mnist
from research import names

KERAS_3 = keras_compat.KERAS_MAJOR_VERSION == 3
if KERAS_3:
    from keras import ops

    def batch_mean(h):
        return ops.mean(h, axis=0)

    relu = ops.relu

    def positive(h):
        return ops.cast(h > 0, "float32")
else:

    def batch_mean(h):
        return tf.reduce_mean(h, axis=0)

    relu = tf.nn.relu

    def positive(h):
        return tf.cast(h > 0, tf.float32)


def attend(attention: keras.layers.Layer, h):
    """``attention`` of 3 positions of 2 features on themselves, flattened."""
    sequence = keras.layers.Reshape((3, 2))(h)
    return keras.layers.Flatten()(attention([sequence, sequence]))


def functional(middle) -> keras.Model:
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(6, activation="tanh")(inputs)
    return keras.Model(inputs, keras.layers.Dense(3)(middle(hidden)))


def test_a_layer_that_subtracts_the_batch_mean_moves_the_clipped_sum_by_at_most_c():
    # On the ghost path (main) the outlier moved the clipped sum by 3.28 C; each example now runs alone.
    clip_norm = 0.1
    rng = np.random.default_rng(1)
    x = rng.normal(size=(16, 4)).astype(np.float32)
    x[2] *= 100.0
    y = rng.integers(0, 3, 16).astype(np.int32)
    keep = np.arange(16) != 2
    sums = []
    for rows in (slice(None), keep):
        keras.utils.set_random_seed(0)
        model = functional(keras.layers.Lambda(lambda h: h - batch_mean(h)))
        step = tf.function(
            lambda a, b, m=model: per_example.clipped_gradient_sum(
                m, LOSS, a, b, None, clip_norm, m.trainable_variables
            )[0],
            input_signature=[tf.TensorSpec([None, 4]), tf.TensorSpec([None], tf.int32)],
        )
        sums.append(step(x[rows], y[rows]))
    distance = np.sqrt(sum(np.sum(np.square(np.float64(a) - np.float64(b))) for a, b in zip(*sums)))
    assert distance <= clip_norm * (1 + 1e-4), distance / clip_norm


def test_ghost_is_refused_for_a_layer_not_known_to_act_per_example():
    model = functional(keras.layers.Lambda(lambda h: h - batch_mean(h), name="centre"))
    x, y = tf.ones([3, 4]), tf.zeros([3], tf.int32)
    with pytest.raises(ValueError, match=r"layer 'centre' \(Lambda\).*register_per_example_layer.*'vectorized'"):
        per_example.clipped_gradient_sum(model, LOSS, x, y, None, 1.0, model.trainable_variables, method="ghost")


class Halve(keras.layers.Layer):
    def call(self, inputs):
        return inputs * 0.5


def test_a_declared_custom_layer_is_known(monkeypatch):
    monkeypatch.setattr(registry, "_PER_EXAMPLE", dict(registry._PER_EXAMPLE))  # pylint: disable=protected-access
    model = functional(Halve(name="halve"))
    assert per_example_layers.first_unknown(model) == "layer 'halve' (Halve)"
    per_example.register_per_example_layer(Halve)
    assert per_example_layers.first_unknown(model) is None
    with pytest.raises(TypeError, match="layer_class"):
        per_example.register_per_example_layer(print)


class Subclassed(keras.Model):
    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(3)

    def call(self, inputs):
        return self.dense(inputs)


@pytest.mark.parametrize(
    "middle,unknown",
    [
        (lambda h: relu(h) * 2.0 + h - 1.0, None),  # Elementwise ops.
        (lambda h: h - batch_mean(h), "mean"),  # Reads across the batch.
        (lambda h: h[:, 1:5] * positive(h[:, 0:4]) + h[:, 0, None], None),  # Slices keeping the batch; comparison.
        (lambda h: h - h[0], "getitem"),  # Reads example 0.
        (lambda h: h + h[1:2, :], "getitem"),  # Slices the batch axis.
        (lambda h: h * np.ones((3, 6), np.float32), "multiply"),  # A constant with rows of its own.
        (lambda h: keras.layers.Softmax(axis=0)(h), "softmax"),
        (lambda h: keras.layers.Concatenate(axis=0)([h, h]), "concatenate"),
        (lambda h: keras.layers.LayerNormalization()(keras.layers.Dropout(0.5)(h)), None),
        (lambda h: keras.layers.GaussianNoise(0.1)(h), "gaussian_noise"),  # Draws row by row.
        (lambda h: attend(keras.layers.Attention(), h), None),  # Within one example.
        (lambda h: attend(keras.layers.AdditiveAttention(dropout=0.5), h), "additive_attention"),  # Row by row.
    ],
)
def test_ops_and_layer_configurations(middle, unknown):
    found = per_example_layers.first_unknown(functional(middle))
    if unknown is None:
        assert found is None
    else:
        assert found is not None and unknown in found.lower().replace("tf.math.", "").replace("get_item", "getitem")


def test_a_subclassed_model_with_its_own_call_is_unknown():
    model = Subclassed()
    model(tf.ones([1, 4]))
    assert "Subclassed" in per_example_layers.first_unknown(model)


def task_data(x_shape: tuple, dtype=np.float32, num_classes: int = 10) -> datasets.TaskData:
    x = np.zeros((2, *x_shape), dtype)
    return datasets.TaskData(x, np.zeros(2, np.int64), x, np.zeros(2, np.int64), num_classes, "shapes only")


@pytest.mark.parametrize(
    "build,data",
    [
        (mnist.build_model, task_data((28, 28, 1))),
        (digits.build_model, task_data((8, 8, 1))),
        (imdb.build_model, task_data((20,), np.int32, 2)),
        (names.build_model, task_data((12,), np.int32, 18)),
        (chest_xray.build_model, task_data((32, 32, 1), np.uint8, 2)),
        (federated_mnist.build_model, task_data((3, 28, 28, 1), np.uint8)),
    ],
)
def test_the_example_models_take_the_ghost_path(build, data):
    model = build(data)
    assert per_example_layers.first_unknown(model) is None
    assert ghost.supported(model, model.trainable_variables)
