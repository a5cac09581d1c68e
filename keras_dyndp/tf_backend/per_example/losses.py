"""The per-example loss vector that both ways of clipping differentiate."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

from keras_dyndp import refusals


def per_example_loss(
    loss_fn: Callable[[Any, Any], tf.Tensor], y: Any, y_pred: Any, sample_weight: tf.Tensor | None
) -> tf.Tensor:
    """float32 [B]: ``loss_fn(y, y_pred)`` (a per-example loss) averaged over non-batch axes, times ``sample_weight``
    (None: 1). ValueError if ``loss_fn`` returns a scalar (a reduced loss cannot be clipped per example)."""
    losses = loss_fn(y, y_pred)
    if losses.shape.rank == 0:
        raise ValueError(
            f"`loss_fn` must return one loss per example (use {refusals.PER_EXAMPLE_REDUCTION}). "
            f"Received a scalar loss from loss_fn={loss_fn!r}."
        )
    losses = tf.cast(losses, tf.float32)
    if losses.shape.rank > 1:
        losses = tf.reduce_mean(losses, axis=list(range(1, losses.shape.rank)))
    if sample_weight is not None:
        losses = losses * tf.reshape(tf.cast(sample_weight, losses.dtype), [-1])
    return losses
