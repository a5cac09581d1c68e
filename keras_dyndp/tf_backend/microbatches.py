"""Microbatches on TensorFlow: each row's random microbatch and the M microbatch losses whose gradients are clipped.

Membership is drawn per row and per step from the optimizer's noise generator (`noise_source`), never from the
row's position or the data; microbatch j's loss is the sum of its rows' weighted losses over the number of its rows
with a non-zero loss (a zero-weight padding row changes neither, wherever it lands). `keras_dyndp.mechanism` states
why this bounds one example's effect by 2 C, hence the doubled noise.
"""

from __future__ import annotations

import tensorflow as tf


def random_assignment(num_rows: tf.Tensor | int, num_microbatches: int, generator: tf.random.Generator) -> tf.Tensor:
    """Microbatch of each row: i.i.d. uniform on {0, ..., num_microbatches - 1}, int32 [num_rows].

    Args:
      num_rows: number of rows B of the batch (int or int32 scalar tensor).
      num_microbatches: M >= 1.
      generator: the optimizer's noise generator; each call advances it.
    """
    return generator.uniform(tf.reshape(num_rows, [1]), minval=0, maxval=num_microbatches, dtype=tf.int32)


def microbatch_losses(per_example_losses: tf.Tensor, assignment: tf.Tensor, num_microbatches: int) -> tf.Tensor:
    """Loss of each microbatch: the sum of its rows' losses over the number of its rows with a non-zero loss.

    Args:
      per_example_losses: float tensor [B], the (sample-weighted) per-example losses; padding rows are 0.
      assignment: int32 tensor [B] of microbatch indices in [0, num_microbatches).
      num_microbatches: M >= 1.

    Returns:
      Tensor [M] of the dtype of `per_example_losses`; an empty microbatch has loss 0.
    """
    membership = tf.one_hot(assignment, num_microbatches, dtype=per_example_losses.dtype)  # [B, M]
    sums = tf.linalg.matvec(membership, per_example_losses, transpose_a=True)
    real_rows = tf.stop_gradient(tf.cast(tf.not_equal(per_example_losses, 0), per_example_losses.dtype))
    counts = tf.linalg.matvec(membership, real_rows, transpose_a=True)
    return sums / tf.maximum(counts, 1)
