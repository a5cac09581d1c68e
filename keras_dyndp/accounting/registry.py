"""Accountants by name: one table from an accountant's name to everything the package does with it. Schedules,
callbacks, reports and scripts look an `--accountant` up here (`get`): a new accountant is one `Accountant` in
`_ACCOUNTANTS`. 'rdp' and 'pld' are rigorous (`fast_rdp`, `fast_pld`); 'gdp_clt', the paper's CLT approximation, can
understate epsilon badly (docs/privacy.md) and is used only when named. `DEFAULT_ACCOUNTANT` 'pld' is the tightest."""

from __future__ import annotations

import dataclasses
import itertools
import types
from collections.abc import Callable
from collections.abc import Mapping
from typing import Any

import dp_accounting
import numpy as np
from dp_accounting import pld
from dp_accounting import rdp

from keras_dyndp.accounting import fast_pld
from keras_dyndp.accounting import fast_rdp
from keras_dyndp.accounting import gdp
from keras_dyndp.accounting import noise_range
from keras_dyndp.accounting.gdp_clt_accountant import GdpCltAccountant
from keras_dyndp.core import validation

DEFAULT_ACCOUNTANT = "pld"
DEFAULT_PLD_VALUE_DISCRETIZATION_INTERVAL = fast_pld.DEFAULT_VALUE_DISCRETIZATION_INTERVAL
# dp_accounting's own default grid, recommended for final reported numbers (the PLD entry's `final_options`).
FINAL_PLD_VALUE_DISCRETIZATION_INTERVAL = 1e-4


@dataclasses.dataclass(frozen=True)
class Accountant:
    """What one accountant offers, on plain arrays; every callable takes the accountant's options as keywords. `make()`
    gives a fresh `dp_accounting.PrivacyAccountant` (add-or-remove-one); `epsilon(p, clip_norms, noise_stddevs, delta)`
    the epsilon of the steps of those arrays [k >= 1], each with noise > 0 (`DPSchedule.epsilon` handles the other
    cases); `epsilons_at(..., steps)` that of the first k steps for each k of the non-decreasing `steps`, in one pass
    (the arrays, not z alone: the GDP-CLT takes mu_t = C_t / sigma_t); `min_noise_multiplier()` the least z it
    represents. `option_checks` maps an option to its check, `final_options` are for final reported numbers. What the
    callers do differently per accountant is said here, not by its name: `rigorous` (False: it can understate epsilon,
    so a schedule calibrated under it is checked against the PLD), `clt_calibration` (mu_0 is the extended CLT's root
    rather than searched), `always_logged` (`PrivacyLogger` logs it beside the accountant it is given)."""

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
    clt_calibration: bool = False
    always_logged: bool = False

    def check_options(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """Returns the checked `options`, or raises ValueError naming an unknown or bad one."""
        unknown = sorted(set(options) - set(self.option_checks))
        if unknown:
            raise ValueError(
                f"Options of the {self.name!r} accountant must be among {tuple(self.option_checks)}. "
                f"Received: {', '.join(unknown)}."
            )
        return {key: self.option_checks[key](value) for key, value in options.items()}


def dp_event(sampling_probability: float, noise_multipliers: np.ndarray) -> dp_accounting.DpEvent:
    """The dp_accounting event of Poisson-sampled Gaussian steps (rate p, noise multipliers z_t [T]): runs of equal
    z as `SelfComposedDpEvent`s in one `ComposedDpEvent` (a constant schedule is one self-composed event)."""
    if len(noise_multipliers) == 0:
        return dp_accounting.NoOpDpEvent()
    events = [
        dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(sampling_probability, dp_accounting.GaussianDpEvent(z)), len(list(run))
        )
        for z, run in itertools.groupby(map(float, noise_multipliers))
    ]
    return events[0] if len(events) == 1 else dp_accounting.ComposedDpEvent(events)


def _on_multipliers(function: Callable) -> Callable:
    """`function(p, z, *arguments, **options)` of the noise multipliers z_t = sigma_t / C_t, called with the arrays."""
    return lambda p, clip_norms, noise_stddevs, *arguments, **options: function(
        p, noise_stddevs / clip_norms, *arguments, **options
    )


def _gdp_clt_epsilon(sampling_probability: float, noise_multipliers: np.ndarray, delta: float) -> float:
    """GDP-CLT epsilon of the steps' dp_accounting event (the same numbers as composing it by hand)."""
    noise_range.check_noise_multipliers(noise_multipliers, "gdp_clt")
    return float(GdpCltAccountant().compose(dp_event(sampling_probability, noise_multipliers)).get_epsilon(delta))


def _gdp_clt_epsilons_at(p, clip_norms, noise_stddevs, delta, steps) -> np.ndarray:
    """`gdp.gdp_clt_epsilons_at` of mu_t = C_t / sigma_t (inf where sigma_t = 0)."""
    with np.errstate(divide="ignore"):
        return gdp.gdp_clt_epsilons_at(p, clip_norms / noise_stddevs, delta, steps)


_ACCOUNTANTS = {
    entry.name: entry
    for entry in (
        Accountant(
            name="gdp_clt",
            rigorous=False,
            make=GdpCltAccountant,
            epsilon=_on_multipliers(_gdp_clt_epsilon),
            epsilons_at=_gdp_clt_epsilons_at,
            clt_calibration=True,
            always_logged=True,
        ),
        Accountant(
            name="rdp",
            rigorous=True,
            make=lambda orders=None: rdp.RdpAccountant(orders),
            epsilon=_on_multipliers(fast_rdp.rdp_epsilon),
            epsilons_at=_on_multipliers(fast_rdp.rdp_epsilons_at),
            option_checks=types.MappingProxyType({"orders": fast_rdp.check_orders}),
        ),
        Accountant(
            name="pld",
            rigorous=True,
            make=lambda value_discretization_interval=DEFAULT_PLD_VALUE_DISCRETIZATION_INTERVAL: pld.PLDAccountant(
                value_discretization_interval=value_discretization_interval
            ),
            epsilon=_on_multipliers(fast_pld.pld_epsilon),
            epsilons_at=_on_multipliers(fast_pld.pld_epsilons_at),
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
# What `PrivacyLogger` logs beside the accountant it is given.
ALWAYS_LOGGED_ACCOUNTANT_NAMES = tuple(name for name, entry in _ACCOUNTANTS.items() if entry.always_logged)


def get(name: str, argument: str = "accountant") -> Accountant:
    """The registry entry of accountant `name`, or ValueError naming `argument` and the valid names."""
    return _ACCOUNTANTS[validation.check_choice(argument, name, ACCOUNTANT_NAMES)]


def make_accountant(
    name: str, *, pld_value_discretization_interval: float = DEFAULT_PLD_VALUE_DISCRETIZATION_INTERVAL
) -> dp_accounting.PrivacyAccountant:
    """A fresh `dp_accounting.PrivacyAccountant` (add-or-remove-one) with nothing composed.

    Args:
      name: 'gdp_clt' (`GdpCltAccountant`, the paper's CLT), 'rdp' (`RdpAccountant`) or 'pld' (`PLDAccountant`).
      pld_value_discretization_interval: the PLD's grid step, a float > 0, for 'pld' only; smaller: tighter, slower.

    Raises:
      ValueError: on an unknown ``name`` or an interval out of range.
    """
    entry = get(name, "name")
    if "value_discretization_interval" not in entry.option_checks:
        return entry.make()
    interval = fast_pld.check_interval(pld_value_discretization_interval, "pld_value_discretization_interval")
    return entry.make(value_discretization_interval=interval)
