"""Accumulation on the JAX backend: a batch clipped in k physical batches (``accumulation_steps``), its clipped sums
added, so that the peak memory is one physical batch's and the noise is added once (the optimizer adds it)."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp


def accumulated(physical_batch: Callable, batch: tuple, num_rows: int, num_physical_batches: int, sum_shapes: list):
    """``(sums, (y_pred, new_non_trainable, losses), first)``: ``physical_batch(batch) -> (sums, outputs)`` on the
    whole batch, or over k = ``num_physical_batches`` physical batches in turn (``jax.lax.scan``), the float32
    ``sums`` (of ``sum_shapes``) added, y_pred and losses [B, ...], ``batch``'s rows padded with zeros to k * ceil(B /
    k) (weight 0: they add nothing); ``first`` takes a non-trainable value's one copy (the physical batches' first)."""
    if num_physical_batches == 1 or num_rows <= 1:
        return *physical_batch(batch), lambda value: value
    size = -(-num_rows // num_physical_batches)
    padding = num_physical_batches * size - num_rows

    def split(value):  # tree_map skips None leaves (no y, no sample weight)
        value = jnp.pad(value, [(0, padding)] + [(0, 0)] * (value.ndim - 1))
        return value.reshape(num_physical_batches, size, *value.shape[1:])

    def body(carry, chunk):
        sums, outputs = physical_batch(chunk)
        return [total + value for total, value in zip(carry, sums)], outputs

    init = [jnp.zeros(shape, jnp.float32) for shape in sum_shapes]
    sums, (y_pred, new_non_trainable, losses) = jax.lax.scan(body, init, jax.tree_util.tree_map(split, batch))
    rows = lambda value: value.reshape(-1, *value.shape[2:])[:num_rows]  # noqa: E731
    y_pred, losses = jax.tree_util.tree_map(rows, (y_pred, losses))
    return sums, (y_pred, new_non_trainable, losses), lambda value: value[0]
