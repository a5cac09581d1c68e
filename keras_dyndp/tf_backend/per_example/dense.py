"""Ghost-clipping rule for ``Dense``: a kernel used at every position of its input, and a bias."""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf

from keras_dyndp.tf_backend.per_example import norms
from keras_dyndp.tf_backend.per_example.taps import GhostGradient
from keras_dyndp.tf_backend.per_example.taps import Tap
from keras_dyndp.tf_backend.per_example.taps import UnsupportedModel


def call(tap: Tap) -> Callable:
    """Dense's call for the tapped pass: ``activation(inputs W + b)``, recording inputs and ``inputs W + b``."""
    layer = tap.layer

    def dense_call(inputs, *args, **kwargs):
        if not isinstance(inputs, tf.Tensor):
            raise UnsupportedModel(f"Dense {layer.name!r} received a non-dense input")
        inputs = tap.guard(tf.cast(inputs, layer.kernel.dtype))
        z = tf.tensordot(inputs, tap.weight(layer.kernel), axes=[[inputs.shape.rank - 1], [0]])
        return record_and_activate(tap, inputs, z)

    return dense_call


def record_and_activate(tap: Tap, inputs: tf.Tensor, kernel_output: tf.Tensor) -> tf.Tensor:
    """Adds the bias, records (inputs, pre-activation) for the norms, and applies the activation."""
    layer = tap.layer
    z = kernel_output + tap.weight(layer.bias) if layer.use_bias else kernel_output
    tap.record(inputs, z)
    return layer.activation(z) if layer.activation is not None else z


def norms_and_sums(tap: Tap, g: tf.Tensor) -> list[GhostGradient]:
    """Kernel: G_i = a_i^T g_i over the example's positions (a sequence axis, TimeDistributed steps); bias."""
    layer = tap.layer
    g = norms.flatten_positions(g, tap.rows)
    gradients = [norms.bilinear_gradient(layer.kernel, norms.flatten_positions(tap.inputs, tap.rows), g)]
    if layer.use_bias:
        gradients.append(norms.bias_gradient(layer.bias, g))
    return gradients
