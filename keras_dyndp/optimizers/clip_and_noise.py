"""The Gaussian mechanism of one DP-SGD step, as small pure-TensorFlow functions.

One DP-SGD step (Abadi et al. 2016; Du et al., Dynamic DP-SGD, Alg. 2) releases

    noisy_sum = sum_i clip(g_i, C_t) + N(0, sigma_t^2 I),

where g_i is the gradient of example (or microbatch) i flattened over ALL trainable variables, clip scales g_i by
min(1, C_t / ||g_i||_2), and the noise of absolute standard deviation sigma_t is added ONCE, to the SUM. The noise
multiplier that privacy depends on is z_t = sigma_t / C_t (TF-Privacy's `noise_multiplier`; Opacus's
`noise_multiplier`); normalising the noisy sum afterwards (dividing by the batch size) is post-processing and
changes no privacy. These functions hold no state (the noise generator is passed in), never read Python values at
run time and compile under XLA, so the optimizers and the fast per-example path share one implementation of the
mechanism.

References:
  Abadi et al., Deep Learning with Differential Privacy, https://arxiv.org/abs/1607.00133
  Du et al., Dynamic Differential-Privacy Preserving SGD.
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf


def per_example_global_norms(per_example_grads: Sequence[tf.Tensor | None]) -> tf.Tensor:
    """L2 norm of each example's gradient taken across all variables at once (the "global" norm).

    Args:
      per_example_grads: one tensor [N, *variable_shape] per variable; row i is example i's gradient. `None`
        entries (variables the loss does not depend on) count as zero.

    Returns:
      float32 tensor [N] of global norms.

    Raises:
      ValueError: if every entry is `None` (the number of examples is then unknown).
    """
    squares = []
    for grad in per_example_grads:
        if grad is None:
            continue
        grad = tf.cast(grad, tf.float32)
        flat = tf.reshape(grad, tf.stack([tf.shape(grad)[0], -1]))
        squares.append(tf.reduce_sum(tf.square(flat), axis=1))
    if not squares:
        raise ValueError("`per_example_grads` must contain at least one tensor. Received only None.")
    return tf.sqrt(tf.add_n(squares))


def clip_factors(norms: tf.Tensor, clip_norm: tf.Tensor | float) -> tf.Tensor:
    """Per-example clipping factors min(1, clip_norm / norms), computed as clip_norm / max(norm, clip_norm).

    A zero gradient gets factor 1 (no 0/0), and `clip_norm` = 0 gives factor 0 for every example (the optimizers'
    data-independent step once the budget is spent).

    Args:
      norms: tensor [N] of per-example global L2 norms.
      clip_norm: the clipping threshold C >= 0, a scalar.

    Returns:
      Tensor [N] of factors in [0, 1], of the dtype of `norms`.
    """
    clip_norm = tf.cast(clip_norm, norms.dtype)
    return tf.math.divide_no_nan(clip_norm, tf.maximum(norms, clip_norm))


def clip_by_global_norm_per_example(
    per_example_grads: Sequence[tf.Tensor | None], clip_norm: tf.Tensor | float
) -> tuple[list[tf.Tensor | None], tf.Tensor]:
    """Clips each example's gradient to global L2 norm `clip_norm` and sums over examples, vectorized.

    Example i is scaled by clip_norm / max(||g_i||, clip_norm), i.e. min(1, clip_norm / ||g_i||). A zero gradient
    gets factor 1 (no 0/0), and `clip_norm` = 0 gives factor 0 for every example (a data-independent zero sum,
    which the optimizers use once the budget is spent). The sum is a contraction of the factors with the gradients
    (`tf.tensordot`), so the clipped per-example gradients are never materialised.

    Args:
      per_example_grads: one tensor [N, *variable_shape] per variable (`None` for variables without a gradient).
      clip_norm: the clipping threshold C >= 0, a scalar.

    Returns:
      `(clipped_sums, norms)`: `clipped_sums[j]` has variable j's shape and dtype (`None` where the input was
      `None`); `norms` is the float32 tensor [N] of unclipped global norms.
    """
    norms = per_example_global_norms(per_example_grads)
    factors = clip_factors(norms, clip_norm)
    clipped_sums = [
        None if grad is None else tf.tensordot(tf.cast(factors, grad.dtype), grad, axes=1) for grad in per_example_grads
    ]
    return clipped_sums, norms


def add_gaussian_noise(
    tensors: Sequence[tf.Tensor], noise_stddev: tf.Tensor | float, *, generator: tf.random.Generator
) -> list[tf.Tensor]:
    """Adds independent N(0, noise_stddev^2) noise to every coordinate of every tensor.

    `noise_stddev` is ABSOLUTE: pass sigma_t = z_t * C_t when `tensors` are sums of gradients clipped to C_t.
    The noise comes from `generator` alone, never from TensorFlow's global seed: the optimizers pass their own
    generator, seeded from OS entropy and kept out of checkpoints (`keras_dyndp.optimizers.noise_source`), so the
    noise cannot be repeated by a seed or replayed by a restore. Each call advances the generator.

    Args:
      tensors: the clipped sums, one per variable.
      noise_stddev: the standard deviation sigma >= 0, a scalar.
      generator: the `tf.random.Generator` to draw from.

    Returns:
      The noised tensors, same shapes and dtypes.
    """
    noise_stddev = tf.cast(noise_stddev, tf.float32)
    noised = []
    for tensor in tensors:
        noise = generator.normal(tf.shape(tensor), stddev=noise_stddev, dtype=tf.float32)
        noised.append(tensor + tf.cast(noise, tensor.dtype))
    return noised
