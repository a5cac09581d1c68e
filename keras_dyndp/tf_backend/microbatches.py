"""Microbatches on TensorFlow: each row's random microbatch (from the noise generator, never from the row's position
or data) and the microbatch losses (weighted sums over the number of rows with a non-zero loss, so padding changes
neither); `keras_dyndp.mechanism` states why one example then moves the sum by at most 2 C."""

from __future__ import annotations

import tensorflow as tf


def random_assignment(num_rows: tf.Tensor | int, num_microbatches: int, generator: tf.random.Generator) -> tf.Tensor:
    """Microbatch of each of the ``num_rows`` rows, int32 i.i.d. uniform on {0, ..., M - 1}, from ``generator``."""
    return generator.uniform(tf.reshape(num_rows, [1]), minval=0, maxval=num_microbatches, dtype=tf.int32)


def microbatch_losses(per_example_losses: tf.Tensor, assignment: tf.Tensor, num_microbatches: int) -> tf.Tensor:
    """[M] losses from the weighted losses [B] (padding rows 0) and the ``assignment`` [B]; an empty one is 0."""
    membership = tf.one_hot(assignment, num_microbatches, dtype=per_example_losses.dtype)  # [B, M]
    sums = tf.linalg.matvec(membership, per_example_losses, transpose_a=True)
    real_rows = tf.stop_gradient(tf.cast(tf.not_equal(per_example_losses, 0), per_example_losses.dtype))
    counts = tf.linalg.matvec(membership, real_rows, transpose_a=True)
    return sums / tf.maximum(counts, 1)
