"""Accountants by name, so that schedules, callbacks and scripts can take an `--accountant` string.

'gdp_clt' is the paper's extended-CLT accountant (an approximation that can underestimate epsilon); 'rdp' and
'pld' are `dp_accounting`'s rigorous upper bounds. Every call returns a fresh accountant with an empty ledger.

`DEFAULT_ACCOUNTANT` ('pld') is the one the library calibrates and reports under unless told otherwise: rigorous
and the tightest of the three. The GDP-CLT can understate epsilon badly (p = 0.01, T = 20, delta = 1e-5: GDP-CLT
1.00 is PLD 4.20), so it is only ever used when asked for by name.
"""

import dp_accounting
from dp_accounting import pld
from dp_accounting import rdp

from keras_dyndp.accounting.gdp_clt_accountant import GdpCltAccountant

ACCOUNTANT_NAMES = ("gdp_clt", "rdp", "pld")
DEFAULT_ACCOUNTANT = "pld"

# PLD discretisation of the privacy-loss values. dp_accounting's default is 1e-4. 1e-3 is ~10x faster (p = 250/60000,
# T = 4800, sigma 1.126, delta 1e-5: 0.06 s vs 0.55 s; ten distinct sigmas: 1.0 s vs 7.7 s), which matters when
# epsilon is logged every epoch, and the epsilon it gives stays a valid upper bound (the discretisation is
# pessimistic) that is only ~0.4% looser (1.2554 vs 1.2505). Pass 1e-4 or smaller for final reported numbers.
DEFAULT_PLD_VALUE_DISCRETIZATION_INTERVAL = 1e-3


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
    if name == "gdp_clt":
        return GdpCltAccountant()
    if name == "rdp":
        return rdp.RdpAccountant()
    if name == "pld":
        if not pld_value_discretization_interval > 0:
            raise ValueError(
                "`pld_value_discretization_interval` must be > 0. "
                f"Received: pld_value_discretization_interval={pld_value_discretization_interval}."
            )
        return pld.PLDAccountant(value_discretization_interval=pld_value_discretization_interval)
    raise ValueError(f"`name` must be one of {ACCOUNTANT_NAMES}. Received: name={name!r}.")
