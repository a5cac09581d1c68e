"""Tests for keras_dyndp.tf_backend.microbatches: random membership, per-microbatch losses, the jacobian path's sum.

The neighbour-sensitivity test of the whole mechanism is in test_optimizer.py, where the optimizer runs it.
"""

import numpy as np
import pytest
import tensorflow as tf

from keras_dyndp.tf_backend import microbatches
from keras_dyndp.tf_backend.keras_compat import keras
from keras_dyndp.tf_backend.per_example import clipped_sum


def test_losses_average_over_the_rows_with_a_non_zero_loss():
    losses = tf.constant([2.0, 0.0, 4.0, 6.0, 0.0])  # rows 1 and 4: zero-weight padding
    assignment = tf.constant([0, 0, 1, 1, 2])
    np.testing.assert_allclose(microbatches.microbatch_losses(losses, assignment, 4).numpy(), [2.0, 5.0, 0.0, 0.0])


def test_losses_of_an_empty_batch_are_zero():
    losses = tf.zeros([0])
    result = microbatches.microbatch_losses(losses, tf.zeros([0], tf.int32), 3)
    np.testing.assert_array_equal(result.numpy(), np.zeros(3))


def test_assignment_is_uniform_per_row_independent_across_rows_and_fresh_each_call():
    generator = tf.random.Generator.from_seed(0)
    num_calls, num_rows, num_microbatches = 2000, 8, 4
    draws = np.stack(
        [microbatches.random_assignment(num_rows, num_microbatches, generator).numpy() for _ in range(num_calls)]
    )
    assert draws.dtype == np.int32 and draws.min() == 0 and draws.max() == num_microbatches - 1
    counts = np.stack([np.bincount(draws[:, row], minlength=num_microbatches) for row in range(num_rows)])
    expected, std = num_calls / num_microbatches, np.sqrt(num_calls * 0.25 * 0.75)
    assert np.all(np.abs(counts - expected) < 5 * std)  # every position is uniform
    same = np.mean(draws[:, :, None] == draws[:, None, :], axis=0)[~np.eye(num_rows, dtype=bool)]
    assert np.all(np.abs(same - 1 / num_microbatches) < 0.05)  # rows agree as often as independent draws
    assert np.mean(np.all(draws[1:] == draws[:-1], axis=1)) < 0.01  # each call draws anew


def test_the_jacobian_path_clips_each_example_as_the_vectorized_path_does():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    x = tf.constant(np.random.default_rng(0).normal(size=(5, 3)) * 3, tf.float32)
    y = tf.zeros([5, 2])
    weights = tf.constant([1.0, 0.0, 1.0, 1.0, 1.0])  # row 1: padding
    loss_fn = keras.losses.MeanSquaredError(reduction="none")
    results = {
        method: clipped_sum.clipped_gradient_sum(model, loss_fn, x, y, weights, 1.0, model.trainable_variables, method)
        for method in ("jacobian", "vectorized")
    }
    for jacobian_sum, vectorized_sum in zip(results["jacobian"][0], results["vectorized"][0]):
        np.testing.assert_allclose(jacobian_sum.numpy(), vectorized_sum.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(results["jacobian"][1].numpy(), results["vectorized"][1].numpy(), rtol=1e-5)
    with pytest.raises(ValueError, match="`num_microbatches` needs `random_source`"):
        clipped_sum.clipped_gradient_sum(
            model, loss_fn, x, y, weights, 1.0, model.trainable_variables, num_microbatches=2
        )


def test_a_gradient_that_is_not_finite_refuses_the_step():
    variable = tf.Variable([1.0, 2.0])
    with tf.GradientTape() as tape:
        losses = variable * tf.constant([1.0, np.inf])
    with pytest.raises(tf.errors.InvalidArgumentError, match="a gradient in this batch is not finite"):
        microbatches.clipped_sum(tape, losses, [variable], 1.0, None, None)
