"""ghost: TimeDistributed folds are clipped per example; rows that are not examples, tied or shared weights send
the model to the vectorized path (checked against a loop of single-example gradients)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from brute_force import LOSS
from brute_force import assert_matches
from brute_force import reference

from keras_dyndp.rules import registry
from keras_dyndp.tf_backend import keras_compat
from keras_dyndp.tf_backend import per_example
from keras_dyndp.tf_backend.keras_compat import keras

BATCH = 6
WEIGHTS = np.array([1.0, 0.0, 1.0, 2.0, 0.0, 1.0], np.float32)


def clipped_sum_step(model, x, clip_norm, method):
    """The clipped sum traced as in model.fit: a tf.function whose batch size is unknown while tracing."""
    signature = [tf.TensorSpec([None, *x.shape[1:]], x.dtype), tf.TensorSpec([None], tf.int32)]
    return tf.function(
        lambda x, y: per_example.clipped_gradient_sum(
            model, LOSS, x, y, None, clip_norm, model.trainable_variables, method=method
        ),
        input_signature=signature,
    )


def time_distributed() -> keras.Model:
    """Each example is 2 steps of 5 ids; Embedding and Dense see the steps folded into their rows."""
    inputs = keras.Input(shape=(2, 5), dtype=tf.int32)
    hidden = keras.layers.TimeDistributed(keras.layers.Embedding(7, 4))(inputs)
    hidden = keras.layers.TimeDistributed(keras.layers.Dense(3, activation="tanh"))(hidden)
    hidden = keras.layers.Reshape((2, 15))(hidden)
    hidden = keras.layers.TimeDistributed(keras.layers.Dense(3))(hidden)
    return keras.Model(inputs, keras.layers.GlobalAveragePooling1D()(hidden))


def time_distributed_data():
    rng = np.random.default_rng(4)
    return tf.constant(rng.integers(0, 7, (BATCH, 2, 5)), tf.int32), tf.constant(rng.integers(0, 3, BATCH), tf.int32)


@pytest.mark.parametrize("batch", [1, 2, BATCH])
def test_time_distributed_is_clipped_per_example_on_the_ghost_path(batch):
    keras.utils.set_random_seed(0)
    model = time_distributed()
    x, y = time_distributed_data()
    x, y = x[:batch], y[:batch]
    clip_norm = 0.05
    expected = reference(model, x, y, np.ones(batch, np.float32), clip_norm)
    assert expected[1].min() > clip_norm  # Every example is clipped.
    step = clipped_sum_step(model, x, clip_norm, "ghost")
    sums, norms = step(x, y)
    assert_matches(sums, norms, expected)
    # Neighbour sensitivity: adding the last example to the others moves the clipped sum by exactly C.
    without = step(x[:-1], y[:-1])[0] if batch > 1 else [tf.zeros_like(v) for v in model.trainable_variables]
    distance = np.sqrt(sum(np.sum(np.square(np.float64(a) - np.float64(b))) for a, b in zip(sums, without)))
    assert distance == pytest.approx(clip_norm, rel=1e-4)


class TiedEmbedding(keras.Model):
    """The embedding matrix is also the output layer (tied weights): its gradient has two parts."""

    def __init__(self):
        super().__init__()
        self.embedding = keras.layers.Embedding(5, 4)
        self.hidden = keras.layers.Dense(4, activation="tanh")

    def call(self, ids):
        hidden = self.hidden(tf.reduce_mean(self.embedding(ids), axis=1))
        return tf.matmul(hidden, self.embedding.embeddings, transpose_b=True)


class SharedKernel(keras.Model):
    """Two Dense layers with one kernel: its per-example gradient is the sum of both layers' parts."""

    def __init__(self):
        super().__init__()
        self.first = keras.layers.Dense(4, activation="tanh", use_bias=False)
        self.second = keras.layers.Dense(4, use_bias=False)

    def build(self, input_shape):
        self.first.build(input_shape)
        if keras_compat.KERAS_MAJOR_VERSION == 2:
            self.second.kernel = self.first.kernel
        else:  # Keras 3's Dense.kernel is a property reading `_kernel`; its build sets `bias`.
            self.second._kernel = self.first.kernel  # pylint: disable=protected-access
            self.second.bias = None
        self.second.built = True
        super().build(input_shape)

    def call(self, inputs):
        return self.second(self.first(tf.reduce_mean(inputs, axis=1)))


class FoldedByHand(keras.Model):
    """A Dense over the 5 steps of each example, folded into rows with tf.reshape (not TimeDistributed)."""

    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(3)

    def call(self, inputs):
        rows = self.dense(tf.reshape(inputs, [-1, 4]))
        return tf.reduce_mean(tf.reshape(rows, [-1, 5, 3]), axis=1)


class FixedTable(keras.Model):
    """A Dense applied to a table of BATCH rows that are not examples, broadcast onto the batch."""

    def __init__(self):
        super().__init__()
        self.table = tf.constant(np.random.default_rng(5).normal(size=(BATCH, 4)), tf.float32)
        self.keys = keras.layers.Dense(3)
        self.out = keras.layers.Dense(3)

    def call(self, inputs):
        return self.out(tf.reduce_mean(inputs, axis=1)) * tf.reduce_mean(self.keys(self.table), axis=0)


@pytest.mark.parametrize(
    "build,reason",
    [
        (TiedEmbedding, "tied weights"),
        (SharedKernel, "shares a variable"),
        (FoldedByHand, "not have one row per example"),
        (FixedTable, "not have one row per example"),
    ],
)
def test_rows_that_are_not_examples_fall_back_to_the_vectorized_path(build, reason, monkeypatch):
    # Declared per example (wrongly, for the folds), so that the ghost path's own checks are what sends them away.
    monkeypatch.setattr(registry, "_PER_EXAMPLE", {**registry._PER_EXAMPLE, build: None})  # pylint: disable=protected-access
    keras.utils.set_random_seed(0)
    model = build()
    rng = np.random.default_rng(6)
    if build is TiedEmbedding:
        x = tf.constant(rng.integers(0, 5, (BATCH, 3)), tf.int32)
    else:
        x = tf.constant(rng.normal(size=(BATCH, 5, 4)), tf.float32)
    y = tf.constant(rng.integers(0, 3, BATCH), tf.int32)
    model(x[:1])
    expected = reference(model, x, y, WEIGHTS, 0.1)
    # Eagerly (the batch size is known: BATCH, as many as the table's rows) and traced as in fit (unknown).
    assert_matches(
        *per_example.clipped_gradient_sum(model, LOSS, x, y, tf.constant(WEIGHTS), 0.1, model.trainable_variables),
        expected,
    )
    step = tf.function(
        lambda x, y, w: per_example.clipped_gradient_sum(model, LOSS, x, y, w, 0.1, model.trainable_variables),
        input_signature=[
            tf.TensorSpec([None, *x.shape[1:]], x.dtype),
            tf.TensorSpec([None], tf.int32),
            tf.TensorSpec([None]),
        ],
    )
    assert_matches(*step(x, y, tf.constant(WEIGHTS)), expected)
    with pytest.raises(ValueError, match=reason):
        per_example.clipped_gradient_sum(model, LOSS, x, y, None, 0.1, model.trainable_variables, method="ghost")


@pytest.mark.parametrize("traced", [False, True])
def test_clipped_sums_without_selects_only_when_finite(traced):
    """The sums are first taken without the per-row selects; a factor-0 row holding inf or NaN (0 x inf is NaN)
    sends them to the selects, which add exactly nothing from it; finite rows give the same sums either way."""
    from keras_dyndp.rules.layer_rules import weighted_sum  # pylint: disable=import-outside-toplevel
    from keras_dyndp.tf_backend.per_example import ghost  # pylint: disable=import-outside-toplevel
    from keras_dyndp.tf_backend.per_example.taps import GhostGradient  # pylint: disable=import-outside-toplevel

    finite = tf.constant([[1.0, 2.0], [3.0, -4.0], [0.5, 0.25]])
    spoiled = tf.constant([[1.0, 2.0], [np.inf, np.nan], [0.5, 0.25]])
    factors = tf.constant([1.0, 0.0, 0.5])

    def sums(factors):
        gradients = [GhostGradient(None, None, lambda f, t=t: weighted_sum(f, t)) for t in (finite, spoiled)]
        return ghost._clipped_sums(gradients, factors)  # pylint: disable=protected-access

    result = tf.function(sums)(factors) if traced else sums(factors)
    np.testing.assert_array_equal(result[0], [1.25, 2.125])
    np.testing.assert_array_equal(result[1], [1.25, 2.125])
