"""Argument checks shared by the public entry points: each error names the argument and its valid range.

Two ranges exist for delta and for the sampling probability, and each has one helper here:

* delta: (0, 1) open, the budget a schedule is calibrated or reported at (delta = 0 has infinite epsilon under a
  Gaussian mechanism, delta = 1 promises nothing). Functions that mirror `dp_accounting`'s
  `PrivacyAccountant.get_epsilon(target_delta)` contract accept [0, 1] instead (`allow_ends=True`), as it does.
* sampling probability: (0, 1] for a schedule (a step that samples nobody trains nothing); [0, 1] for the
  accounting of a single event (`allow_zero=True`), where p = 0 is a valid, free step.
"""

import math
from typing import Any


def _as_float(value: Any) -> float:
    """`value` as a float, or nan when it is no real number (strings included), so that range checks fail."""
    if isinstance(value, (str, bytes)):
        return math.nan
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def check_probability(
    sampling_probability: Any, name: str = "sampling_probability", *, allow_zero: bool = False
) -> float:
    """Returns `sampling_probability` as a float, or raises ValueError unless it lies in (0, 1] ([0, 1] with
    `allow_zero`)."""
    p = _as_float(sampling_probability)
    if not (0.0 <= p <= 1.0 if allow_zero else 0.0 < p <= 1.0):
        interval = "[0, 1]" if allow_zero else "(0, 1]"
        raise ValueError(f"`{name}` must be in {interval}. Received: {name}={sampling_probability}.")
    return p


def check_delta(delta: Any, name: str = "delta", *, allow_ends: bool = False) -> float:
    """Returns `delta` as a float, or raises ValueError unless it is a real number in (0, 1) ([0, 1] with
    `allow_ends`, `dp_accounting`'s range for `get_epsilon`)."""
    value = _as_float(delta)
    if not (0.0 <= value <= 1.0 if allow_ends else 0.0 < value < 1.0):
        interval = "[0, 1]" if allow_ends else "(0, 1)"
        raise ValueError(f"`{name}` must be in {interval}. Received: {name}={delta}.")
    return value


def check_positive_int(name: str, value: Any) -> int:
    """Returns `value` as an int, or raises ValueError unless it is a whole number >= 1."""
    try:
        whole = not isinstance(value, bool) and int(value) == value
    except (TypeError, ValueError, OverflowError):
        whole = False
    if not whole or value < 1:
        raise ValueError(f"`{name}` must be an integer >= 1. Received: {name}={value}.")
    return int(value)
