"""Ghost-clipping rule for ``Conv2D`` (channels_last, groups 1, not causal), and the convolution machinery that the
Conv1D, DepthwiseConv2D and SeparableConv2D rules share.

A convolution's kernel is applied at every output position to the input patch there, so its per-example gradient is
the bilinear form of `norms` over image patches. A faster form where it applies: per channel (a depthwise
convolution, or a 1-channel input without dilation where `one_channel_by_depthwise_filter` says so), a depthwise
filter gradient that treats the batch as channels gives every example's kernel gradient at once.
``python benchmarks/conv_gradient.py`` times the forms against each other.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from keras_dyndp.tf_backend.keras_compat import keras
from keras_dyndp.tf_backend.per_example import dense
from keras_dyndp.tf_backend.per_example import norms
from keras_dyndp.tf_backend.per_example.taps import GhostGradient
from keras_dyndp.tf_backend.per_example.taps import Rows
from keras_dyndp.tf_backend.per_example.taps import Tap


class Window(NamedTuple):
    """The sliding window of a 2D convolution (channels_last): each field is (rows, columns) but ``padding``."""

    kernel_size: tuple[int, int]
    strides: tuple[int, int]
    dilation_rate: tuple[int, int]
    padding: str  # "valid" or "same".

    @classmethod
    def of(cls, layer: keras.layers.Layer) -> Window:
        """The window of a 2D convolution layer (Conv2D, DepthwiseConv2D, SeparableConv2D)."""
        return cls(tuple(layer.kernel_size), tuple(layer.strides), tuple(layer.dilation_rate), layer.padding)


def supports(layer: keras.layers.Conv2D) -> bool:
    """channels_last, groups 1 and no causal padding."""
    return layer.data_format == "channels_last" and layer.groups == 1 and layer.padding != "causal"


def call(tap: Tap) -> Callable:
    """Conv2D's call for the tapped pass, recording its inputs and pre-activation."""
    layer = tap.layer

    def conv2d_call(inputs, *args, **kwargs):
        inputs = tap.guard(tf.cast(inputs, layer.kernel.dtype))
        # tf.nn.convolution, as Keras: the CPU's Conv2D kernels have no dilation, it uses space_to_batch there.
        z = tf.nn.convolution(
            inputs,
            tap.weight(layer.kernel),
            strides=tuple(layer.strides),
            padding=layer.padding.upper(),
            dilations=tuple(layer.dilation_rate),
        )
        return dense.record_and_activate(tap, inputs, z)

    return conv2d_call


# Groups of examples whose depthwise filter gradients are separate ops (see `depthwise_filter_norms_and_sum`).
_DEPTHWISE_PARTS = 4


def _depthwise_filter_gradients(window: Window, inputs: tf.Tensor, g: tf.Tensor) -> tf.Tensor:
    """[kh * kw, N, c_in * m]: image n's kernel gradient [kh, kw, c_in, m] of a depthwise convolution, in slice n.

    ``inputs`` [N, H, W, c_in], ``g`` [N, OH, OW, c_in * m] (output channel c * m + j comes from input channel c).
    Treating the N images' channels as the N * c_in channels of a single image, ``DepthwiseConv2dNativeBackpropFilter``
    returns [kh, kw, N * c_in, m] (several times faster on CPU than image patches and a batched matmul). A
    1-channel input of an ordinary convolution is the case c_in = 1, m = c_out. No dilation (the CPU kernel has none).
    """
    kernel_h, kernel_w = window.kernel_size
    height, width, channels = inputs.shape[1], inputs.shape[2], inputs.shape[3]
    out_height, out_width, out_channels = g.shape[1], g.shape[2], g.shape[3]
    multiplier = out_channels // channels
    images = tf.shape(inputs)[0]
    stacked_inputs = tf.reshape(tf.transpose(inputs, [1, 2, 0, 3]), [1, height, width, images * channels])
    out_backprop = tf.reshape(tf.transpose(g, [1, 2, 0, 3]), [1, out_height, out_width, images * out_channels])
    per_image = tf.raw_ops.DepthwiseConv2dNativeBackpropFilter(
        input=stacked_inputs,
        filter_sizes=tf.stack([kernel_h, kernel_w, images * channels, multiplier]),
        out_backprop=out_backprop,
        strides=[1, *window.strides, 1],
        padding=window.padding.upper(),
    )
    return tf.reshape(per_image, [kernel_h * kernel_w, images, out_channels])


def depthwise_filter_norms_and_sum(window: Window, inputs: tf.Tensor, g: tf.Tensor, rows: Rows):
    """Per-example kernel-gradient norms and clipped sum [kh * kw, c_in * m] from depthwise filter gradients.

    The depthwise filter-gradient CPU kernel uses one thread for a single image, so the batch is cut into
    ``_DEPTHWISE_PARTS`` groups of examples, independent ops that TF's inter-op threads run in parallel (about
    8% off the whole tutorial-CNN step on 2 cores). Images folded in by TimeDistributed (``rows.fold`` per
    example) get one gradient each, summed per example.
    """
    kernel_positions = window.kernel_size[0] * window.kernel_size[1]
    out_channels = g.shape[-1]
    batch = rows.batch
    images_per_example = 1 if rows.fold == 1 else rows.count // tf.maximum(rows.batch, 1)  # 0 // 1: empty batch.
    static_batch = None if rows.static is None or rows.fold is None else rows.static // rows.fold
    # Balanced groups, none empty when the batch has at least `parts` examples (XLA refuses empty ones).
    parts = min(_DEPTHWISE_PARTS, static_batch or _DEPTHWISE_PARTS)
    bounds = [i * batch // parts for i in range(parts + 1)]
    groups = list(zip(bounds[:-1], bounds[1:]))

    def gradients_of(start, end):
        images = slice(start * images_per_example, end * images_per_example)
        per_image = _depthwise_filter_gradients(window, inputs[images], g[images])
        if rows.fold == 1:
            return per_image
        return tf.reduce_sum(tf.reshape(per_image, [kernel_positions, end - start, -1, out_channels]), axis=2)

    per_example = [gradients_of(start, end) for start, end in groups]
    squared = tf.concat([norms.squared_norms(gradients, [0, 2]) for gradients in per_example], axis=0)

    def kernel_sum(f):
        # sum_b f_b G_b as kh*kw row-vector-matrix products: twice as fast on CPU as the einsum "hwbc,b->hwc".
        total = tf.add_n(
            [
                tf.matmul(tf.broadcast_to(f[None, None, start:end], [kernel_positions, 1, end - start]), gradients)
                for (start, end), gradients in zip(groups, per_example)
            ]
        )
        return tf.reshape(total, [kernel_positions, out_channels])

    return squared, kernel_sum


def _window_starts(size: int, kernel: int, stride: int, dilation: int, padding: str) -> tuple[np.ndarray, int, int]:
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


def image_patches(window: Window, inputs: tf.Tensor) -> tf.Tensor:
    """A convolution input's patches [N, T, kh * kw * c_in], in the kernel's (kh, kw, c_in) order.

    With a static image size: one ``tf.gather`` of the padded input's pixel rows (c_in floats each) at positions
    computed once when tracing, several times faster on CPU than ``tf.image.extract_patches`` (which is used for
    an unknown image size).
    """
    kernel_h, kernel_w = window.kernel_size
    height, width, channels = inputs.shape[1], inputs.shape[2], inputs.shape[3]
    if height is None or width is None:
        patches = tf.image.extract_patches(
            inputs,
            sizes=[1, kernel_h, kernel_w, 1],
            strides=[1, *window.strides, 1],
            rates=[1, *window.dilation_rate, 1],
            padding=window.padding.upper(),
        )
        return tf.reshape(patches, [tf.shape(patches)[0], -1, patches.shape[-1]])
    rows, top, bottom = _window_starts(height, kernel_h, window.strides[0], window.dilation_rate[0], window.padding)
    cols, left, right = _window_starts(width, kernel_w, window.strides[1], window.dilation_rate[1], window.padding)
    padded_width = width + left + right
    # [out_h, out_w, kh, kw] flat pixel positions in the padded image.
    pixels = rows[:, None, :, None] * padded_width + cols[None, :, None, :]
    inputs = tf.pad(inputs, [[0, 0], [top, bottom], [left, right], [0, 0]])
    inputs = tf.reshape(inputs, [tf.shape(inputs)[0], (height + top + bottom) * padded_width, channels])
    patches = tf.gather(inputs, tf.constant(pixels.reshape(-1), tf.int32), axis=1)
    positions = rows.shape[0] * cols.shape[0]
    return tf.reshape(patches, [tf.shape(inputs)[0], positions, kernel_h * kernel_w * channels])


def patch_norms_and_sum(window: Window, inputs: tf.Tensor, g: tf.Tensor, rows: Rows):
    """Per-example kernel-gradient norms and clipped sum of an ordinary convolution from image patches: the
    bilinear form (Gram or materialised, `norms.bilinear_norms_and_sum`) of the patches and ``g``."""
    patches = norms.flatten_positions(image_patches(window, inputs), rows)
    return norms.bilinear_norms_and_sum(patches, norms.flatten_positions(g, rows))


# Without oneDNN, a 1-channel convolution's per-example kernel gradients come from depthwise filter gradients when it
# has fewer output channels than this, else from image patches: TF's own depthwise filter-gradient CPU kernel is
# 1.5-5x faster than image patches up to 15 channels and 2-5x slower from 16 (a step at 16 seen at every kernel size
# and stride). With oneDNN on they always come from depthwise filter gradients: oneDNN's kernel was faster in 36 of 42
# shapes (up to 11x) and at most 1.7x slower (3x3 and 5x5 kernels with 32-64 channels). Measured with
# benchmarks/conv_gradient.py (2-core AMD EPYC, TF 2.15 and 2.21, batch 256, 28x28 images).
_DEPTHWISE_FILTERS_BELOW = 16


@functools.cache
def onednn_enabled() -> bool:
    """Whether TensorFlow runs its CPU kernels through oneDNN (``TF_ENABLE_ONEDNN_OPTS``, or TF's default for the
    CPU). TensorFlow has no public API for it; where the private one is missing, False (the safer guess: with 16 or
    more channels, image patches were at most 3.8x slower with oneDNN, depthwise filter gradients up to 5.4x slower
    without)."""
    try:
        from tensorflow.python.util import _pywrap_util_port  # pylint: disable=g-direct-tensorflow-import
    except ImportError:
        return False
    return bool(getattr(_pywrap_util_port, "IsMklEnabled", lambda: False)())


def _depthwise_filter_applies(window: Window, inputs: tf.Tensor, g: tf.Tensor) -> bool:
    """Whether `_depthwise_filter_gradients` can compute the kernel gradients: no dilation, equal strides (the
    CPU kernel's limits) and image sizes known while tracing."""
    return (
        window.dilation_rate == (1, 1)
        and window.strides[0] == window.strides[1]
        and inputs.shape[1:].is_fully_defined()
        and g.shape[1:].is_fully_defined()
    )


def one_channel_by_depthwise_filter(window: Window, inputs: tf.Tensor, g: tf.Tensor) -> bool:
    """Whether an ordinary convolution's per-example kernel gradients come from depthwise filter gradients: a
    1-channel input, `_depthwise_filter_applies`, and oneDNN on or fewer than ``_DEPTHWISE_FILTERS_BELOW`` output
    channels."""
    return (
        inputs.shape[-1] == 1
        and (onednn_enabled() or g.shape[-1] < _DEPTHWISE_FILTERS_BELOW)
        and _depthwise_filter_applies(window, inputs, g)
    )


def conv_kernel_gradient(
    kernel: tf.Variable, window: Window, inputs: tf.Tensor, g: tf.Tensor, rows: Rows
) -> GhostGradient:
    """The per-example gradients of an ordinary 2D convolution's kernel [kh, kw, c_in, c_out] (groups 1).

    ``inputs`` [rows, H, W, c_in] as the convolution saw them (padded by hand for a causal Conv1D), ``g`` the
    gradient of its output [rows, OH, OW, c_out]. Depthwise filter gradients where
    `one_channel_by_depthwise_filter` says so, else image patches (`patch_norms_and_sum`).
    """
    if one_channel_by_depthwise_filter(window, inputs, g):
        squared, kernel_sum = depthwise_filter_norms_and_sum(window, inputs, g, rows)
    else:
        squared, kernel_sum = patch_norms_and_sum(window, inputs, g, rows)
    return GhostGradient(kernel, squared, lambda f: tf.reshape(kernel_sum(f), kernel.shape))


def depthwise_kernel_gradient(
    kernel: tf.Variable, window: Window, inputs: tf.Tensor, g: tf.Tensor, rows: Rows
) -> GhostGradient:
    """The per-example gradients of a depthwise convolution's kernel [kh, kw, c_in, m].

    ``inputs`` [rows, H, W, c_in], ``g`` [rows, OH, OW, c_in * m]. Depthwise filter gradients where they apply
    (`_depthwise_filter_applies`); else each example's gradient sum_t patch_{t, c} g_{t, c, j} from image patches,
    materialised (a depthwise kernel is small: kh kw c_in m floats).
    """
    if _depthwise_filter_applies(window, inputs, g):
        squared, kernel_sum = depthwise_filter_norms_and_sum(window, inputs, g, rows)
        return GhostGradient(kernel, squared, lambda f: tf.reshape(kernel_sum(f), kernel.shape))
    kernel_h, kernel_w, channels, multiplier = kernel.shape
    patches = norms.flatten_positions(image_patches(window, inputs), rows)
    patches = tf.reshape(patches, [rows.batch, -1, kernel_h * kernel_w, channels])
    g = tf.reshape(norms.flatten_positions(g, rows), [rows.batch, -1, channels, multiplier])
    per_example = tf.einsum("btkc,btcm->bkcm", patches, g)
    return norms.materialised_gradient(kernel, tf.reshape(per_example, [-1, *kernel.shape]))


def norms_and_sums(tap: Tap, g: tf.Tensor) -> list[GhostGradient]:
    """Kernel (`conv_kernel_gradient`); bias."""
    layer = tap.layer
    gradients = [conv_kernel_gradient(layer.kernel, Window.of(layer), tap.inputs, g, tap.rows)]
    if layer.use_bias:
        gradients.append(norms.bias_gradient(layer.bias, norms.flatten_positions(g, tap.rows)))
    return gradients
