"""Per-example kernel gradients of a 1-channel Conv2D in TensorFlow: depthwise filter gradients against image
patches, and the batch's own filter gradient for scale, interleaved in one run.

The Conv2D rule (`keras_dyndp.tf_backend.per_example.conv2d`) has two forms for a 1-channel input (a grayscale image's
first convolution): a depthwise filter gradient that treats the batch as channels, and image patches with a batched
matmul. Which is faster depends on the output channels and on whether TensorFlow uses oneDNN;
`conv2d.one_channel_by_depthwise_filter` picks by them.
This prints, per shape, both forms' time for the norms and the clipped sum, and which form the rule picks, so the
choice can be checked on another machine or TensorFlow.

Usage: [TF_ENABLE_ONEDNN_OPTS=0|1] python benchmarks/conv_gradient.py [--batch_size 256 --image 28 --repeats 5]
"""

from __future__ import annotations

import itertools
import platform

import interleaved  # benchmarks/interleaved.py (this script's directory is on sys.path)
import numpy as np
import tensorflow as tf
from absl import app
from absl import flags

from keras_dyndp.tf_backend.per_example import conv2d
from keras_dyndp.tf_backend.per_example.taps import Rows

FLAGS = flags.FLAGS
flags.DEFINE_integer("batch_size", 256, "Examples per call.")
flags.DEFINE_integer("image", 28, "Height and width of the 1-channel input.")
flags.DEFINE_list("kernels", ["3", "5", "8"], "Kernel sizes (square).")
flags.DEFINE_list("filters", ["4", "8", "12", "15", "16", "32", "64"], "Output channels.")
flags.DEFINE_list("strides", ["1", "2"], "Strides (both axes); padding 'same'.")
flags.DEFINE_integer("calls", 5, "Timed calls per repetition.")
flags.DEFINE_integer("repeats", 5, "Interleaved repetitions; the median is reported.")


def _forms(window: conv2d.Window, inputs: tf.Tensor, g: tf.Tensor) -> dict:
    rows = Rows.of_batch(inputs)
    factors = tf.random.uniform([inputs.shape[0]])

    def timed(norms_and_sum):
        def run():
            squared, kernel_sum = norms_and_sum(window, inputs, g, rows)
            return squared, kernel_sum(factors)

        return tf.function(run)

    def batch_gradient():
        return tf.raw_ops.Conv2DBackpropFilter(
            input=inputs,
            filter_sizes=[*window.kernel_size, 1, g.shape[-1]],
            out_backprop=g,
            strides=[1, *window.strides, 1],
            padding=window.padding.upper(),
        )

    return {
        "depthwise filter": timed(conv2d.depthwise_filter_norms_and_sum),
        "image patches": timed(conv2d.patch_norms_and_sum),
        "batch gradient": tf.function(batch_gradient),
    }


def main(argv):
    del argv  # Unused.
    rng = np.random.default_rng(0)
    size = FLAGS.image
    inputs = tf.constant(rng.normal(size=(FLAGS.batch_size, size, size, 1)).astype("float32"))
    onednn = "on" if conv2d.onednn_enabled() else "off"
    print(
        f"TensorFlow {tf.__version__}, oneDNN {onednn} (TF_ENABLE_ONEDNN_OPTS), "
        f"{platform.processor() or platform.machine()}, batch {FLAGS.batch_size}"
    )
    print("| kernel | stride | filters | depthwise filter ms | image patches ms | batch gradient ms | picked |")
    print("|---|---|---|---|---|---|---|")
    for kernel, filters, stride in itertools.product(
        map(int, FLAGS.kernels), map(int, FLAGS.filters), map(int, FLAGS.strides)
    ):
        window = conv2d.Window((kernel, kernel), (stride, stride), (1, 1), "same")
        out = -(-size // stride)
        g = tf.constant(rng.normal(size=(FLAGS.batch_size, out, out, filters)).astype("float32"))
        forms = _forms(window, inputs, g)
        depthwise, patches = forms["depthwise filter"](), forms["image patches"]()
        np.testing.assert_allclose(depthwise[0].numpy(), patches[0].numpy(), rtol=1e-4)
        medians = interleaved.median_milliseconds(forms, FLAGS.calls, FLAGS.repeats)
        picked = "depthwise filter" if conv2d.one_channel_by_depthwise_filter(window, inputs, g) else "image patches"
        print(
            f"| {kernel}x{kernel} | {stride} | {filters} | "
            f"{medians['depthwise filter']:.2f} | {medians['image patches']:.2f} | {medians['batch gradient']:.2f} | "
            f"{picked} |"
        )


if __name__ == "__main__":
    app.run(main)
