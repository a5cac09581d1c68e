"""Ghost-clipping rule for ``Conv1D`` (channels_last, groups 1; causal padding included): kernel and bias.

A Conv1D is a Conv2D over images one row high: its inputs [rows, L, c_in] are recorded as such and the kernel's
per-example gradients come from the Conv2D machinery (`conv2d.conv_kernel_gradient`) with a 1 x k window. Causal
padding is done by hand in the tapped call (k - 1 dilated steps on the left, as Keras does), so the recorded input
is the padded one and the window is 'valid'.
"""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf

from keras_dyndp.tf_backend.keras_compat import keras
from keras_dyndp.tf_backend.per_example import conv2d
from keras_dyndp.tf_backend.per_example import dense
from keras_dyndp.tf_backend.per_example import norms
from keras_dyndp.tf_backend.per_example.taps import GhostGradient
from keras_dyndp.tf_backend.per_example.taps import Tap


def supports(layer: keras.layers.Conv1D) -> bool:
    """channels_last and groups 1."""
    return layer.data_format == "channels_last" and layer.groups == 1


def _window(layer: keras.layers.Conv1D) -> conv2d.Window:
    """The layer's window as a 1 x k Conv2D window over its (causally padded) input one row high.

    The row stride is the column stride: one row gives one output row whatever the row stride, and the depthwise
    filter gradients need equal strides.
    """
    padding = "valid" if layer.padding == "causal" else layer.padding
    stride = layer.strides[0]
    return conv2d.Window((1, layer.kernel_size[0]), (stride, stride), (1, layer.dilation_rate[0]), padding)


def call(tap: Tap) -> Callable:
    """Conv1D's call for the tapped pass, recording its (causally padded) inputs and pre-activation."""
    layer = tap.layer

    def conv1d_call(inputs, *args, **kwargs):
        inputs = tap.guard(tf.cast(inputs, layer.kernel.dtype))
        if layer.padding == "causal":
            inputs = tf.pad(inputs, [[0, 0], [layer.dilation_rate[0] * (layer.kernel_size[0] - 1), 0], [0, 0]])
        z = tf.nn.convolution(  # Not tf.nn.conv1d: the CPU's Conv2D kernels have no dilation.
            inputs,
            tap.weight(layer.kernel),
            strides=tuple(layer.strides),
            padding=_window(layer).padding.upper(),
            dilations=tuple(layer.dilation_rate),
        )
        return dense.record_and_activate(tap, inputs, z)

    return conv1d_call


def norms_and_sums(tap: Tap, g: tf.Tensor) -> list[GhostGradient]:
    """Kernel (as a Conv2D kernel one row high); bias."""
    layer = tap.layer
    kernel = conv2d.conv_kernel_gradient(layer.kernel, _window(layer), tap.inputs[:, None], g[:, None], tap.rows)
    gradients = [kernel]
    if layer.use_bias:
        gradients.append(norms.bias_gradient(layer.bias, norms.flatten_positions(g, tap.rows)))
    return gradients
