"""TensorFlow's tapped ReversibleEmbedding rule (`reversible`): a model that looks tokens up and projects back through
the same layer (a causal LM's output) takes the ghost path, untied and tied, and clips as the per-example path does;
the tied table's norm (the Gram form over both calls' positions) never falls below the exact one, also where the two
calls' gradients cancel; what the rule does not cover falls back."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from keras_dyndp.tf_backend.keras_compat import keras
from keras_dyndp.tf_backend.per_example import clipped_sum
from keras_dyndp.tf_backend.per_example import reversible
from keras_dyndp.tf_backend.per_example.taps import Rows
from keras_dyndp.tf_backend.per_example.taps import Tap
from keras_dyndp.tf_backend.per_example.taps import Tapping

if not hasattr(keras.layers, "ReversibleEmbedding"):
    pytest.skip("Keras 3's ReversibleEmbedding", allow_module_level=True)

VOCABULARY, LENGTH, WIDTH = 50, 6, 8
LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")


def _causal_model(tie_weights: bool, logit_soft_cap: float | None = None, reverse_calls: int = 1) -> keras.Model:
    """Token ids -> ReversibleEmbedding -> Dense -> the same layer in reverse: next-token logits [B, L, V]."""
    keras.utils.set_random_seed(0)
    ids = keras.Input((LENGTH,), dtype="int32")
    table = keras.layers.ReversibleEmbedding(VOCABULARY, WIDTH, tie_weights=tie_weights, logit_soft_cap=logit_soft_cap)
    h = keras.layers.Dense(WIDTH, activation="tanh")(table(ids))
    logits = table(h, reverse=True)
    for _ in range(reverse_calls - 1):
        logits = logits + table(h, reverse=True)
    return keras.Model(ids, logits)


def _batch() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    x = rng.integers(0, VOCABULARY, (4, LENGTH)).astype("int32")
    x[1] = x[1, 0]  # one example of a single id, repeated
    return x, rng.integers(0, VOCABULARY, (4, LENGTH)).astype("int32")


def _clipped(model: keras.Model, method: str, clip_norm: float = 1e-3) -> tuple[np.ndarray, np.ndarray]:
    x, y = _batch()
    sums, norms = tf.function(
        lambda: clipped_sum.clipped_gradient_sum(
            model, LOSS, x, y, None, clip_norm, model.trainable_variables, method=method
        )
    )()
    return np.concatenate([np.ravel(s) for s in sums]), np.asarray(norms)


@pytest.mark.parametrize(
    "tie_weights, logit_soft_cap", [(False, None), (False, 3.0), (True, None), (True, 3.0)], ids=str
)
def test_a_layer_called_forward_and_in_reverse_clips_on_the_ghost_path_as_on_the_per_example_path(
    tie_weights, logit_soft_cap
):
    model = _causal_model(tie_weights, logit_soft_cap)
    assert clipped_sum._ghost_applies(model, _batch()[0], model.trainable_variables, "ghost")
    (ghost_sums, ghost_norms), (sums, norms) = _clipped(model, "ghost"), _clipped(model, "vectorized")
    assert np.all(ghost_norms >= norms * (1 - 1e-6))  # tied: the rounding bound's margin, never below
    np.testing.assert_allclose(ghost_norms, norms, rtol=1e-3 if tie_weights else 1e-5)
    np.testing.assert_allclose(ghost_sums, sums, atol=1e-3 * np.max(np.abs(sums)))


def test_an_untied_layer_only_looked_up_gives_its_output_table_a_zero_gradient():
    keras.utils.set_random_seed(0)
    ids = keras.Input((LENGTH,), dtype="int32")
    table = keras.layers.ReversibleEmbedding(VOCABULARY, WIDTH, tie_weights=False)
    model = keras.Model(ids, keras.layers.Dense(VOCABULARY)(table(ids)))
    (ghost_sums, ghost_norms), (sums, norms) = _clipped(model, "ghost"), _clipped(model, "vectorized")
    np.testing.assert_allclose(ghost_norms, norms, rtol=1e-5)
    np.testing.assert_allclose(ghost_sums, sums, atol=1e-5 * np.max(np.abs(sums)))


def test_a_tied_layer_called_twice_in_reverse_takes_the_per_example_path():
    model = _causal_model(tie_weights=True, reverse_calls=2)
    with pytest.raises(ValueError, match="called in reverse more than once"):
        _clipped(model, "ghost")
    np.testing.assert_array_equal(_clipped(model, "auto")[1], _clipped(model, "vectorized")[1])


def _tied_taps(layer, ids, g1, h, g2) -> tuple[Tap, Tap]:
    """A lookup's and a projection's taps of ``layer`` with the given inputs and gradients (one row per example)."""
    batch = len(ids)
    tapping = Tapping(Rows(tf.constant(batch), batch, 1, tf.constant(batch)), None)
    taps = []
    for inputs, gradient in ((tf.constant(ids), g1), (tf.constant(h), g2)):
        tap = Tap(layer, tapping)
        tap.rows, tap.inputs, tap.gradient = tapping.rows[0], inputs, tf.constant(gradient)
        tapping.taps.append(tap)
        taps.append(tap)
    return taps[0], taps[1]


def test_the_tied_tables_norm_is_never_below_the_exact_one_where_the_two_calls_cancel():
    """Example i looks up id v and projects h = -g1 / c with output gradient c e_v: its two gradients of the table
    cancel exactly, large values on both sides; a perturbation of 1e-6 leaves a tiny exact norm that float32's
    |A|^2 + |B|^2 + 2 <A, B> would round to anything. The bound stays above the float64 norm; the sum matches."""
    rng = np.random.default_rng(0)
    layer = keras.layers.ReversibleEmbedding(VOCABULARY, WIDTH, tie_weights=True)
    layer.build((None,))
    batch = 64
    ids = rng.integers(0, VOCABULARY, (batch, 1)).astype("int32")
    g1 = (rng.normal(size=(batch, 1, WIDTH)) * 1e3).astype(np.float32)
    scale = rng.uniform(0.5, 2.0, (batch, 1, 1)).astype(np.float32)
    g2 = np.zeros((batch, 1, VOCABULARY), np.float32)
    g2[np.arange(batch), 0, ids[:, 0]] = scale[:, 0, 0]
    h = (-g1 / scale + rng.normal(size=g1.shape) * 1e-6).astype(np.float32)
    lookup, projection = _tied_taps(layer, ids, g1, h, g2)
    assert reversible.norms_and_sums(lookup, lookup.gradient) == []  # the projection's tap returns the table's
    (gradient,) = reversible.norms_and_sums(projection, projection.gradient)
    exact = np.zeros((batch, VOCABULARY, WIDTH))
    exact[np.arange(batch), ids[:, 0]] += g1[:, 0].astype(np.float64)
    exact += np.einsum("bsv,bsd->bvd", g2.astype(np.float64), h.astype(np.float64))
    exact_squared = np.sum(exact**2, axis=(1, 2))
    assert np.all(gradient.squared_norms.numpy() >= exact_squared)
    factors = rng.uniform(0.0, 1.0, batch).astype(np.float32)
    factors[:4] = 0.0
    summed = np.einsum("b,bvd->vd", factors.astype(np.float64), exact)
    np.testing.assert_allclose(gradient.clipped_sum(tf.constant(factors)).numpy(), summed, atol=1e-3)


def test_the_tied_tables_norm_matches_the_materialised_gradients_on_random_values():
    rng = np.random.default_rng(1)
    layer = keras.layers.ReversibleEmbedding(VOCABULARY, WIDTH, tie_weights=True)
    layer.build((None,))
    batch, length, steps = 8, 5, 7
    ids = rng.integers(0, 6, (batch, length)).astype("int32")  # repeated ids
    g1 = rng.normal(size=(batch, length, WIDTH)).astype(np.float32)
    h = rng.normal(size=(batch, steps, WIDTH)).astype(np.float32)
    g2 = rng.normal(size=(batch, steps, VOCABULARY)).astype(np.float32)
    lookup, projection = _tied_taps(layer, ids, g1, h, g2)
    (gradient,) = reversible.norms_and_sums(projection, projection.gradient)
    exact = np.einsum("bsv,bsd->bvd", g2.astype(np.float64), h.astype(np.float64))
    for b in range(batch):
        np.add.at(exact[b], ids[b], g1[b].astype(np.float64))
    exact_norms = np.sqrt(np.sum(exact**2, axis=(1, 2)))
    norms = np.sqrt(gradient.squared_norms.numpy())
    assert np.all(norms >= exact_norms)
    np.testing.assert_allclose(norms, exact_norms, rtol=1e-3)
    factors = np.linspace(0.0, 1.0, batch).astype(np.float32)
    summed = np.einsum("b,bvd->vd", factors.astype(np.float64), exact)
    np.testing.assert_allclose(gradient.clipped_sum(tf.constant(factors)).numpy(), summed, rtol=1e-4, atol=1e-4)


def test_a_tied_example_whose_values_are_not_finite_gets_a_norm_that_is_not_finite_and_adds_nothing():
    """Its squared norm is NaN or inf (`mechanism.norms_from_squares` makes either infinite: clip factor 0), the
    others' finite; with factor 0 its rows add exactly nothing to the table's sum."""
    rng = np.random.default_rng(2)
    layer = keras.layers.ReversibleEmbedding(VOCABULARY, WIDTH, tie_weights=True)
    layer.build((None,))
    ids = rng.integers(0, VOCABULARY, (4, 3)).astype("int32")
    g1, h = rng.normal(size=(4, 3, WIDTH)).astype(np.float32), rng.normal(size=(4, 2, WIDTH)).astype(np.float32)
    g2 = rng.normal(size=(4, 2, VOCABULARY)).astype(np.float32)
    g2[0, 0, 0], h[0, 1, 0] = np.nan, np.inf  # example 0
    lookup, projection = _tied_taps(layer, ids, g1, h, g2)
    (gradient,) = reversible.norms_and_sums(projection, projection.gradient)
    squared = gradient.squared_norms.numpy()
    assert not np.isfinite(squared[0]) and np.all(np.isfinite(squared[1:]))
    factors = np.array([0.0, 1.0, 1.0, 1.0], np.float32)
    summed = gradient.clipped_sum(tf.constant(factors)).numpy()
    exact = np.einsum("bsv,bsd->vd", g2[1:].astype(np.float64), h[1:].astype(np.float64))
    for b in range(1, 4):
        np.add.at(exact, ids[b], g1[b].astype(np.float64))
    np.testing.assert_allclose(summed, exact, rtol=1e-4, atol=1e-4)
