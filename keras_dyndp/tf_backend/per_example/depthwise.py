"""Ghost-clipping rules for ``DepthwiseConv2D`` and ``SeparableConv2D`` (channels_last).

A depthwise convolution applies each input channel's own filters (``depth_multiplier`` of them) to that channel:
its kernel's per-example gradients come from `conv2d.depthwise_kernel_gradient`. A separable convolution is a
depthwise convolution followed by a 1 x 1 pointwise one: the tapped call records the input and the pointwise output
(the pre-activation) and keeps the depthwise output u. With g the gradient of the pre-activation, the pointwise
kernel's per-example gradient is the bilinear form of u and g, and the gradient reaching u is g P^T (P the
pointwise kernel as a [c_in * m, filters] matrix), from which the depthwise kernel's per-example gradients follow.
"""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf

from keras_dyndp.tf_backend import keras_compat
from keras_dyndp.tf_backend.keras_compat import keras
from keras_dyndp.tf_backend.per_example import conv2d
from keras_dyndp.tf_backend.per_example import dense
from keras_dyndp.tf_backend.per_example import norms
from keras_dyndp.tf_backend.per_example.taps import GhostGradient
from keras_dyndp.tf_backend.per_example.taps import Tap


def supports(layer: keras.layers.Layer) -> bool:
    """channels_last."""
    return layer.data_format == "channels_last"


def _depthwise(tap: Tap, inputs: tf.Tensor, kernel: tf.Variable) -> tf.Tensor:
    """The layer's depthwise convolution of ``inputs`` (guarded) with ``kernel`` read through ``tap.weight``."""
    layer = tap.layer
    return tf.nn.depthwise_conv2d(
        inputs,
        tap.weight(kernel),
        strides=(1,) + tuple(layer.strides) + (1,),
        padding=layer.padding.upper(),
        dilations=tuple(layer.dilation_rate),
    )


def depthwise_call(tap: Tap) -> Callable:
    """DepthwiseConv2D's call for the tapped pass, recording its inputs and pre-activation."""
    layer = tap.layer
    kernel = keras_compat.depthwise_kernel(layer)

    def call(inputs, *args, **kwargs):
        inputs = tap.guard(tf.cast(inputs, kernel.dtype))
        return dense.record_and_activate(tap, inputs, _depthwise(tap, inputs, kernel))

    return call


def depthwise_norms_and_sums(tap: Tap, g: tf.Tensor) -> list[GhostGradient]:
    """Kernel; bias."""
    layer = tap.layer
    kernel = keras_compat.depthwise_kernel(layer)
    gradients = [conv2d.depthwise_kernel_gradient(kernel, conv2d.Window.of(layer), tap.inputs, g, tap.rows)]
    if layer.use_bias:
        gradients.append(norms.bias_gradient(layer.bias, norms.flatten_positions(g, tap.rows)))
    return gradients


def separable_call(tap: Tap) -> Callable:
    """SeparableConv2D's call for the tapped pass: records inputs and pre-activation, keeps the depthwise output."""
    layer = tap.layer

    def call(inputs, *args, **kwargs):
        inputs = tap.guard(tf.cast(inputs, layer.depthwise_kernel.dtype))
        depthwise_output = _depthwise(tap, inputs, layer.depthwise_kernel)
        z = tf.nn.conv2d(depthwise_output, tap.weight(layer.pointwise_kernel), strides=1, padding="VALID")
        tap.saved["depthwise_output"] = depthwise_output
        return dense.record_and_activate(tap, inputs, z)

    return call


def separable_norms_and_sums(tap: Tap, g: tf.Tensor) -> list[GhostGradient]:
    """Pointwise kernel (bilinear in the depthwise output and g), depthwise kernel (from g P^T), bias."""
    layer = tap.layer
    pointwise = layer.pointwise_kernel
    depthwise_output = tap.saved["depthwise_output"]
    pointwise_matrix = tf.reshape(tf.convert_to_tensor(pointwise), pointwise.shape[2:])  # [c_in * m, filters].
    squared, pointwise_sum = norms.bilinear_norms_and_sum(
        norms.flatten_positions(depthwise_output, tap.rows), norms.flatten_positions(g, tap.rows)
    )
    g_depthwise = tf.tensordot(g, pointwise_matrix, axes=[[3], [1]])
    gradients = [
        GhostGradient(pointwise, squared, lambda f: tf.reshape(pointwise_sum(f), pointwise.shape)),
        conv2d.depthwise_kernel_gradient(
            layer.depthwise_kernel, conv2d.Window.of(layer), tap.inputs, g_depthwise, tap.rows
        ),
    ]
    if layer.use_bias:
        gradients.append(norms.bias_gradient(layer.bias, norms.flatten_positions(g, tap.rows)))
    return gradients
