"""JAX's primitives of the DP step: `OPS`, the array functions `keras_dyndp.core.mechanism` is written over."""

from __future__ import annotations

import itertools
import math
import types
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from keras_dyndp.core import adaptive_clipping


def _divide_no_nan(x, y):
    nonzero = y != 0
    return jnp.where(nonzero, x / jnp.where(nonzero, y, 1.0), 0.0)


_LOW = np.nextafter(np.float32(-1), np.float32(0))  # jax.random.normal's uniforms lie in [_LOW, 1)


def standard_normals(key: jax.Array, size: int) -> jax.Array:
    """``jax.random.normal(key, (size,), float32)`` as it draws with ``jax_threefry_partitionable`` off, [size]: the
    same counter-mode generator, every block used once, one 32-bit word per normal (the flag only decides how a draw
    splits over devices, and this one is a single flat vector). The bits are materialised before JAX's transform,
    written out here, which XLA:CPU would otherwise fuse element by element (docs/performance.md)."""
    with jax.threefry_partitionable(False):
        bits = jax.lax.optimization_barrier(jax.random.bits(key, (size,), jnp.uint32))
    mantissas = jax.lax.shift_right_logical(bits, np.uint32(32 - 23)) | np.asarray(1.0, np.float32).view(np.uint32)
    floats = jax.lax.bitcast_convert_type(mantissas, jnp.float32) - np.float32(1)  # [0, 1)
    uniforms = jax.lax.max(_LOW, floats * (np.float32(1) - _LOW) + _LOW)
    return np.float32(np.sqrt(2)) * jax.lax.erf_inv(uniforms)


def _normals(key: jax.Array, tensors) -> list[jax.Array]:
    """Standard normals shaped like ``tensors``: one draw for all of them (`standard_normals`, of an even count), cut
    in turn (a random generator's kernels run once per step, not once per variable: a GPU launches each)."""
    sizes = [math.prod(tensor.shape) for tensor in tensors]
    total = sum(sizes)
    # An even count: XLA:CPU draws an odd one's threefry blocks several times slower (docs/performance.md).
    flat = jax.lax.optimization_barrier(standard_normals(key, total + total % 2))
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
    exp=jnp.exp,
    mean=jnp.mean,
    normals=_normals,
)
"""`keras_dyndp.core.mechanism`'s primitives in JAX; ``normals`` draws from one key (the step's noise key)."""


def vjp(function: Callable[[list], Any], primals: list, cotangent: Any) -> list:
    """The gradients of ``<function(primals), cotangent>`` with respect to ``primals`` (a list of arrays), matmuls
    at ``HIGHEST`` precision (float32 on every device; a GPU's default is TensorFloat-32)."""
    with jax.default_matmul_precision("highest"):
        return list(jax.vjp(function, primals)[1](cotangent)[0])


def centred_count(norms: jax.Array, clip_norm: jax.Array, rows: jax.Array | None = None) -> jax.Array:
    """float32 sum of adaptive clipping's `keras_dyndp.core.adaptive_clipping.centred_indicators` of the gradient
    ``norms`` [N] at ``clip_norm``, over the bool ``rows`` [N] (None: all: microbatches)."""
    rows = jnp.ones(norms.shape, bool) if rows is None else rows
    return jnp.sum(adaptive_clipping.centred_indicators(OPS, norms, clip_norm, rows))
