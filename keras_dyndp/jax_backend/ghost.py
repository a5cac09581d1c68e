"""Ghost-clipping rules on JAX: the per-example gradient norms and clipped sums of a layer's kernel (or scale and
offset) from each example's layer input ``a_i`` and output gradient ``g_i`` (before the activation) as `taps` records
them, [B, rows, ...].

A kernel applied at T positions (``z_t = a_t W``: Dense, also over a sequence axis; a convolution, ``a_t`` the input
patch at t) has G_i = sum_t a_{i,t}^T g_{i,t}; ||G_i||^2 = sum_{t,s} (a_i a_i^T)_{ts} (g_i g_i^T)_{ts} ("ghost", Li et
al. 2021) where `keras_dyndp.ghost_cost` finds it cheaper, else from G_i itself (Bu et al. 2022). The clipped sum
sum_i f_i G_i is the op's weight gradient for the output gradients f_i g_i (one ``jax.vjp`` on the batch,
book-keeping, Bu et al. 2023): no second backward pass. The TensorFlow rules' math
(`keras_dyndp.tf_backend.per_example.rules`); check a new rule against the vmap path. A layer normalisation's
scale and offset (LayerNormalization, GroupNormalization) have per-example gradients sum_t x_hat_t g_t and sum_t g_t
(x_hat the normalised input): small, they are materialised.

`RULES` is the registry (exactly one class per rule, as on TensorFlow: `register_layer_rule`, also
``keras_dyndp.register_layer_rule`` on JAX). A rule for a custom layer, ``y = x * scale + shift`` over the last axis
(a: the layer's input, g: its output's gradient, [B, rows, ...]):

```python
import jax.numpy as jnp
import keras
from keras_dyndp.jax_backend import ghost

class ScaleShift(keras.layers.Layer):
    def build(self, input_shape):
        self.scale = self.add_weight(name="scale", shape=[input_shape[-1]], initializer="ones")
        self.shift = self.add_weight(name="shift", shape=[input_shape[-1]], initializer="zeros")

    def call(self, inputs):
        return inputs * self.scale + self.shift

def scale_shift_grads(layer, a, g):  # per example [B, d]: sum over positions
    a, g = a.reshape(a.shape[0], -1, a.shape[-1]), g.reshape(g.shape[0], -1, g.shape[-1])
    return [jnp.sum(a * g, axis=1), jnp.sum(g, axis=1)]

ghost.register_layer_rule(
    ScaleShift,
    variables=lambda layer: [layer.scale, layer.shift],
    squared_norms=lambda layer, a, g: sum(jnp.sum(d**2, axis=1) for d in scale_shift_grads(layer, a, g)),
    clipped_sums=lambda layer, a, g, f: [f @ d for d in scale_shift_grads(layer, a, g)],
)
```

Check a new rule against ``method='vectorized'`` (both must agree): a wrong rule breaks privacy silently.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import keras

from keras_dyndp import ghost_cost
from keras_dyndp import validation


class LayerRule(NamedTuple):
    """How one layer class is clipped from its taps: the ``variables(layer)`` it covers (its other variables keep
    per-example gradients), ``squared_norms(layer, a, g)`` [B] of their per-example gradients together,
    ``clipped_sums(layer, a, g, factors)``: sum_i factors_i (example i's gradient) for each of them, and which
    configurations it ``supports``. The tap is before the layer's activation where it has one, else its output."""

    variables: Callable[[keras.layers.Layer], list[keras.Variable]]
    squared_norms: Callable[[keras.layers.Layer, jax.Array, jax.Array], jax.Array]
    clipped_sums: Callable[[keras.layers.Layer, jax.Array, jax.Array, jax.Array], list[jax.Array]]
    supports: Callable[[keras.layers.Layer], bool] = lambda layer: True


def bilinear_squared_norms(a: jax.Array, g: jax.Array) -> jax.Array:
    """||sum_t a_t^T g_t||^2 per example, a: [B, T, p], g: [B, T, d]."""
    a, g = a.astype(jnp.float32), g.astype(jnp.float32)
    positions, fan_in, fan_out = a.shape[1], a.shape[2], g.shape[2]
    if positions == 1:
        return jnp.sum(a[:, 0] ** 2, axis=1) * jnp.sum(g[:, 0] ** 2, axis=1)
    if ghost_cost.use_gram(positions, fan_in, fan_out):
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
    ids, deltas = (
        ids.reshape(ids.shape[0], -1).astype(jnp.int32),
        deltas.reshape(ids.shape[0], ids.size // ids.shape[0], -1),
    )
    batch, rows = ids.shape
    order = jnp.argsort(ids, axis=1)
    sorted_ids = jnp.take_along_axis(ids, order, axis=1)
    sorted_deltas = jnp.take_along_axis(deltas.astype(jnp.float32), order[..., None], axis=1)
    starts = jnp.concatenate([jnp.ones((batch, 1), bool), sorted_ids[:, 1:] != sorted_ids[:, :-1]], axis=1)
    segments = (jnp.arange(batch)[:, None] * rows + jnp.cumsum(starts, axis=1) - 1).reshape(-1)
    sums = jax.ops.segment_sum(sorted_deltas.reshape(batch * rows, -1), segments, num_segments=batch * rows)
    return jnp.sum(sums.reshape(batch, rows, -1) ** 2, axis=(1, 2))


def _scaled(g: jax.Array, factors: jax.Array) -> jax.Array:
    return factors.reshape((-1,) + (1,) * (g.ndim - 1)) * g.astype(jnp.float32)


def _kernel_sums(op: Callable) -> Callable:
    """A kernel's clipped sum: the weight gradient of ``op(layer, a, kernel)`` (linear in the kernel: zeros stand
    in for its value) for the output gradients f_i g_i."""

    def clipped_sums(layer, a, g, factors):
        a, g = a.reshape(-1, *a.shape[2:]).astype(jnp.float32), _scaled(g, factors).reshape(-1, *g.shape[2:])
        kernel = jnp.zeros(layer.kernel.shape, jnp.float32)
        return [jax.vjp(lambda k: op(layer, a, k), kernel)[1](g)[0]]

    return clipped_sums


def _embedding_sums(layer, ids, g, factors):
    """A scatter-add of the rows f_i g_i."""
    g = _scaled(g, factors)
    rows = ids.reshape(-1).astype(jnp.int32)
    return [jnp.zeros(layer.embeddings.shape, jnp.float32).at[rows].add(g.reshape(-1, g.shape[-1]))]


def _norm_variables(layer) -> list:
    return [variable for variable in (layer.gamma, layer.beta) if variable is not None]


def _norm_grads(layer, a, g) -> list[jax.Array]:
    """Per-example gradients [B, ...] of the layer's scale and offset (x_hat g and g summed over positions) from the
    vjp of its own call on each example: exact for any axis, epsilon and groups. The call is affine in them: zeros
    stand in for their values."""
    values = [jnp.zeros(variable.shape, variable.dtype) for variable in _norm_variables(layer)]

    def example(a_i, g_i):
        outputs, vjp = jax.vjp(lambda values: layer.stateless_call(values, [], a_i)[0], values)
        return [grad.astype(jnp.float32) for grad in vjp(g_i.astype(outputs.dtype))[0]]

    return jax.vmap(example)(a, g)


_NORM = LayerRule(
    _norm_variables,
    lambda layer, a, g: sum(jnp.sum(grad.reshape(a.shape[0], -1) ** 2, axis=1) for grad in _norm_grads(layer, a, g)),
    lambda layer, a, g, factors: [jnp.tensordot(factors, grad, axes=1) for grad in _norm_grads(layer, a, g)],
)


def _plain(layer) -> bool:
    return not getattr(layer, "lora_enabled", False) and getattr(layer, "quantization_mode", None) is None


def _channels_last(layer) -> bool:
    return _plain(layer) and layer.data_format == "channels_last" and layer.padding != "causal"


_CONV = LayerRule(
    lambda layer: [layer.kernel],
    lambda layer, a, g: bilinear_squared_norms(_patches(layer, a), _positions(g)),
    _kernel_sums(lambda layer, a, k: layer.convolution_op(a, k)),
    lambda layer: _channels_last(layer) and layer.groups == 1,
)
RULES: dict[type, LayerRule] = {
    keras.layers.Dense: LayerRule(
        lambda layer: [layer.kernel],
        lambda layer, a, g: bilinear_squared_norms(_positions(a), _positions(g)),
        _kernel_sums(lambda layer, a, k: jnp.matmul(a, k)),
        _plain,
    ),
    keras.layers.Conv1D: _CONV,
    keras.layers.Conv2D: _CONV,
    keras.layers.DepthwiseConv2D: LayerRule(
        lambda layer: [layer.kernel],
        _depthwise_norms,
        _kernel_sums(
            lambda layer, a, k: keras.ops.depthwise_conv(
                a, k, layer.strides, layer.padding, layer.data_format, layer.dilation_rate
            )
        ),
        _channels_last,
    ),
    keras.layers.Embedding: LayerRule(lambda layer: [layer.embeddings], _embedding_norms, _embedding_sums, _plain),
    keras.layers.LayerNormalization: _NORM,
    keras.layers.GroupNormalization: _NORM,
}


def register_layer_rule(
    layer_class: type,
    *,
    variables: Callable[[keras.layers.Layer], list[keras.Variable]],
    squared_norms: Callable[[keras.layers.Layer, jax.Array, jax.Array], jax.Array],
    clipped_sums: Callable[[keras.layers.Layer, jax.Array, jax.Array, jax.Array], list[jax.Array]],
    supports: Callable[[keras.layers.Layer], bool] | None = None,
) -> None:
    """Registers (or replaces) the rule of exactly ``layer_class`` (`LayerRule`'s parts; module docstring). TypeError
    if ``layer_class`` is not a Keras layer class or a part is not callable."""
    parts = {"variables": variables, "squared_norms": squared_norms, "clipped_sums": clipped_sums, "supports": supports}
    validation.check_layer_rule(layer_class, keras.layers.Layer, parts, optional=("supports",))
    RULES[layer_class] = LayerRule(variables, squared_norms, clipped_sums, supports or (lambda layer: True))
