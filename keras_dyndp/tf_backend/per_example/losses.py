"""The per-example loss vector that both ways of clipping differentiate."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

from keras_dyndp.core import mechanism
from keras_dyndp.core import refusals
from keras_dyndp.tf_backend import ops


def per_example_loss(
    loss_fn: Callable[[Any, Any], tf.Tensor], y: Any, y_pred: Any, sample_weight: tf.Tensor | None
) -> tf.Tensor:
    """float32 [B]: ``loss_fn(y, y_pred)`` (a per-example loss) reduced per example with ``sample_weight`` (None: 1;
    per example or per loss entry, such as a [B, L] padding mask), as `keras_dyndp.core.mechanism.per_example_losses`
    says. ValueError if ``loss_fn`` returns a scalar (a reduced loss cannot be clipped per example)."""
    losses = loss_fn(y, y_pred)
    if losses.shape.rank == 0:
        raise ValueError(
            f"`loss_fn` must return one loss per example (use {refusals.PER_EXAMPLE_REDUCTION}). "
            f"Received a scalar loss from loss_fn={loss_fn!r}."
        )
    return mechanism.per_example_losses(ops.OPS, losses, sample_weight)
