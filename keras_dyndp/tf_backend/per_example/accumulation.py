"""Logical batches larger than memory: the clipped-gradient sum of one Poisson batch, computed k physical batches at a
time in a ``tf.while_loop``, then noised once (docs/scaling.md, "Accumulation")."""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from keras_dyndp.tf_backend.per_example import clipped_sum


def _pad_rows(tensor: tf.Tensor, num_padding_rows: tf.Tensor) -> tf.Tensor:
    """``tensor`` with ``num_padding_rows`` rows of zeros after its own, its other axes' static sizes kept (layers that
    read a size, such as GroupNormalization's channels, cannot trace run-time paddings' unknown sizes)."""
    paddings = tf.concat([[[0, num_padding_rows]], tf.zeros([tf.rank(tensor) - 1, 2], tf.int32)], axis=0)
    return tf.ensure_shape(tf.pad(tensor, paddings), [None, *tensor.shape[1:]])


def clipped_sum_in_physical_batches(
    clipped_sum_fn: Callable[[Any, Any, tf.Tensor], tuple[list[tf.Tensor], tf.Tensor, tf.Tensor, tf.Tensor]],
    var_list: Sequence[tf.Variable],
    x: Any,
    y: Any,
    sample_weight: tf.Tensor | None,
    num_physical_batches: int,
) -> tuple[list[tf.Tensor], tf.Tensor, tf.Tensor, tf.Tensor]:
    """``clipped_sum_fn(x, y, sample_weight) -> (sums, norms, y_pred, losses)`` (`clipped_sum`'s, all else bound; one
    model output) on the whole batch, in ``num_physical_batches`` (k >= 1) physical batches, summed; ``sums`` in
    ``var_list``'s order, ``y_pred`` in float32."""
    var_list = list(var_list)
    sample_weight = clipped_sum.example_weights(x, sample_weight)
    num_rows = tf.shape(sample_weight)[0]
    rows_per_batch = (num_rows + num_physical_batches - 1) // num_physical_batches
    num_padding_rows = rows_per_batch * num_physical_batches - num_rows
    x, y, sample_weight = tf.nest.map_structure(
        lambda tensor: _pad_rows(tf.convert_to_tensor(tensor), num_padding_rows), (x, y, sample_weight)
    )

    # The shapes of a physical batch's outputs, as tracing the loop body finds them: TensorArray.concat loses them.
    row_shapes = {}

    def physical_batch(index, sums, norms, predictions, losses):
        rows = tf.range(index * rows_per_batch, (index + 1) * rows_per_batch)
        batch = tf.nest.map_structure(lambda tensor: tf.gather(tensor, rows), (x, y, sample_weight))
        batch_sums, batch_norms, batch_pred, batch_losses = clipped_sum_fn(*batch)
        row_shapes.update(y_pred=batch_pred.shape[1:], losses=batch_losses.shape[1:])
        sums = [total + tf.cast(part, total.dtype) for total, part in zip(sums, batch_sums)]
        predictions = predictions.write(index, tf.cast(batch_pred, tf.float32))
        return index + 1, sums, norms.write(index, batch_norms), predictions, losses.write(index, batch_losses)

    arrays = [tf.TensorArray(tf.float32, size=num_physical_batches, infer_shape=False) for _ in range(3)]
    _, sums, norms, predictions, losses = tf.while_loop(
        lambda index, *_: index < num_physical_batches,
        physical_batch,
        (tf.constant(0), [tf.zeros(var.shape, tf.float32) for var in var_list], *arrays),
    )
    y_pred = tf.ensure_shape(predictions.concat()[:num_rows], [None, *row_shapes["y_pred"]])
    losses = tf.ensure_shape(losses.concat()[:num_rows], [None, *row_shapes["losses"]])
    return sums, norms.concat()[:num_rows], y_pred, losses
