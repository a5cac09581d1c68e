"""Tests for keras_dyndp.tf_backend.microbatches: random membership and per-microbatch losses.

The neighbour-sensitivity test of the whole mechanism is in test_optimizer.py, where the optimizer runs it.
"""

import numpy as np
import tensorflow as tf

from keras_dyndp.tf_backend import microbatches


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
