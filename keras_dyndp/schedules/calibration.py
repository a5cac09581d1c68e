"""Calibration of a schedule's shape to a privacy budget: only mu_0 is solved for (`calibrate_shape`), for the paper's
schedules (`calibrate`) and its noise-decay baselines (`calibrate_baseline`); the GDP-CLT's understatement check."""

from __future__ import annotations

import math

import numpy as np
from scipy import optimize

from keras_dyndp.accounting import cdp
from keras_dyndp.accounting import fast_pld
from keras_dyndp.accounting import gdp
from keras_dyndp.accounting import noise_range
from keras_dyndp.accounting import registry
from keras_dyndp.accounting import scale_search
from keras_dyndp.accounting.scale_search import CalibrationError
from keras_dyndp.core import validation
from keras_dyndp.schedules.schedule import ALL_METHODS
from keras_dyndp.schedules.schedule import BASELINES
from keras_dyndp.schedules.schedule import ArrayOrFn
from keras_dyndp.schedules.schedule import Calibration
from keras_dyndp.schedules.schedule import DPSchedule

# A schedule calibrated under the GDP-CLT is flagged when its PLD epsilon exceeds the target by more than this.
GDP_CLT_WARNING_RATIO = 1.05
_ROUGH_SEARCH_GROUPS = 8  # Distinct noise multipliers of a rigorous calibration's rough first pass.
# `_clt_mu0`: a closed-form bracket narrower than this (relative) is one point; brentq solves to float precision.
_CLT_BRACKET_RTOL = 1e-15
_CLT_XTOL = 1e-300
_CLT_RTOL = 4 * np.finfo(float).eps
_GDP_CLT_SAFETY_STEP = 1e-13  # Relative step of mu_0 down past the rounding of the eps <-> mu conversions.
_SCALE_RANGE_MARGIN = 1e-9  # In log mu_0: keeps exp() rounding at the ends inside the accepted range.
_SLOPE_HALF_WIDTH = 0.01  # In log mu_0, of `_clt_log_slope`'s central difference.


class GdpCltUnderstatementWarning(UserWarning):
    """A schedule calibrated under the GDP-CLT spends noticeably more than its target under the PLD."""


def _as_step_array(name: str, values: ArrayOrFn, num_steps: int) -> np.ndarray:
    """Evaluates a callable of t = 1..T, or checks an array has T entries."""
    if callable(values):
        values = values(np.arange(1, num_steps + 1, dtype=np.float64))
    array = np.broadcast_to(np.asarray(values, dtype=np.float64), (num_steps,)).copy()
    if not np.all(np.isfinite(array)) or np.any(array <= 0):
        raise ValueError(f"`{name}` must be finite and > 0 at every step.")
    return array


def _clt_mu0(mu_tot: float, p: float, mu_shape: np.ndarray) -> float:
    """Largest mu_0 with p^2 sum_t expm1((mu_0 s_t)^2) <= mu_tot^2 (Eq. 13; the CLT's root, not a guarantee), to
    float precision. The constant-shape closed form (Eq. 16) at the smallest and largest s_t brackets the root."""
    per_step = math.log1p(mu_tot**2 / (p**2 * mu_shape.size))
    low, high = math.sqrt(per_step) / mu_shape.max(), math.sqrt(per_step) / mu_shape.min()
    target = mu_tot**2 / p**2

    def excess(mu0: float) -> float:
        return float(np.sum(np.expm1((mu0 * mu_shape) ** 2))) - target

    mu0 = low
    if high > low * (1 + _CLT_BRACKET_RTOL):
        mu0 = optimize.brentq(excess, low, high, xtol=_CLT_XTOL, rtol=_CLT_RTOL)
    # brentq may land a hair above the root.
    return float(scale_search.step_to_safe_side(mu0, lambda mu: excess(mu) <= 0, lambda mu: np.nextafter(mu, 0.0)))


def _clt_log_slope(mu0: float, p: float, mu_shape: np.ndarray, delta: float) -> float:
    """d log(epsilon) / d log(mu_0) of the GDP-CLT at mu0 (central difference), the rigorous search's first guess;
    nan where the CLT epsilon is 0 or infinite (the search then assumes 1)."""
    step = _SLOPE_HALF_WIDTH
    try:
        with np.errstate(over="ignore"):
            epsilons = [
                gdp.epsilon_from_mu(gdp.clt_mu(p, mu0 * math.exp(sign * step) * mu_shape), delta) for sign in (-1, 1)
            ]
    except ValueError:  # No bracket for an extreme mu.
        return math.nan
    return math.log(epsilons[1] / epsilons[0]) / (2 * step) if all(0 < e < math.inf for e in epsilons) else math.nan


def calibrate_shape(
    clip_norms: ArrayOrFn,
    mu_shape: ArrayOrFn,
    *,
    target_epsilon: float,
    target_delta: float,
    sampling_probability: float,
    num_steps: int,
    accountant: str = registry.DEFAULT_ACCOUNTANT,
) -> DPSchedule:
    """Scales a schedule shape so that the whole run spends the target budget under `accountant`.

    C_t = clip_norms(t) and sigma_t = C_t / (mu_0 * mu_shape(t)) for t = 1..T (a noise shape n_t is mu_shape = C_t /
    n_t). Only mu_0 is solved for: under 'pld' (default) or 'rdp' the result's epsilon is in [target (1 - 1e-3),
    target]; under 'gdp_clt' mu_0 solves the CLT equation, and the rigorous epsilon may be far above the target
    (docs/accounting.md). Returns the `DPSchedule` with `calibration` set.

    Args:
      clip_norms: C_t, the L2 clipping norm of each step (> 0): an array [T], a scalar or a callable of t = 1..T.
      mu_shape: mu_t / mu_0, the shape of the per-step privacy cost (> 0): an array [T], a scalar or a callable.
      target_epsilon: epsilon of the whole run, a finite float > 0.
      target_delta: delta of the whole run, in (0, 1).
      sampling_probability: p, the Poisson sampling rate, in (0, 1].
      num_steps: T, an int >= 1.
      accountant: 'pld' (default), 'rdp' or 'gdp_clt'.

    Raises:
      ValueError: on a bad argument; CalibrationError if no scale meets the target with noise multipliers the
        accountant accepts (`accounting.noise_range`), e.g. a target so large that it needs almost no noise.
    """
    validation.check_budget(target_epsilon, target_delta)
    entry, p = registry.get(accountant), validation.check_probability(sampling_probability)
    num_steps = validation.check_positive_int("num_steps", num_steps)
    clips = _as_step_array("clip_norms", clip_norms, num_steps)
    shape = _as_step_array("mu_shape", mu_shape, num_steps)
    calibration = Calibration(accountant, float(target_epsilon), float(target_delta))

    def make_schedule(mu0: float) -> DPSchedule:
        return DPSchedule(clips, clips / (mu0 * shape), p, calibration)

    mu0 = _clt_mu0(gdp.mu_from_epsilon(target_epsilon, target_delta), p, shape)
    budget = (accountant, target_epsilon, target_delta)
    if entry.clt_calibration:
        return make_schedule(_clt_root_within(make_schedule, mu0, *budget))
    return make_schedule(math.exp(_largest_log_mu0_within(make_schedule, mu0, p, shape, *budget)))


def _clt_root_within(make_schedule, mu0: float, accountant: str, target_epsilon: float, target_delta: float) -> float:
    """The CLT's root `mu0` stepped down past float rounding in the eps <-> mu conversions, until the schedule's
    epsilon under `accountant` (the CLT's) is within the target."""
    try:
        return scale_search.step_to_safe_side(
            mu0,
            lambda mu: make_schedule(mu).epsilon(target_delta, accountant) <= target_epsilon,
            lambda mu: mu * (1 - _GDP_CLT_SAFETY_STEP),
        )
    except noise_range.NoiseOutOfRangeError as error:
        raise CalibrationError(
            f"Under the {accountant!r} accountant, target_epsilon={target_epsilon} needs noise outside the accepted "
            f"range: {error}"
        ) from error


def _largest_log_mu0_within(
    make_schedule, mu0: float, p: float, shape: np.ndarray, accountant: str, target_epsilon: float, target_delta: float
) -> float:
    """The largest log mu_0 whose schedule's epsilon under a rigorous `accountant` is within the target, searched
    from the CLT's `mu0`; a shape of more than `_ROUGH_SEARCH_GROUPS` distinct values first with its noise multipliers
    rounded down into that many groups (pessimistic and cheaper), so few evaluations of the real thing remain."""

    def epsilon_of(schedule: DPSchedule) -> float:
        try:
            return schedule.epsilon(target_delta, accountant)
        except noise_range.NoiseOutOfRangeError:
            return math.inf  # Too little noise for the accountant to represent: far over any budget.

    def rough_epsilon_of(log_mu0: float) -> float:
        schedule = make_schedule(math.exp(log_mu0))
        values, counts = fast_pld.group_noise_multipliers(schedule.noise_multipliers, _ROUGH_SEARCH_GROUPS)
        noise = np.repeat(values, counts)
        return epsilon_of(DPSchedule(np.ones_like(noise), noise, p))

    return scale_search.largest_scale_within(
        lambda log_mu0: epsilon_of(make_schedule(math.exp(log_mu0))),
        target_epsilon,
        start=math.log(mu0),
        # The log mu_0 whose noise multipliers z_t = 1 / (mu_0 s_t) the accountant accepts.
        lower=-math.log(noise_range.MAX_NOISE_MULTIPLIER * shape.min()) + _SCALE_RANGE_MARGIN,
        upper=-math.log(registry.get(accountant).min_noise_multiplier() * shape.max()) - _SCALE_RANGE_MARGIN,
        rough_epsilon_of=rough_epsilon_of if np.unique(shape).size > _ROUGH_SEARCH_GROUPS else None,
        slope=_clt_log_slope(mu0, p, shape, target_delta),
        what=f"the schedule under the {accountant!r} accountant",
    )


def check_rhos(rho_mu: float, rho_c: float) -> tuple[float, float]:
    return tuple(
        validation.check_float(name, value, 1.0, inclusive=True, hint=f"the paper's 1/{name} is in (0, 1]")
        for name, value in (("rho_mu", rho_mu), ("rho_c", rho_c))
    )


def calibrate(
    method: str,
    *,
    target_epsilon: float,
    target_delta: float,
    sampling_probability: float,
    num_steps: int,
    initial_clip: float,
    rho_mu: float = 1.0,
    rho_c: float = 1.0,
    accountant: str = registry.DEFAULT_ACCOUNTANT,
) -> DPSchedule:
    """One of the paper's schedules (`keras_dyndp.schedules`), calibrated to (target_epsilon, target_delta) by
    `calibrate_shape`, which says what is raised.

    Args:
      method: one of `METHODS` ('vanilla', 'growing_mu', 'sensitivity_decay', 'dynamic'), or of `BASELINES`
        ('zcdp', 'tcdp': `calibrate_baseline` with exponential noise decay rho_mu; `rho_c` and `accountant` are
        checked but not used). The shapes are explained under `keras_dyndp.optimizer_base.DPOptimizerBase`.
      target_epsilon: epsilon of the whole run, a finite float > 0.
      target_delta: delta of the whole run, in (0, 1) (the paper: 1 / (10 N)).
      sampling_probability: p = expected batch size / N, in (0, 1] (`sampling_from_epochs`).
      num_steps: T, the number of steps, an int >= 1.
      initial_clip: C_0, the first step's clipping norm (L2, per example), a finite float > 0.
      rho_mu: mu_T / mu_0 >= 1, the growth of the per-step privacy cost mu_t = C_t / sigma_t over the run
        ('growing_mu', 'dynamic'). The paper sweeps 1 / rho_mu over 0.1, ..., 0.8; research/ uses 1 / 0.8.
      rho_c: C_0 / C_T >= 1, the decay of the clipping norm over the run ('sensitivity_decay', 'dynamic'). The
        paper sweeps 1 / rho_c over 0.1, ..., 0.8; research/ uses 1 / 0.3.
      accountant: 'pld' (default), 'rdp' or 'gdp_clt' (the paper's approximation, which can understate epsilon).

    Example:
      >>> schedule = calibrate('dynamic', target_epsilon=1.2, target_delta=1e-5, sampling_probability=250 / 60000,
      ...                      num_steps=4800, initial_clip=1.5, rho_mu=1 / 0.8, rho_c=1 / 0.3)
    """
    validation.check_choice("method", method, ALL_METHODS)
    rho_mu, rho_c = check_rhos(rho_mu, rho_c)
    num_steps = validation.check_positive_int("num_steps", num_steps)
    budget = {"target_epsilon": target_epsilon, "target_delta": target_delta, "num_steps": num_steps}
    budget["sampling_probability"] = sampling_probability
    if method in BASELINES:  # calibrate_baseline checks initial_clip.
        registry.get(accountant)
        return calibrate_baseline(method, **budget, initial_clip=initial_clip, noise_decay=rho_mu)
    initial_clip = validation.check_float("initial_clip", initial_clip)
    growth_mu = rho_mu if method in ("growing_mu", "dynamic") else 1.0
    decay_c = rho_c if method in ("sensitivity_decay", "dynamic") else 1.0
    return calibrate_shape(
        lambda t: initial_clip * decay_c ** (-t / num_steps),
        lambda t: growth_mu ** (t / num_steps),
        **budget,
        accountant=accountant,
    )


def calibrate_baseline(
    method: str,
    *,
    target_epsilon: float,
    target_delta: float,
    sampling_probability: float,
    num_steps: int,
    initial_clip: float,
    noise_decay: float = 1.25,
    decay: str = "exponential",
) -> DPSchedule:
    """A noise-decay baseline of the paper, 'zcdp' (Yu et al. 2019) or 'tcdp' (Zhang et al. 2021; p <= 0.1): constant
    clip `initial_clip` > 0 and noise multipliers `cdp.calibrate_noise` (decay z_0 / z_T = `noise_decay`, see
    `cdp.decay_shape`) whose epsilon under the baseline's own accountant (`cdp.baseline_epsilon`) is <= target. No
    `calibration`: that accountant is not in the registry.

    Args:
      method: 'zcdp' or 'tcdp', one of `BASELINES`.
      target_epsilon: epsilon of the whole run under the baseline's accountant, a finite float > 0.
      target_delta: delta of the whole run, in (0, 1).
      sampling_probability: p, as `calibrate`'s, in (0, 1]; in (0, 0.1] for 'tcdp' (its subsampling theorem).
      num_steps: T, the number of steps, an int >= 1.
      initial_clip: C_0, the clipping norm of every step (L2, per example), a finite float > 0.
      noise_decay: z_0 / z_T, the decay of the noise multiplier over the run, a float >= 1 (default 1.25; 1: constant).
      decay: 'exponential' (default, z_t = z_0 noise_decay^(-t/T)) or 'time' (z_t = z_0 / (1 + (noise_decay - 1)
        t / T)).
    """
    initial_clip = validation.check_float("initial_clip", initial_clip)
    multipliers = cdp.calibrate_noise(
        method, target_epsilon, target_delta, sampling_probability, num_steps, noise_decay=noise_decay, decay=decay
    )
    clips = np.full(multipliers.size, initial_clip)
    return DPSchedule(clips, clips * multipliers, sampling_probability)


def gdp_clt_understatement(schedule: DPSchedule) -> str | None:
    """A warning text if a schedule calibrated under the GDP-CLT (an accountant that is not `rigorous`) has a PLD
    epsilon (same delta) above GDP_CLT_WARNING_RATIO x its target or one the PLD cannot represent; else (or for any
    other schedule) None.

    Args:
      schedule: any `DPSchedule`; only one calibrated under a non-rigorous accountant is checked, at its target delta.
    """
    calibration = schedule.calibration
    if calibration is None or registry.get(calibration.accountant).rigorous:
        return None
    target, delta = calibration.target_epsilon, calibration.target_delta
    try:
        rigorous = schedule.epsilon(delta, "pld")
    except noise_range.NoiseOutOfRangeError as error:
        rigorous, detail = math.inf, f" (the PLD cannot represent it: {error})"
    else:
        detail = ""
    if rigorous <= GDP_CLT_WARNING_RATIO * target:
        return None
    return (
        f"This schedule was calibrated to epsilon = {target:g} (delta = {delta:g}) under the GDP-CLT, an "
        f"approximation; its rigorous PLD epsilon is {rigorous:.4g}{detail}, {rigorous / target:.2f}x the "
        "target. For a guarantee, calibrate under a rigorous accountant: accountant='pld' (the default) or "
        "'rdp' in keras_dyndp.schedules.calibrate / calibrate_shape or the optimizer's budget arguments."
    )
