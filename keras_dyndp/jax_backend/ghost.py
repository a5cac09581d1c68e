"""Ghost-clipping rules on JAX: a kernel's per-example gradient norms and clipped sum from each example's layer
input ``a_i`` and output gradient ``g_i`` (before the activation) as `taps` records them, [B, rows, ...].

A kernel applied at T positions (``z_t = a_t W``: Dense, also over a sequence axis; a convolution, ``a_t`` the input
patch at t) has G_i = sum_t a_{i,t}^T g_{i,t}; ||G_i||^2 = sum_{t,s} (a_i a_i^T)_{ts} (g_i g_i^T)_{ts} ("ghost", Li et
al. 2021) when 2 T^2 < p d (the kernel's size), else from G_i itself (Bu et al. 2022). The clipped sum sum_i f_i G_i is
the op's weight gradient for the output gradients f_i g_i (one ``jax.vjp`` on the batch, book-keeping, Bu et al.
2023): no second backward pass. The TensorFlow rules' math (`keras_dyndp.tf_backend.per_example.rules`); check a new
rule against the vmap path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import keras


class Rule(NamedTuple):
    """How one layer class is clipped from its taps: the ``kernel`` it covers (its other variables keep per-example
    gradients), ``squared_norms(layer, a, g)`` [B], its ``op(layer, a, kernel)`` (None: the tap is the output, else
    the pre-activation) and which configurations it ``supports``."""

    kernel: Callable[[keras.layers.Layer], keras.Variable]
    squared_norms: Callable[[keras.layers.Layer, jax.Array, jax.Array], jax.Array]
    op: Callable[[keras.layers.Layer, jax.Array, jax.Array], jax.Array] | None = None
    supports: Callable[[keras.layers.Layer], bool] = lambda layer: True


def bilinear_squared_norms(a: jax.Array, g: jax.Array) -> jax.Array:
    """||sum_t a_t^T g_t||^2 per example, a: [B, T, p], g: [B, T, d]."""
    a, g = a.astype(jnp.float32), g.astype(jnp.float32)
    positions, fan_in, fan_out = a.shape[1], a.shape[2], g.shape[2]
    if positions == 1:
        return jnp.sum(a[:, 0] ** 2, axis=1) * jnp.sum(g[:, 0] ** 2, axis=1)
    if 2 * positions * positions < fan_in * fan_out:
        return jnp.sum(jnp.einsum("btp,bsp->bts", a, a) * jnp.einsum("btd,bsd->bts", g, g), axis=(1, 2))
    return jnp.sum(jnp.einsum("btp,btd->bpd", a, g) ** 2, axis=(1, 2))


def _positions(value: jax.Array) -> jax.Array:
    return value.reshape(value.shape[0], -1, value.shape[-1])


def _patches(layer: keras.layers.Layer, a: jax.Array) -> jax.Array:
    """A channels_last convolution's input patches [B, T, c_in * kernel positions] (channel-major)."""
    spatial = "DHW"[3 - layer.rank :]
    patches = jax.lax.conv_general_dilated_patches(
        a.reshape(-1, *a.shape[2:]).astype(jnp.float32),
        tuple(layer.kernel_size),
        tuple(layer.strides),
        layer.padding.upper(),
        rhs_dilation=tuple(layer.dilation_rate),
        dimension_numbers=(f"N{spatial}C", f"OI{spatial}", f"N{spatial}C"),
        precision=jax.lax.Precision.HIGHEST,  # a copy of the input: exact
    )
    return patches.reshape(a.shape[0], -1, patches.shape[-1])


def _depthwise_norms(layer, a, g):
    """G_i [c, kernel positions, m] materialised: a depthwise kernel is small."""
    channels = a.shape[-1]
    patches = _patches(layer, a).reshape(a.shape[0], -1, channels, layer.kernel.shape[0] * layer.kernel.shape[1])
    g = _positions(g).reshape(g.shape[0], -1, channels, g.shape[-1] // channels).astype(jnp.float32)
    return jnp.sum(jnp.einsum("btck,btcm->bckm", patches, g) ** 2, axis=(1, 2, 3))


def _embedding_norms(layer, ids, deltas):
    """sum over distinct ids of ||sum of their rows of delta||^2 (ids [B, ...], deltas [B, ..., D]), after a sort."""
    del layer  # Unused.
    ids, deltas = ids.reshape(ids.shape[0], -1), deltas.reshape(ids.shape[0], ids.size // ids.shape[0], -1)
    batch, rows = ids.shape
    order = jnp.argsort(ids, axis=1)
    sorted_ids = jnp.take_along_axis(ids, order, axis=1)
    sorted_deltas = jnp.take_along_axis(deltas.astype(jnp.float32), order[..., None], axis=1)
    starts = jnp.concatenate([jnp.ones((batch, 1), bool), sorted_ids[:, 1:] != sorted_ids[:, :-1]], axis=1)
    segments = (jnp.arange(batch)[:, None] * rows + jnp.cumsum(starts, axis=1) - 1).reshape(-1)
    sums = jax.ops.segment_sum(sorted_deltas.reshape(batch * rows, -1), segments, num_segments=batch * rows)
    return jnp.sum(sums.reshape(batch, rows, -1) ** 2, axis=(1, 2))


def clipped_sum(rule: Rule, layer: keras.layers.Layer, kernel: jax.Array, a, g, factors: jax.Array) -> jax.Array:
    """sum_i factors_i G_i of ``rule``'s kernel: its op's weight gradient for the output gradients f_i g_i."""
    g = factors.reshape((-1,) + (1,) * (g.ndim - 1)) * g.astype(jnp.float32)
    kernel = jnp.asarray(kernel, jnp.float32)
    if rule.op is None:  # Embedding: a scatter-add of the rows.
        return jnp.zeros(kernel.shape, jnp.float32).at[a.reshape(-1)].add(g.reshape(-1, g.shape[-1]))
    a, g = a.reshape(-1, *a.shape[2:]).astype(jnp.float32), g.reshape(-1, *g.shape[2:])
    return jax.vjp(lambda k: rule.op(layer, a, k), kernel)[1](g)[0]


def _plain(layer) -> bool:
    return not getattr(layer, "lora_enabled", False) and getattr(layer, "quantization_mode", None) is None


def _channels_last(layer) -> bool:
    return _plain(layer) and layer.data_format == "channels_last" and layer.padding != "causal"


_CONV = Rule(
    lambda layer: layer.kernel,
    lambda layer, a, g: bilinear_squared_norms(_patches(layer, a), _positions(g)),
    lambda layer, a, k: layer.convolution_op(a, k),
    lambda layer: _channels_last(layer) and layer.groups == 1,
)
RULES: dict[type, Rule] = {
    keras.layers.Dense: Rule(
        lambda layer: layer.kernel,
        lambda layer, a, g: bilinear_squared_norms(_positions(a), _positions(g)),
        lambda layer, a, k: jnp.matmul(a, k),
        _plain,
    ),
    keras.layers.Conv1D: _CONV,
    keras.layers.Conv2D: _CONV,
    keras.layers.DepthwiseConv2D: Rule(
        lambda layer: layer.kernel,
        _depthwise_norms,
        lambda layer, a, k: keras.ops.depthwise_conv(
            a, k, layer.strides, layer.padding, layer.data_format, layer.dilation_rate
        ),
        _channels_last,
    ),
    keras.layers.Embedding: Rule(lambda layer: layer.embeddings, _embedding_norms, None, _plain),
}
