"""Ghost-clipping rules of ``LayerNormalization`` and ``GroupNormalization`` (Keras 3's and Keras 2's) and Keras 3's
``RMSNormalization`` (its ``scale`` as gamma, no beta): the output is x_hat * gamma + beta, x_hat each row's input
normalised over its own axes (never the batch's), so example i's gradients are sum x_hat g and sum g over the axes
gamma and beta broadcast over (its positions): small, materialised (exact, no rounding bound needed). The tapped call
computes x_hat itself (in at least float32, as Keras does) and keeps it for the rule."""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf

from keras_dyndp.tf_backend.keras_compat import keras
from keras_dyndp.tf_backend.per_example import norms
from keras_dyndp.tf_backend.per_example.taps import GhostGradient
from keras_dyndp.tf_backend.per_example.taps import Tap
from keras_dyndp.tf_backend.per_example.taps import UnsupportedModel


def _axes(axis, rank: int) -> list[int]:
    """``axis`` (an int or a sequence) as sorted non-negative axes of a rank-``rank`` input."""
    axes = [axis] if isinstance(axis, int) else list(axis)
    return sorted(a % rank for a in axes)


def layer_norm_supports(layer: keras.layers.Layer) -> bool:
    """A LayerNormalization whose ``axis`` does not name the batch axis (0; a negative one is checked in the call)."""
    return 0 not in ([layer.axis] if isinstance(layer.axis, int) else list(layer.axis))


def group_norm_supports(layer: keras.layers.Layer) -> bool:
    """A GroupNormalization whose channel ``axis`` is not the batch axis."""
    return layer.axis != 0


def _scale_and_offset(layer: keras.layers.Layer) -> tuple:
    """``(gamma, beta)``, either None where the layer has none (RMSNormalization: its ``scale``, no offset)."""
    if hasattr(layer, "gamma"):
        return layer.gamma, layer.beta
    return layer.scale, None


def _checked_input(tap: Tap, inputs, axes: list[int]) -> tf.Tensor:
    if not isinstance(inputs, tf.Tensor) or 0 in axes:
        raise UnsupportedModel(f"{type(tap.layer).__name__} {tap.layer.name!r} would mix examples")
    inputs = tap.guard(inputs)
    return tf.cast(inputs, tf.float64 if inputs.dtype == tf.float64 else tf.float32)


def _affine(tap: Tap, inputs: tf.Tensor, normalized: tf.Tensor, axes: list[int]) -> tf.Tensor:
    """``normalized * gamma + beta`` (each broadcast along ``axes``), recorded; cast to the layer's compute dtype."""
    layer = tap.layer
    shape = [normalized.shape[axis] if axis in axes else 1 for axis in range(normalized.shape.rank)]
    outputs = normalized
    gamma, beta = _scale_and_offset(layer)
    if gamma is not None:
        outputs = outputs * tf.reshape(tf.cast(tap.weight(gamma), outputs.dtype), shape)
    if beta is not None:
        outputs = outputs + tf.reshape(tf.cast(tap.weight(beta), outputs.dtype), shape)
    tap.saved["normalized"] = normalized
    tap.record(inputs, outputs)
    return tf.cast(outputs, layer.compute_dtype)


def _over_axes(tap: Tap, normalize: Callable[[tf.Tensor, list[int]], tf.Tensor], takes_mask: bool = False) -> Callable:
    """The tapped call of a layer normalising its input over ``layer.axis`` by ``normalize(x, axes)``; a mask is
    refused where ``takes_mask``."""
    layer = tap.layer

    def call(inputs, *args, **kwargs):
        if takes_mask and kwargs.get("mask") is not None:
            raise UnsupportedModel(f"{type(layer).__name__} {layer.name!r} received a mask")
        rank = inputs.shape.rank if isinstance(inputs, tf.Tensor) else 0
        axes = _axes(layer.axis, max(rank, 1))
        x = _checked_input(tap, inputs, axes)
        return _affine(tap, x, normalize(x, axes), axes)

    return call


def layer_norm_call(tap: Tap) -> Callable:
    """LayerNormalization's call for the tapped pass (``rms_scaling`` too: Keras 3 divides by the variance's root)."""
    layer = tap.layer

    def normalize(x, axes):
        mean, variance = tf.nn.moments(x, axes, keepdims=True)
        centred = x if getattr(layer, "rms_scaling", False) else x - mean
        return centred * tf.math.rsqrt(variance + layer.epsilon)

    return _over_axes(tap, normalize)


def rms_norm_call(tap: Tap) -> Callable:
    """RMSNormalization's call for the tapped pass: x / sqrt(mean(x^2) + epsilon) over its axes, times its scale."""
    layer = tap.layer
    epsilon = keras.config.epsilon() if layer.epsilon is None else layer.epsilon
    return _over_axes(
        tap, lambda x, axes: x * tf.math.rsqrt(tf.reduce_mean(tf.square(x), axes, keepdims=True) + epsilon)
    )


def group_norm_call(tap: Tap) -> Callable:
    """GroupNormalization's tapped call: moments over each group of channels and all non-batch axes (no mask)."""
    layer = tap.layer

    def normalize(x, axes):
        (axis,), shape = axes, tf.shape(x)
        groups = [layer.groups, x.shape[axis] // layer.groups]
        grouped = tf.reshape(x, tf.concat([shape[:axis], groups, shape[axis + 1 :]], axis=0))
        mean, variance = tf.nn.moments(grouped, [a for a in range(1, x.shape.rank + 1) if a != axis], keepdims=True)
        normalized = tf.reshape((grouped - mean) * tf.math.rsqrt(variance + layer.epsilon), shape)
        normalized.set_shape(x.shape)
        return normalized

    return _over_axes(tap, normalize, takes_mask=True)


def norms_and_sums(tap: Tap, g: tf.Tensor) -> list[GhostGradient]:
    """gamma: sum x_hat g, beta: sum g, over each example's axes the parameters broadcast over, materialised."""
    layer = tap.layer
    normalized = tap.saved["normalized"]
    kept = _axes(layer.axis, normalized.shape.rank)
    summed = [axis for axis in range(1, normalized.shape.rank) if axis not in kept]
    gamma, beta = _scale_and_offset(layer)
    return [
        norms.summed_gradient(variable, per_row, summed, tap.rows.batch)
        for variable, per_row in ((gamma, normalized * g), (beta, g))
        if variable is not None
    ]
