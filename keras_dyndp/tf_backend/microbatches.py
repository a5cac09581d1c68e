"""Microbatches on TensorFlow: each row's random microbatch (from the noise generator, never from the row's position or
data), their losses (weighted sums over their rows with a non-zero loss, so padding changes neither; one example moves
the clipped sum by at most 2 C, `keras_dyndp.core.mechanism`) and the clipped sum of their gradients, one jacobian; with
B losses, the jacobian path: any model, but O(B^2), and graphs pfor cannot vectorise fail (tensorflow#43904)."""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from keras_dyndp.core import refusals
from keras_dyndp.tf_backend import ops


def random_assignment(num_rows: tf.Tensor | int, num_microbatches: int, generator: tf.random.Generator) -> tf.Tensor:
    """Microbatch of each of the ``num_rows`` rows, int32 i.i.d. uniform on {0, ..., M - 1}, from ``generator``."""
    return generator.uniform(tf.reshape(num_rows, [1]), minval=0, maxval=num_microbatches, dtype=tf.int32)


def microbatch_losses(per_example_losses: tf.Tensor, assignment: tf.Tensor, num_microbatches: int) -> tf.Tensor:
    """[M] losses from the weighted losses [B] (padding rows 0) and the ``assignment`` [B]; an empty one is 0."""
    membership = tf.one_hot(assignment, num_microbatches, dtype=per_example_losses.dtype)  # [B, M]
    sums = tf.linalg.matvec(membership, per_example_losses, transpose_a=True)
    real_rows = tf.stop_gradient(tf.cast(tf.not_equal(per_example_losses, 0), per_example_losses.dtype))
    return sums / tf.maximum(tf.linalg.matvec(membership, real_rows, transpose_a=True), 1)


def clipped_sum(
    tape: tf.GradientTape,
    losses: tf.Tensor,
    var_list: Sequence[tf.Variable],
    clip_norm: tf.Tensor,
    num_microbatches: int | None,
    random_source: tf.random.Generator | None,
) -> tuple[list[tf.Tensor], tf.Tensor]:
    """``(sums, norms)``: the gradients of the weighted per-example ``losses`` [B] that ``tape`` recorded (of the M =
    ``num_microbatches`` losses of random microbatches, each row's drawn from ``random_source``), each clipped to
    ``clip_norm`` and summed, one dense sum per variable of ``var_list``; their unclipped norms [B] (or [M])."""
    with tape:
        if num_microbatches is None:
            # pfor mis-shapes the jacobian of an empty (Poisson) batch; one constant row, whose gradient is zero and
            # adds nothing to the clipped sum, keeps the loop non-empty at O(1/B) cost.
            units = tf.concat([losses, tf.zeros([1], losses.dtype)], axis=0)
        else:
            assignment = random_assignment(tf.shape(losses)[0], num_microbatches, random_source)
            units = microbatch_losses(losses, assignment, num_microbatches)
    per_unit = ops.zeros_where_unconnected(tape.jacobian(units, list(var_list)), var_list, [tf.shape(units)[0]])
    norms = ops.per_example_global_norms(per_unit)
    finite = tf.debugging.Assert(tf.reduce_all(tf.math.is_finite(norms)), [refusals.BATCHED_NON_FINITE_REFUSAL])
    with tf.control_dependencies([finite]):
        sums = [tf.identity(total) for total in ops.clipped_sums(per_unit, norms, clip_norm)]
    return sums, norms if num_microbatches is not None else norms[:-1]
