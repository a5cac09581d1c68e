"""A run's privacy budget (`PrivacyBudget`) and the DP optimizers' choice between a schedule and a budget
(`resolve_schedule`): the schedule the optimizer trains under and the public normaliser of its noisy sum."""

from __future__ import annotations

import dataclasses

from keras_dyndp.accounting import registry
from keras_dyndp.core import batch_sizes
from keras_dyndp.core import validation
from keras_dyndp.schedules import calibration
from keras_dyndp.schedules.schedule import ALL_METHODS
from keras_dyndp.schedules.schedule import DPSchedule
from keras_dyndp.schedules.schedule import sampling_from_epochs

BUDGET_ARGUMENTS = tuple(
    "target_epsilon target_delta num_examples batch_size epochs steps method initial_clip rho_mu rho_c "
    "accountant".split()
)
_REQUIRED_BUDGET_ARGUMENTS = {
    "target_epsilon": "target_epsilon=1.0 (the whole run's epsilon)",
    "target_delta": "target_delta=1e-5 (below 1 / num_examples)",
    "num_examples": "num_examples=len(x) (the training set's size)",
    "batch_size": "batch_size=256 (the expected Poisson batch size p * num_examples)",
    "method": f"method='vanilla' (one of {', '.join(ALL_METHODS)})",
    "initial_clip": "initial_clip=1.0 (C_0, the clip norm of the first step)",
}
"""The budget arguments without a default, each with an example and its meaning, for the refusal of a missing one."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class PrivacyBudget:
    """A run's privacy budget and the schedule to spend it: `calibrate()` returns the `DPSchedule` (`calibrate`'s,
    with p and T from `sampling_from_epochs`). The DP optimizers' budget arguments are one. Checked at construction
    (ValueError naming the argument), so a bad budget fails before any calibration.

    Args:
      target_epsilon: epsilon of the whole run, a finite float > 0.
      target_delta: delta of the whole run, in (0, 1 / num_examples).
      num_examples: N, the size of the training set, an int >= 1.
      batch_size: the EXPECTED batch size pN of Poisson sampling, an int in [1, N].
      method: as `calibrate`'s: one of `METHODS` or `BASELINES`.
      initial_clip: C_0, the first step's clipping norm (L2, per example), a finite float > 0.
      epochs: passes over the data, > 0: T = ceil(epochs N / batch_size). Exactly one of `epochs` and `steps`.
      steps: T, the number of steps, an int >= 1. Exactly one of `epochs` and `steps`.
      rho_mu: as `calibrate`'s: mu_T / mu_0 >= 1.
      rho_c: as `calibrate`'s: C_0 / C_T >= 1.
      accountant: as `calibrate`'s: 'pld' (default), 'rdp' or 'gdp_clt'.
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
        calibration.check_rhos(self.rho_mu, self.rho_c)
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
        return calibration.calibrate(**arguments, sampling_probability=sampling_probability, num_steps=num_steps)


def check_expected_batch_size(expected_batch_size) -> float | None:
    if expected_batch_size is None:
        return None
    return validation.check_float(
        "expected_batch_size", expected_batch_size, hint="p*N, the expected number of examples per batch"
    )


def schedule_normaliser(schedule: DPSchedule, expected_batch_size, public_batch_size: bool) -> float | None:
    """The normaliser of a `DPSchedule`: exactly one of ``expected_batch_size`` (p N) and ``public_batch_size`` (None:
    each batch's rows). It must not follow the private data as a Poisson batch's size or a padded batch's rows do: p N
    is public and gives the batch-size check its N; rows are safe only for fixed-size batches, as the user states."""
    expected_batch_size = check_expected_batch_size(expected_batch_size)
    if public_batch_size and expected_batch_size is not None:
        raise ValueError(
            "Give either `expected_batch_size` (p*N: divide the noisy sum by that public constant and check each "
            "batch's size against Poisson sampling) or public_batch_size=True (divide it by each batch's rows, "
            f"which you state are public), not both. Received: expected_batch_size={expected_batch_size:g}, "
            "public_batch_size=True."
        )
    if not public_batch_size and expected_batch_size is None:
        p = schedule.sampling_probability
        raise ValueError(
            "An optimizer built from a `schedule` needs `expected_batch_size` = p*N (here p*N = "
            f"{p:g} * the number of training examples): the noisy sum is divided by it. Dividing by each batch's "
            "rows instead would release the private Poisson batch size with every update (padded batches follow "
            "it too), and without N no batch size can be checked against the schedule's sampling. Only if your "
            "batches have a fixed, public size (not Poisson sampling, so outside the schedule's accounting) pass "
            "public_batch_size=True instead. Received: expected_batch_size=None."
        )
    return expected_batch_size


def resolve_schedule(
    schedule, budget: dict, expected_batch_size, public_batch_size: bool
) -> tuple[DPSchedule, float | None]:
    """The optimizer's schedule and normaliser from exactly one of ``schedule``, a `DPSchedule` (normaliser:
    `schedule_normaliser`) or a `PrivacyBudget`, and ``budget``, the budget arguments by name (None: not given), which
    are one. A budget is calibrated here (under its ``accountant``), its normaliser its ``batch_size``."""
    given = {name: value for name, value in budget.items() if value is not None}
    if schedule is not None and given:
        raise ValueError(
            "Give either `schedule` or the budget arguments, not both. "
            f"Received: schedule={schedule!r} and {', '.join(given)}."
        )
    if isinstance(schedule, PrivacyBudget):
        return _calibrated(schedule, expected_batch_size, public_batch_size)
    if schedule is not None:
        return _checked(schedule, expected_batch_size, public_batch_size)
    if not given:
        raise ValueError(
            "Give either `schedule` (a DPSchedule or a PrivacyBudget) or the budget arguments target_epsilon, "
            "target_delta, num_examples, batch_size, epochs or steps, method and initial_clip. Received neither."
        )
    missing = [name for name in _REQUIRED_BUDGET_ARGUMENTS if name not in given]
    if missing:
        examples = ", ".join(_REQUIRED_BUDGET_ARGUMENTS[name] for name in missing)
        raise ValueError(
            f"Building the schedule from a budget needs {', '.join(missing)} as well: pass e.g. {examples}. "
            f"Received only: {', '.join(given)}."
        )
    return _calibrated(PrivacyBudget(**given), expected_batch_size, public_batch_size)


def _checked(schedule, expected_batch_size, public_batch_size: bool) -> tuple[DPSchedule, float | None]:
    """A given `DPSchedule` and its normaliser; its calibration's delta below 1 / N where p N gives N."""
    if not isinstance(schedule, DPSchedule):
        raise TypeError(
            "`schedule` must be a keras_dyndp.schedules.DPSchedule or a keras_dyndp.schedules.PrivacyBudget. "
            f"Received: schedule={schedule!r} of type {type(schedule).__name__}."
        )
    expected_batch_size = schedule_normaliser(schedule, expected_batch_size, public_batch_size)
    num_examples = batch_sizes.implied_num_examples(expected_batch_size, schedule.sampling_probability)
    if schedule.calibration is not None and num_examples is not None:
        validation.check_delta_below_inverse_size(
            schedule.calibration.target_delta, num_examples, "schedule.calibration.target_delta"
        )
    return schedule, expected_batch_size


def _calibrated(budget: PrivacyBudget, expected_batch_size, public_batch_size: bool) -> tuple[DPSchedule, float]:
    """The schedule that spends ``budget`` and its normaliser, ``budget.batch_size`` (p N)."""
    if public_batch_size:
        raise ValueError(
            "A privacy budget accounts for Poisson batches of batch_size examples in expectation, whose actual "
            "sizes are private: the noisy sum is divided by expected_batch_size = batch_size. Leave "
            "public_batch_size out. Received: public_batch_size=True."
        )
    if expected_batch_size is not None and expected_batch_size != budget.batch_size:
        raise ValueError(
            "With a privacy budget (or the budget arguments) `expected_batch_size` is `batch_size`; leave it out or "
            "make them equal. "
            f"Received: expected_batch_size={expected_batch_size}, batch_size={budget.batch_size}."
        )
    return budget.calibrate(), check_expected_batch_size(budget.batch_size)
