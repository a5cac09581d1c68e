"""Per-step clipping and noise schedules, and their calibration to a privacy budget.

A `DPSchedule` is the single description of what a dynamic DP-SGD run does: step k (0-based, the paper's t = k + 1)
clips every per-example gradient to L2 norm `clip_norms[k]` and adds Gaussian noise of std `noise_stddevs[k]` to
their SUM; the same schedule gives the event every accountant composes, so training and accounting cannot drift.

`calibrate` builds the paper's schedules (Du et al., "Dynamic Differential-Privacy Preserving SGD"): ``vanilla``
(C_t = C_0, mu_t = mu_0; Abadi et al. 2016), ``growing_mu`` (Eq. 11-14, Alg. 1: mu_t = rho_mu^(t/T) mu_0),
``sensitivity_decay`` (Eq. 15-17: C_t = rho_c^(-t/T) C_0) and ``dynamic`` (Alg. 2: C_t = rho_c^(-t/T) C_0,
sigma_t = (C_0 / mu_0) (rho_mu rho_c)^(-t/T)), and the baselines of its Table 1 (`calibrate_baseline`).
Only mu_0 is solved for, so that the run spends the target under the accountant: 'pld' (default) or 'rdp' by a
search (`accounting.scale_search`), 'gdp_clt' (the paper's) by solving the extended GDP CLT (Corollary 1)
mu_tot = p sqrt(sum_t (exp(mu_t^2) - 1)), an approximation that can understate epsilon badly (delta 1e-5, p 0.01,
T 20: GDP-CLT 1.00 is PLD 4.20), so the optimizers warn past 5% (`gdp_clt_understatement`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Callable
from collections.abc import Sequence

import dp_accounting
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

METHODS = ("vanilla", "growing_mu", "sensitivity_decay", "dynamic")
"""The paper's schedules, `calibrate`'s and the optimizers' ``method``: constant clip and noise (Abadi et al. 2016),
growing mu_t (Alg. 1), a decaying clip, and both (Alg. 2)."""
BASELINES = cdp.NAMES
"""The paper's noise-decay baselines (its Table 1), 'zcdp' and 'tcdp', each calibrated by its own accountant
(`accounting.cdp`)."""
ALL_METHODS = METHODS + BASELINES
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

__all__ = [
    "ALL_METHODS",
    "BASELINES",
    "CalibrationError",
    "Calibration",
    "DPSchedule",
    "GdpCltUnderstatementWarning",
    "METHODS",
    "PrivacyBudget",
    "calibrate",
    "calibrate_baseline",
    "calibrate_shape",
    "gdp_clt_understatement",
    "sampling_from_epochs",
]


class GdpCltUnderstatementWarning(UserWarning):
    """A schedule calibrated under the GDP-CLT spends noticeably more than its target under the PLD."""


@dataclasses.dataclass(frozen=True)
class Calibration:
    """How a schedule was calibrated: its epsilon under `accountant` meets (target_epsilon, target_delta). Metadata
    only (privacy depends on the arrays alone): the optimizer checks a GDP-CLT promise against the PLD."""

    accountant: str
    target_epsilon: float
    target_delta: float

    def __post_init__(self):
        validation.check_budget(self.target_epsilon, self.target_delta)
        registry.get(self.accountant)


ArrayOrFn = Sequence[float] | np.ndarray | Callable[[np.ndarray], np.ndarray]


class DPSchedule:
    """Immutable per-step clipping norms C_t and noise standard deviations sigma_t over T steps: privacy depends only
    on z_t = sigma_t / C_t and p, step k being ``PoissonSampledDpEvent(p, GaussianDpEvent(z_k))`` (add-or-remove-one).

    Args:
      clip_norms: 1-D array [T] of L2 clipping thresholds C_t, each > 0.
      noise_stddevs: 1-D array [T] of noise stds sigma_t >= 0 on the clipped sum (0: no privacy, epsilon inf).
      sampling_probability: probability p in (0, 1] with which each example joins a step's batch.
      calibration: how it was calibrated (`calibrate` sets it), or None for a hand-built schedule. Kept by
        `get_config` / `to_json`; equality ignores it.
    """

    def __init__(self, clip_norms, noise_stddevs, sampling_probability: float, calibration: Calibration | None = None):
        clip = np.array(clip_norms, dtype=np.float64)
        noise = np.array(noise_stddevs, dtype=np.float64)
        if clip.ndim != 1 or clip.size < 1:
            raise ValueError(f"`clip_norms` must be a non-empty 1-D array. Received shape {clip.shape}.")
        if noise.shape != clip.shape:
            raise ValueError(
                "`noise_stddevs` must have the same shape as `clip_norms`. "
                f"Received shapes {noise.shape} and {clip.shape}."
            )
        if not np.all(np.isfinite(clip)) or np.any(clip <= 0):
            raise ValueError(f"`clip_norms` must be finite and > 0. Received min={clip.min()}.")
        if not np.all(np.isfinite(noise)) or np.any(noise < 0):
            raise ValueError(f"`noise_stddevs` must be finite and >= 0. Received min={noise.min()}.")
        for array in (clip, noise):
            array.setflags(write=False)
        self._clip_norms, self._noise_stddevs = clip, noise
        self._sampling_probability = validation.check_probability(sampling_probability)
        if calibration is not None and not isinstance(calibration, Calibration):
            raise TypeError(
                "`calibration` must be a keras_dyndp.schedules.Calibration or None. "
                f"Received: calibration={calibration!r}."
            )
        self._calibration = calibration

    clip_norms = property(lambda self: self._clip_norms, doc="Read-only array [T] of clipping thresholds C_t.")
    noise_stddevs = property(lambda self: self._noise_stddevs, doc="Read-only array [T] of noise stds sigma_t.")
    sampling_probability = property(lambda self: self._sampling_probability, doc="Poisson sampling probability p.")
    calibration = property(lambda self: self._calibration, doc="The `Calibration`, or None for a hand-built one.")
    num_steps = property(lambda self: int(self._clip_norms.size), doc="Number of steps T the budget covers.")

    @property
    def noise_multipliers(self) -> np.ndarray:
        """z_t = sigma_t / C_t, the quantity privacy depends on (TF-Privacy's `noise_multiplier`)."""
        return self._noise_stddevs / self._clip_norms

    @property
    def fingerprint(self) -> tuple[int, int]:
        """Two int32 words (first odd: never (0, 0)) of a 64-bit hash of T, p, the clip norms and the noise: equal
        schedules have equal fingerprints. The DP optimizers store it with their step counter, so that a counter
        restored into another schedule is refused (`step_checks.restored_schedule_refusal`); int32 survives
        every backend's saving."""
        digest = hashlib.blake2b(digest_size=8)
        digest.update(np.asarray([self.num_steps], "<i8").tobytes())
        # + 0.0 makes -0.0 (equal to 0.0 under __eq__) hash as 0.0.
        for values in ([self._sampling_probability], self._clip_norms, self._noise_stddevs):
            digest.update((np.asarray(values, np.float64) + 0.0).astype("<f8").tobytes())
        first, second = (int(word) for word in np.frombuffer(digest.digest(), "<i4"))
        return first | 1, second

    @property
    def mus(self) -> np.ndarray:
        """Per-step GDP parameters mu_t = C_t / sigma_t (inf where sigma_t = 0)."""
        with np.errstate(divide="ignore"):
            return self._clip_norms / self._noise_stddevs

    def _check_steps(self, steps) -> int:
        if steps is None:
            return self.num_steps
        if isinstance(steps, bool) or int(steps) != steps or not 0 <= steps <= self.num_steps:
            raise ValueError(f"`steps` must be an integer in [0, {self.num_steps}]. Received: steps={steps}.")
        return int(steps)

    def check_accountable(self, accountant: str = registry.DEFAULT_ACCOUNTANT, **options) -> None:
        """Raises now, before any training, if `epsilon(..., accountant, **options)` would refuse a step: ValueError
        on an unknown accountant or option, `noise_range.NoiseOutOfRangeError` naming the first step it cannot
        represent and the accepted range."""
        entry = registry.get(accountant)
        noise_range.check_noise_multipliers(
            self.noise_multipliers, accountant, entry.min_noise_multiplier(**entry.check_options(options))
        )

    def to_dp_event(self, steps: int | None = None) -> dp_accounting.DpEvent:
        """The dp_accounting event of the first `steps` steps (all T by default): runs of equal noise multipliers as
        `SelfComposedDpEvent`s in one `ComposedDpEvent` (a constant schedule is one self-composed event)."""
        return registry.dp_event(self.sampling_probability, self.noise_multipliers[: self._check_steps(steps)])

    def epsilon(
        self, delta: float, accountant: str = registry.DEFAULT_ACCOUNTANT, steps: int | None = None, **options
    ) -> float:
        """Epsilon of the first `steps` steps (default: all T) at `delta` in (0, 1) under `accountant`: 'pld'
        (default; `fast_pld.pld_epsilon`), 'rdp' (`fast_rdp.rdp_epsilon`) or 'gdp_clt' (`GdpCltAccountant`; it can
        understate). `**options` are the accountant's (`registry.get(accountant).option_checks`), e.g.
        `value_discretization_interval=1e-4` for 'pld' (its `final_options`, for final reported numbers).

        Raises:
          ValueError: on a bad argument or option; `noise_range.NoiseOutOfRangeError` naming the step if a noise
            multiplier is outside what the accountant can represent.
        """
        delta = validation.check_delta(delta)
        entry = registry.get(accountant)
        options = entry.check_options(options)
        steps = self._check_steps(steps)
        if steps == 0:
            return 0.0
        if np.any(self._noise_stddevs[:steps] == 0):
            return math.inf
        arrays = (self._sampling_probability, self._clip_norms[:steps], self._noise_stddevs[:steps])
        return float(entry.epsilon(*arrays, delta, **options))

    def epsilons_at(self, delta: float, steps, accountant: str = registry.DEFAULT_ACCOUNTANT, **options) -> np.ndarray:
        """Epsilon of the first k steps at `delta` under `accountant` for each k of the non-decreasing integer
        array `steps` (in [0, T]), in one pass; options as `epsilon`'s."""
        entry = registry.get(accountant)
        arrays = (self._sampling_probability, self._clip_norms, self._noise_stddevs)
        return entry.epsilons_at(*arrays, delta, steps, **entry.check_options(options))

    def get_config(self) -> dict:
        """Plain-Python description, the inverse of `from_config` ('calibration' only when there is one)."""
        config = {
            "clip_norms": self._clip_norms.tolist(),
            "noise_stddevs": self._noise_stddevs.tolist(),
            "sampling_probability": self._sampling_probability,
        }
        if self._calibration is not None:
            config["calibration"] = dataclasses.asdict(self._calibration)
        return config

    @classmethod
    def from_config(cls, config: dict) -> DPSchedule:
        """Rebuilds a schedule from `get_config()` output (also the output of versions without calibration)."""
        config = dict(config)
        if isinstance(config.get("calibration"), dict):
            config["calibration"] = Calibration(**config["calibration"])
        return cls(**config)

    def to_json(self) -> str:
        """JSON text of `get_config()` (float64 values survive the round trip exactly)."""
        return json.dumps(self.get_config())

    @classmethod
    def from_json(cls, text: str) -> DPSchedule:
        """Rebuilds a schedule from `to_json()` output."""
        return cls.from_config(json.loads(text))

    def __eq__(self, other) -> bool:
        """Same mechanism: equal clip norms, noise and sampling probability (the calibration is ignored)."""
        if not isinstance(other, DPSchedule):
            return NotImplemented
        return (
            self._sampling_probability == other._sampling_probability
            and np.array_equal(self._clip_norms, other._clip_norms)
            and np.array_equal(self._noise_stddevs, other._noise_stddevs)
        )

    def __repr__(self) -> str:
        return (
            f"DPSchedule(num_steps={self.num_steps}, sampling_probability={self.sampling_probability:.6g}, "
            f"clip_norms=[{self._clip_norms[0]:.4g} .. {self._clip_norms[-1]:.4g}], "
            f"noise_stddevs=[{self._noise_stddevs[0]:.4g} .. {self._noise_stddevs[-1]:.4g}]"
            + ("" if self._calibration is None else f", calibration={self._calibration}")
            + ")"
        )


def sampling_from_epochs(
    num_examples: int, batch_size: int, epochs: float | None = None, steps: int | None = None
) -> tuple[float, int]:
    """(p, T) of a run as TF-Privacy's `compute_dp_sgd_privacy` derives them: p = batch_size / num_examples (the
    EXPECTED batch size) and T = `steps` or ceil(epochs * num_examples / batch_size).

    Args:
      num_examples: N, the number of training examples, an int >= 1.
      batch_size: the expected batch size p N, an int in [1, N].
      epochs: passes over the data, a float > 0; give exactly one of ``epochs`` and ``steps``.
      steps: T, an int >= 1.

    Raises:
      ValueError: on a value out of its range, or unless exactly one of ``epochs`` and ``steps`` is given.
    """
    num_examples = validation.check_positive_int("num_examples", num_examples)
    batch_size = validation.check_positive_int("batch_size", batch_size)
    if batch_size > num_examples:
        raise ValueError(f"`batch_size` must be <= num_examples={num_examples}. Received: batch_size={batch_size}.")
    if (epochs is None) == (steps is None):
        raise ValueError(f"Give exactly one of `epochs` and `steps`. Received: epochs={epochs}, steps={steps}.")
    if steps is None:
        steps = int(math.ceil(validation.check_float("epochs", epochs) * num_examples / batch_size))
    steps = validation.check_positive_int("steps", steps)
    return batch_size / num_examples, steps


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
    if not all(0 < epsilon < math.inf for epsilon in epsilons):
        return math.nan
    return math.log(epsilons[1] / epsilons[0]) / (2 * step)


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
    target]; under 'gdp_clt' mu_0 solves the CLT equation, and the rigorous epsilon may be far above the target (p =
    250/60000, T = 4800, the last 5 steps at 3x mu, delta 1e-5: GDP-CLT 1.0 is PLD 3.78). Returns the `DPSchedule` with
    `calibration` set.

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
    entry = registry.get(accountant)
    p = validation.check_probability(sampling_probability)
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
    from the CLT's `mu0`. A shape with more than `_ROUGH_SEARCH_GROUPS` distinct values first gets a rough pass with
    its noise multipliers rounded down into that many groups (pessimistic and cheaper), leaving 2-4 evaluations of
    the real thing."""

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


def _check_rhos(rho_mu: float, rho_c: float) -> tuple[float, float]:
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
    """One of the paper's schedules (module docstring), calibrated to (target_epsilon, target_delta) by
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
    rho_mu, rho_c = _check_rhos(rho_mu, rho_c)
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


@dataclasses.dataclass(frozen=True, kw_only=True)
class PrivacyBudget:
    """A run's privacy budget and the schedule to spend it: `calibrate()` returns the `DPSchedule` (`calibrate`'s,
    with p and T from `sampling_from_epochs`). The DP optimizers' budget arguments are one. Checked at construction
    (ValueError naming the argument), so a bad budget fails before any calibration.

    Args:
      target_epsilon, target_delta: the budget, epsilon > 0 and delta in (0, 1 / num_examples).
      num_examples, batch_size: N and the EXPECTED batch size pN (<= N) of Poisson sampling.
      method, initial_clip, rho_mu, rho_c, accountant: as `calibrate`'s.
      epochs, steps: exactly one: T = steps, or ceil(epochs N / batch_size).
    """

    target_epsilon: float
    target_delta: float
    num_examples: int
    batch_size: int
    method: str
    initial_clip: float
    epochs: float | None = None
    steps: int | None = None
    rho_mu: float = 1.0
    rho_c: float = 1.0
    accountant: str = registry.DEFAULT_ACCOUNTANT

    def __post_init__(self):
        self.sampling()
        validation.check_choice("method", self.method, ALL_METHODS)
        _check_rhos(self.rho_mu, self.rho_c)
        validation.check_float("initial_clip", self.initial_clip)
        validation.check_budget(self.target_epsilon, self.target_delta)
        validation.check_delta_below_inverse_size(self.target_delta, self.num_examples)
        registry.get(self.accountant)

    def sampling(self) -> tuple[float, int]:
        """(p, T) of the run: `sampling_from_epochs`."""
        return sampling_from_epochs(self.num_examples, self.batch_size, epochs=self.epochs, steps=self.steps)

    def calibrate(self) -> DPSchedule:
        """The schedule that spends this budget (`calibrate`, which says what is raised)."""
        arguments = dataclasses.asdict(self)
        for name in ("num_examples", "batch_size", "epochs", "steps"):
            del arguments[name]
        sampling_probability, num_steps = self.sampling()
        return calibrate(**arguments, sampling_probability=sampling_probability, num_steps=num_steps)


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
    `calibration`: that accountant is not in the registry."""
    initial_clip = validation.check_float("initial_clip", initial_clip)
    multipliers = cdp.calibrate_noise(
        method, target_epsilon, target_delta, sampling_probability, num_steps, noise_decay=noise_decay, decay=decay
    )
    clips = np.full(multipliers.size, initial_clip)
    return DPSchedule(clips, clips * multipliers, sampling_probability)


def gdp_clt_understatement(schedule: DPSchedule) -> str | None:
    """A warning text if a schedule calibrated under the GDP-CLT (an accountant that is not `rigorous`) has a PLD
    epsilon (same delta) above GDP_CLT_WARNING_RATIO x its target or one the PLD cannot represent; else (or for any
    other schedule) None."""
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
