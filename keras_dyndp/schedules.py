"""Per-step clipping and noise schedules, and their calibration to a privacy budget.

A `DPSchedule` is the single description of what a dynamic DP-SGD run does at each step: step k (0-based,
the paper's t = k + 1) clips every per-example gradient to L2 norm `clip_norms[k]` and adds Gaussian noise of
standard deviation `noise_stddevs[k]` to the SUM of the clipped gradients. The same schedule produces the
dp_accounting event that every accountant consumes, so what is trained and what is accounted cannot drift apart.

`calibrate` builds the paper's schedules (Du et al., "Dynamic Differential-Privacy Preserving SGD"):

* ``vanilla``: C_t = C_0, mu_t = mu_0 (Abadi et al. 2016).
* ``growing_mu`` (Eq. 11-14, Alg. 1): C_t = C_0, mu_t = rho_mu^(t/T) mu_0.
* ``sensitivity_decay`` (Eq. 15-17): C_t = rho_c^(-t/T) C_0, mu_t = mu_0.
* ``dynamic`` (Alg. 2): C_t = rho_c^(-t/T) C_0, sigma_t = (C_0 / mu_0) (rho_mu rho_c)^(-t/T).

and the baselines it compares with (its Table 1; `calibrate_baseline`): ``zcdp`` and ``tcdp``, C_t = C_0 and
noise multipliers decaying by z_0 / z_T = rho_mu (the growing-mu noise shape), each calibrated by its own accountant
(`keras_dyndp.accounting.cdp`).

In every case only the scale mu_0 is solved for, so that the whole run spends the target (epsilon, delta) under
the chosen accountant:

* ``'pld'`` (the default, `registry.DEFAULT_ACCOUNTANT`): rigorous and the tightest; ``'rdp'``: rigorous, looser.
  A search over mu_0 (`accounting.scale_search`) lands the epsilon in [target (1 - 1e-3), target], well inside
  the PLD's own pessimism (its grid and grouping add ~0.4% and <= 2%).
* ``'gdp_clt'``: the paper's method. mu_0 solves the extended GDP central limit theorem (Corollary 1),
  mu_tot = p sqrt(sum_t (exp(mu_t^2) - 1)), with mu_tot the GDP parameter of (target_epsilon, target_delta). The
  CLT is an approximation, not a bound, and can understate epsilon badly (delta 1e-5: p 0.01, T 20: GDP-CLT 1.00
  is PLD 4.20; p 250/60000, T 4800 with the last 5 steps at 3 mu: GDP-CLT 1.0 is PLD 3.78). Use it to reproduce
  the paper; the optimizers warn when such a schedule's PLD epsilon exceeds its target by more than 5%
  (`gdp_clt_understatement`).

The calibrated schedule remembers how it was made (`DPSchedule.calibration`). Use `DPSchedule.epsilon` to compare
accountants on the same schedule.
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

from keras_dyndp import validation
from keras_dyndp.accounting import cdp
from keras_dyndp.accounting import fast_pld
from keras_dyndp.accounting import gdp
from keras_dyndp.accounting import noise_range
from keras_dyndp.accounting import registry
from keras_dyndp.accounting import scale_search
from keras_dyndp.accounting.scale_search import CalibrationError

METHODS = ("vanilla", "growing_mu", "sensitivity_decay", "dynamic")
# The paper's noise-decay baselines (its Table 1), each calibrated by its own accountant (`accounting.cdp`).
BASELINES = cdp.NAMES
ALL_METHODS = METHODS + BASELINES
# A schedule calibrated under the GDP-CLT is flagged when its PLD epsilon exceeds the target by more than this.
GDP_CLT_WARNING_RATIO = 1.05
# Distinct noise multipliers of the rough first pass of a rigorous calibration (see `_calibrate_rigorous`).
_ROUGH_SEARCH_GROUPS = 8
# `_clt_mu0`: a closed-form bracket narrower than this (relative) is a single point, and brentq's tolerances on mu_0
# (absolute: none to speak of; relative: 4 ulp) solve the CLT equation to float precision.
_CLT_BRACKET_RTOL = 1e-15
_CLT_XTOL = 1e-300
_CLT_RTOL = 4 * np.finfo(float).eps
# `_calibrate_gdp_clt`: relative step of mu_0 down past the float rounding of the eps <-> mu conversions.
_GDP_CLT_SAFETY_STEP = 1e-13
# `_scale_range`: margin in log mu_0 that keeps exp() rounding at the ends inside the accountant's accepted range.
_SCALE_RANGE_MARGIN = 1e-9
# `_clt_log_slope`: half-width in log mu_0 of the central difference.
_SLOPE_HALF_WIDTH = 0.01

__all__ = [
    "ALL_METHODS",
    "BASELINES",
    "CalibrationError",
    "Calibration",
    "DPSchedule",
    "GdpCltUnderstatementWarning",
    "METHODS",
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
    """How a schedule was calibrated: its epsilon under `accountant` meets (target_epsilon, target_delta).

    Metadata only: it says what was promised, so that the optimizer can check a GDP-CLT promise against the PLD.
    Privacy itself depends on the schedule's arrays alone.
    """

    accountant: str
    target_epsilon: float
    target_delta: float

    def __post_init__(self):
        registry.get(self.accountant)
        validation.check_budget(self.target_epsilon, self.target_delta)


ArrayOrFn = Sequence[float] | np.ndarray | Callable[[np.ndarray], np.ndarray]


class DPSchedule:
    """Immutable per-step clipping norms C_t and noise standard deviations sigma_t over T steps.

    Privacy depends only on the noise multipliers z_t = sigma_t / C_t (equivalently mu_t = C_t / sigma_t) and the
    Poisson sampling probability p; the clip norms themselves shape utility. Step k (0-based) is accounted as
    ``PoissonSampledDpEvent(p, GaussianDpEvent(z_k))`` under add-or-remove-one adjacency.

    Args:
      clip_norms: 1-D array [T] of L2 clipping thresholds C_t, each > 0.
      noise_stddevs: 1-D array [T] of absolute noise standard deviations sigma_t >= 0, added to the sum of the
        clipped per-example gradients. A zero entry means no privacy for that step (epsilon is infinite).
      sampling_probability: probability p in (0, 1] with which each example joins a step's batch.
      calibration: how the schedule was calibrated (`calibrate` and `calibrate_shape` set it), or None for a
        schedule built by hand. Kept by `get_config` / `to_json`; equality ignores it (see `__eq__`).
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
        clip.setflags(write=False)
        noise.setflags(write=False)
        self._clip_norms = clip
        self._noise_stddevs = noise
        self._sampling_probability = validation.check_probability(sampling_probability)
        if calibration is not None and not isinstance(calibration, Calibration):
            raise TypeError(
                "`calibration` must be a keras_dyndp.schedules.Calibration or None. "
                f"Received: calibration={calibration!r}."
            )
        self._calibration = calibration

    @property
    def clip_norms(self) -> np.ndarray:
        """Read-only array [T] of clipping thresholds C_t."""
        return self._clip_norms

    @property
    def noise_stddevs(self) -> np.ndarray:
        """Read-only array [T] of absolute noise standard deviations sigma_t (noise on the clipped sum)."""
        return self._noise_stddevs

    @property
    def sampling_probability(self) -> float:
        """Poisson sampling probability p of each step."""
        return self._sampling_probability

    @property
    def calibration(self) -> Calibration | None:
        """How the schedule was calibrated (accountant and target), or None for a hand-built schedule."""
        return self._calibration

    @property
    def num_steps(self) -> int:
        """Number of steps T the budget covers."""
        return int(self._clip_norms.size)

    @property
    def noise_multipliers(self) -> np.ndarray:
        """z_t = sigma_t / C_t, the quantity privacy depends on (TF-Privacy's `noise_multiplier`)."""
        return self._noise_stddevs / self._clip_norms

    @property
    def fingerprint(self) -> tuple[int, int]:
        """Two int32 words of a 64-bit hash of T, p, the clip norms and the noise (not the calibration), first word
        odd: equal schedules (`__eq__`) have equal fingerprints, and no fingerprint is (0, 0).

        The DP optimizers store it with their step counter, so that a counter restored into another schedule is
        refused (`keras_dyndp.optimizer_base.restored_schedule_refusal`); int32 survives every backend's saving.
        """
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
        """Raises now, before any training, if `epsilon(..., accountant, **options)` would refuse a step of this
        schedule.

        Raises:
          ValueError: on an unknown accountant or option; noise_range.NoiseOutOfRangeError (a ValueError) naming
            the first step whose noise multiplier the accountant cannot represent, and the accepted range (see
            `keras_dyndp.accounting.noise_range`).
        """
        entry = registry.get(accountant)
        noise_range.check_noise_multipliers(
            self.noise_multipliers, accountant, entry.min_noise_multiplier(**entry.check_options(options))
        )

    def to_dp_event(self, steps: int | None = None) -> dp_accounting.DpEvent:
        """The dp_accounting event of the first `steps` steps (all T by default).

        Consecutive steps with the same noise multiplier are run-length encoded as `SelfComposedDpEvent`s inside
        one `ComposedDpEvent`, so a constant schedule is a single self-composed event.
        """
        steps = self._check_steps(steps)
        multipliers = self.noise_multipliers[:steps]
        if steps == 0:
            return dp_accounting.NoOpDpEvent()
        change = np.flatnonzero(np.diff(multipliers)) + 1
        starts = np.concatenate([[0], change])
        counts = np.diff(np.concatenate([starts, [steps]]))
        events = [
            dp_accounting.SelfComposedDpEvent(
                dp_accounting.PoissonSampledDpEvent(
                    self.sampling_probability, dp_accounting.GaussianDpEvent(float(multipliers[start]))
                ),
                int(count),
            )
            for start, count in zip(starts, counts)
        ]
        return events[0] if len(events) == 1 else dp_accounting.ComposedDpEvent(events)

    def epsilon(
        self, delta: float, accountant: str = registry.DEFAULT_ACCOUNTANT, steps: int | None = None, **options
    ) -> float:
        """Epsilon spent by the first `steps` steps at `delta`, by the named accountant (`accounting.registry`).

        Args:
          delta: target delta in (0, 1).
          accountant: 'pld' (default; rigorous and tightest: `fast_pld.pld_epsilon` groups steps by rounding noise
            multipliers down, a valid upper bound within about 2% of the ungrouped PLD, a few seconds for 4800
            distinct steps), 'rdp' (rigorous; exact heterogeneous RDP, `fast_rdp.rdp_epsilon`, about 1 s for 4800
            distinct steps) or 'gdp_clt' (the paper's CLT approximation, via `GdpCltAccountant`; it can understate).
          steps: number of leading steps to account (default: all T).
          **options: the accountant's options (`registry.get(accountant).option_checks`), e.g.
            `value_discretization_interval=1e-4` for 'pld' (`registry.get('pld').final_options`, for final
            reported numbers) or `orders` for 'rdp'.

        Raises:
          ValueError: on a bad argument or option; `noise_range.NoiseOutOfRangeError` (a ValueError) naming the step
            if a noise multiplier is outside what the accountant can represent (`keras_dyndp.accounting.noise_range`).
        """
        delta = validation.check_delta(delta)
        entry = registry.get(accountant)
        options = entry.check_options(options)
        steps = self._check_steps(steps)
        if steps == 0:
            return 0.0
        if np.any(self._noise_stddevs[:steps] == 0):
            return math.inf
        return float(entry.epsilon(self, delta, steps, **options))

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
        """Same mechanism: equal clip norms, noise and sampling probability (how it was calibrated is ignored).

        Two schedules that train and account identically are equal, e.g. a saved schedule from before calibration
        metadata existed and the same schedule calibrated now; compare `calibration` separately where it matters.
        """
        if not isinstance(other, DPSchedule):
            return NotImplemented
        return (
            self._sampling_probability == other._sampling_probability
            and np.array_equal(self._clip_norms, other._clip_norms)
            and np.array_equal(self._noise_stddevs, other._noise_stddevs)
        )

    __hash__ = None

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
    """Sampling probability p and step count T of a run, as TF-Privacy's `compute_dp_sgd_privacy` derives them.

    p = batch_size / num_examples (batch_size is the EXPECTED batch size under Poisson sampling) and, given
    `epochs`, T = ceil(epochs * num_examples / batch_size). Give exactly one of `epochs` and `steps`.
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
    """Largest mu_0 with p^2 sum_t expm1((mu_0 s_t)^2) <= mu_tot^2 (Eq. 13), solved to float precision.

    That is the root of the CLT equation, not a privacy guarantee: the CLT itself is an approximation.

    The left side is increasing in mu_0, and the constant-shape closed form (Eq. 16) evaluated at the smallest and
    largest s_t brackets the root exactly, so no bracket search is needed.
    """
    per_step = math.log1p(mu_tot**2 / (p**2 * mu_shape.size))
    low, high = math.sqrt(per_step) / mu_shape.max(), math.sqrt(per_step) / mu_shape.min()
    target = mu_tot**2 / p**2

    def excess(mu0: float) -> float:
        return float(np.sum(np.expm1((mu0 * mu_shape) ** 2))) - target

    if high > low * (1 + _CLT_BRACKET_RTOL):
        mu0 = optimize.brentq(excess, low, high, xtol=_CLT_XTOL, rtol=_CLT_RTOL)
    else:
        mu0 = low
    # brentq may land a hair above the root.
    return float(scale_search.step_to_safe_side(mu0, lambda mu: excess(mu) <= 0, lambda mu: np.nextafter(mu, 0.0)))


def _scale_range(mu_shape: np.ndarray, accountant: str) -> tuple[float, float]:
    """[lower, upper] of log mu_0 whose noise multipliers z_t = 1 / (mu_0 s_t) the accountant accepts."""
    floor = registry.get(accountant).min_noise_multiplier()
    return (
        -math.log(noise_range.MAX_NOISE_MULTIPLIER * mu_shape.min()) + _SCALE_RANGE_MARGIN,
        -math.log(floor * mu_shape.max()) - _SCALE_RANGE_MARGIN,
    )


def _calibrate_gdp_clt(
    make_schedule: Callable[[float], DPSchedule], mu0: float, target_epsilon: float, target_delta: float
) -> DPSchedule:
    """The schedule at the CLT solution mu0, stepped down past float rounding in the eps <-> mu conversions."""
    try:
        mu0 = scale_search.step_to_safe_side(
            mu0,
            lambda mu: make_schedule(mu).epsilon(target_delta, "gdp_clt") <= target_epsilon,
            lambda mu: mu * (1 - _GDP_CLT_SAFETY_STEP),
        )
    except noise_range.NoiseOutOfRangeError as error:
        raise CalibrationError(
            f"Under the 'gdp_clt' accountant, target_epsilon={target_epsilon} needs noise outside the accepted "
            f"range: {error}"
        ) from error
    return make_schedule(mu0)


def _clt_log_slope(mu0: float, p: float, mu_shape: np.ndarray, delta: float) -> float:
    """d log(epsilon) / d log(mu_0) of the GDP-CLT at mu0 (central difference): the rigorous search's first guess.

    nan where the CLT epsilon is 0 or infinite there (the search then assumes 1).
    """
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


def _calibrate_rigorous(
    make_schedule: Callable[[float], DPSchedule],
    mu0: float,
    p: float,
    mu_shape: np.ndarray,
    target_epsilon: float,
    target_delta: float,
    accountant: str,
) -> DPSchedule:
    """The largest mu_0 whose schedule's rigorous epsilon is <= target, searched from the CLT solution mu0.

    When the shape has more than `_ROUGH_SEARCH_GROUPS` distinct values, a rough pass first accounts the schedule
    with its noise multipliers rounded down into that many (pessimistic, and 3-5x cheaper per evaluation for T = 40
    to 4800 distinct steps), which leaves 2-4 evaluations of the real thing.
    """

    def epsilon_of(schedule: DPSchedule) -> float:
        try:
            return schedule.epsilon(target_delta, accountant)
        except noise_range.NoiseOutOfRangeError:
            return math.inf  # Too little noise for the accountant to represent: far over any budget.

    def rough_epsilon_of(log_mu0: float) -> float:
        schedule = make_schedule(math.exp(log_mu0))
        values, counts = fast_pld.group_noise_multipliers(schedule.noise_multipliers, _ROUGH_SEARCH_GROUPS)
        noise = np.repeat(values, counts)
        return epsilon_of(DPSchedule(np.ones_like(noise), noise, schedule.sampling_probability))

    lower, upper = _scale_range(mu_shape, accountant)
    log_mu0 = scale_search.largest_scale_within(
        lambda log_mu0: epsilon_of(make_schedule(math.exp(log_mu0))),
        target_epsilon,
        start=math.log(mu0),
        lower=lower,
        upper=upper,
        rough_epsilon_of=rough_epsilon_of if np.unique(mu_shape).size > _ROUGH_SEARCH_GROUPS else None,
        slope=_clt_log_slope(mu0, p, mu_shape, target_delta),
        what=f"the schedule under the {accountant!r} accountant",
    )
    return make_schedule(math.exp(log_mu0))


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
    """Scales a user-given schedule shape so the whole run spends the target budget under `accountant`.

    The schedule is C_t = clip_norms(t) and sigma_t = C_t / (mu_0 * mu_shape(t)) for t = 1..T; only the scalar
    mu_0 is solved for. A noise shape n_t is expressed as mu_shape = C_t / n_t. The shape matters to how far the
    GDP-CLT is off: p = 250/60000, T = 4800 with the last 5 steps at 3x mu, GDP-CLT 1.0 is PLD 3.78 (delta 1e-5).

    Args:
      clip_norms: C_t, an array [T] (or scalar) or a callable of the float array t = 1..T.
      mu_shape: relative per-step GDP parameters s_t > 0, same forms as `clip_norms`.
      target_epsilon, target_delta: the budget, epsilon > 0 and delta in (0, 1).
      sampling_probability: Poisson sampling probability p in (0, 1].
      num_steps: T >= 1.
      accountant: 'pld' (default) or 'rdp', rigorous: the result's epsilon under it is in
        [target (1 - 1e-3), target]; or 'gdp_clt', the paper's approximation: mu_0 solves the CLT equation, and
        the rigorous epsilon of the result may be far above the target.

    Returns:
      The calibrated `DPSchedule`, with `calibration` set; its epsilon under `accountant` is <= target_epsilon.

    Raises:
      ValueError: on a bad argument.
      CalibrationError: if no scale meets the target with noise multipliers the accountant accepts
        (`keras_dyndp.accounting.noise_range`), e.g. a target so large that it needs almost no noise.
    """
    validation.check_budget(target_epsilon, target_delta)
    registry.get(accountant)
    p = validation.check_probability(sampling_probability)
    num_steps = validation.check_positive_int("num_steps", num_steps)
    clips = _as_step_array("clip_norms", clip_norms, num_steps)
    shape = _as_step_array("mu_shape", mu_shape, num_steps)
    calibration = Calibration(accountant, float(target_epsilon), float(target_delta))

    def make_schedule(mu0: float) -> DPSchedule:
        return DPSchedule(clips, clips / (mu0 * shape), p, calibration)

    mu0 = _clt_mu0(gdp.mu_from_epsilon(target_epsilon, target_delta), p, shape)
    if accountant == "gdp_clt":
        return _calibrate_gdp_clt(make_schedule, mu0, target_epsilon, target_delta)
    return _calibrate_rigorous(make_schedule, mu0, p, shape, target_epsilon, target_delta, accountant)


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
    """Builds one of the paper's schedules, calibrated to (target_epsilon, target_delta).

    Args:
      method: 'vanilla', 'growing_mu', 'sensitivity_decay' or 'dynamic' (see the module docstring); or a
        baseline, 'zcdp' or 'tcdp' (`calibrate_baseline` with exponential noise decay rho_mu; `rho_c` and
        `accountant` are checked but not used: the baseline has its own accountant and no calibration record).
      target_epsilon: total epsilon > 0 of the run.
      target_delta: total delta in (0, 1); the paper uses 1 / (10 N).
      sampling_probability: Poisson sampling probability p = expected batch size / N, in (0, 1].
      num_steps: number of steps T >= 1 (see `sampling_from_epochs`).
      initial_clip: C_0 > 0.
      rho_mu: mu_T / mu_0 >= 1, used by 'growing_mu' and 'dynamic' (the paper sweeps 1/rho_mu in 0.1..0.8).
      rho_c: C_0 / C_T >= 1, used by 'sensitivity_decay' and 'dynamic'.
      accountant: which accountant the budget is met under: 'pld' (default, rigorous and tight), 'rdp'
        (rigorous) or 'gdp_clt' (the paper's method, an approximation that can understate epsilon; pass it to
        reproduce the paper). See `calibrate_shape`.

    Returns:
      A `DPSchedule` of T steps, with `calibration` set.

    Raises:
      ValueError: on a bad argument; `CalibrationError` if the accountant cannot meet the target (see
        `calibrate_shape`).

    Example:
      >>> schedule = calibrate('dynamic', target_epsilon=1.2, target_delta=1e-5, sampling_probability=250 / 60000,
      ...                      num_steps=4800, initial_clip=1.5, rho_mu=1 / 0.8, rho_c=1 / 0.3)
    """
    validation.check_choice("method", method, ALL_METHODS)
    rho_mu, rho_c = (
        validation.check_float(name, value, 1.0, inclusive=True, hint=f"the paper's 1/{name} is in (0, 1]")
        for name, value in (("rho_mu", rho_mu), ("rho_c", rho_c))
    )
    num_steps = validation.check_positive_int("num_steps", num_steps)
    if method in BASELINES:  # calibrate_baseline checks initial_clip.
        registry.get(accountant)
        return calibrate_baseline(
            method,
            target_epsilon=target_epsilon,
            target_delta=target_delta,
            sampling_probability=sampling_probability,
            num_steps=num_steps,
            initial_clip=initial_clip,
            noise_decay=rho_mu,
        )
    initial_clip = validation.check_float("initial_clip", initial_clip)
    uses_mu = method in ("growing_mu", "dynamic")
    uses_c = method in ("sensitivity_decay", "dynamic")
    growth_mu = rho_mu if uses_mu else 1.0
    decay_c = rho_c if uses_c else 1.0
    return calibrate_shape(
        lambda t: initial_clip * decay_c ** (-t / num_steps),
        lambda t: growth_mu ** (t / num_steps),
        target_epsilon=target_epsilon,
        target_delta=target_delta,
        sampling_probability=sampling_probability,
        num_steps=num_steps,
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
    """One of the paper's noise-decay baselines: constant clip C_0, noise multipliers z_0 s_t calibrated so that
    the baseline's own accountant spends (target_epsilon, target_delta) (`accounting.cdp`).

    Args:
      method: 'zcdp' (rho-zCDP-SGD, Yu et al. 2019) or 'tcdp' (tCDP-SGD, Zhang et al. 2021; p <= 0.1).
      target_epsilon, target_delta: the budget, epsilon > 0 and delta in (0, 1).
      sampling_probability: p in (0, 1].
      num_steps: T >= 1.
      initial_clip: the constant clipping norm C > 0.
      noise_decay: z_0 / z_T >= 1.
      decay: 'exponential' or 'time' (`cdp.decay_shape`).

    Returns:
      A `DPSchedule` (no `calibration`: its accountant is not one of the registry's) whose epsilon under the
      baseline's accountant (`cdp.baseline_epsilon`) is <= target_epsilon.

    Raises:
      ValueError: on a bad argument, e.g. ('tcdp') p > 0.1.
    """
    initial_clip = validation.check_float("initial_clip", initial_clip)
    multipliers = cdp.calibrate_noise(
        method, target_epsilon, target_delta, sampling_probability, num_steps, noise_decay=noise_decay, decay=decay
    )
    clips = np.full(multipliers.size, initial_clip)
    return DPSchedule(clips, clips * multipliers, sampling_probability)


def gdp_clt_understatement(schedule: DPSchedule) -> str | None:
    """Why a schedule calibrated under the GDP-CLT is not worth its target, or None if it is (or was not).

    For a schedule whose `calibration` says 'gdp_clt', computes the PLD epsilon of the same schedule at the same
    delta; returns a warning text giving both numbers if it exceeds GDP_CLT_WARNING_RATIO (1.05) x the target, or
    if the PLD cannot represent the schedule at all. Hand-built schedules (no calibration) and rigorous
    calibrations return None.
    """
    calibration = schedule.calibration
    if calibration is None or calibration.accountant != "gdp_clt":
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
