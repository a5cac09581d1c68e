"""JAX's primitives of the DP step: `OPS`, the array functions `keras_dyndp.mechanism` is written over."""

from __future__ import annotations

import itertools
import math
import types

import jax
import jax.numpy as jnp


def _divide_no_nan(x, y):
    nonzero = y != 0
    return jnp.where(nonzero, x / jnp.where(nonzero, y, 1.0), 0.0)


def _normals(key: jax.Array, tensors) -> list[jax.Array]:
    """Standard normals shaped like ``tensors``: one draw for all of them, cut in turn (a random generator's kernels
    run once per step, not once per variable: a GPU launches each)."""
    sizes = [math.prod(tensor.shape) for tensor in tensors]
    flat = jax.lax.optimization_barrier(jax.random.normal(key, (sum(sizes),), jnp.float32))
    starts = itertools.accumulate(sizes, initial=0)
    return [flat[start : start + size].reshape(tensor.shape) for start, size, tensor in zip(starts, sizes, tensors)]


OPS = types.SimpleNamespace(
    where=jnp.where,
    minimum=jnp.minimum,
    maximum=jnp.maximum,
    take=lambda values, index: jnp.asarray(values)[index],
    cast=jnp.asarray,
    divide_no_nan=_divide_no_nan,
    normals=_normals,
)
"""`keras_dyndp.mechanism`'s primitives in JAX; ``normals`` draws from one key (the step's noise key)."""
