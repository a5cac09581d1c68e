"""The paper's noise-decay baselines (its Table 1), each calibrated by its own accountant.

Du et al. compare dynamic DP-SGD with two earlier noise-decay methods. Both keep the clipping norm fixed
(C_t = C_0) and decay the noise multiplier z_t = sigma_t / C_t over the run; they differ in how they account
privacy, which decides how much noise a given (epsilon, delta) budget demands:

* rho-zCDP-SGD (Yu et al. 2019, "Differentially private model publishing for deep learning"): a Gaussian step of
  noise multiplier z_t is (1 / (2 z_t^2))-zCDP, steps compose additively and NO amplification by subsampling is
  used: rho = sum_t 1 / (2 z_t^2), and rho-zCDP gives (rho + 2 sqrt(rho log(1/delta)), delta)-DP (Bun and Steinke
  2016). Yu et al. sample batches as disjoint partitions of a shuffled epoch and compose the steps of one epoch in
  parallel (the epoch costs the max of its steps' rho); pass `steps_per_epoch` for that accounting, which is not
  valid for the Poisson sampling that the other accountants (and this package's training) assume.
* tCDP-SGD (Zhang et al. 2021, "Adaptive privacy preserving deep learning algorithms for medical data"): truncated
  CDP (Bun, Dwork, Rothblum and Steinke 2018, "BDRS") with amplification by subsampling. The paper under
  reproduction gives no formula, so this module ASSUMES the following, all from BDRS:
  - a Gaussian step is (rho_t, inf)-tCDP with rho_t = 1 / (2 z_t^2);
  - BDRS's subsampling theorem, applied with s = p (the sampling probability; BDRS prove it for sampling a subset
    of fixed size s n without replacement): if rho_t <= 0.1 and log(1/s) >= 3 rho_t (2 + log2(1/rho_t)), the
    subsampled step is (13 s^2 rho_t, log(1/s) / (4 rho_t))-tCDP. A step outside these conditions is accounted
    without amplification, (rho_t, inf)-tCDP (subsampling never hurts: Renyi divergence is jointly quasi-convex);
  - composition adds rho and takes the minimum omega;
  - (rho, omega)-tCDP gives (epsilon, delta)-DP through its Renyi bound D_alpha <= rho alpha for alpha < omega:
    epsilon = rho + 2 sqrt(rho log(1/delta)) when log(1/delta) <= (omega - 1)^2 rho, else
    epsilon = rho omega + log(1/delta) / (omega - 1).

The noise shape is Yu et al.'s exponential decay z_t = z_0 noise_decay^(-t/T) (t = 1..T; the same shape as the
paper's growing-mu schedule with rho_mu = noise_decay) or their time-based decay z_t = z_0 / (1 + (noise_decay - 1)
t / T); either way z_0 / z_T = noise_decay. Only z_0 is calibrated.

The returned `DPSchedule`s are ordinary schedules: their GDP-CLT, RDP or PLD epsilon (`DPSchedule.epsilon`) can be
reported beside their own accountant's. They differ: zCDP without amplification is far looser than all three (it
needs ~15x more noise at the paper's MNIST settings), tCDP's constant 13 makes it looser than RDP.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

from keras_dyndp import schedules
from keras_dyndp import validation

DECAYS = ("exponential", "time")

# BDRS subsampling theorem: amplified rho = 13 s^2 rho_t, valid for rho_t <= 0.1.
_TCDP_AMPLIFICATION_CONSTANT = 13.0
_TCDP_MAX_RHO = 0.1
# Bisection on log(z_0) for the tCDP calibration: 200 halvings of a bracket of width <= 2^11 reach float precision.
_BISECTION_STEPS = 200


def _check_budget(target_epsilon: float, target_delta: float) -> None:
    if isinstance(target_epsilon, bool) or not (
            isinstance(target_epsilon, (int, float)) and math.isfinite(target_epsilon) and target_epsilon > 0):
        raise ValueError(f"`target_epsilon` must be finite and > 0. Received: target_epsilon={target_epsilon}.")
    if not (isinstance(target_delta, (int, float)) and 0.0 < target_delta < 1.0):
        raise ValueError(f"`target_delta` must be in (0, 1). Received: target_delta={target_delta}.")


def _check_delta(delta: float) -> float:
    if not (isinstance(delta, (int, float)) and 0.0 < delta < 1.0):
        raise ValueError(f"`delta` must be in (0, 1). Received: delta={delta}.")
    return float(delta)


def _check_multipliers(noise_multipliers) -> np.ndarray:
    multipliers = np.asarray(noise_multipliers, dtype=np.float64)
    if multipliers.ndim != 1 or multipliers.size == 0:
        raise ValueError(f"`noise_multipliers` must be a non-empty 1-D array. Received shape {multipliers.shape}.")
    if not np.all(multipliers >= 0):  # Also rejects NaN.
        raise ValueError("Every entry of `noise_multipliers` must be >= 0 (inf allowed).")
    return multipliers


def _step_rhos(multipliers: np.ndarray) -> np.ndarray:
    """rho_t = 1 / (2 z_t^2) of each Gaussian step (inf for z = 0, 0 for z = inf)."""
    with np.errstate(divide="ignore"):
        return 0.5 / multipliers**2


def decay_shape(num_steps: int, noise_decay: float, decay: str = "exponential") -> np.ndarray:
    """Relative noise multipliers s_t (z_t = z_0 s_t) for t = 1..T, with s_T = 1 / noise_decay.

    Args:
      num_steps: T >= 1.
      noise_decay: z_0 / z_T >= 1 (1: constant noise).
      decay: 'exponential' (s_t = noise_decay^(-t/T)) or 'time' (s_t = 1 / (1 + (noise_decay - 1) t / T)).
    """
    num_steps = validation.check_positive_int("num_steps", num_steps)
    if decay not in DECAYS:
        raise ValueError(f"`decay` must be one of {DECAYS}. Received: decay={decay!r}.")
    if isinstance(noise_decay, bool) or not (
            isinstance(noise_decay, (int, float)) and math.isfinite(noise_decay) and noise_decay >= 1):
        raise ValueError(f"`noise_decay` must be a finite number >= 1. Received: noise_decay={noise_decay}.")
    fraction = np.arange(1, num_steps + 1, dtype=np.float64) / num_steps
    if decay == "exponential":
        return noise_decay ** (-fraction)
    return 1.0 / (1.0 + (noise_decay - 1.0) * fraction)


def zcdp_rho(noise_multipliers, steps_per_epoch: Optional[int] = None) -> float:
    """zCDP rho of Gaussian steps without amplification by subsampling (Yu et al. 2019).

    Args:
      noise_multipliers: 1-D array [T] of z_t >= 0.
      steps_per_epoch: None: sequential composition, rho = sum_t 1 / (2 z_t^2). An integer >= 1: Yu et al.'s
        parallel composition within each epoch of disjoint batches, rho = sum over epochs of the max step rho.
    """
    rhos = _step_rhos(_check_multipliers(noise_multipliers))
    if steps_per_epoch is None:
        return float(np.sum(rhos))
    size = validation.check_positive_int("steps_per_epoch", steps_per_epoch)
    return float(sum(np.max(rhos[start:start + size]) for start in range(0, rhos.size, size)))


def zcdp_epsilon_from_rho(rho: float, delta: float) -> float:
    """epsilon = rho + 2 sqrt(rho log(1/delta)) of rho-zCDP at `delta` (Bun and Steinke 2016, Prop. 1.3)."""
    delta = _check_delta(delta)
    if not rho >= 0:
        raise ValueError(f"`rho` must be >= 0. Received: rho={rho}.")
    return float(rho + 2.0 * math.sqrt(rho * math.log(1.0 / delta)))


def zcdp_rho_from_epsilon(epsilon: float, delta: float) -> float:
    """Largest rho-zCDP that converts to at most `epsilon`: (sqrt(eps + L) - sqrt(L))^2 with L = log(1/delta)."""
    _check_budget(epsilon, delta)
    log_inv_delta = math.log(1.0 / delta)
    # (sqrt(eps + L) - sqrt(L))^2 written without cancellation.
    return float((epsilon / (math.sqrt(epsilon + log_inv_delta) + math.sqrt(log_inv_delta))) ** 2)


def zcdp_epsilon(noise_multipliers, delta: float, steps_per_epoch: Optional[int] = None) -> float:
    """Epsilon of the noise multipliers under Yu et al.'s zCDP accounting (see `zcdp_rho`)."""
    return zcdp_epsilon_from_rho(zcdp_rho(noise_multipliers, steps_per_epoch), delta)


def tcdp_parameters(sampling_probability: float, noise_multipliers) -> tuple[float, float]:
    """(rho, omega) of Poisson-subsampled Gaussian steps under tCDP, with the assumptions of the module docstring."""
    p = validation.check_probability(sampling_probability)
    rhos = _step_rhos(_check_multipliers(noise_multipliers))
    omegas = np.full_like(rhos, math.inf)
    if p < 1:
        log_inv_p = math.log(1.0 / p)
        with np.errstate(divide="ignore", invalid="ignore"):
            amplifiable = (rhos > 0) & (rhos <= _TCDP_MAX_RHO) & (log_inv_p >= 3 * rhos * (2 + np.log2(1 / rhos)))
        omegas[amplifiable] = log_inv_p / (4 * rhos[amplifiable])
        rhos = np.where(amplifiable, _TCDP_AMPLIFICATION_CONSTANT * p**2 * rhos, rhos)
    return float(np.sum(rhos)), float(np.min(omegas))


def tcdp_epsilon_from_parameters(rho: float, omega: float, delta: float) -> float:
    """Epsilon of (rho, omega)-tCDP at `delta`, through the Renyi bound D_alpha <= rho alpha for 1 < alpha < omega."""
    delta = _check_delta(delta)
    if not (rho >= 0 and omega > 1):
        raise ValueError(f"Need rho >= 0 and omega > 1. Received: rho={rho}, omega={omega}.")
    log_inv_delta = math.log(1.0 / delta)
    if math.isinf(rho):
        return math.inf
    if log_inv_delta <= (omega - 1) ** 2 * rho:
        return float(rho + 2.0 * math.sqrt(rho * log_inv_delta))
    return float(rho * omega + log_inv_delta / (omega - 1))


def tcdp_epsilon(sampling_probability: float, noise_multipliers, delta: float) -> float:
    """Epsilon of Poisson-subsampled Gaussian steps under the tCDP accounting of the module docstring."""
    rho, omega = tcdp_parameters(sampling_probability, noise_multipliers)
    return tcdp_epsilon_from_parameters(rho, omega, delta)


def _check_common(target_epsilon, target_delta, sampling_probability, num_steps, initial_clip):
    _check_budget(target_epsilon, target_delta)
    p = validation.check_probability(sampling_probability)
    num_steps = validation.check_positive_int("num_steps", num_steps)
    if isinstance(initial_clip, bool) or not (
            isinstance(initial_clip, (int, float)) and math.isfinite(initial_clip) and initial_clip > 0):
        raise ValueError(f"`initial_clip` must be finite and > 0. Received: initial_clip={initial_clip}.")
    return p, num_steps


def _schedule(initial_clip: float, noise_multipliers: np.ndarray, p: float) -> schedules.DPSchedule:
    clips = np.full(noise_multipliers.size, float(initial_clip))
    return schedules.DPSchedule(clips, clips * noise_multipliers, p)


def zcdp_schedule(
    target_epsilon: float,
    target_delta: float,
    sampling_probability: float,
    num_steps: int,
    initial_clip: float,
    *,
    noise_decay: float = 1.25,
    decay: str = "exponential",
    steps_per_epoch: Optional[int] = None,
) -> schedules.DPSchedule:
    """rho-zCDP-SGD (Yu et al. 2019): constant clip, decaying noise, calibrated so `zcdp_epsilon` <= target.

    z_0 has a closed form: rho(z_0) = rho(shape) / z_0^2, so z_0 = sqrt(rho(shape) / rho_target).

    Args:
      target_epsilon, target_delta: the budget, epsilon > 0 and delta in (0, 1).
      sampling_probability: p in (0, 1], stored in the schedule (zCDP itself ignores it: no amplification).
      num_steps: T >= 1.
      initial_clip: the constant clipping norm C > 0.
      noise_decay: z_0 / z_T >= 1.
      decay: 'exponential' or 'time' (see `decay_shape`).
      steps_per_epoch: None (sequential composition over all steps) or Yu et al.'s epoch-parallel composition.

    Returns:
      A `DPSchedule` whose zCDP epsilon is <= target_epsilon (equal up to float rounding).
    """
    p, num_steps = _check_common(target_epsilon, target_delta, sampling_probability, num_steps, initial_clip)
    shape = decay_shape(num_steps, noise_decay, decay)
    z0 = math.sqrt(zcdp_rho(shape, steps_per_epoch) / zcdp_rho_from_epsilon(target_epsilon, target_delta))
    while zcdp_epsilon(z0 * shape, target_delta, steps_per_epoch) > target_epsilon:  # Rounding: step to safety.
        z0 *= 1 + 1e-13
    return _schedule(initial_clip, z0 * shape, p)


def tcdp_schedule(
    target_epsilon: float,
    target_delta: float,
    sampling_probability: float,
    num_steps: int,
    initial_clip: float,
    *,
    noise_decay: float = 1.25,
    decay: str = "exponential",
) -> schedules.DPSchedule:
    """tCDP-SGD (Zhang et al. 2021, as assumed in the module docstring): constant clip, decaying noise.

    z_0 is the smallest value (to float precision, by bisection on log z_0) whose `tcdp_epsilon` is <= target;
    epsilon is non-increasing in z_0 but can jump where a step enters the amplification conditions, so bisection is
    used rather than a root finder.

    Args: as `zcdp_schedule` (without `steps_per_epoch`); p in (0, 1] drives the amplification.

    Returns:
      A `DPSchedule` whose tCDP epsilon is <= target_epsilon: equal up to ~1e-12 relative, or just below the target
      when the target falls inside a jump (e.g. 7.98 for a target of 8.0 at p = 250/60000, T = 4800).
    """
    p, num_steps = _check_common(target_epsilon, target_delta, sampling_probability, num_steps, initial_clip)
    shape = decay_shape(num_steps, noise_decay, decay)

    def fits(log_z0: float) -> bool:
        return tcdp_epsilon(p, math.exp(log_z0) * shape, target_delta) <= target_epsilon

    low = high = 0.0
    while fits(low):
        low -= 1.0
    while not fits(high):
        high += 1.0
    for _ in range(_BISECTION_STEPS):
        middle = 0.5 * (low + high)
        if middle in (low, high):
            break
        if fits(middle):
            high = middle
        else:
            low = middle
    return _schedule(initial_clip, math.exp(high) * shape, p)


def baseline_epsilon(name: str, schedule: schedules.DPSchedule, delta: float,
                     steps: Optional[int] = None) -> float:
    """Epsilon of `schedule` under a baseline's own accountant: name 'zcdp' or 'tcdp'.

    Args:
      name: 'zcdp' or 'tcdp'.
      schedule: the schedule whose noise multipliers are accounted.
      delta: in (0, 1).
      steps: account only the first `steps` steps (1 <= steps <= T); None: all T.
    """
    if steps is not None and not 1 <= steps <= schedule.num_steps:
        raise ValueError(f"`steps` must be in [1, {schedule.num_steps}]. Received: steps={steps}.")
    multipliers = schedule.noise_multipliers[:steps]
    if name == "zcdp":
        return zcdp_epsilon(multipliers, delta)
    if name == "tcdp":
        return tcdp_epsilon(schedule.sampling_probability, multipliers, delta)
    raise ValueError(f"`name` must be 'zcdp' or 'tcdp'. Received: name={name!r}.")
