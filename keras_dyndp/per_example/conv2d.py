"""Ghost-clipping rule for ``Conv2D`` (channels_last, groups 1, not causal): kernel and bias.

The kernel's per-example gradients come from image patches (the bilinear form of `norms`), or, for a 1-channel
input without dilation, from a depthwise filter gradient that treats the batch as channels (faster on CPU).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import tensorflow as tf

from keras_dyndp.keras_compat import keras
from keras_dyndp.per_example import dense
from keras_dyndp.per_example import norms
from keras_dyndp.per_example.taps import GhostGradient
from keras_dyndp.per_example.taps import Rows
from keras_dyndp.per_example.taps import Tap


def supports(layer: keras.layers.Conv2D) -> bool:
    """channels_last, groups 1 and no causal padding."""
    return layer.data_format == "channels_last" and layer.groups == 1 and layer.padding != "causal"


def call(tap: Tap) -> Callable:
    """Conv2D's call for the tapped pass, recording its inputs and pre-activation."""
    layer = tap.layer

    def conv2d_call(inputs, *args, **kwargs):
        inputs = tap.guard(tf.cast(inputs, layer.kernel.dtype))
        z = tf.nn.conv2d(
            inputs,
            tap.weight(layer.kernel),
            strides=(1,) + tuple(layer.strides) + (1,),
            padding=layer.padding.upper(),
            dilations=(1,) + tuple(layer.dilation_rate) + (1,),
        )
        return dense.record_and_activate(tap, inputs, z)

    return conv2d_call


# Groups of examples whose 1-channel Conv2D kernel gradients are separate ops (see below).
_DEPTHWISE_PARTS = 4


def _depthwise_kernel_gradients(layer, inputs: tf.Tensor, g: tf.Tensor) -> tf.Tensor:
    """[kh * kw, B, c_out]: example b's kernel gradient of a 1-input-channel Conv2D in slice b.

    Treating the batch as the channels of a single image, ``DepthwiseConv2dNativeBackpropFilter`` returns
    [kh, kw, B, c_out] (several times faster on CPU than image patches and a batched matmul).
    """
    kernel_h, kernel_w = layer.kernel_size
    height, width = inputs.shape[1], inputs.shape[2]
    out_height, out_width, out_channels = g.shape[1], g.shape[2], g.shape[3]
    batch = tf.shape(inputs)[0]
    images = tf.reshape(tf.transpose(inputs, [3, 1, 2, 0]), [1, height, width, batch])
    out_backprop = tf.reshape(tf.transpose(g, [1, 2, 0, 3]), [1, out_height, out_width, batch * out_channels])
    per_example = tf.raw_ops.DepthwiseConv2dNativeBackpropFilter(
        input=images,
        filter_sizes=tf.stack([kernel_h, kernel_w, batch, out_channels]),
        out_backprop=out_backprop,
        strides=[1, *layer.strides, 1],
        padding=layer.padding.upper(),
    )
    return tf.reshape(per_example, [kernel_h * kernel_w, batch, out_channels])


def _single_channel_conv2d_norms_and_sum(layer, inputs: tf.Tensor, g: tf.Tensor, rows: Rows):
    """Per-example kernel-gradient norms of a 1-input-channel Conv2D from depthwise filter gradients.

    The depthwise filter-gradient CPU kernel uses one thread for a single image, so the batch is cut into
    ``_DEPTHWISE_PARTS`` groups of examples, independent ops that TF's inter-op threads run in parallel (about
    8% off the whole tutorial-CNN step on 2 cores). Images folded in by TimeDistributed (``rows.fold`` per
    example) get one gradient each, summed per example.
    """
    kernel_h, kernel_w = layer.kernel_size
    batch = rows.batch
    images_per_example = 1 if rows.fold == 1 else rows.count // tf.maximum(rows.batch, 1)  # 0 // 1: empty batch.
    static_batch = None if rows.static is None or rows.fold is None else rows.static // rows.fold
    # Balanced groups, none empty when the batch has at least `parts` examples (XLA refuses empty ones).
    parts = min(_DEPTHWISE_PARTS, static_batch or _DEPTHWISE_PARTS)
    bounds = [i * batch // parts for i in range(parts + 1)]
    groups = list(zip(bounds[:-1], bounds[1:]))

    def gradients_of(start, end):
        images = slice(start * images_per_example, end * images_per_example)
        per_image = _depthwise_kernel_gradients(layer, inputs[images], g[images])
        if rows.fold == 1:
            return per_image
        return tf.reduce_sum(tf.reshape(per_image, [kernel_h * kernel_w, end - start, -1, g.shape[-1]]), axis=2)

    per_example = [gradients_of(start, end) for start, end in groups]
    squared = tf.concat([norms.squared_norms(gradients, [0, 2]) for gradients in per_example], axis=0)

    def kernel_sum(f):
        # sum_b f_b G_b as kh*kw row-vector-matrix products: twice as fast on CPU as the einsum "hwbc,b->hwc".
        total = tf.add_n([
            tf.matmul(tf.broadcast_to(f[None, None, start:end], [kernel_h * kernel_w, 1, end - start]), gradients)
            for (start, end), gradients in zip(groups, per_example)
        ])
        return tf.reshape(total, layer.kernel.shape)

    return squared, kernel_sum


def _window_starts(
    size: int, kernel: int, stride: int, dilation: int, padding: str
) -> tuple[np.ndarray, int, int]:
    """TF's conv windows along one axis: [out, kernel] input positions (padded coordinates) and the padding."""
    span = (kernel - 1) * dilation + 1
    if padding == "same":
        out = -(-size // stride)
        pad_total = max((out - 1) * stride + span - size, 0)
    else:
        out = (size - span) // stride + 1
        pad_total = 0
    positions = np.arange(out)[:, None] * stride + np.arange(kernel)[None, :] * dilation
    return positions, pad_total // 2, pad_total - pad_total // 2


def image_patches(layer, inputs: tf.Tensor) -> tf.Tensor:
    """A Conv2D input's patches [B, T, kh * kw * c_in], in the kernel's (kh, kw, c_in) order.

    With a static image size: one ``tf.gather`` of the padded input's pixel rows (c_in floats each) at positions
    computed once when tracing, several times faster on CPU than ``tf.image.extract_patches`` (which is used for
    an unknown image size).
    """
    kernel_h, kernel_w = layer.kernel_size
    height, width, channels = inputs.shape[1], inputs.shape[2], inputs.shape[3]
    if height is None or width is None:
        patches = tf.image.extract_patches(
            inputs,
            sizes=[1, kernel_h, kernel_w, 1],
            strides=[1, *layer.strides, 1],
            rates=[1, *layer.dilation_rate, 1],
            padding=layer.padding.upper(),
        )
        return tf.reshape(patches, [tf.shape(patches)[0], -1, patches.shape[-1]])
    rows, top, bottom = _window_starts(height, kernel_h, layer.strides[0], layer.dilation_rate[0], layer.padding)
    cols, left, right = _window_starts(width, kernel_w, layer.strides[1], layer.dilation_rate[1], layer.padding)
    padded_width = width + left + right
    # [out_h, out_w, kh, kw] flat pixel positions in the padded image.
    pixels = rows[:, None, :, None] * padded_width + cols[None, :, None, :]
    inputs = tf.pad(inputs, [[0, 0], [top, bottom], [left, right], [0, 0]])
    inputs = tf.reshape(inputs, [tf.shape(inputs)[0], (height + top + bottom) * padded_width, channels])
    patches = tf.gather(inputs, tf.constant(pixels.reshape(-1), tf.int32), axis=1)
    positions = rows.shape[0] * cols.shape[0]
    return tf.reshape(patches, [tf.shape(inputs)[0], positions, kernel_h * kernel_w * channels])


def _patch_conv2d_norms_and_sum(layer, inputs: tf.Tensor, g: tf.Tensor, rows: Rows):
    """Per-example kernel-gradient norms of a Conv2D from image patches (Gram or materialised form)."""
    patches = norms.flatten_positions(image_patches(layer, inputs), rows)
    squared, kernel_sum = norms.bilinear_norms_and_sum(patches, norms.flatten_positions(g, rows))
    kernel_shape = layer.kernel.shape
    return squared, lambda f: tf.reshape(kernel_sum(f), kernel_shape)


def norms_and_sums(tap: Tap, g: tf.Tensor) -> list[GhostGradient]:
    """Kernel (depthwise filter gradients for a 1-channel input without dilation, else image patches); bias."""
    layer = tap.layer
    if tap.inputs.shape[-1] == 1 and tuple(layer.dilation_rate) == (1, 1):
        kernel_squared, kernel_sum = _single_channel_conv2d_norms_and_sum(layer, tap.inputs, g, tap.rows)
    else:
        kernel_squared, kernel_sum = _patch_conv2d_norms_and_sum(layer, tap.inputs, g, tap.rows)
    gradients = [GhostGradient(layer.kernel, kernel_squared, kernel_sum)]
    if layer.use_bias:
        gradients.append(norms.bias_gradient(layer.bias, norms.flatten_positions(g, tap.rows)))
    return gradients
