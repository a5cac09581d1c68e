"""norms: per-example squared norms and clipped sums of the bilinear (each `ghost_cost` form), bias and materialised
gradients."""

import numpy as np
import pytest
import tensorflow as tf
from brute_force import assert_close

from keras_dyndp import ghost_cost
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
    assert_close(squared, np.sum(per_example_grads**2, axis=(1, 2)))
    assert_close(kernel_sum(tf.constant(factors)), np.einsum("b,bkc->kc", factors, per_example_grads))


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
