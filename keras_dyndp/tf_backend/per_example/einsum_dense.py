"""The ghost-clipping rule of ``EinsumDense`` (Keras 3's and Keras 2's, also inside MultiHeadAttention): a Dense over
positions after a transpose (`keras_dyndp.rules.einsum_equation`), its kernel by `norms.bilinear_norms_and_sum` (Gram or
materialised, with the rounding bound), its bias (``bias_axes``) materialised per example."""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf

from keras_dyndp.rules import einsum_equation
from keras_dyndp.tf_backend.keras_compat import keras
from keras_dyndp.tf_backend.per_example import dense
from keras_dyndp.tf_backend.per_example import norms
from keras_dyndp.tf_backend.per_example.taps import GhostGradient
from keras_dyndp.tf_backend.per_example.taps import Tap
from keras_dyndp.tf_backend.per_example.taps import UnsupportedModel


def supports(layer: keras.layers.Layer) -> bool:
    """An equation that keeps the examples apart and reduces to a Dense over positions (`einsum_equation.plan`)."""
    kernel = getattr(layer, "kernel", None)
    if kernel is None:
        return False
    rank = einsum_equation.equation_input_rank(layer.equation)
    return einsum_equation.plan(layer.equation, tuple(kernel.shape), rank) is not None


def call(tap: Tap) -> Callable:
    """EinsumDense's tapped call ``activation(einsum(inputs, K) + bias)``, recording inputs and the pre-activation."""
    layer = tap.layer

    def einsum_call(inputs, *args, **kwargs):
        if not isinstance(inputs, tf.Tensor):
            raise UnsupportedModel(f"EinsumDense {layer.name!r} received a non-dense input")
        if einsum_equation.plan(layer.equation, tuple(layer.kernel.shape), inputs.shape.rank) is None:
            raise UnsupportedModel(f"EinsumDense {layer.name!r}'s equation {layer.equation!r} mixes examples")
        inputs = tap.guard(tf.cast(inputs, layer.kernel.dtype))
        return dense.record_and_activate(tap, inputs, tf.einsum(layer.equation, inputs, tap.weight(layer.kernel)))

    return einsum_call


def _positions_rows(tensor: tf.Tensor, order: tuple[int, ...], width: int, tap: Tap) -> tf.Tensor:
    """[B, T, width]: each example's positions (its folded time steps included, `norms.flatten_positions`)."""
    moved = tf.transpose(tensor, order)
    rows = tf.reshape(moved, [tf.shape(moved)[0], -1, width])
    per_row = moved.shape[1:].num_elements()  # None where an axis is unknown while tracing
    rows.set_shape([moved.shape[0], None if per_row is None else per_row // width, width])
    return norms.flatten_positions(rows, tap.rows)


def norms_and_sums(tap: Tap, g: tf.Tensor) -> list[GhostGradient]:
    """Kernel: G_i = a_i^T g_i over the positions of the equation's Dense reading; bias: g summed per example."""
    layer = tap.layer
    plan = einsum_equation.plan(layer.equation, tuple(layer.kernel.shape), tap.inputs.shape.rank)  # checked in call
    a = _positions_rows(tap.inputs, plan.input_order, plan.fan_in, tap)
    squared, summed = norms.bilinear_norms_and_sum(a, _positions_rows(g, plan.output_order, plan.fan_out, tap))

    def clipped_sum(f):
        return tf.transpose(tf.reshape(summed(f), plan.gradient_shape), plan.kernel_order)

    return [GhostGradient(layer.kernel, squared, clipped_sum), *with_bias(tap, g)]


def with_bias(tap: Tap, g: tf.Tensor) -> list[GhostGradient]:
    """The bias's per-example gradients (g summed over the axes it is broadcast along, and over each example's
    rows), materialised; none where the layer has no bias."""
    layer = tap.layer
    if layer.bias is None:
        return []
    axes = einsum_equation.bias_axes(tuple(layer.bias.shape), tuple(g.shape))
    return [norms.summed_gradient(layer.bias, g, axes, tap.rows.batch)]
