"""Ghost-clipping rules for the convolutions (channels_last): Conv1D and Conv2D (groups 1; Conv1D causal too),
DepthwiseConv2D and SeparableConv2D, and the kernel-gradient machinery they share. A kernel's per-example gradient is
the bilinear form of its image patches and g (`norms`), or, faster where it applies, a depthwise filter gradient with
the batch as channels (a depthwise kernel, or a 1-channel input, see `one_channel_by_depthwise_filter`;
``benchmarks/conv_gradient.py``). A Conv1D is a Conv2D one row high. A SeparableConv2D is a depthwise convolution u then
a 1 x 1 pointwise P: P's gradient is bilinear in u and g, and u's gradient g P^T gives the depthwise kernel's."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from keras_dyndp.tf_backend import keras_compat
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
        """The window of a 2D convolution layer; of a Conv1D, a 1 x k window over its (causally padded) input one
        row high, with the row stride equal to the column stride (the depthwise filter gradients need equal ones)."""
        if len(layer.kernel_size) == 2:
            return cls(tuple(layer.kernel_size), tuple(layer.strides), tuple(layer.dilation_rate), layer.padding)
        padding = "valid" if layer.padding == "causal" else layer.padding
        stride = layer.strides[0]
        return cls((1, layer.kernel_size[0]), (stride, stride), (1, layer.dilation_rate[0]), padding)


def channels_last(layer: keras.layers.Layer) -> bool:
    return layer.data_format == "channels_last"


def supports(layer: keras.layers.Layer) -> bool:
    """Conv1D and Conv2D: channels_last, groups 1; causal padding only on a Conv1D."""
    return channels_last(layer) and layer.groups == 1 and (layer.padding != "causal" or len(layer.kernel_size) == 1)


def call(tap: Tap) -> Callable:
    """Conv1D's and Conv2D's call for the tapped pass, recording its (causally padded) inputs and pre-activation."""
    layer = tap.layer

    def conv_call(inputs, *args, **kwargs):
        inputs = tap.guard(tf.cast(inputs, layer.kernel.dtype))
        if layer.padding == "causal":
            inputs = tf.pad(inputs, [[0, 0], [layer.dilation_rate[0] * (layer.kernel_size[0] - 1), 0], [0, 0]])
        # tf.nn.convolution, as Keras: the CPU's Conv2D kernels have no dilation, it uses space_to_batch there.
        z = tf.nn.convolution(
            inputs,
            tap.weight(layer.kernel),
            strides=tuple(layer.strides),
            padding=Window.of(layer).padding.upper(),
            dilations=tuple(layer.dilation_rate),
        )
        return dense.record_and_activate(tap, inputs, z)

    return conv_call


def norms_and_sums(tap: Tap, g: tf.Tensor) -> list[GhostGradient]:
    """Kernel (`conv_kernel_gradient`; a Conv1D's as a Conv2D kernel one row high); bias."""
    layer, inputs, image_g = tap.layer, tap.inputs, g
    if len(layer.kernel_size) == 1:
        inputs, image_g = inputs[:, None], g[:, None]
    kernel = conv_kernel_gradient(layer.kernel, Window.of(layer), inputs, image_g, tap.rows)
    return norms.with_bias(layer, norms.flatten_positions(g, tap.rows), [kernel])


def depthwise_call(tap: Tap) -> Callable:
    """DepthwiseConv2D's and SeparableConv2D's call for the tapped pass, recording inputs and pre-activation; a
    separable one keeps its depthwise output."""
    layer = tap.layer
    separable = isinstance(layer, keras.layers.SeparableConv2D)
    kernel = keras_compat.depthwise_kernel(layer)

    def call(inputs, *args, **kwargs):
        inputs = tap.guard(tf.cast(inputs, kernel.dtype))
        z = tf.nn.depthwise_conv2d(
            inputs,
            tap.weight(kernel),
            strides=(1,) + tuple(layer.strides) + (1,),
            padding=layer.padding.upper(),
            dilations=tuple(layer.dilation_rate),
        )
        if separable:
            tap.saved["depthwise_output"] = z
            z = tf.nn.conv2d(z, tap.weight(layer.pointwise_kernel), strides=1, padding="VALID")
        return dense.record_and_activate(tap, inputs, z)

    return call


def depthwise_norms_and_sums(tap: Tap, g: tf.Tensor) -> list[GhostGradient]:
    """Depthwise kernel; a separable one's pointwise kernel first (module docstring); bias."""
    layer, g_depthwise, gradients = tap.layer, g, []
    if isinstance(layer, keras.layers.SeparableConv2D):
        pointwise = layer.pointwise_kernel
        pointwise_matrix = tf.reshape(tf.convert_to_tensor(pointwise), pointwise.shape[2:])  # [c_in * m, filters].
        squared, pointwise_sum = norms.bilinear_norms_and_sum(
            norms.flatten_positions(tap.saved["depthwise_output"], tap.rows), norms.flatten_positions(g, tap.rows)
        )
        gradients.append(_reshaped(pointwise, squared, pointwise_sum))
        g_depthwise = tf.tensordot(g, pointwise_matrix, axes=[[3], [1]])
    kernel, window = keras_compat.depthwise_kernel(layer), Window.of(layer)
    gradients.append(depthwise_kernel_gradient(kernel, window, tap.inputs, g_depthwise, tap.rows))
    return norms.with_bias(layer, norms.flatten_positions(g, tap.rows), gradients)


def _reshaped(variable: tf.Variable, squared: tf.Tensor, clipped_sum: Callable) -> GhostGradient:
    return GhostGradient(variable, squared, lambda f: tf.reshape(clipped_sum(f), variable.shape))


# Groups of examples whose depthwise filter gradients are separate ops (see `depthwise_filter_norms_and_sum`).
_DEPTHWISE_PARTS = 4


def _depthwise_filter_gradients(window: Window, inputs: tf.Tensor, g: tf.Tensor) -> tf.Tensor:
    """[kh * kw, N, c_in * m]: image n's depthwise kernel gradient in slice n (``inputs`` [N, H, W, c_in], ``g`` [N,
    OH, OW, c_in * m]) by one ``DepthwiseConv2dNativeBackpropFilter`` of N c_in channels (N images; no dilation)."""
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
    """Per-example kernel-gradient norms and clipped sum [kh * kw, c_in * m] from depthwise filter gradients, the
    batch cut into ``_DEPTHWISE_PARTS`` parallel ops (docs/performance.md); TimeDistributed's images summed per row."""
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
        # sum_b f_b G_b as kh*kw row-vector-matrix products: twice as fast on CPU as the einsum "hwbc,b->hwc"; a
        # factor-0 example's G_b selected out (0 x inf is NaN).
        total = tf.add_n(
            [
                tf.matmul(
                    tf.broadcast_to(f[None, None, start:end], [kernel_positions, 1, end - start]),
                    tf.where(f[None, start:end, None] > 0, gradients, tf.zeros([], gradients.dtype)),
                )
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
    """A convolution input's patches [N, T, kh * kw * c_in], in the kernel's (kh, kw, c_in) order: one ``tf.gather``
    of the padded input's pixels with a static image size, else ``tf.image.extract_patches``."""
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
    return tf.reshape(patches, [tf.shape(inputs)[0], rows.shape[0] * cols.shape[0], kernel_h * kernel_w * channels])


def patch_norms_and_sum(window: Window, inputs: tf.Tensor, g: tf.Tensor, rows: Rows):
    """Per-example kernel-gradient norms and clipped sum from image patches (`norms.bilinear_norms_and_sum`)."""
    patches = norms.flatten_positions(image_patches(window, inputs), rows)
    return norms.bilinear_norms_and_sum(patches, norms.flatten_positions(g, rows))


# Without oneDNN, a 1-channel convolution's kernel gradients come from depthwise filter gradients below this many
# output channels, where TF's own kernel is the faster, else from image patches; with oneDNN always from depthwise
# filter gradients, the faster in most shapes (docs/performance.md, benchmarks/conv_gradient.py).
_DEPTHWISE_FILTERS_BELOW = 16


@functools.cache
def onednn_enabled() -> bool:
    """Whether TensorFlow runs its CPU kernels through oneDNN (``TF_ENABLE_ONEDNN_OPTS`` or TF's default), by a
    private API; without it, False, the safer guess for the choice of kernel (docs/performance.md)."""
    try:
        from tensorflow.python.util import _pywrap_util_port  # pylint: disable=g-direct-tensorflow-import
    except ImportError:
        return False
    return bool(getattr(_pywrap_util_port, "IsMklEnabled", lambda: False)())


def _depthwise_filter_applies(window: Window, inputs: tf.Tensor, g: tf.Tensor) -> bool:
    """No dilation, equal strides (the CPU kernel's limits) and image sizes known while tracing."""
    return (
        window.dilation_rate == (1, 1)
        and window.strides[0] == window.strides[1]
        and inputs.shape[1:].is_fully_defined()
        and g.shape[1:].is_fully_defined()
    )


def one_channel_by_depthwise_filter(window: Window, inputs: tf.Tensor, g: tf.Tensor) -> bool:
    """Whether an ordinary convolution's kernel gradients come from depthwise filter gradients: a 1-channel input,
    `_depthwise_filter_applies`, and oneDNN on or fewer than ``_DEPTHWISE_FILTERS_BELOW`` output channels."""
    return (
        inputs.shape[-1] == 1
        and (onednn_enabled() or g.shape[-1] < _DEPTHWISE_FILTERS_BELOW)
        and _depthwise_filter_applies(window, inputs, g)
    )


def conv_kernel_gradient(
    kernel: tf.Variable, window: Window, inputs: tf.Tensor, g: tf.Tensor, rows: Rows
) -> GhostGradient:
    """Per-example gradients of an ordinary convolution's kernel [kh, kw, c_in, c_out] from its inputs [rows, H, W,
    c_in] and output gradient [rows, OH, OW, c_out]: depthwise filter gradients or image patches."""
    if one_channel_by_depthwise_filter(window, inputs, g):
        return _reshaped(kernel, *depthwise_filter_norms_and_sum(window, inputs, g, rows))
    return _reshaped(kernel, *patch_norms_and_sum(window, inputs, g, rows))


def depthwise_kernel_gradient(
    kernel: tf.Variable, window: Window, inputs: tf.Tensor, g: tf.Tensor, rows: Rows
) -> GhostGradient:
    """Per-example gradients of a depthwise kernel [kh, kw, c_in, m] (``g`` [rows, OH, OW, c_in * m]): depthwise
    filter gradients where they apply, else sum_t patch_{t, c} g_{t, c, j} materialised (the kernel is small)."""
    if _depthwise_filter_applies(window, inputs, g):
        return _reshaped(kernel, *depthwise_filter_norms_and_sum(window, inputs, g, rows))
    kernel_h, kernel_w, channels, multiplier = kernel.shape
    patches = norms.flatten_positions(image_patches(window, inputs), rows)
    patches = tf.reshape(patches, [rows.batch, -1, kernel_h * kernel_w, channels])
    g = tf.reshape(norms.flatten_positions(g, rows), [rows.batch, -1, channels, multiplier])
    per_example = tf.einsum("btkc,btcm->bkcm", patches, g)
    return norms.materialised_gradient(kernel, tf.reshape(per_example, [-1, *kernel.shape]))
