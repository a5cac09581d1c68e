"""JAX's primitives of the DP step: `OPS`, the array functions `keras_dyndp.mechanism` is written over."""

from __future__ import annotations

import types

import jax
import jax.numpy as jnp


def _divide_no_nan(x, y):
    nonzero = y != 0
    return jnp.where(nonzero, x / jnp.where(nonzero, y, 1.0), 0.0)


def _normals(key: jax.Array, tensors) -> list[jax.Array]:
    keys = jax.random.split(key, len(tensors))
    return [jax.random.normal(k, tensor.shape, jnp.float32) for k, tensor in zip(keys, tensors)]


OPS = types.SimpleNamespace(
    where=jnp.where,
    minimum=jnp.minimum,
    maximum=jnp.maximum,
    take=lambda values, index: jnp.asarray(values)[index],
    cast=jnp.asarray,
    divide_no_nan=_divide_no_nan,
    normals=_normals,
)
"""`keras_dyndp.mechanism`'s primitives in JAX; ``normals`` splits one key (the step's noise key)."""
