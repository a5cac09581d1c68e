"""The Embedding rule against a loop of single-example gradients: repeated ids, all ids equal, padding ids under
mask_zero, a long sequence, a factor-0 example, with the batch size known and unknown while tracing, and under XLA;
an example whose gradient is not finite adds exactly nothing."""

from __future__ import annotations

import types

import numpy as np
import pytest
import tensorflow as tf
from brute_force import LOSS
from brute_force import assert_close
from brute_force import assert_ghost_matches_the_brute_force
from brute_force import assert_matches
from brute_force import clip_case
from brute_force import clipped
from brute_force import per_example_gradients

from keras_dyndp.tf_backend import per_example
from keras_dyndp.tf_backend.keras_compat import keras
from keras_dyndp.tf_backend.per_example import dense

pytestmark = pytest.mark.xdist_group("embedding_rule")  # its module fixtures run once (tests/conftest.py)

L = keras.layers
WEIGHTS = np.array([1.0, 2.0, 0.0, 1.0, 1.0], np.float32)  # example 2: factor 0


def _model(vocabulary: int, length: int, mask_zero: bool = False) -> keras.Model:
    return keras.Sequential(
        [
            L.Input((length,), dtype="int32"),
            L.Embedding(vocabulary, 4, mask_zero=mask_zero),
            L.GlobalAveragePooling1D(),
            L.Dense(5, activation="tanh"),
            L.Dense(3),
        ]
    )


def _ids(name: str) -> np.ndarray:
    rng = np.random.default_rng(3)
    if name == "repeated":
        return rng.integers(0, 6, (5, 12))  # 12 tokens from 6 ids
    if name == "all_equal":
        return np.full((5, 9), 4) + np.arange(5)[:, None] % 2  # each example one id, 9 times
    if name == "padding":
        ids = rng.integers(1, 6, (5, 10))
        ids[:, 6:] = 0  # padded, masked by mask_zero
        ids[3, 1:] = 0  # one token, then padding
        return ids
    return rng.integers(0, 20, (5, 300))  # long: 300 tokens from 20 ids


CASES = {"repeated": (6, False), "all_equal": (6, False), "padding": (6, True), "long": (20, False)}


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request):
    keras.utils.set_random_seed(0)
    ids = _ids(request.param)
    vocabulary, mask_zero = CASES[request.param]
    model = _model(vocabulary, ids.shape[1], mask_zero)
    y = tf.constant(np.arange(5) % 3, tf.int32)
    return clip_case(model, tf.constant(ids, tf.int32), y, WEIGHTS)


def test_the_embedding_rule_matches_the_brute_force(case):
    assert_ghost_matches_the_brute_force(case, WEIGHTS)


def test_the_embedding_rule_compiles_with_xla(case):
    model, x, y, gradients, norms, clip_norm = case
    step = tf.function(
        lambda: per_example.clipped_gradient_sum(
            model, LOSS, x, y, tf.constant(WEIGHTS), clip_norm, model.trainable_variables, method="ghost"
        ),
        jit_compile=True,
    )
    assert_matches(*step(), clipped(gradients, norms, clip_norm))


@pytest.mark.parametrize("positions", [1, 7])
def test_an_example_with_factor_0_adds_nothing_even_if_not_finite(positions):
    """Example 1's rows hold inf and NaN: its squared norm is not finite, and with factor 0 the sum is exactly the
    others' (a select, not 0 x inf)."""
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 4, (3, positions))
    g = rng.normal(size=(3, positions, 2)).astype(np.float32)
    g[1, 0] = [np.inf, np.nan]
    layer = L.Embedding(4, 2)
    layer.build((None, positions))
    tap = types.SimpleNamespace(
        layer=layer, rows=types.SimpleNamespace(batch=3, fold=1), inputs=tf.constant(ids, tf.int32)
    )
    (gradient,) = dense.embedding_norms_and_sums(tap, tf.constant(g))
    squared = gradient.squared_norms.numpy()
    assert not np.isfinite(squared[1])
    factors = np.array([0.5, 0.0, 2.0], np.float32)
    expected = np.zeros((4, 2))
    for example in (0, 2):
        np.add.at(expected, ids[example], factors[example] * g[example].astype(np.float64))
    total = gradient.clipped_sum(tf.constant(factors)).numpy()
    np.testing.assert_allclose(total, expected, rtol=1e-6, atol=1e-6)
    assert np.all(np.isfinite(total))
    example_gradient = np.zeros((4, 2))
    np.add.at(example_gradient, ids[0], g[0].astype(np.float64))
    assert squared[0] >= np.sum(example_gradient**2) * (1 - 1e-6)


def test_per_example_norms_with_unknown_batch_and_length():
    """Traced with the batch size and sequence length unknown (fit's signature for a ragged text input)."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [L.Input((None,), dtype="int32"), L.Embedding(9, 3), L.GlobalAveragePooling1D(), L.Dense(2)]
    )
    x = tf.constant(np.random.default_rng(1).integers(0, 9, (5, 40)), tf.int32)
    y = tf.constant([0, 1, 1, 0, 1], tf.int32)
    gradients, norms = per_example_gradients(model, x, y, WEIGHTS)
    clip_norm = float(np.median(norms[WEIGHTS > 0]))
    step = tf.function(
        lambda x, y: per_example.clipped_gradient_sum(
            model, LOSS, x, y, tf.constant(WEIGHTS), clip_norm, model.trainable_variables, method="ghost"
        ),
        input_signature=[tf.TensorSpec([None, None], tf.int32), tf.TensorSpec([None], tf.int32)],
    )
    (table, *_), ghost_norms = step(x, y)
    expected_sums, expected_norms = clipped(gradients, norms, clip_norm)
    assert_close(ghost_norms, expected_norms)
    assert_close(table, expected_sums[0])  # the output bias's sum nearly cancels: float32 noise beyond 1e-5


def test_a_batch_of_empty_sequences_has_zero_norms_and_adds_nothing():
    """T = 0 positions, unknown while tracing: every example's norm is 0 (one per example, none dropped by the
    per-pair sums) and the clipped sum is the zero table."""
    layer = L.Embedding(4, 2)
    layer.build((None, None))

    @tf.function(input_signature=[tf.TensorSpec([3, None], tf.int32), tf.TensorSpec([3, None, 2], tf.float32)])
    def rule(ids, g):
        tap = types.SimpleNamespace(layer=layer, rows=types.SimpleNamespace(batch=tf.shape(ids)[0], fold=1), inputs=ids)
        (gradient,) = dense.embedding_norms_and_sums(tap, g)
        return gradient.squared_norms, gradient.clipped_sum(tf.ones([3]))

    squared, total = rule(tf.zeros([3, 0], tf.int32), tf.zeros([3, 0, 2]))
    np.testing.assert_array_equal(squared.numpy(), np.zeros(3))
    np.testing.assert_array_equal(total.numpy(), np.zeros((4, 2)))


@pytest.mark.parametrize("shape", [(5, 12), (200, 300), (37, 500)])
@pytest.mark.parametrize("static", [True, False])
def test_pairs_hashed_in_chunks_are_numbered_as_by_one_unique(shape, static):
    """Chunks of whole examples (8 while the shape is unknown, some empty for 5 examples; 7 of uneven size for 200 x
    300; 2 for 37 x 500) give the pairs and indices of one `tf.unique` of all the keys, duplicates within an example
    included."""
    vocabulary = 20
    ids = np.random.default_rng(0).integers(0, vocabulary, shape)
    keys = tf.constant(np.arange(shape[0])[:, None] * vocabulary + ids, tf.int64)
    signature = [tf.TensorSpec(shape if static else [None, None], tf.int64)]
    pairs, index = tf.function(dense._unique_pairs, input_signature=signature)(keys)
    expected_pairs, expected_index = tf.unique(tf.reshape(keys, [-1]))
    np.testing.assert_array_equal(pairs.numpy(), expected_pairs.numpy())
    np.testing.assert_array_equal(index.numpy(), expected_index.numpy())
