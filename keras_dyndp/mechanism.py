"""The DP-SGD step of keras_dyndp, written once for every backend.

Step t (0-based, t = the optimizer's step counter ``dp_step``) of dynamic DP-SGD (Abadi et al. 2016; Du et al.,
Dynamic DP-SGD, Alg. 2) releases

    update_t = (sum_i clip(g_i, C_t) + N(0, (s sigma_t)^2 I)) / n_t,

1. `schedule_values`: C_t = ``schedule.clip_norms[t]`` and sigma_t = ``schedule.noise_stddevs[t]``; both 0 past the
   schedule's T steps, or when the step may not run (a step counter restored from another schedule), so that a
   step the checks should stop releases nothing about the data even where XLA drops TensorFlow's assertions;
2. `clip_factors`: g_i, the gradient of example (or microbatch) i flattened over ALL trainable variables, is scaled
   by min(1, C_t / ||g_i||_2) (the backends contract the factors with the gradients);
3. `noise_stddev`: Gaussian noise is added ONCE, to the SUM, with std s sigma_t, where s is the sensitivity in clip
   norms (`sensitivity`). sigma_t is absolute: the noise multiplier is z_t = sigma_t / C_t and each step is
   (C_t / sigma_t)-GDP (on the sum, not the mean: tensorflow/privacy#153, opacus#753);
4. `normaliser`: the noisy sum is divided by n_t and handed to the base optimizer's update rule (post-processing,
   so Adam, Adagrad and RMSprop are as private as SGD):
   * per-example clipping: n = ``expected_batch_size`` = p N, a public constant (as in the paper's g_t and in
     Opacus): under Poisson sampling the batch's size is itself private, and so are the rows of a padded batch.
     Only with ``public_batch_size=True`` (fixed-size batches, outside the Poisson accounting) is n the batch's
     rows, at least 1 (an empty batch applies pure noise);
   * microbatches (``num_microbatches`` = M): n = M, a constant;
   * ``rescale_to_unit_norm=True`` multiplies n by C_t: the update is the mean of per-example gradients rescaled to
     norm at most 1 plus noise of std z_t / n (De et al. 2022). Privacy is unchanged; a decaying C_t then no
     longer shrinks the step as a learning-rate schedule would.
   A normaliser of 0 (C_t = 0 with ``rescale_to_unit_norm``) gives a zero update.

Microbatches. With M microbatches every row joins one of them uniformly at random, per row and per step, from the
optimizer's noise source (never from its position or the data); microbatch j's loss is the sum of its rows' losses
over the number of its rows with a non-zero loss, and each microbatch gradient is clipped. Placing rows by position
is unsound: in a Poisson batch adding one example shifts others into other microbatches (a neighbour moved the
clipped sum by 4 C). Sensitivity 2 C: couple the memberships of D and D' = D + {x} by drawing every row's
microbatch once (i.i.d. and position-free, so each batch's membership keeps its law); every microbatch but x's holds
the same examples and the same clipped gradient, and x's moves from one vector of norm <= C to another, by at most
2 C. For a fixed membership the outputs are N(s, 4 sigma^2 I) and N(s + v, 4 sigma^2 I) with ||v|| <= 2 C, dominated
by N(0, 1) vs N(C / sigma, 1); the released law mixes such pairs, and the hockey-stick and Renyi divergences are
jointly convex, so each step is dominated by ``PoissonSampledDpEvent(p, GaussianDpEvent(sigma / C))``, what the
schedule accounts. Hence s = 2 on EVERY step (a scale chosen from the batch size would depend on the data).
Microbatches cost twice the noise of per-example clipping: use them only when per-example gradients are too slow.

What is protected: each example under add-or-remove-one adjacency, with Poisson sampling at the schedule's rate
assumed by the accounting, and every intermediate model released.

Primitives. Each function takes ``ops``, a backend's small set of array primitives (`keras_dyndp.tf_backend.
clip_and_noise.OPS`, `keras_dyndp.jax_backend.ops.OPS`; numpy in the tests): ``where``, ``minimum``, ``maximum``,
``take(values, index)``, ``cast(x, dtype)``, ``divide_no_nan(x, y)`` (0 where y is 0) and ``normals(source,
tensors)`` (independent standard normal float32 draws shaped like each tensor, from a generator or key). This module
imports neither TensorFlow nor JAX.

References:
  Abadi et al., Deep Learning with Differential Privacy, https://arxiv.org/abs/1607.00133
  Du et al., Dynamic Differential-Privacy Preserving SGD.
  De et al., Unlocking High-Accuracy Differentially Private Image Classification through Scale, 2022.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def schedule_values(ops: Any, clip_norms: Any, noise_stddevs: Any, step: Any, num_steps: int, may_run: Any = None):
    """float32 (C_t, sigma_t) at step counter ``step``: index min(step, T - 1); both 0 when ``step`` >= T =
    ``num_steps`` or where the bool ``may_run`` (None: always) is False."""
    index = ops.minimum(step, num_steps - 1)
    live = step < num_steps
    if may_run is not None:
        live = live & may_run
    zero = ops.cast(0.0, "float32")
    return ops.where(live, ops.take(clip_norms, index), zero), ops.where(live, ops.take(noise_stddevs, index), zero)


def clip_factors(ops: Any, norms: Any, clip_norm: Any) -> Any:
    """min(1, C / ||g||) per gradient norm, as C / max(||g||, C): a zero gradient gets 1, and C = 0 gives 0."""
    clip_norm = ops.cast(clip_norm, norms.dtype)
    return ops.divide_no_nan(clip_norm, ops.maximum(norms, clip_norm))


def sensitivity(num_microbatches: int | None) -> float:
    """How far one example can move the clipped sum, in units of C_t: 1 per example, 2 with microbatches."""
    return 1.0 if num_microbatches is None else 2.0


def noise_stddev(sigma: Any, num_microbatches: int | None) -> Any:
    """The std of the noise on the clipped sum: the sensitivity times sigma_t."""
    return sensitivity(num_microbatches) * sigma


def normaliser(
    ops: Any,
    *,
    clip_norm: Any,
    num_rows: Any,
    expected_batch_size: float | None,
    num_microbatches: int | None,
    rescale_to_unit_norm: bool,
) -> Any:
    """float32 n_t: ``num_microbatches`` (all the step's microbatches), else ``expected_batch_size``, else the
    batch's rows (at least 1; ``public_batch_size``); times C_t with ``rescale_to_unit_norm``."""
    if num_microbatches is not None:
        result = ops.cast(num_microbatches, "float32")
    elif expected_batch_size is not None:
        result = ops.cast(expected_batch_size, "float32")
    else:
        result = ops.maximum(ops.cast(num_rows, "float32"), 1.0)
    return result * clip_norm if rescale_to_unit_norm else result


def add_noise(ops: Any, clipped_sums: Sequence[Any], stddev: Any, noise_source: Any) -> list[Any]:
    """Each clipped sum plus N(0, stddev^2 I), drawn from ``noise_source`` alone, once per sum."""
    noises = ops.normals(noise_source, clipped_sums)
    return [total + ops.cast(stddev * noise, total.dtype) for total, noise in zip(clipped_sums, noises)]


def private_update(
    ops: Any,
    clipped_sums: Sequence[Any],
    noise_source: Any,
    *,
    clip_norm: Any,
    sigma: Any,
    num_rows: Any,
    expected_batch_size: float | None,
    num_microbatches: int | None,
    rescale_to_unit_norm: bool,
) -> list[Any]:
    """Steps 3 and 4 of the module docstring: (clipped sum + noise) / normaliser for each sum, the update that the
    base optimizer applies."""
    n = normaliser(
        ops,
        clip_norm=clip_norm,
        num_rows=num_rows,
        expected_batch_size=expected_batch_size,
        num_microbatches=num_microbatches,
        rescale_to_unit_norm=rescale_to_unit_norm,
    )
    noised = add_noise(ops, clipped_sums, noise_stddev(sigma, num_microbatches), noise_source)
    return [ops.divide_no_nan(total, ops.cast(n, total.dtype)) for total in noised]  # n = 0: a zero update
