"""`DPSchedule`, the one description of a run's per-step clip norms and noise, and a run's (p, T) from its epochs."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Callable
from collections.abc import Sequence

import dp_accounting
import numpy as np

from keras_dyndp.accounting import cdp
from keras_dyndp.accounting import noise_range
from keras_dyndp.accounting import registry
from keras_dyndp.core import validation

METHODS = ("vanilla", "growing_mu", "sensitivity_decay", "dynamic")
"""The paper's schedules, `calibrate`'s and the optimizers' ``method``: constant clip and noise (Abadi et al. 2016),
growing mu_t (Alg. 1), a decaying clip, and both (Alg. 2)."""
BASELINES = cdp.NAMES
"""The paper's noise-decay baselines (its Table 1), 'zcdp' and 'tcdp', each calibrated by its own accountant (`cdp`)."""
ALL_METHODS = METHODS + BASELINES


@dataclasses.dataclass(frozen=True)
class Calibration:
    """How a schedule was calibrated: its epsilon under `accountant` meets (target_epsilon, target_delta). Metadata
    only (privacy depends on the arrays alone): the optimizer checks a GDP-CLT promise against the PLD.

    Attributes:
      accountant: what it was calibrated under, one of `accounting.ACCOUNTANT_NAMES` ('pld', 'rdp', 'gdp_clt').
      target_epsilon: epsilon of the whole run, a finite float > 0.
      target_delta: delta of the whole run, in (0, 1).
    """

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
        clip, noise = np.array(clip_norms, dtype=np.float64), np.array(noise_stddevs, dtype=np.float64)
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
        """Two int32 words (first odd: never (0, 0); int32 survives every backend's saving) of a 64-bit hash of T, p,
        the clip norms and the noise, equal for equal schedules. The DP optimizers store it with their step counter,
        so that a counter restored into another schedule is refused (`step_checks.restored_schedule_refusal`)."""
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
        """Raises now, before any training, if `epsilon(..., accountant, **options)` would refuse a step: ValueError on
        an unknown accountant or option, `noise_range.NoiseOutOfRangeError` naming the first step outside its range."""
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
        delta, entry = validation.check_delta(delta), registry.get(accountant)
        options, steps = entry.check_options(options), self._check_steps(steps)
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
