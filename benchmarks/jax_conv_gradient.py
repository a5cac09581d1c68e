"""Per-example kernel-gradient norms of single convolutions on JAX: keras_dyndp's Conv2D ghost rule
(`keras_dyndp.jax_backend.per_example.rules`: in the form `ghost_cost` picks, from input patches or one batched matmul
per kernel offset) against ``jax.vmap`` of the convolution's vjp (which XLA compiles to a convolution grouped by
example) and the batch's own kernel gradient (what the non-private step pays), interleaved in one run.

Shapes: the paper CNN's two convolutions at batch 256 and WideResNet-16-4's 3x3 convolutions of each group at
batch 32 (``--batch_scale`` multiplies both batches).

Usage: python benchmarks/jax_conv_gradient.py [--steps 3 --repeats 5 --batch_scale 1]
"""

from __future__ import annotations

import os

os.environ["KERAS_BACKEND"] = "jax"

import functools  # noqa: E402

import interleaved  # noqa: E402  (benchmarks/interleaved.py)
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import keras  # noqa: E402
from absl import app  # noqa: E402
from absl import flags  # noqa: E402

from keras_dyndp.rules import ghost_cost  # noqa: E402
from keras_dyndp.rules import registry  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_integer("steps", 3, "Timed calls per repetition.")
flags.DEFINE_integer("repeats", 5, "Interleaved repetitions; the median is reported.")
flags.DEFINE_integer("batch_scale", 1, "Multiplies every shape's batch size.")

SHAPES = {  # name: (batch, input [H, W, C], Conv2D arguments)
    "CNN conv 1 (8x8/2, 1->16)": (256, (28, 28, 1), dict(filters=16, kernel_size=8, strides=2, padding="same")),
    "CNN conv 2 (4x4/2, 16->32)": (256, (13, 13, 16), dict(filters=32, kernel_size=4, strides=2)),
    "WRN group 1 (3x3, 64->64 at 32x32)": (32, (32, 32, 64), dict(filters=64, kernel_size=3, padding="same")),
    "WRN group 2 (3x3, 128->128 at 16x16)": (32, (16, 16, 128), dict(filters=128, kernel_size=3, padding="same")),
    "WRN group 3 (3x3, 256->256 at 8x8)": (32, (8, 8, 256), dict(filters=256, kernel_size=3, padding="same")),
}


def _functions(layer: keras.layers.Conv2D) -> dict:
    kernel = layer.kernel.value

    def vjp(a, g):
        return jax.vjp(lambda k: layer.convolution_op(a, k), kernel)[1](g)[0]

    def vmap_norms(a, g):
        per_example = jax.vmap(lambda a_i, g_i: vjp(a_i[None], g_i[None]))(a, g)
        return jnp.sum(per_example.reshape(a.shape[0], -1) ** 2, axis=1)

    def rule_norms(a, g):
        return registry.registered()[keras.layers.Conv2D].norms_and_sums(layer, a[:, None], g[:, None])[0]

    return {"batch gradient": jax.jit(vjp), "vmap of the vjp": jax.jit(vmap_norms), "ghost rule": jax.jit(rule_norms)}


def main(argv):
    del argv  # Unused.
    print(f"JAX {jax.__version__} on {jax.devices()[0].platform}; median ms per call, {FLAGS.repeats} repetitions")
    print("| convolution | batch | form | batch gradient | vmap of the vjp | ghost rule | vmap / rule | norms' bound |")
    print("|---|---|---|---|---|---|---|---|")
    for name, (batch, shape, arguments) in SHAPES.items():
        batch *= FLAGS.batch_scale
        layer = keras.layers.Conv2D(**arguments)
        layer.build((batch, *shape))
        a = jax.random.normal(jax.random.PRNGKey(0), (batch, *shape))
        g = jax.random.normal(jax.random.PRNGKey(1), (batch, *layer.compute_output_shape((batch, *shape))[1:]))
        functions = _functions(layer)
        vmapped, rule = functions["vmap of the vjp"](a, g), functions["ghost rule"](a, g)
        # The rule's norms are never below the exact ones: its rounding bound (ghost_cost.bounded_squared_norms) lifts
        # them, most where the Gram form sums many positions.
        excess = float(jnp.max(rule / vmapped)) - 1
        assert float(jnp.min(rule / vmapped)) > 1 - 1e-4 and excess < 0.1, "the rule's norms differ from vmap's"
        calls = {key: functools.partial(f, a, g) for key, f in functions.items()}
        ms = interleaved.median_milliseconds(calls, FLAGS.steps, FLAGS.repeats, jax.block_until_ready)
        fan_in = layer.kernel.shape[0] * layer.kernel.shape[1] * shape[2]
        form = ghost_cost.form(g.shape[1] * g.shape[2], fan_in, arguments["filters"])
        print(
            f"| {name} | {batch} | {form} | {ms['batch gradient']:.1f} | {ms['vmap of the vjp']:.1f} "
            f"| {ms['ghost rule']:.1f} | {ms['vmap of the vjp'] / ms['ghost rule']:.2f}x | +{excess:.2%} |"
        )


if __name__ == "__main__":
    app.run(main)
