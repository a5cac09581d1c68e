"""TensorFlow's primitives of the DP step (`OPS`, for `keras_dyndp.core.mechanism`) and its per-example clipping kernel:
stateless (the noise generator is passed in), XLA-compatible, shared by the optimizers and `per_example`."""

from __future__ import annotations

import math
import types
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from keras_dyndp.core import adaptive_clipping
from keras_dyndp.core import mechanism
from keras_dyndp.rules import layer_rules

OPS = types.SimpleNamespace(
    where=tf.where,
    minimum=tf.minimum,
    maximum=tf.maximum,
    take=tf.gather,
    cast=tf.cast,
    divide_no_nan=tf.math.divide_no_nan,
    is_finite=tf.math.is_finite,
    sqrt=tf.sqrt,
    exp=tf.exp,
    mean=tf.reduce_mean,
    normals=lambda generator, tensors: [standard_normals(generator, t.shape, tf.shape(t)) for t in tensors],
)
"""`keras_dyndp.core.mechanism`'s primitives in TensorFlow; ``normals`` draws from a `tf.random.Generator`."""


def standard_normals(generator: tf.random.Generator, static_shape: tf.TensorShape, shape: tf.Tensor) -> tf.Tensor:
    """float32 N(0, 1) of ``static_shape`` (``shape`` where not fully defined) from ``generator`` alone: Box-Muller
    on the generator's uniforms, as ``generator.normal`` computes its normals from the same Philox stream (largest
    |z| sqrt(2 log 2^23) = 5.6, as there), in vectorized kernels (why: docs/performance.md). A static shape adds no
    dependency on the tensor noised, so the draw can run before it is computed."""
    size = static_shape.num_elements() if static_shape.is_fully_defined() else tf.reduce_prod(shape)
    uniforms = generator.uniform(tf.stack([2, (size + 1) // 2]), dtype=tf.float32)
    radius = tf.sqrt(-2.0 * tf.math.log(1.0 - uniforms[0]))
    angle = (2.0 * math.pi) * uniforms[1]
    normals = tf.concat([radius * tf.cos(angle), radius * tf.sin(angle)], axis=0)[:size]
    return tf.reshape(normals, static_shape if static_shape.is_fully_defined() else shape)


def zeros_where_unconnected(
    grads: Sequence[tf.Tensor | tf.IndexedSlices | None], var_list: Sequence, outer_shape: Sequence = ()
) -> list[tf.Tensor]:
    """``grads`` dense, each None (a variable the loss does not use) replaced by zeros of ``outer_shape`` + the
    variable's shape. ``tape.gradient``'s own ``UnconnectedGradients.ZERO`` cannot do it for Keras 3 variables (their
    dtype is a string there), such as the untied output embedding a KerasHub backbone holds but does not call."""
    return [
        tf.zeros([*outer_shape, *v.shape], tf.as_dtype(v.dtype)) if g is None else tf.convert_to_tensor(g)
        for g, v in zip(grads, var_list)
    ]


def per_example_global_norms(per_example_grads: Sequence[tf.Tensor | None]) -> tf.Tensor:
    """float32 [N]: the L2 norm of each example's gradient over all variables (one tensor [N, *shape] per variable;
    None counts as zero). ValueError if every entry is None."""
    flat = [
        tf.reshape(tf.cast(g, tf.float32), tf.stack([tf.shape(g)[0], -1])) for g in per_example_grads if g is not None
    ]
    squares = [tf.reduce_sum(tf.square(grad), axis=1) for grad in flat]
    if not squares:
        raise ValueError("`per_example_grads` must contain at least one tensor. Received only None.")
    return tf.sqrt(tf.add_n(squares))


def clip_factors(norms: tf.Tensor, clip_norm: tf.Tensor | float) -> tf.Tensor:
    """Per-example clipping factors min(1, clip_norm / norms) (`keras_dyndp.core.mechanism.clip_factors`), [N]."""
    return mechanism.clip_factors(OPS, norms, clip_norm)


def clip_by_global_norm_per_example(
    per_example_grads: Sequence[tf.Tensor | None], clip_norm: tf.Tensor | float
) -> tuple[list[tf.Tensor | None], tf.Tensor]:
    """``(clipped_sums, norms)``: each example's gradient clipped to global L2 norm ``clip_norm`` and summed, as one
    contraction of the factors with the gradients (None stays None), and the float32 [N] unclipped norms."""
    norms = per_example_global_norms(per_example_grads)
    return clipped_sums(per_example_grads, norms, clip_norm), norms


def clipped_sums(
    per_example_grads: Sequence[tf.Tensor | None], norms: tf.Tensor, clip_norm: tf.Tensor | float
) -> list[tf.Tensor | None]:
    """Each example's gradient (one tensor [N, *shape] per variable; None stays None) clipped to ``clip_norm`` by its
    global ``norms`` [N] (`per_example_global_norms`) and summed."""
    factors = clip_factors(norms, clip_norm)
    return [None if grad is None else layer_rules.weighted_sum(factors, grad) for grad in per_example_grads]


def centred_count(norms: tf.Tensor, clip_norm: tf.Tensor, rows: tf.Tensor | None = None) -> tf.Tensor:
    """float32 sum of adaptive clipping's `keras_dyndp.core.adaptive_clipping.centred_indicators` of the gradient
    ``norms`` [N] at ``clip_norm``, over the bool ``rows`` [N] (None: all: microbatches)."""
    rows = tf.ones(tf.shape(norms), tf.bool) if rows is None else rows
    return tf.reduce_sum(adaptive_clipping.centred_indicators(OPS, norms, clip_norm, rows))


def add_gaussian_noise(
    tensors: Sequence[tf.Tensor], noise_stddev: tf.Tensor | float, *, generator: tf.random.Generator
) -> list[tf.Tensor]:
    """Adds N(0, noise_stddev^2) (absolute: sigma_t = z_t C_t) to every coordinate, drawn from ``generator`` alone
    (`noise_source`), never from TensorFlow's global seed."""
    return mechanism.add_noise(OPS, tensors, tf.cast(noise_stddev, tf.float32), generator)


def vjp(function: Callable[[list], Any], primals: list, cotangent: Any) -> list:
    """The gradients of ``<function(primals), cotangent>`` with respect to the list ``primals`` (zeros if unused)."""
    with tf.GradientTape() as tape:
        tape.watch(primals)
        outputs = function(primals)
    return tape.gradient(outputs, primals, output_gradients=cotangent, unconnected_gradients="zero")
