"""The Embedding ghost rule on JAX against each example's dense table gradient, grouped by a table of first positions
and by a sort (`keras_dyndp.rules.ghost_cost.embedding_by_table`): repeated ids, all ids equal, a long sequence, ids
outside the table, and an example whose rows are not finite with factor 0."""

from __future__ import annotations

import jax.numpy as jnp
import keras
import numpy as np
import pytest

from keras_dyndp.rules import ghost_cost
from keras_dyndp.rules import registry

RULE = registry.registered()[keras.layers.Embedding]


def _ids(kind: str, vocabulary: int, length: int) -> np.ndarray:
    rng = np.random.default_rng(5)
    if kind == "all_equal":
        return np.full((4, length), 3) + np.arange(4)[:, None] % 2
    if kind == "outside":
        ids = rng.integers(-vocabulary, vocabulary, (4, length))  # negatives read as N + id
        ids[:, :3] = [vocabulary, vocabulary + 7, -vocabulary - 1]  # outside the table: no gradient
        return ids
    return rng.integers(0, min(vocabulary, max(2, length // 4)), (4, length))  # each id about 4 times or more


@pytest.mark.parametrize("vocabulary,length", [(30, 12), (70000, 12), (30, 600), (5000, 600), (70000, 600)])
@pytest.mark.parametrize("kind", ["repeated", "all_equal", "outside"])
def test_norms_and_clipped_sum_equal_the_dense_per_example_gradients(kind, vocabulary, length):
    ids = _ids(kind, vocabulary, length)
    rng = np.random.default_rng(1)
    deltas = rng.normal(size=(4, length, 3)).astype(np.float32)
    factors = np.array([0.5, 0.0, 1.0, 2.0], np.float32)
    dense = np.zeros((4, vocabulary, 3))
    for example in range(4):
        read = np.where(ids[example] < 0, ids[example] + vocabulary, ids[example])
        inside = (read >= 0) & (read < vocabulary)
        np.add.at(dense[example], read[inside], deltas[example][inside].astype(np.float64))
    layer = keras.layers.Embedding(vocabulary, 3)
    layer.build()
    squared, clipped_sums = RULE.norms_and_sums(layer, jnp.asarray(ids), jnp.asarray(deltas))
    exact = np.sum(dense**2, axis=(1, 2))
    squared = np.asarray(squared, np.float64)
    if kind == "outside":  # ids outside the table count in the norm (an upper bound), not in the sum
        assert np.all(squared >= exact * (1 - 1e-6))
    else:
        np.testing.assert_allclose(squared, exact, rtol=1e-5)
    (total,) = clipped_sums(jnp.asarray(factors))
    np.testing.assert_allclose(total, np.tensordot(factors, dense, axes=1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("vocabulary", [30, 70000])
def test_an_example_with_factor_0_adds_nothing_even_if_not_finite(vocabulary):
    ids = np.random.default_rng(2).integers(0, 10, (3, 20))
    deltas = np.random.default_rng(3).normal(size=(3, 20, 2)).astype(np.float32)
    deltas[1, 4] = [np.inf, np.nan]
    layer = keras.layers.Embedding(vocabulary, 2)
    layer.build()
    squared, clipped_sums = RULE.norms_and_sums(layer, jnp.asarray(ids), jnp.asarray(deltas))
    assert not np.isfinite(squared[1]) and np.all(np.isfinite(np.asarray(squared)[[0, 2]]))
    (total,) = clipped_sums(jnp.asarray([1.0, 0.0, 0.5], jnp.float32))
    expected = np.zeros((vocabulary, 2))
    np.add.at(expected, ids[0], deltas[0].astype(np.float64))
    np.add.at(expected, ids[2], 0.5 * deltas[2].astype(np.float64))
    np.testing.assert_allclose(total, expected, rtol=1e-5, atol=1e-6)


def test_the_grouping_is_chosen_by_the_cost_model():
    assert ghost_cost.embedding_by_table(256, 10_000)  # the paper's text model
    assert ghost_cost.embedding_by_table(40, 1_000)  # the LSTM model
    assert not ghost_cost.embedding_by_table(40, 50_000)
    assert not ghost_cost.embedding_by_table(4096, 100_000)  # above MAX_MATERIALISED
    assert not ghost_cost.embedding_by_table(12, 70_000) and ghost_cost.embedding_by_table(600, 5_000)
