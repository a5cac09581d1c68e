"""Argument checks shared by the public entry points: each error names the argument and its valid range."""

import math
from typing import Any


def check_probability(sampling_probability: Any, name: str = "sampling_probability") -> float:
    """Returns `sampling_probability` as a float, or raises ValueError unless it lies in (0, 1]."""
    try:
        p = float(sampling_probability)
    except (TypeError, ValueError):
        p = math.nan
    if not 0.0 < p <= 1.0:
        raise ValueError(f"`{name}` must be in (0, 1]. Received: {name}={sampling_probability}.")
    return p


def check_positive_int(name: str, value: Any) -> int:
    """Returns `value` as an int, or raises ValueError unless it is a whole number >= 1."""
    try:
        whole = not isinstance(value, bool) and int(value) == value
    except (TypeError, ValueError, OverflowError):
        whole = False
    if not whole or value < 1:
        raise ValueError(f"`{name}` must be an integer >= 1. Received: {name}={value}.")
    return int(value)
