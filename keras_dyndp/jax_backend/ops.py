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
    is_finite=jnp.isfinite,
    sqrt=jnp.sqrt,
    normals=_normals,
)
"""`keras_dyndp.mechanism`'s primitives in JAX; ``normals`` draws from one key (the step's noise key)."""


def kept_rows(tensor: jax.Array, factors: jax.Array) -> jax.Array:
    """``tensor`` [N, ...] with exactly 0 in the rows whose factor is 0 (a select: 0 x inf and 0 x NaN are NaN)."""
    return jnp.where((factors > 0).reshape((-1,) + (1,) * (tensor.ndim - 1)), tensor, 0)


def scaled_rows(tensor: jax.Array, factors: jax.Array) -> jax.Array:
    """Row i of ``tensor`` [N, ...] times ``factors[i]`` in float32; exactly 0 where the factor is 0 (`kept_rows`)."""
    return kept_rows(factors.reshape((-1,) + (1,) * (tensor.ndim - 1)) * tensor.astype(jnp.float32), factors)


def weighted_sum(factors: jax.Array, per_example: jax.Array) -> jax.Array:
    """float32 sum_i factors_i per_example_i over the leading axis; a row whose factor is 0 adds exactly 0, whatever
    it holds (`keras_dyndp.mechanism.clip_factors`)."""
    return jnp.tensordot(factors, kept_rows(per_example.astype(jnp.float32), factors), axes=1)
