"""The accountants of the paper's noise-decay baselines (its Table 1), zCDP and tCDP, and their noise calibration. Both
keep C_t = C_0 and decay z_t = sigma_t / C_t: exponentially, z_t = z_0 noise_decay^(-t/T) (t = 1..T), or by time, z_t =
z_0 / (1 + (noise_decay - 1) t / T); only z_0 is calibrated. Each epsilon here is the baseline's OWN claim; report it
beside the PLD or RDP epsilon of the same schedule (`DPSchedule.epsilon`), which this package's training guarantees.

rho-zCDP-SGD (Yu et al. 2019, "Differentially private model publishing for deep learning")
  Add-or-remove-one: a step is (1 / (2 z_t^2))-zCDP (also under Poisson sampling: Renyi divergence is jointly
  quasi-convex), steps add up without amplification, and rho-zCDP is (rho + 2 sqrt(rho log(1/delta)), delta)-DP
  (Bun and Steinke 2016, Prop. 1.3). Yu et al.'s parallel composition needs disjoint batches: not offered.

tCDP-SGD (Zhang et al. 2021, "Adaptive privacy preserving deep learning algorithms for medical data")
  Truncated CDP with amplification by subsampling from Bun, Dwork, Rothblum and Steinke (2018), "Composable and
  versatile privacy via truncated CDP" (STOC), "BDRS" (the paper under reproduction gives no formula):
  - replace-one neighbours move the clipped sum by up to 2C: a step is (rho_t, inf)-tCDP, rho_t = 2 / z_t^2;
  - subsampling (BDRS): for rho, s in (0, 0.1] with log(1/s) >= 3 rho (2 + log2(1/rho)), an (rho, omega)-tCDP M on
    a uniformly random subset of size s n drawn WITHOUT replacement is (13 s^2 rho, log(1/s) / (4 rho))-tCDP. Here
    s = p; a step outside these conditions (rho_t <= 0.1 means z_t >= sqrt(20)) raises ValueError;
  - composition adds rho and takes the minimum omega; by D_alpha <= rho alpha for alpha < omega, epsilon =
    rho + 2 sqrt(rho log(1/delta)) when log(1/delta) <= (omega - 1)^2 rho, else rho omega + log(1/delta) / (omega - 1).
  Poisson sampling and add-or-remove neighbours are outside the theorem: the tCDP epsilon is a claim about
  fixed-size batches under replace-one neighbours, not a guarantee of the training run.
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from keras_dyndp.accounting import scale_search
from keras_dyndp.core import validation

NAMES = ("zcdp", "tcdp")
DECAYS = ("exponential", "time")

# BDRS's subsampling theorem (module docstring).
_TCDP_AMPLIFICATION_CONSTANT = 13.0
_TCDP_MAX_RHO = 0.1
_TCDP_MAX_SAMPLING = 0.1
# Bisection on log(z_0) for the tCDP calibration: 200 halvings of a bracket of width <= 2^11 reach float precision.
_BISECTION_STEPS = 200
# Steps past float rounding to the safe side of a closed form: relative on z_0 (zCDP), absolute on log z_0 (tCDP).
_SAFETY_STEP = 1e-13
_LOG_SAFETY_STEP = 1e-14


def _check_tcdp_sampling(sampling_probability: float) -> float:
    p = validation.check_probability(sampling_probability)
    if p > _TCDP_MAX_SAMPLING:
        raise ValueError(
            f"`sampling_probability` must be <= {_TCDP_MAX_SAMPLING} for the tCDP baseline: the subsampling theorem "
            "of Bun, Dwork, Rothblum and Steinke (2018) holds for sampling fractions s in (0, 0.1] only. Use a "
            f"smaller batch, or the RDP/PLD accountants. Received: sampling_probability={p}."
        )
    return p


def _add_remove_rhos(multipliers: np.ndarray) -> np.ndarray:
    """zCDP rho_t = 1 / (2 z_t^2) per step (inf for z = 0); 4x that is the replace-one tCDP rho_t = 2 / z_t^2."""
    with np.errstate(divide="ignore"):
        return 0.5 / multipliers**2


def _meets_subsampling_conditions(rhos: np.ndarray, s: float) -> np.ndarray:
    """Per step: BDRS's rho_t <= 0.1 and log(1/s) >= 3 rho_t (2 + log2(1/rho_t))."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return (rhos <= _TCDP_MAX_RHO) & (math.log(1.0 / s) >= 3 * rhos * (2 + np.log2(1 / rhos)))


def decay_shape(num_steps: int, noise_decay: float, decay: str = "exponential") -> np.ndarray:
    """Relative noise multipliers s_t (z_t = z_0 s_t) for t = 1..T >= 1, s_T = 1 / noise_decay (>= 1), of the
    module docstring's 'exponential' or 'time' decay."""
    num_steps = validation.check_positive_int("num_steps", num_steps)
    validation.check_choice("decay", decay, DECAYS)
    noise_decay = validation.check_float("noise_decay", noise_decay, 1.0, inclusive=True)
    fraction = np.arange(1, num_steps + 1, dtype=np.float64) / num_steps
    return noise_decay ** (-fraction) if decay == "exponential" else 1.0 / (1.0 + (noise_decay - 1.0) * fraction)


def zcdp_rho(noise_multipliers) -> float:
    """zCDP rho = sum_t 1 / (2 z_t^2) of Gaussian steps, composed sequentially without amplification (Yu et al.)."""
    multipliers = validation.check_nonnegative_array("noise_multipliers", noise_multipliers, allow_empty=False)
    return float(np.sum(_add_remove_rhos(multipliers)))


def zcdp_epsilon_from_rho(rho: float, delta: float) -> float:
    """epsilon = rho + 2 sqrt(rho log(1/delta)) of rho-zCDP at `delta` (Bun and Steinke 2016, Prop. 1.3)."""
    delta = validation.check_delta(delta)
    rho = validation.check_float("rho", rho, 0.0, inclusive=True, allow_inf=True)
    return float(rho + 2.0 * math.sqrt(rho * math.log(1.0 / delta)))


def zcdp_rho_from_epsilon(epsilon: float, delta: float) -> float:
    """Largest rho-zCDP that converts to at most `epsilon`: (sqrt(eps + L) - sqrt(L))^2 with L = log(1/delta)."""
    epsilon, delta = validation.check_budget(epsilon, delta)
    log_inv_delta = math.log(1.0 / delta)
    # (sqrt(eps + L) - sqrt(L))^2 written without cancellation.
    return float((epsilon / (math.sqrt(epsilon + log_inv_delta) + math.sqrt(log_inv_delta))) ** 2)


def zcdp_epsilon(noise_multipliers, delta: float) -> float:
    """Epsilon of the noise multipliers under Yu et al.'s zCDP accounting (see `zcdp_rho`)."""
    return zcdp_epsilon_from_rho(zcdp_rho(noise_multipliers), delta)


def tcdp_parameters(sampling_probability: float, noise_multipliers) -> tuple[float, float]:
    """(rho, omega) = (13 p^2 sum_t rho_t, log(1/p) / (4 max_t rho_t)) of T subsampled Gaussian steps under BDRS's
    theorem (module docstring; z_t = inf costs nothing); ValueError if p > 0.1 or a step is outside its conditions."""
    s = _check_tcdp_sampling(sampling_probability)
    multipliers = validation.check_nonnegative_array("noise_multipliers", noise_multipliers, allow_empty=False)
    rhos = 4.0 * _add_remove_rhos(multipliers)
    private = rhos > 0
    outside = private & ~_meets_subsampling_conditions(rhos, s)
    if np.any(outside):
        step = int(np.argmax(outside))
        raise ValueError(
            "The tCDP baseline's subsampling theorem (Bun et al. 2018) needs rho_t = 2 / z_t^2 <= 0.1, i.e. "
            f"z_t >= sqrt(20) = {math.sqrt(2 / _TCDP_MAX_RHO):.4f}, and log(1/p) >= 3 rho_t (2 + log2(1/rho_t)) "
            f"at every step. Step {step + 1} has z_t = {multipliers[step]:.6g} (rho_t = {rhos[step]:.6g}) at "
            f"p = {s:.6g}."
        )
    if not np.any(private):
        return 0.0, math.inf
    rho = _TCDP_AMPLIFICATION_CONSTANT * s**2 * float(np.sum(rhos[private]))
    return rho, math.log(1.0 / s) / (4.0 * float(np.max(rhos)))


def tcdp_epsilon_from_parameters(rho: float, omega: float, delta: float) -> float:
    """Epsilon of (rho, omega)-tCDP at `delta` (module docstring)."""
    delta = validation.check_delta(delta)
    rho = validation.check_float("rho", rho, 0.0, inclusive=True, allow_inf=True)
    omega, log_inv_delta = validation.check_float("omega", omega, 1.0, allow_inf=True), math.log(1.0 / delta)
    if math.isinf(rho):
        return math.inf
    if log_inv_delta <= (omega - 1) ** 2 * rho:
        return float(rho + 2.0 * math.sqrt(rho * log_inv_delta))
    return float(rho * omega + log_inv_delta / (omega - 1))


def tcdp_epsilon(sampling_probability: float, noise_multipliers, delta: float) -> float:
    """Epsilon of subsampled Gaussian steps under the tCDP accounting of the module docstring (`tcdp_parameters`)."""
    return tcdp_epsilon_from_parameters(*tcdp_parameters(sampling_probability, noise_multipliers), delta)


def zcdp_noise_multipliers(
    target_epsilon: float,
    target_delta: float,
    sampling_probability: float,
    num_steps: int,
    *,
    noise_decay: float = 1.25,
    decay: str = "exponential",
) -> np.ndarray:
    """rho-zCDP-SGD (Yu et al. 2019): noise multipliers z_0 s_t [T] (`decay_shape`) whose `zcdp_epsilon` is the
    target (<=, equal up to rounding): z_0 = sqrt(rho(shape) / rho_target); p in (0, 1] unused (no amplification)."""
    validation.check_budget(target_epsilon, target_delta)
    validation.check_probability(sampling_probability)
    shape = decay_shape(num_steps, noise_decay, decay)
    z0 = math.sqrt(zcdp_rho(shape) / zcdp_rho_from_epsilon(target_epsilon, target_delta))
    z0 = scale_search.step_to_safe_side(  # Rounding: step to more noise.
        z0, lambda z: zcdp_epsilon(z * shape, target_delta) <= target_epsilon, lambda z: z * (1 + _SAFETY_STEP)
    )
    return z0 * shape


def tcdp_noise_multipliers(
    target_epsilon: float,
    target_delta: float,
    sampling_probability: float,
    num_steps: int,
    *,
    noise_decay: float = 1.25,
    decay: str = "exponential",
) -> np.ndarray:
    """tCDP-SGD (Zhang et al. 2021, module docstring): noise multipliers z_0 s_t [T], z_0 the smallest (bisection on
    log z_0, to float precision) whose `tcdp_epsilon` is <= target among those inside the theorem's conditions (z_t
    >= sqrt(20)). If even the smallest such z_0 spends less than the target, it is returned with a warning: the
    theorem certifies no schedule with less noise. Arguments as `zcdp_noise_multipliers`, with p in (0, 0.1]."""
    validation.check_budget(target_epsilon, target_delta)
    p, shape = _check_tcdp_sampling(sampling_probability), decay_shape(num_steps, noise_decay, decay)

    def epsilon(log_z0: float) -> float:
        return tcdp_epsilon(p, math.exp(log_z0) * shape, target_delta)

    # The last step has the least noise; for p <= 0.1 rho_t <= 0.1 implies the log condition.
    low = math.log(math.sqrt(2.0 / _TCDP_MAX_RHO) / float(np.min(shape)))
    low = scale_search.step_to_safe_side(  # Rounding: step to the inside.
        low,
        lambda x: bool(np.all(_meets_subsampling_conditions(4.0 * _add_remove_rhos(math.exp(x) * shape), p))),
        lambda x: x + _LOG_SAFETY_STEP,
    )
    if epsilon(low) <= target_epsilon:
        warnings.warn(
            f"tCDP baseline: the subsampling theorem needs z_t >= sqrt(20) at every step, and with that little "
            f"noise this schedule's tCDP epsilon is {epsilon(low):.4g}, below the target {target_epsilon:g}; it "
            "spends less than the budget.",
            stacklevel=2,
        )
        return math.exp(low) * shape
    high = low + 1.0
    while epsilon(high) > target_epsilon:
        high += 1.0
    high = scale_search.bisect(lambda x: epsilon(x) > target_epsilon, low, high, _BISECTION_STEPS)[1]
    return math.exp(high) * shape


_NOISE_MULTIPLIERS = {"zcdp": zcdp_noise_multipliers, "tcdp": tcdp_noise_multipliers}


def calibrate_noise(
    name: str,
    target_epsilon: float,
    target_delta: float,
    sampling_probability: float,
    num_steps: int,
    *,
    noise_decay: float = 1.25,
    decay: str = "exponential",
) -> np.ndarray:
    """`zcdp_noise_multipliers` or `tcdp_noise_multipliers` by `name` ('zcdp' or 'tcdp')."""
    return _NOISE_MULTIPLIERS[validation.check_choice("name", name, NAMES)](
        target_epsilon, target_delta, sampling_probability, num_steps, noise_decay=noise_decay, decay=decay
    )


def baseline_epsilon(name: str, sampling_probability: float, noise_multipliers, delta: float) -> float:
    """`zcdp_epsilon` or `tcdp_epsilon` of the noise multipliers by `name` ('zcdp' or 'tcdp')."""
    if validation.check_choice("name", name, NAMES) == "zcdp":
        return zcdp_epsilon(noise_multipliers, delta)
    return tcdp_epsilon(sampling_probability, noise_multipliers, delta)
