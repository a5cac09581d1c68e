"""The DP-SGD step, written once for every backend. Step t (t = the optimizer's ``dp_step``) releases

    update_t = (sum_i clip(g_i, C_t) + N(0, (s sigma_t)^2 I)) / n_t,

g_i example (or microbatch) i's gradient over ALL trainable variables, clipped to C_t; the noise added ONCE, to the
SUM (tensorflow/privacy#153, opacus#753), s the sensitivity in clip norms; n_t the public normaliser, so the base
optimizer (SGD, Adam, ...) only post-processes. Which function makes which decision: docs/architecture.md, "The DP
step, once". Protected: each example under add-or-remove-one adjacency, Poisson sampling at the schedule's rate,
every intermediate model released.

Microbatches: each row joins one of M microbatches uniformly at random, per row and per step, from the noise source
(never by position: adding one example would shift others, moving the clipped sum by 4 C). Sensitivity 2 C: coupling
D and D' = D + {x} by drawing every row's microbatch once, only x's microbatch changes, by at most 2 C; the released
law mixes such pairs, and the hockey-stick and Renyi divergences are jointly convex, so each step is dominated by
``PoissonSampledDpEvent(p, GaussianDpEvent(sigma / C))``. Hence s = 2 on EVERY step (a data-dependent scale would leak).

``ops``: a backend's array primitives (`keras_dyndp.tf_backend.ops.OPS`, `keras_dyndp.jax_backend.ops.OPS`; numpy in
the tests): ``where``, ``minimum``, ``maximum``, ``take(values, index)``, ``cast(x, dtype)``, ``divide_no_nan(x, y)``
(0 where y is 0), ``is_finite``, ``sqrt``, ``mean(x, axes)``, ``normals(source, tensors)`` (standard normal float32
draws shaped like each tensor). References: Abadi et al. 2016 (arXiv:1607.00133), Du et al., De et al. 2022.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def schedule_values(
    ops: Any, clip_norms: Any, noise_stddevs: Any, step: Any, num_steps: int, may_run: Any = None, scale: Any = None
):
    """float32 (C_t, sigma_t) at step counter ``step``: index min(step, T - 1), times ``scale`` (None: 1; adaptive
    clipping's C_t over arrays (1, z_g,t)); both 0 where ``step`` >= T or the bool ``may_run`` (None: true) is False."""
    index = ops.minimum(step, num_steps - 1)
    live = step < num_steps if may_run is None else (step < num_steps) & may_run
    zero = ops.cast(0.0, "float32")
    clip_norm, noise = ops.take(clip_norms, index), ops.take(noise_stddevs, index)
    if scale is not None:
        clip_norm, noise = clip_norm * scale, noise * scale
    return ops.where(live, clip_norm, zero), ops.where(live, noise, zero)


def per_example_losses(ops: Any, losses: Any, weights: Any = None) -> Any:
    """float32 [B]: example i's loss, whose gradient is g_i, from a loss function's unreduced ``losses`` ([B] or [B,
    ...], e.g. [B, L] per token) and the sample ``weights`` (None: 1; [B], [B, 1], or the losses' leading axes such as a
    [B, L] padding mask). Each example is reduced alone, as Keras's default reduction weighs it: the mean over its
    positions of weight x loss (a [B, L] mask: divided by L, the public padded length), never by a batch statistic
    (Keras's 'mean_with_sample_weight' would mix token counts). ValueError for ``weights`` axes beyond the losses'."""
    losses = ops.cast(losses, "float32")
    rank = len(losses.shape)
    if weights is None:
        return _mean_from_axis(ops, losses, 1)
    weights = ops.cast(weights, "float32")
    while len(weights.shape) > rank and weights.shape[-1] == 1:
        weights = weights[..., 0]
    if len(weights.shape) > rank:
        error = ValueError(
            "`sample_weight` must hold one weight per example ([B]) or per loss entry (the losses' leading axes, "
            "e.g. [B, L] per token): return the loss per entry (a per-token loss), or give one weight per example. "
            f"Received: sample_weight of axes {tuple(weights.shape[1:])} after the batch axis, for losses of axes "
            f"{tuple(losses.shape[1:])}."
        )
        error.ag_pass_through = True  # raised as is from a traced step (`keras_dyndp.core.refusals.user_error`)
        raise error
    # Weight x loss averaged over each example's positions; a weight constant over the trailing axes comes out.
    losses = _mean_from_axis(ops, losses, max(len(weights.shape), 1))
    return _mean_from_axis(ops, losses * weights, 1)


def _mean_from_axis(ops: Any, values: Any, axis: int) -> Any:
    """``values``' mean over its axes from ``axis`` on (itself where it has none)."""
    axes = tuple(range(axis, len(values.shape)))
    return ops.mean(values, axes) if axes else values


def norms_from_squares(ops: Any, squared_norms: Any) -> Any:
    """sqrt of each per-example squared norm; +inf where it is negative or NaN (a rule's rounding went wrong, or its
    values were not finite), never a clamp to 0, which would let it through unclipped: `clip_factors` gives it 0."""
    return ops.sqrt(ops.where(squared_norms >= 0, squared_norms, ops.cast(float("inf"), squared_norms.dtype)))


def clip_factors(ops: Any, norms: Any, clip_norm: Any) -> Any:
    """min(1, C / ||g||) per gradient norm, as C / max(||g||, C): 1 for a zero gradient, 0 for C = 0 and for a norm
    that is not finite (a NaN or inf input, loss or gradient, or an overflow), whose row must then add exactly nothing
    (``weighted_sum``: a select, 0 x inf being NaN), neither turning the release NaN nor showing it was sampled."""
    clip_norm = ops.cast(clip_norm, norms.dtype)
    factors = ops.divide_no_nan(clip_norm, ops.maximum(norms, clip_norm))
    return ops.where(ops.is_finite(norms), factors, ops.cast(0.0, norms.dtype))


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
    """float32 n_t: ``num_microbatches`` (all the step's microbatches), else ``expected_batch_size`` (p N: public, where
    a Poisson batch's size is not), else the batch's rows (at least 1; ``public_batch_size``); times C_t with
    ``rescale_to_unit_norm`` (De et al. 2022: privacy unchanged, and a decaying C_t no longer shrinks the step)."""
    if num_microbatches is not None:
        result = ops.cast(num_microbatches, "float32")
    elif expected_batch_size is not None:
        result = ops.cast(expected_batch_size, "float32")
    else:
        result = ops.maximum(ops.cast(num_rows, "float32"), 1.0)
    return result * clip_norm if rescale_to_unit_norm else result


def add_noise(ops: Any, clipped_sums: Sequence[Any], stddev: Any, noise_source: Any, num_extra: int = 0) -> list[Any]:
    """Each clipped sum plus N(0, stddev^2 I), drawn from ``noise_source`` alone, once per sum; then ``num_extra``
    more standard normal float32 scalars of the same draw (adaptive clipping's count noise: one draw, not two)."""
    noises = ops.normals(noise_source, [*clipped_sums, *[ops.cast(0.0, "float32")] * num_extra])
    noised = [total + ops.cast(stddev * noise, total.dtype) for total, noise in zip(clipped_sums, noises)]
    return noised + list(noises[len(clipped_sums) :])


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
    num_extra: int = 0,
) -> list[Any]:
    """(clipped sum + noise) / normaliser for each sum, the update the base optimizer applies; then ``num_extra``
    standard normal scalars drawn with the noise (`add_noise`)."""
    sizes = {"num_rows": num_rows, "expected_batch_size": expected_batch_size, "num_microbatches": num_microbatches}
    n = normaliser(ops, clip_norm=clip_norm, rescale_to_unit_norm=rescale_to_unit_norm, **sizes)
    noised = add_noise(ops, clipped_sums, noise_stddev(sigma, num_microbatches), noise_source, num_extra)
    sums, extra = noised[: len(clipped_sums)], noised[len(clipped_sums) :]
    return [ops.divide_no_nan(total, ops.cast(n, total.dtype)) for total in sums] + extra  # n = 0: a zero update
