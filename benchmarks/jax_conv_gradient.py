"""Per-example kernel gradients of the paper's CNN convolutions on JAX: ``jax.vmap`` of the convolution against an
im2col form (image patches and a batched matmul), and the batch's own gradient, interleaved in one run.

Why keras_dyndp's JAX step has no rule of its own for convolutions: if an im2col form's per-example gradients were
cheaper than ``jax.vmap``'s, a rule like the Embedding taps would pay. The network is the CNN's two convolutions
(16 filters 8x8 stride 2 'same', max-pool 2/1, 32 filters 4x4 stride 2 'valid', ReLU) with a sum-of-squares loss.

Usage: python benchmarks/jax_conv_gradient.py [--batch_size 256 --steps 5 --repeats 5]
"""

from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp
from absl import app
from absl import flags

FLAGS = flags.FLAGS
flags.DEFINE_integer("batch_size", 256, "Examples per step.")
flags.DEFINE_integer("steps", 5, "Timed calls per repetition.")
flags.DEFINE_integer("repeats", 5, "Interleaved repetitions; the median is reported.")

DIMENSIONS = ("NHWC", "HWIO", "NHWC")


def _conv(x, kernel, stride, padding):
    return jax.lax.conv_general_dilated(x, kernel, (stride, stride), padding, dimension_numbers=DIMENSIONS)


def _conv_im2col(x, kernel, stride, padding):
    height, width, channels, filters = kernel.shape
    patches = jax.lax.conv_general_dilated_patches(
        x, (height, width), (stride, stride), padding, dimension_numbers=DIMENSIONS
    )  # [N, OH, OW, channels * height * width], channel-major
    return patches @ jnp.transpose(kernel, (2, 0, 1, 3)).reshape(channels * height * width, filters)


def _loss(kernels, x, conv):
    h = jax.nn.relu(conv(x, kernels[0], 2, "SAME"))
    h = jax.lax.reduce_window(h, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 1, 1, 1), "VALID")
    return jnp.sum(jax.nn.relu(conv(h, kernels[1], 2, "VALID")) ** 2)


def main(argv):
    del argv  # Unused.
    key = jax.random.PRNGKey(0)
    x = jax.random.normal(key, (FLAGS.batch_size, 28, 28, 1))
    kernels = [jax.random.normal(key, (8, 8, 1, 16)) * 0.1, jax.random.normal(key, (4, 4, 16, 32)) * 0.1]
    functions = {
        "batch gradient": jax.jit(lambda k, x: jax.grad(_loss)(k, x, _conv)),
        "per-example, vmap of the convolution": jax.jit(
            lambda k, x: jax.vmap(lambda row: jax.grad(_loss)(k, row[None], _conv))(x)
        ),
        "per-example, vmap of im2col": jax.jit(
            lambda k, x: jax.vmap(lambda row: jax.grad(_loss)(k, row[None], _conv_im2col))(x)
        ),
    }
    for function in functions.values():
        jax.block_until_ready(function(kernels, x))  # compile
    seconds = {name: [] for name in functions}
    for _ in range(FLAGS.repeats):
        for name, function in functions.items():
            start = time.perf_counter()
            for _ in range(FLAGS.steps):
                jax.block_until_ready(function(kernels, x))
            seconds[name].append((time.perf_counter() - start) / FLAGS.steps)
    print(f"JAX {jax.__version__} on {jax.devices()[0].platform}, batch {FLAGS.batch_size}, medians:")
    for name, values in seconds.items():
        print(f"  {name}: {1e3 * statistics.median(values):.1f} ms")


if __name__ == "__main__":
    app.run(main)
