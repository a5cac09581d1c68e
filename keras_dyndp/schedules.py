"""Per-step clipping and noise schedules, and their calibration to a privacy budget.

A `DPSchedule` is the single description of what a dynamic DP-SGD run does at each step: step k (0-based,
the paper's t = k + 1) clips every per-example gradient to L2 norm `clip_norms[k]` and adds Gaussian noise of
standard deviation `noise_stddevs[k]` to the SUM of the clipped gradients. The same schedule produces the
dp_accounting event that every accountant consumes, so what is trained and what is accounted cannot drift apart.

`calibrate` builds the paper's schedules (Du et al., "Dynamic Differential-Privacy Preserving SGD"):

* ``vanilla``: C_t = C_0, mu_t = mu_0 (Abadi et al. 2016 with the GDP-CLT accountant of Bu et al.).
* ``growing_mu`` (Eq. 11-14, Alg. 1): C_t = C_0, mu_t = rho_mu^(t/T) mu_0.
* ``sensitivity_decay`` (Eq. 15-17): C_t = rho_c^(-t/T) C_0, mu_t = mu_0 (closed form).
* ``dynamic`` (Alg. 2): C_t = rho_c^(-t/T) C_0, sigma_t = (C_0 / mu_0) (rho_mu rho_c)^(-t/T).

In every case mu_0 is chosen so the schedule spends exactly the target budget under the extended GDP central
limit theorem (Corollary 1): mu_tot = p sqrt(sum_t (exp(mu_t^2) - 1)), with mu_tot the GDP parameter of
(target_epsilon, target_delta). The GDP-CLT is an approximation that can understate epsilon (Gopi et al. 2021);
pass ``accountant='rdp'`` (or ``'pld'``) to calibrate against a rigorous accountant instead, and use
`DPSchedule.epsilon` to compare accountants on the same schedule.
"""

from __future__ import annotations

import functools
import json
import math
from typing import Callable, Sequence, Union

import dp_accounting
import numpy as np
from scipy import optimize

from keras_dyndp.accounting import fast_pld
from keras_dyndp.accounting import fast_rdp
from keras_dyndp.accounting import gdp
from keras_dyndp.accounting import registry
from keras_dyndp import validation

METHODS = ("vanilla", "growing_mu", "sensitivity_decay", "dynamic")


class CalibrationError(ValueError):
    """No schedule of the requested shape meets the target budget under the chosen accountant."""


ArrayOrFn = Union[Sequence[float], np.ndarray, Callable[[np.ndarray], np.ndarray]]


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
    """

    def __init__(self, clip_norms, noise_stddevs, sampling_probability: float):
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
    def num_steps(self) -> int:
        """Number of steps T the budget covers."""
        return int(self._clip_norms.size)

    @property
    def noise_multipliers(self) -> np.ndarray:
        """z_t = sigma_t / C_t, the quantity privacy depends on (TF-Privacy's `noise_multiplier`)."""
        return self._noise_stddevs / self._clip_norms

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

    def epsilon(self, delta: float, accountant: str = "gdp_clt", steps: int | None = None) -> float:
        """Epsilon spent by the first `steps` steps at `delta`, by the named accountant.

        Args:
          delta: target delta in (0, 1).
          accountant: 'gdp_clt' (the paper's CLT approximation, via `GdpCltAccountant`), 'rdp' (rigorous; exact
            heterogeneous RDP, `fast_rdp.rdp_epsilon`, about 1 s for 4800 distinct steps) or 'pld' (rigorous and
            tightest; `fast_pld.pld_epsilon` groups steps by rounding noise multipliers down, a valid upper bound
            within about 2% of the ungrouped PLD, a few seconds for 4800 distinct steps).
          steps: number of leading steps to account (default: all T).
        """
        if not 0.0 < delta < 1.0:
            raise ValueError(f"`delta` must be in (0, 1). Received: delta={delta}.")
        steps = self._check_steps(steps)
        if steps == 0:
            return 0.0
        if np.any(self._noise_stddevs[:steps] == 0):
            return math.inf
        if accountant == "rdp":
            return float(fast_rdp.rdp_epsilon(self.sampling_probability, self.noise_multipliers[:steps], delta))
        if accountant == "pld":
            return float(fast_pld.pld_epsilon(self.sampling_probability, self.noise_multipliers[:steps], delta))
        return float(registry.make_accountant(accountant).compose(self.to_dp_event(steps)).get_epsilon(delta))

    def get_config(self) -> dict:
        """Plain-Python description, the inverse of `from_config`."""
        return {
            "clip_norms": self._clip_norms.tolist(),
            "noise_stddevs": self._noise_stddevs.tolist(),
            "sampling_probability": self._sampling_probability,
        }

    @classmethod
    def from_config(cls, config: dict) -> "DPSchedule":
        """Rebuilds a schedule from `get_config()` output."""
        return cls(**config)

    def to_json(self) -> str:
        """JSON text of `get_config()` (float64 values survive the round trip exactly)."""
        return json.dumps(self.get_config())

    @classmethod
    def from_json(cls, text: str) -> "DPSchedule":
        """Rebuilds a schedule from `to_json()` output."""
        return cls.from_config(json.loads(text))

    def __eq__(self, other) -> bool:
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
            f"noise_stddevs=[{self._noise_stddevs[0]:.4g} .. {self._noise_stddevs[-1]:.4g}])"
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
        raise ValueError(
            f"`batch_size` must be <= num_examples={num_examples}. Received: batch_size={batch_size}."
        )
    if (epochs is None) == (steps is None):
        raise ValueError(f"Give exactly one of `epochs` and `steps`. Received: epochs={epochs}, steps={steps}.")
    if steps is None:
        if not (math.isfinite(epochs) and epochs > 0):
            raise ValueError(f"`epochs` must be > 0. Received: epochs={epochs}.")
        steps = int(math.ceil(epochs * num_examples / batch_size))
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
    """Largest mu_0 with p^2 sum_t expm1((mu_0 s_t)^2) <= mu_tot^2, to float precision (Eq. 13).

    The left side is increasing in mu_0, and the constant-shape closed form (Eq. 16) evaluated at the smallest and
    largest s_t brackets the root exactly, so no bracket search is needed.
    """
    per_step = math.log1p(mu_tot**2 / (p**2 * mu_shape.size))
    low, high = math.sqrt(per_step) / mu_shape.max(), math.sqrt(per_step) / mu_shape.min()
    target = mu_tot**2 / p**2

    def excess(mu0: float) -> float:
        return float(np.sum(np.expm1((mu0 * mu_shape) ** 2))) - target

    if high > low * (1 + 1e-15):
        mu0 = optimize.brentq(excess, low, high, xtol=1e-300, rtol=4 * np.finfo(float).eps)
    else:
        mu0 = low
    while excess(mu0) > 0:  # brentq may land a hair above the root: step to the safe side.
        mu0 = np.nextafter(mu0, 0.0)
    return float(mu0)


def _rigorous_scale(
    make_schedule: Callable[[float], DPSchedule], target_epsilon: float, target_delta: float,
    accountant: str, initial: float,
) -> DPSchedule:
    """Largest mu_0 whose schedule's rigorous epsilon is <= target (bracketed search, then the safe side).

    Epsilon increases with mu_0. The search starts at the GDP-CLT solution `initial`, widens a bracket in steps
    that double (rigorous accountants usually need a little more noise than the CLT), finds the root with brentq
    and finally steps mu_0 down until the target is met, as dp_accounting's `calibrate_dp_mechanism` does.
    """

    @functools.lru_cache(maxsize=None)
    def excess(log_mu0: float) -> float:
        spent = make_schedule(math.exp(log_mu0)).epsilon(target_delta, accountant)
        return min(spent, 1e6) - target_epsilon  # brentq needs finite values.

    start, width = math.log(initial), 0.125
    low, high = (start - width, start) if excess(start) > 0 else (start, start + width)
    for _ in range(60):
        if excess(low) <= 0 < excess(high):
            break
        width *= 2
        low, high = (low - width, low) if excess(low) > 0 else (high, high + width)
    else:
        raise CalibrationError(
            f"No noise level meets target_epsilon={target_epsilon} under the {accountant!r} accountant."
        )
    log_mu0 = optimize.brentq(excess, low, high, xtol=1e-9)
    while excess(log_mu0) > 0:
        log_mu0 -= 1e-9
    return make_schedule(math.exp(log_mu0))


def calibrate_shape(
    clip_norms: ArrayOrFn,
    mu_shape: ArrayOrFn,
    *,
    target_epsilon: float,
    target_delta: float,
    sampling_probability: float,
    num_steps: int,
    accountant: str = "gdp_clt",
) -> DPSchedule:
    """Scales a user-given schedule shape so the whole run spends exactly the target budget.

    The schedule is C_t = clip_norms(t) and sigma_t = C_t / (mu_0 * mu_shape(t)) for t = 1..T; only the scalar
    mu_0 is solved for. A noise shape n_t is expressed as mu_shape = C_t / n_t.

    Args:
      clip_norms: C_t, an array [T] (or scalar) or a callable of the float array t = 1..T.
      mu_shape: relative per-step GDP parameters s_t > 0, same forms as `clip_norms`.
      target_epsilon, target_delta: the budget, epsilon > 0 and delta in (0, 1).
      sampling_probability: Poisson sampling probability p in (0, 1].
      num_steps: T >= 1.
      accountant: 'gdp_clt' (paper, exact to float precision) or a rigorous 'rdp' / 'pld' (bracketed search,
        then stepped to the safe side so the result never exceeds the target).

    Returns:
      The calibrated `DPSchedule`; its epsilon under `accountant` is <= target_epsilon and, for 'gdp_clt', equal
      to it up to float rounding.
    """
    if not (isinstance(target_epsilon, (int, float)) and math.isfinite(target_epsilon) and target_epsilon > 0):
        raise ValueError(f"`target_epsilon` must be finite and > 0. Received: target_epsilon={target_epsilon}.")
    if not 0.0 < target_delta < 1.0:
        raise ValueError(f"`target_delta` must be in (0, 1). Received: target_delta={target_delta}.")
    if accountant not in registry.ACCOUNTANT_NAMES:
        raise ValueError(f"`accountant` must be one of {registry.ACCOUNTANT_NAMES}. Received: {accountant!r}.")
    p = validation.check_probability(sampling_probability)
    num_steps = validation.check_positive_int("num_steps", num_steps)
    clips = _as_step_array("clip_norms", clip_norms, num_steps)
    shape = _as_step_array("mu_shape", mu_shape, num_steps)

    def make_schedule(mu0: float) -> DPSchedule:
        return DPSchedule(clips, clips / (mu0 * shape), p)

    mu0 = _clt_mu0(gdp.mu_from_epsilon(target_epsilon, target_delta), p, shape)
    if accountant != "gdp_clt":
        return _rigorous_scale(make_schedule, target_epsilon, target_delta, accountant, initial=mu0)
    schedule = make_schedule(mu0)
    while schedule.epsilon(target_delta) > target_epsilon:  # Rounding in the eps <-> mu conversions.
        mu0 *= 1 - 1e-13
        schedule = make_schedule(mu0)
    return schedule


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
    accountant: str = "gdp_clt",
) -> DPSchedule:
    """Builds one of the paper's schedules, calibrated to (target_epsilon, target_delta).

    Args:
      method: 'vanilla', 'growing_mu', 'sensitivity_decay' or 'dynamic' (see the module docstring).
      target_epsilon: total epsilon > 0 of the run.
      target_delta: total delta in (0, 1); the paper uses 1 / (10 N).
      sampling_probability: Poisson sampling probability p = expected batch size / N, in (0, 1].
      num_steps: number of steps T >= 1 (see `sampling_from_epochs`).
      initial_clip: C_0 > 0.
      rho_mu: mu_T / mu_0 >= 1, used by 'growing_mu' and 'dynamic' (the paper sweeps 1/rho_mu in 0.1..0.8).
      rho_c: C_0 / C_T >= 1, used by 'sensitivity_decay' and 'dynamic'.
      accountant: which accountant the budget is met under; 'gdp_clt' is the paper's method.

    Returns:
      A `DPSchedule` of T steps.

    Example:
      >>> schedule = calibrate('dynamic', target_epsilon=1.2, target_delta=1e-5, sampling_probability=250 / 60000,
      ...                      num_steps=4800, initial_clip=1.5, rho_mu=1 / 0.8, rho_c=1 / 0.3)
    """
    if method not in METHODS:
        raise ValueError(f"`method` must be one of {METHODS}. Received: method={method!r}.")
    for name, value in (("initial_clip", initial_clip), ("rho_mu", rho_mu), ("rho_c", rho_c)):
        if not (isinstance(value, (int, float)) and math.isfinite(value)):
            raise ValueError(f"`{name}` must be a finite number. Received: {name}={value}.")
    if initial_clip <= 0:
        raise ValueError(f"`initial_clip` must be > 0. Received: initial_clip={initial_clip}.")
    for name, value in (("rho_mu", rho_mu), ("rho_c", rho_c)):
        if value < 1:
            raise ValueError(f"`{name}` must be >= 1 (the paper's 1/{name} is in (0, 1]). Received: {name}={value}.")
    num_steps = validation.check_positive_int("num_steps", num_steps)
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
