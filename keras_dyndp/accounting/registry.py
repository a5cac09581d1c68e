"""Accountants by name: one table from an accountant's name to everything the package does with it.

Schedules, callbacks, reports and scripts look an `--accountant` up here (`get`): a new accountant is one `Accountant`
in `_ACCOUNTANTS`. 'rdp' and 'pld' are rigorous (`fast_rdp`, `fast_pld`); 'gdp_clt', the paper's CLT approximation,
can understate epsilon badly (p = 0.01, T = 20, delta = 1e-5: GDP-CLT 1.00 is PLD 4.20) and is used only when named.
`DEFAULT_ACCOUNTANT` 'pld' is the tightest.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable
from collections.abc import Mapping
from typing import Any

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
DEFAULT_PLD_VALUE_DISCRETIZATION_INTERVAL = fast_pld.DEFAULT_VALUE_DISCRETIZATION_INTERVAL
# dp_accounting's own default grid, recommended for final reported numbers (the PLD entry's `final_options`).
FINAL_PLD_VALUE_DISCRETIZATION_INTERVAL = 1e-4


@dataclasses.dataclass(frozen=True)
class Accountant:
    """What one accountant offers; every callable takes the accountant's options as keyword arguments.

    `make()` gives a fresh `dp_accounting.PrivacyAccountant` (add-or-remove-one); `epsilon(schedule, delta, steps)`
    the epsilon of a `DPSchedule`'s first 1 <= steps <= T steps, each with noise > 0 (`DPSchedule.epsilon` handles
    the other cases); `epsilons_at(schedule, delta, steps)` that of the first k steps for each k of the
    non-decreasing `steps`, in one pass; `min_noise_multiplier()` the least noise it represents (`noise_range`).
    `option_checks` maps an option to its check, `final_options` are for final reported numbers (read-only).
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


def _gdp_clt_epsilon(schedule, delta: float, steps: int) -> float:
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
    name: str, *, pld_value_discretization_interval: float = DEFAULT_PLD_VALUE_DISCRETIZATION_INTERVAL
) -> dp_accounting.PrivacyAccountant:
    """A fresh `dp_accounting.PrivacyAccountant` (add-or-remove-one) with nothing composed.

    Args:
      name: 'gdp_clt' (`GdpCltAccountant`, the paper's approximation), 'rdp' (`RdpAccountant`, default orders) or
        'pld' (`PLDAccountant`).
      pld_value_discretization_interval: the PLD's grid step, a float > 0, used for 'pld' only; smaller is tighter
        and slower.

    Raises:
      ValueError: on an unknown ``name`` or an interval out of range.
    """
    entry = get(name, "name")
    if "value_discretization_interval" not in entry.option_checks:
        return entry.make()
    return entry.make(
        value_discretization_interval=fast_pld.check_interval(
            pld_value_discretization_interval, "pld_value_discretization_interval"
        )
    )
