"""Accountants by name: one table from an accountant's name to everything the package does with it.

Schedules, callbacks, reports and scripts take an `--accountant` string and look it up here (`get`), so a new
accountant is one `Accountant` entry in `_ACCOUNTANTS`. An entry offers a fresh `dp_accounting` accountant
(`make`), the epsilon of a schedule's first steps (`epsilon`), the epsilons after several step counts in one pass
(`epsilons_at`), the smallest noise multiplier it can represent, and its options (keyword arguments of all of
these, checked by `check_options`), with the values recommended for final reported numbers (`final_options`).

'gdp_clt' is the paper's extended-CLT accountant (an approximation that can underestimate epsilon); 'rdp' and
'pld' are rigorous upper bounds (`dp_accounting`'s, computed fast by `fast_rdp` and `fast_pld`). Every `make`
returns a fresh accountant with an empty ledger.

`DEFAULT_ACCOUNTANT` ('pld') is the one the library calibrates and reports under unless told otherwise: rigorous
and the tightest of the three. The GDP-CLT can understate epsilon badly (p = 0.01, T = 20, delta = 1e-5: GDP-CLT
1.00 is PLD 4.20), so it is only ever used when asked for by name.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable
from collections.abc import Mapping
from typing import Any
from typing import Protocol

import dp_accounting
import numpy as np
from dp_accounting import pld
from dp_accounting import rdp

from keras_dyndp import validation
from keras_dyndp.accounting import fast_pld
from keras_dyndp.accounting import fast_rdp
from keras_dyndp.accounting import gdp
from keras_dyndp.accounting import noise_range
from keras_dyndp.accounting.gdp_clt_accountant import GdpCltAccountant

DEFAULT_ACCOUNTANT = "pld"
# The PLD grid the package accounts on by default (`fast_pld.DEFAULT_VALUE_DISCRETIZATION_INTERVAL`, one constant
# under its registry name): ~10x faster than dp_accounting's 1e-4 and ~0.4% looser, still a valid upper bound.
DEFAULT_PLD_VALUE_DISCRETIZATION_INTERVAL = fast_pld.DEFAULT_VALUE_DISCRETIZATION_INTERVAL
# dp_accounting's own default grid, recommended for final reported numbers (the PLD entry's `final_options`).
FINAL_PLD_VALUE_DISCRETIZATION_INTERVAL = 1e-4


class Schedule(Protocol):
    """What an accountant reads of a `keras_dyndp.schedules.DPSchedule` (which this layer does not import)."""

    @property
    def sampling_probability(self) -> float: ...

    @property
    def noise_multipliers(self) -> np.ndarray: ...

    @property
    def mus(self) -> np.ndarray: ...

    def to_dp_event(self, steps: int | None = None) -> dp_accounting.DpEvent: ...


@dataclasses.dataclass(frozen=True)
class Accountant:
    """What one accountant offers. Every callable takes the accountant's options as keyword arguments.

    Attributes:
      name: the name callers pass (`--accountant`).
      rigorous: whether its epsilon is an upper bound (False for the GDP-CLT approximation).
      make: `make(**options)`, a fresh `dp_accounting.PrivacyAccountant` (add-or-remove-one) with nothing composed.
      epsilon: `epsilon(schedule, delta, steps, **options)`, the epsilon of the first `steps` steps (1 <= steps
        <= T, every one with noise > 0; `DPSchedule.epsilon` handles the other cases).
      epsilons_at: `epsilons_at(schedule, delta, steps, **options)`, the epsilon of the first k steps for each k of
        the non-decreasing integer array `steps`, in one pass.
      min_noise_multiplier: `min_noise_multiplier(**options)`, the smallest noise multiplier it can represent
        (`noise_range`).
      option_checks: {option name: check returning the option's value or raising ValueError} (read-only).
      final_options: options recommended for final reported numbers (tighter, slower than the defaults; read-only).
    """

    name: str
    rigorous: bool
    make: Callable[..., dp_accounting.PrivacyAccountant]
    epsilon: Callable[..., float]
    epsilons_at: Callable[..., np.ndarray]
    min_noise_multiplier: Callable[..., float] = lambda **options: noise_range.MIN_NOISE_MULTIPLIER
    option_checks: Mapping[str, Callable[[Any], Any]] = dataclasses.field(
        default_factory=lambda: types.MappingProxyType({})
    )
    final_options: Mapping[str, Any] = dataclasses.field(default_factory=lambda: types.MappingProxyType({}))

    def check_options(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """Returns the checked `options`, or raises ValueError naming an unknown or bad one."""
        unknown = sorted(set(options) - set(self.option_checks))
        if unknown:
            raise ValueError(
                f"Options of the {self.name!r} accountant must be among {tuple(self.option_checks)}. "
                f"Received: {', '.join(unknown)}."
            )
        return {key: self.option_checks[key](value) for key, value in options.items()}


def _gdp_clt_epsilon(schedule: Schedule, delta: float, steps: int) -> float:
    """GDP-CLT epsilon of the schedule's dp_accounting event (the same numbers as composing it by hand)."""
    noise_range.check_noise_multipliers(schedule.noise_multipliers[:steps], "gdp_clt")
    return float(GdpCltAccountant().compose(schedule.to_dp_event(steps)).get_epsilon(delta))


_ACCOUNTANTS = {
    entry.name: entry
    for entry in (
        Accountant(
            name="gdp_clt",
            rigorous=False,
            make=GdpCltAccountant,
            epsilon=_gdp_clt_epsilon,
            epsilons_at=lambda schedule, delta, steps: gdp.gdp_clt_epsilons_at(
                schedule.sampling_probability, schedule.mus, delta, steps
            ),
        ),
        Accountant(
            name="rdp",
            rigorous=True,
            make=lambda orders=None: rdp.RdpAccountant(orders),
            epsilon=lambda schedule, delta, steps, **options: fast_rdp.rdp_epsilon(
                schedule.sampling_probability, schedule.noise_multipliers[:steps], delta, **options
            ),
            epsilons_at=lambda schedule, delta, steps, **options: fast_rdp.rdp_epsilons_at(
                schedule.sampling_probability, schedule.noise_multipliers, delta, steps, **options
            ),
            option_checks=types.MappingProxyType({"orders": fast_rdp.check_orders}),
        ),
        Accountant(
            name="pld",
            rigorous=True,
            make=lambda value_discretization_interval=DEFAULT_PLD_VALUE_DISCRETIZATION_INTERVAL: pld.PLDAccountant(
                value_discretization_interval=value_discretization_interval
            ),
            epsilon=lambda schedule, delta, steps, **options: fast_pld.pld_epsilon(
                schedule.sampling_probability, schedule.noise_multipliers[:steps], delta, **options
            ),
            epsilons_at=lambda schedule, delta, steps, **options: fast_pld.pld_epsilons_at(
                schedule.sampling_probability, schedule.noise_multipliers, delta, steps, **options
            ),
            min_noise_multiplier=lambda value_discretization_interval=DEFAULT_PLD_VALUE_DISCRETIZATION_INTERVAL: (
                noise_range.pld_min_noise_multiplier(value_discretization_interval)
            ),
            option_checks=types.MappingProxyType({"value_discretization_interval": fast_pld.check_interval}),
            final_options=types.MappingProxyType(
                {"value_discretization_interval": FINAL_PLD_VALUE_DISCRETIZATION_INTERVAL}
            ),
        ),
    )
}

ACCOUNTANT_NAMES = tuple(_ACCOUNTANTS)
# The accountants whose epsilon is an upper bound, for "report a rigorous epsilon" choices.
RIGOROUS_ACCOUNTANT_NAMES = tuple(name for name, entry in _ACCOUNTANTS.items() if entry.rigorous)


def get(name: str, argument: str = "accountant") -> Accountant:
    """The registry entry of accountant `name`, or ValueError naming `argument` and the valid names."""
    return _ACCOUNTANTS[validation.check_choice(argument, name, ACCOUNTANT_NAMES)]


def make_accountant(
    name: str,
    *,
    pld_value_discretization_interval: float = DEFAULT_PLD_VALUE_DISCRETIZATION_INTERVAL,
) -> dp_accounting.PrivacyAccountant:
    """Returns a fresh privacy accountant (add-or-remove-one neighbouring relation).

    Args:
        name: One of `ACCOUNTANT_NAMES`: 'gdp_clt' (`GdpCltAccountant`), 'rdp' (`dp_accounting.rdp.RdpAccountant`
            with its default orders) or 'pld' (`dp_accounting.pld.PLDAccountant`).
        pld_value_discretization_interval: Discretisation interval of the PLD accountant (only used for 'pld'),
            > 0. Smaller is tighter and slower.

    Returns:
        A new `dp_accounting.PrivacyAccountant` with nothing composed.

    Raises:
        ValueError: If `name` is not in `ACCOUNTANT_NAMES` or the interval is not > 0.
    """
    entry = get(name, "name")
    if "value_discretization_interval" not in entry.option_checks:
        return entry.make()
    return entry.make(
        value_discretization_interval=fast_pld.check_interval(
            pld_value_discretization_interval, "pld_value_discretization_interval"
        )
    )
