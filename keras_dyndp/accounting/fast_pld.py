"""Fast, pessimistic PLD accounting of heterogeneous Poisson-subsampled Gaussian steps. dp_accounting's `PLDAccountant`
is the tightest rigorous accountant for DP-SGD, but composes thousands of distinct noise multipliers z_t slowly. Here:

1. Grouping that can only over-estimate epsilon (`group_noise_multipliers`): a smaller z is a less private step (its
   PLD dominates), so steps sorted by z are cut into groups, each one self-composed PLD at its SMALLEST z. The same
   groups with z rounded UP give a lower bound on the ungrouped epsilon (docs/performance.md, "Accounting cost").
2. Each group's PLD built with numpy, by the algorithm of dp_accounting's `from_gaussian_mechanism(z,
   sampling_prob=p, value_discretization_interval=d)` (tested against it): the privacy loss of the REMOVE pair
   ((1 - p) N(0, z^2) + p N(-1, z^2) against N(0, z^2)) and of the ADD pair (N(0, z^2) against (1 - p) N(0, z^2) +
   p N(1, z^2)) over x within +-t z (t = `noise_range.GAUSSIAN_TAIL_STDDEVS`); the exact hockey-stick divergence
   delta(k d) = P_upper(x <= x_k) - e^(k d) P_lower(x <= x_k) on the grid k d; the pessimistic connect-the-dots PMF
   (Doroshenko et al. 2022, Algorithm 1) with mass (delta_(k+1) - delta_k - e^d (delta_k - delta_(k-1))) / (e^d - 1)
   on k d and the top divergence on +infinity. Compositions are FFT powers and products that drop at most 1e-15 of
   tail mass, a self-composition's support bounded by Chernoff bounds, as dp_accounting does. Epsilon is read
   through dp_accounting's public `DensePLDPmf` and `PrivacyLossDistribution`.

Inputs the grid cannot hold raise `noise_range.NoiseOutOfRangeError` before anything is allocated. The grid is
pessimistic too: for steps far below its spacing (z ~ 300, p = 0.004) the grid dominates the epsilon; pass a finer
`value_discretization_interval` there.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
from dp_accounting.pld import pld_pmf
from dp_accounting.pld import privacy_loss_distribution
from scipy import fft
from scipy import signal
from scipy import special

from keras_dyndp.accounting import noise_range
from keras_dyndp.accounting import scale_search
from keras_dyndp.core import validation

ArrayLike = Sequence[float] | np.ndarray

# The package's PLD grid: coarser than dp_accounting's 1e-4 (the registry's `final_options`, for final reported
# numbers), so faster and slightly looser, still an upper bound (docs/performance.md, "Accounting cost").
DEFAULT_VALUE_DISCRETIZATION_INTERVAL = 1e-3
DEFAULT_MAX_GROUPS = 100
# Largest relative increase of the CLT sum sum_t (exp(1/z_t^2) - 1) that grouping may cause.
DEFAULT_TOLERANCE = 0.01
_BISECTION_STEPS = 60  # On the per-group excess threshold tau (relative precision 2^-60).
# dp_accounting's default: probability mass that a composition may move from the tails (up, to +infinity).
_TAIL_MASS_TRUNCATION = 1e-15
_CHERNOFF_MAX_ORDER = 20


@dataclasses.dataclass(frozen=True)
class _Pmf:
    """Pessimistic PLD PMF of one adjacency direction: `probs[i]` on the loss (lower_index + i) * interval."""

    lower_index: int
    probs: np.ndarray
    infinity_mass: float


@dataclasses.dataclass(frozen=True)
class _Pld:
    """The REMOVE and ADD PMFs of a mechanism; `add is remove` when both are the same (p = 1)."""

    remove: _Pmf
    add: _Pmf

    @property
    def grid_points(self) -> int:
        return max(self.remove.probs.size, self.add.probs.size)

    def to_dp_accounting(self, interval: float) -> privacy_loss_distribution.PrivacyLossDistribution:
        def dense(pmf: _Pmf) -> pld_pmf.DensePLDPmf:
            return pld_pmf.DensePLDPmf(interval, pmf.lower_index, pmf.probs, pmf.infinity_mass, True)

        return privacy_loss_distribution.PrivacyLossDistribution(
            dense(self.remove), None if self.add is self.remove else dense(self.add)
        )


def _log_mixture_weight(exponents: np.ndarray, q: float) -> np.ndarray:
    """log(1 - q + q e^b), elementwise, without overflow for large b or cancellation for b near 0."""
    if q == 1.0:
        return exponents
    with np.errstate(divide="ignore"):
        positive = exponents + np.log1p((1 - q) * np.exp(-np.maximum(exponents, 0.0)) / q) + math.log(q)
        negative = np.log1p(q * np.expm1(np.minimum(exponents, 0.0)))
    return np.where(exponents > 0, positive, negative)


def _inverse_log_mixture_weight(losses: np.ndarray, q: float) -> np.ndarray:
    """b with log(1 - q + q e^b) = loss, i.e. log(1 + (e^loss - 1) / q), for loss > log(1 - q)."""
    if q == 1.0:
        return losses
    with np.errstate(divide="ignore"):
        positive = losses + np.log1p(-(1 - q) * np.exp(-np.maximum(losses, 0.0))) - math.log(q)
        negative = np.log1p(np.expm1(np.minimum(losses, 0.0)) / q)
    return np.where(losses > 0, positive, negative)


def _gaussian_step_pmf(noise_multiplier: float, q: float, interval: float, remove: bool) -> _Pmf:
    """Connect-the-dots PMF of one Poisson-subsampled Gaussian step (module docstring, item 2), one direction. With b(x)
    = (-1/2 - x) / z^2 (the unsampled REMOVE loss), the REMOVE loss is l(x) = log(1 - q + q e^b(x)) and the ADD loss is
    -l(-x); both decrease in x, so {loss >= epsilon} = {x <= x_epsilon}."""
    variance, tail = noise_multiplier**2, noise_range.GAUSSIAN_TAIL_STDDEVS * noise_multiplier
    lowest_x, highest_x = (-tail - 1.0, tail) if remove else (-tail, tail + 1.0)

    def loss_at(x: np.ndarray) -> np.ndarray:
        if remove:
            return _log_mixture_weight((-0.5 - x) / variance, q)
        return -_log_mixture_weight((-0.5 + x) / variance, q)

    lower_index = math.floor(float(loss_at(np.array(highest_x))) / interval)
    upper_index = math.ceil(float(loss_at(np.array(lowest_x))) / interval)
    epsilons = np.arange(lower_index, upper_index + 1) * interval

    # delta(epsilon) = P_upper(x <= x_eps) - e^eps P_lower(x <= x_eps); outside the loss's range it is 1 - e^eps
    # (REMOVE, epsilon <= log(1 - q)) or 0 (ADD, epsilon >= -log(1 - q)).
    deltas = np.zeros_like(epsilons)
    if remove:
        inside = epsilons > math.log1p(-q) if q < 1 else np.ones(epsilons.size, dtype=bool)
        deltas[~inside] = -np.expm1(epsilons[~inside])
        cutoffs = -0.5 - _inverse_log_mixture_weight(epsilons[inside], q) * variance
        upper_cdf = (1 - q) * special.ndtr(cutoffs / noise_multiplier) + q * special.ndtr(
            (cutoffs + 1) / noise_multiplier
        )
        lower_log_cdf = special.log_ndtr(cutoffs / noise_multiplier)
    else:
        inside = epsilons < -math.log1p(-q) if q < 1 else np.ones(epsilons.size, dtype=bool)
        cutoffs = 0.5 + _inverse_log_mixture_weight(-epsilons[inside], q) * variance
        upper_cdf = special.ndtr(cutoffs / noise_multiplier)
        with np.errstate(divide="ignore"):
            lower_log_cdf = np.logaddexp(
                math.log1p(-q) + special.log_ndtr(cutoffs / noise_multiplier),
                math.log(q) + special.log_ndtr((cutoffs - 1) / noise_multiplier),
            )
    deltas[inside] = upper_cdf - np.exp(epsilons[inside] + lower_log_cdf)
    # Exact deltas never increase with epsilon; the clip and running minimum only remove float rounding.
    deltas = np.minimum.accumulate(np.clip(deltas, 0.0, 1.0))
    if deltas.size == 1:
        return _Pmf(lower_index, np.array([1.0 - deltas[0]]), float(deltas[0]))
    differences, probs = np.diff(deltas), np.empty_like(deltas)
    probs[0] = 1.0 - deltas[0] + differences[0] / math.expm1(interval)
    probs[1:-1] = (differences[1:] - differences[:-1] * math.exp(interval)) / math.expm1(interval)
    probs[-1] = differences[-1] / math.expm1(-interval)
    return _Pmf(lower_index, np.maximum(probs, 0.0), float(deltas[-1]))


def _truncate_tails(lower_index: int, probs: np.ndarray, infinity_mass: float) -> _Pmf:
    """Drops the longest prefix and suffix of mass <= 1e-15 / 2 each: the prefix's mass is added to the first kept
    point (losses rounded up), the suffix's to +infinity. Same rule as dp_accounting's composition."""
    threshold = _TAIL_MASS_TRUNCATION / 2
    exceeds_from_left = np.cumsum(probs) > threshold
    left = int(np.argmax(exceeds_from_left)) if exceeds_from_left.any() else probs.size
    exceeds_from_right = np.cumsum(probs[::-1]) > threshold
    right = probs.size - (int(np.argmax(exceeds_from_right)) if exceeds_from_right.any() else probs.size)
    right = max(right, left + 1)
    kept = probs[left:right].copy()
    kept[0] += probs[:left].sum()
    return _Pmf(lower_index + left, kept, infinity_mass + float(probs[right:].sum()))


def _self_compose_pmf(pmf: _Pmf, num_times: int) -> _Pmf:
    """`num_times`-fold composition of a PMF with itself: FFT power, support bounded by Chernoff bounds. The MGF sum_i
    probs_i e^(k i / n) (n the PMF length, k = +-1..+-20, from powers of e^(i / n): no overflow) bounds the composed
    mass beyond any index; each tail cut holds at most 1e-15 / 2, counted as infinity mass."""
    probs = pmf.probs
    length = probs.size
    powers = np.cumprod(np.broadcast_to(np.exp(np.arange(length) / length), (_CHERNOFF_MAX_ORDER, length)), axis=0)
    orders = np.arange(1, _CHERNOFF_MAX_ORDER + 1) / length
    log_slack = math.log(2 / _TAIL_MASS_TRUNCATION)
    upper_bounds = (num_times * np.log(powers @ probs) + log_slack) / orders
    lower_bounds = (num_times * np.log((1 / powers) @ probs) + log_slack) / -orders
    upper = min((length - 1) * num_times, math.ceil(np.min(upper_bounds)))
    lower = max(0, math.floor(np.max(lower_bounds)))
    output_len = upper - lower + 1
    noise_range.check_pld_grid_points(output_len, f"{num_times} identical steps")
    fast_len = fft.next_fast_len(max(output_len, length))
    convolution = np.real(fft.ifft(fft.fft(probs, fast_len) ** num_times))
    composed = np.roll(convolution, -lower)[:output_len]
    infinity_mass = _TAIL_MASS_TRUNCATION - math.expm1(num_times * math.log1p(-pmf.infinity_mass))
    return _Pmf(pmf.lower_index * num_times + lower, composed, infinity_mass)


def _compose_pmfs(first: _Pmf, second: _Pmf) -> _Pmf:
    """The PMF of the sum of two independent privacy losses (FFT convolution), tails truncated."""
    infinity_mass = first.infinity_mass + second.infinity_mass - first.infinity_mass * second.infinity_mass
    return _truncate_tails(
        first.lower_index + second.lower_index, signal.fftconvolve(first.probs, second.probs), infinity_mass
    )


def _subsampled_gaussian(noise_multiplier: float, sampling_probability: float, interval: float, num_times: int) -> _Pld:
    """`num_times` identical steps; arguments validated by the caller."""

    def one_direction(remove: bool) -> _Pmf:
        pmf = _gaussian_step_pmf(noise_multiplier, sampling_probability, interval, remove)
        return pmf if num_times == 1 else _self_compose_pmf(pmf, num_times)

    remove = one_direction(True)
    return _Pld(remove, remove if sampling_probability == 1.0 else one_direction(False))


def subsampled_gaussian_pld(
    noise_multiplier: float,
    sampling_probability: float,
    value_discretization_interval: float = DEFAULT_VALUE_DISCRETIZATION_INTERVAL,
    num_times: int = 1,
) -> privacy_loss_distribution.PrivacyLossDistribution:
    """Pessimistic PLD of `num_times` Poisson-subsampled Gaussian steps: dp_accounting's `from_gaussian_mechanism(
    noise_multiplier, sampling_prob=..., value_discretization_interval=...).self_compose(num_times)` up to rounding.
    Raises `noise_range.NoiseOutOfRangeError` outside [`noise_range.pld_min_noise_multiplier(interval)`, 1e4]."""
    floor = noise_range.pld_min_noise_multiplier(value_discretization_interval)
    if not floor <= noise_multiplier <= noise_range.MAX_NOISE_MULTIPLIER:
        raise noise_range.NoiseOutOfRangeError(noise_range.out_of_range_message(noise_multiplier, None, "pld", floor))
    return _subsampled_gaussian(
        noise_multiplier, sampling_probability, value_discretization_interval, num_times
    ).to_dp_accounting(value_discretization_interval)


def _greedy_cuts(weights: np.ndarray, prefix: np.ndarray, tau: float) -> list[int]:
    """Group starts plus the end n of the fewest groups of ascending-z steps, each adding at most `tau` to the CLT
    sum when rounded down: [i, j) adds (j - i) w_i - sum_{i<=t<j} w_t, growing with j, so greedy is optimal."""
    n = weights.size
    slack = 1e-12 * prefix[-1]  # Absorbs cumsum rounding, so equal z always share a group.
    cuts, start = [0], 0
    positions = np.arange(n + 1)
    while start < n:
        excess = (positions[start + 1 :] - start) * weights[start] - (prefix[start + 1 :] - prefix[start])
        # The first candidate (a group of one step) has excess 0, so every group gets at least one step.
        start += int(np.searchsorted(excess, tau + slack, side="right"))
        cuts.append(start)
    return cuts


def group_noise_multipliers(
    noise_multipliers: ArrayLike, max_groups: int = DEFAULT_MAX_GROUPS, tolerance: float = DEFAULT_TOLERANCE
) -> tuple[np.ndarray, np.ndarray]:
    """Pessimistic grouping of per-step noise multipliers (finite, > 0): (group noise multipliers ascending, counts).
    Every step joins a group whose noise multiplier is <= its own (rounded DOWN), so accounting the groups
    over-estimates the privacy loss. Uses the fewest groups whose rounding increases the CLT sum sum_t (exp(1/z_t^2) -
    1) by at most `tolerance` (relative, >= 0), but never more than `max_groups` (>= 1)."""
    sorted_multipliers = np.sort(np.asarray(noise_multipliers, dtype=np.float64))
    with np.errstate(over="ignore"):  # A huge weight just means "never round down to it".
        weights = np.minimum(np.expm1(1.0 / sorted_multipliers**2), np.finfo(np.float64).max / 1e6)
    prefix = np.concatenate([[0.0], np.cumsum(weights)])

    def excess(tau: float) -> float:
        cuts = _greedy_cuts(weights, prefix, tau)
        starts, ends = np.array(cuts[:-1]), np.array(cuts[1:])
        return float(np.sum((ends - starts) * weights[starts] - (prefix[ends] - prefix[starts])))

    # Largest tau with total excess <= allowed (excess grows with tau) ...
    tau = high = float(sorted_multipliers.size * weights[0])
    if excess(high) > tolerance * prefix[-1]:
        tau = scale_search.bisect(lambda tau: excess(tau) <= tolerance * prefix[-1], 0.0, high, _BISECTION_STEPS)[0]
    cuts = _greedy_cuts(weights, prefix, tau)
    # ... raised to the smallest tau that fits in max_groups (group count falls as tau grows).
    if len(cuts) - 1 > max_groups:
        tau = scale_search.bisect(
            lambda tau: len(_greedy_cuts(weights, prefix, tau)) - 1 > max_groups, tau, high, _BISECTION_STEPS
        )[1]
        cuts = _greedy_cuts(weights, prefix, tau)
    return sorted_multipliers[np.array(cuts[:-1])], np.diff(cuts)


def _compose(first: _Pld, second: _Pld, steps: int) -> _Pld:
    """Composition of two PLDs, refused before the convolution if its grid would exceed MAX_PLD_GRID_POINTS."""
    noise_range.check_pld_grid_points(first.grid_points + second.grid_points - 1, f"the first {steps} steps")
    remove = _compose_pmfs(first.remove, second.remove)
    if first.add is first.remove and second.add is second.remove:
        return _Pld(remove, remove)
    return _Pld(remove, _compose_pmfs(first.add, second.add))


def check_interval(value: float, name: str = "value_discretization_interval") -> float:
    """Returns a PLD discretisation interval as a float, or raises ValueError unless it is > 0."""
    return validation.check_float(name, value, allow_inf=True)


def pld_epsilons_at(
    sampling_probability: float,
    noise_multipliers: ArrayLike,
    delta: float,
    steps: ArrayLike,
    *,
    max_groups: int = DEFAULT_MAX_GROUPS,
    value_discretization_interval: float = DEFAULT_VALUE_DISCRETIZATION_INTERVAL,
    tolerance: float = DEFAULT_TOLERANCE,
) -> np.ndarray:
    """Pessimistic PLD epsilon of the first k steps for each k of `steps` (non-decreasing, in [0, T]), in one pass:
    the steps cut at those counts into segments, each grouped (`group_noise_multipliers`: `tolerance` per segment,
    `max_groups` over all), the segment PLDs composed in order. p in [0, 1]; each z_t is 0 (no privacy), inf (no
    loss) or in [`noise_range.pld_min_noise_multiplier(value_discretization_interval)`, 1e4]; delta in (0, 1)."""
    p = validation.check_probability(sampling_probability, allow_zero=True)
    multipliers = validation.check_nonnegative_array("noise_multipliers", noise_multipliers)
    check_interval(value_discretization_interval)
    noise_range.check_noise_multipliers(
        multipliers, "pld", noise_range.pld_min_noise_multiplier(value_discretization_interval)
    )
    validation.check_delta(delta)
    validation.check_positive_int("max_groups", max_groups)
    validation.check_float("tolerance", tolerance, 0.0, inclusive=True, allow_inf=True)
    counts = validation.check_step_counts(steps, multipliers.size, non_decreasing=True)
    bounds = np.unique(np.concatenate([[0], counts]))
    segments = [multipliers[start:end] for start, end in zip(bounds[:-1], bounds[1:])]
    active = [segment[np.isfinite(segment)] for segment in segments]
    active_steps = sum(segment.size for segment in active)
    epsilon_at, composed, infinite = {0: 0.0}, None, False
    for end, segment in zip(bounds[1:], active):
        if infinite or (p > 0 and np.any(segment == 0)):
            infinite = True
            epsilon_at[end] = math.inf
            continue
        if p > 0 and segment.size:
            budget = max(1, int(max_groups * segment.size / active_steps))
            for multiplier, count in zip(*group_noise_multipliers(segment, budget, tolerance)):
                pld = _subsampled_gaussian(float(multiplier), p, value_discretization_interval, int(count))
                composed = pld if composed is None else _compose(composed, pld, end)
        epsilon_at[end] = (
            0.0
            if composed is None
            else max(0.0, float(composed.to_dp_accounting(value_discretization_interval).get_epsilon_for_delta(delta)))
        )
    return np.array([epsilon_at[int(k)] for k in counts], dtype=np.float64)


def pld_epsilon(
    sampling_probability: float,
    noise_multipliers: ArrayLike,
    delta: float,
    *,
    max_groups: int = DEFAULT_MAX_GROUPS,
    value_discretization_interval: float = DEFAULT_VALUE_DISCRETIZATION_INTERVAL,
    tolerance: float = DEFAULT_TOLERANCE,
) -> float:
    """Pessimistic PLD epsilon of all T steps (`pld_epsilons_at`; math.inf if some step has z = 0 and p > 0). An upper
    bound on `dp_accounting.pld.PLDAccountant`'s epsilon for the same steps at the same discretisation."""
    num_steps = np.asarray(noise_multipliers).shape[0] if np.ndim(noise_multipliers) == 1 else 0
    options = {"max_groups": max_groups, "tolerance": tolerance}
    options["value_discretization_interval"] = value_discretization_interval
    return float(pld_epsilons_at(sampling_probability, noise_multipliers, delta, [num_steps], **options)[0])
