"""graph_rows: a model with a layer not known to act per example as a whole (a subclassed block, as KerasHub's) takes
the ghost path when its traced forward pass keeps each example in its own row, and its clipped sum is then the
brute-force one; a block that mixes examples is refused with the op named, takes the vectorized path under 'auto',
and one example still moves the clipped sum by at most C."""

import numpy as np
import pytest
import tensorflow as tf
from brute_force import LOSS
from brute_force import assert_close
from brute_force import reference

from keras_dyndp.tf_backend import per_example
from keras_dyndp.tf_backend.keras_compat import keras
from keras_dyndp.tf_backend.per_example import clipped_sum
from keras_dyndp.tf_backend.per_example import graph_rows
from keras_dyndp.tf_backend.per_example import per_example_layers


class Block(keras.layers.Layer):
    """Undeclared: query and key projections split into heads by reshapes, attention within each example, a residual
    projection, Dropout, then ``mix`` (None: nothing) and a layer norm."""

    def __init__(self, mix=None, rate=0.25, **kwargs):
        super().__init__(**kwargs)
        self.query, self.key, self.out = (keras.layers.Dense(8) for _ in range(3))
        self.dropout = keras.layers.Dropout(rate)
        self.norm = keras.layers.LayerNormalization()
        self.mix = mix

    def call(self, h, training=None):
        batch = tf.shape(h)[0]
        heads = [tf.reshape(layer(h), [batch, 5, 2, 4]) for layer in (self.query, self.key)]
        scores = tf.nn.softmax(tf.einsum("bqhd,bkhd->bhqk", *heads) / 2.0, axis=-1)
        attended = tf.einsum("bhqk,bkhd->bqhd", scores, tf.reshape(h, [batch, 5, 2, 4]))
        h = h + self.dropout(self.out(tf.reshape(attended, [batch, 5, 8])), training=training)
        return self.norm(h if self.mix is None else self.mix(h))


def model_with(mix=None, rate=0.25) -> keras.Model:
    keras.utils.set_random_seed(0)
    inputs = keras.Input((5, 8))
    hidden = Block(mix, rate, name="block")(keras.layers.Dense(8)(inputs))
    return keras.Model(inputs, keras.layers.Dense(3)(keras.layers.Flatten()(hidden)))


def data(size: int = 6) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.normal(size=(size, 5, 8)).astype(np.float32), rng.integers(0, 3, size).astype(np.int32)


def test_an_undeclared_block_is_proven_and_its_ghost_clipped_sum_is_the_brute_force_one():
    model = model_with()
    x, y = data()
    assert "Block" in per_example_layers.first_unknown(model)
    assert graph_rows.first_mixing_op(model, x) is None
    assert clipped_sum._ghost_applies(model, x, model.trainable_variables, "ghost")  # pylint: disable=protected-access
    weights = np.ones(len(y), np.float32)
    model.get_layer("block").dropout.rate = 0.0  # The brute force runs examples one by one: no shared mask.
    sums, norms = per_example.clipped_gradient_sum(
        model, LOSS, x, y, None, 0.5, model.trainable_variables, method="ghost"
    )
    expected_sums, expected_norms = reference(model, x, y, weights, 0.5)
    assert_close(norms, expected_norms)
    assert_close(np.concatenate([np.ravel(s) for s in sums]), np.concatenate([np.ravel(s) for s in expected_sums]))


def batch_mean(h):
    return h - tf.reduce_mean(h, axis=0)


def test_method_ghost_on_a_block_that_mixes_examples_names_the_op():
    model = model_with(batch_mean)
    x, y = data()
    assert "reduces across the batch axis" in graph_rows.first_mixing_op(model, x)
    with pytest.raises(ValueError, match=r"layer 'block' \(Block\).*\(Mean\) reduces across the batch axis"):
        per_example.clipped_gradient_sum(model, LOSS, x, y, None, 1.0, model.trainable_variables, method="ghost")


@pytest.mark.parametrize("mix", [batch_mean, lambda h: tf.concat([h[1:], h[:1]], axis=0)])
def test_a_block_that_mixes_examples_takes_the_vectorized_path_and_one_example_moves_the_sum_by_at_most_c(mix):
    clip_norm = 0.1
    x, y = data(8)
    x[2] *= 100.0
    keep = np.arange(8) != 2
    sums = []
    for rows in (slice(None), keep):
        model = model_with(mix, rate=0.0)  # Each run's Dropout would draw its own mask.
        sums.append(
            per_example.clipped_gradient_sum(model, LOSS, x[rows], y[rows], None, clip_norm, model.trainable_variables)[
                0
            ]
        )
    distance = np.sqrt(sum(np.sum(np.square(np.float64(a) - np.float64(b))) for a, b in zip(*sums)))
    assert distance <= clip_norm * (1 + 1e-4), distance / clip_norm


def test_the_proof_is_cached_per_input_signature():
    model = model_with()
    x, _ = data()
    assert graph_rows.first_mixing_op(model, x) is None
    traced = dict(graph_rows._results[model])  # pylint: disable=protected-access
    assert graph_rows.first_mixing_op(model, x[:3]) is None
    assert graph_rows._results[model] == traced  # pylint: disable=protected-access
    assert graph_rows.first_mixing_op(model, [1, 2]) is not None
