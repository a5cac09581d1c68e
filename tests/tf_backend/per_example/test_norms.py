"""norms: per-example squared norms and clipped sums of the bilinear (each `ghost_cost` form), bias and materialised
gradients."""

import numpy as np
import pytest
import tensorflow as tf
from brute_force import assert_close

from keras_dyndp.rules import ghost_cost
from keras_dyndp.tf_backend.per_example import norms


@pytest.mark.parametrize(
    "positions,fan_in,fan_out,form",
    [
        (2, 64, 64, ghost_cost.GRAM),
        (4, 300, 300, ghost_cost.GRAM),  # too large to hold, and the Gram form is cheaper
        (5, 3, 4, ghost_cost.PER_EXAMPLE),
        (6, 5, 2, ghost_cost.PER_EXAMPLE),  # the larger fan as the batched matmul's last axis
        (160, 300, 300, ghost_cost.PER_EXAMPLE_NORMS),
        (144, 1152, 128, ghost_cost.PER_EXAMPLE_NORMS),  # fan_out < fan_in
    ],
)
def test_bilinear_norms_and_sum_in_each_form(positions, fan_in, fan_out, form):
    assert ghost_cost.form(positions, fan_in, fan_out) == form
    rng = np.random.default_rng(2)
    a = rng.normal(size=(3, positions, fan_in)).astype(np.float32)
    g = rng.normal(size=(3, positions, fan_out)).astype(np.float32)
    factors = np.array([0.5, 1.0, 0.0], np.float32)
    per_example_grads = np.einsum("btk,btc->bkc", a.astype(np.float64), g.astype(np.float64))
    squared, kernel_sum = norms.bilinear_norms_and_sum(tf.constant(a), tf.constant(g))
    _assert_bounded(squared, a, g, per_example_grads, form)
    assert_close(kernel_sum(tf.constant(factors)), np.einsum("b,bkc->kc", factors, per_example_grads))


def _assert_bounded(squared, a, g, per_example_grads, form, positions=None):
    """Never below the exact squared norms (float64), never above them by more than twice `ghost_cost`'s rounding
    bound: the ghost norms pay for their guarantee, and no more."""
    squared = np.asarray(squared, np.float64)
    exact = np.sum(per_example_grads**2, axis=(1, 2))
    second, first = ghost_cost.rounding_coefficients(form, positions or a.shape[1], a.shape[2], g.shape[2])
    magnitude = np.sum(np.linalg.norm(a.astype(np.float64), axis=2) * np.linalg.norm(g.astype(np.float64), axis=2), 1)
    if form == ghost_cost.PER_EXAMPLE:  # the norms of the very G_i summed: float32's relative rounding
        np.testing.assert_allclose(squared, exact, rtol=1e-5)
        return
    assert np.all(squared >= exact), (squared, exact)
    # The computed sum is within the bound of the exact one, and the bound is added on top: twice the bound.
    assert np.all(squared <= ghost_cost.bounded_squared_norms(np, exact, magnitude, 2 * second, 2 * first))


@pytest.mark.parametrize("magnitude", [1e-3, 1.0, 1e3, 1e6])
@pytest.mark.parametrize("positions,fan_in,fan_out", [(2, 64, 64), (8, 256, 256), (160, 300, 300)])
@pytest.mark.parametrize("known_positions", [True, False])
def test_bilinear_norms_bound_what_each_example_adds_where_positions_cancel(
    positions, fan_in, fan_out, magnitude, known_positions
):
    """a_{i,t} = M s_t u_i + r_{i,t} with s = (1, -1, 1, -1, ...) and g_{i,t} = g_i at every position (mean pooling):
    G_i = sum_t r_{i,t}^T g_i, from terms M larger, whose float32 rounding can exceed ||G_i|| (the Gram form once
    returned a negative, clamped to 0: the example passed unclipped). In every form the norm bounds the exact one
    (or, G_i materialised and summed as such, is that of the very G_i summed), and what example i adds to the sum at
    factor 1 / norm_i is at most 1. T unknown while tracing: G_i materialised where it fits, else the Gram form."""
    rng = np.random.default_rng(5)
    signs = np.resize([1.0, -1.0], positions)
    a = magnitude * signs[None, :, None] * rng.normal(size=(16, 1, fan_in)) + rng.normal(size=(16, positions, fan_in))
    g = np.repeat(rng.normal(size=(16, 1, fan_out)), positions, axis=1)
    a, g = a.astype(np.float32), g.astype(np.float32)
    time = positions if known_positions else None
    specs = [tf.TensorSpec([None, time, fan_in], tf.float32), tf.TensorSpec([None, time, fan_out], tf.float32)]

    @tf.function(input_signature=[*specs, tf.TensorSpec([None], tf.float32)])
    def norms_and_sum(a, g, factors):
        squared, kernel_sum = norms.bilinear_norms_and_sum(a, g)
        return squared, kernel_sum(factors)

    form = ghost_cost.form(time, fan_in, fan_out)
    squared = norms_and_sum(a, g, tf.zeros([16]))[0].numpy()
    if form != ghost_cost.PER_EXAMPLE:
        per_example_grads = np.einsum("btk,btc->bkc", a.astype(np.float64), g.astype(np.float64))
        _assert_bounded(squared, a, g, per_example_grads, form, positions)
    for example in range(16):
        factors = np.zeros(16, np.float32)
        factors[example] = 1 / np.sqrt(squared[example])
        added = np.linalg.norm(norms_and_sum(a, g, factors)[1].numpy().astype(np.float64))
        assert added <= 1 + 1e-4, f"example {example} added {added:.6g} at unit clip"


def test_bias_and_materialised_gradients():
    rng = np.random.default_rng(3)
    g = rng.normal(size=(3, 4, 2)).astype(np.float32)
    factors = np.array([0.5, 1.0, 0.0], np.float32)
    bias = tf.Variable(tf.zeros([2]))
    gradient = norms.bias_gradient(bias, tf.constant(g))
    per_example_grads = g.astype(np.float64).sum(axis=1)
    assert gradient.variable is bias
    assert_close(gradient.squared_norms, np.sum(per_example_grads**2, axis=1))
    assert_close(gradient.clipped_sum(tf.constant(factors)), factors @ per_example_grads)
    kernel = tf.Variable(tf.zeros([2, 3]))
    per_example_grads = rng.normal(size=(3, 2, 3)).astype(np.float32)
    gradient = norms.materialised_gradient(kernel, tf.constant(per_example_grads))
    assert_close(gradient.squared_norms, np.sum(per_example_grads.astype(np.float64) ** 2, axis=(1, 2)))
    assert_close(gradient.clipped_sum(tf.constant(factors)), np.einsum("b,bkc->kc", factors, per_example_grads))
