"""Argument checks, one per kind of argument, called once where an argument is received: each returns the value it
accepts or raises ValueError naming the argument, its valid range and what was received. Delta is in (0, 1) for a budget
(0 has infinite epsilon for a Gaussian, 1 promises nothing); [0, 1] where a function mirrors `dp_accounting`'s
``get_epsilon(target_delta)`` (``allow_ends``). The sampling probability is in (0, 1] for a schedule (sampling nobody
trains nothing); [0, 1] for a single event's accounting, where p = 0 is a free step."""

import math
import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np


def _as_float(value: Any) -> float:
    """`value` as a float, or nan (failing every range check) when it is no real number, bools and strings included."""
    if isinstance(value, (bool, str, bytes)):
        return math.nan
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _hint(hint: str) -> str:
    return f" ({hint})" if hint else ""


def check_probability(
    sampling_probability: Any, name: str = "sampling_probability", *, allow_zero: bool = False
) -> float:
    """`sampling_probability` as a float in (0, 1] ([0, 1] with `allow_zero`)."""
    p = _as_float(sampling_probability)
    if not (0.0 <= p <= 1.0 if allow_zero else 0.0 < p <= 1.0):
        interval = "[0, 1]" if allow_zero else "(0, 1]"
        raise ValueError(f"`{name}` must be in {interval}. Received: {name}={sampling_probability}.")
    return p


def check_delta(delta: Any, name: str = "delta", *, allow_ends: bool = False, allow_zero: bool = False) -> float:
    """`delta` (or a confidence) as a float in (0, 1); [0, 1] with `allow_ends`, [0, 1) with `allow_zero`."""
    value = _as_float(delta)
    low_ok = value >= 0.0 if (allow_ends or allow_zero) else value > 0.0
    if not (low_ok and (value <= 1.0 if allow_ends else value < 1.0)):
        interval = "[0, 1]" if allow_ends else "[0, 1)" if allow_zero else "(0, 1)"
        raise ValueError(f"`{name}` must be in {interval}. Received: {name}={delta}.")
    return value


def check_budget(target_epsilon: Any, target_delta: Any) -> tuple[float, float]:
    """A privacy budget as floats: epsilon finite and > 0, delta in (0, 1)."""
    return check_float("target_epsilon", target_epsilon), check_delta(target_delta, "target_delta")


def check_delta_below_inverse_size(delta: Any, num_examples: int, name: str = "target_delta") -> float:
    """`delta` in (0, 1) and below 1 / N, N = `num_examples` >= 1 the training set's size: a mechanism that publishes
    one training example chosen at random meets delta = 1 / N, so such a delta promises nothing."""
    value = check_delta(delta, name)
    if value < 1.0 / num_examples:
        return value
    typical = f"1/N^1.1 = {num_examples**-1.1:.3g}" + (" or 1e-5" if num_examples < 100_000 else "")
    raise ValueError(
        f"`{name}` must be below 1/N = 1/{num_examples} = {1.0 / num_examples:.3g} (N, the training set's size): a "
        "delta of 1/N or more is met by releasing one whole training example at random, so the epsilon would "
        f"promise nothing. Typical is well below 1/N, e.g. {typical}. Received: {name}={delta!r}."
    )


def check_float(
    name: str, value: Any, low: float = 0.0, *, inclusive: bool = False, allow_inf: bool = False, hint: str = ""
) -> float:
    """`value` as a float > `low` (>= with `inclusive`), finite unless `allow_inf`; by default positive, finite."""
    number = _as_float(value)
    if not ((number >= low if inclusive else number > low) and (allow_inf or math.isfinite(number))):
        bound = f"{'' if allow_inf else 'a finite number '}{'>=' if inclusive else '>'} {low:g}"
        raise ValueError(f"`{name}` must be {bound}{_hint(hint)}. Received: {name}={value!r}.")
    return number


def check_int(name: str, value: Any, low: int, high: int | None = None, *, none_means: str | None = None) -> int | None:
    """`value` as an int (not a bool or a float) in [`low`, `high`]; None passes where `none_means` says what it is."""
    if value is None and none_means is not None:
        return None
    whole = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if not whole or value < low or (high is not None and value > high):
        accepted = f"an integer >= {low}" if high is None else f"an integer in [{low}, {high}]"
        if none_means is not None:
            accepted = f"None ({none_means}) or {accepted}"
        raise ValueError(f"`{name}` must be {accepted}. Received: {name}={value!r}.")
    return int(value)


def check_positive_int(
    name: str, value: Any, hint: str = "", *, none_means: str | None = None, exact: bool = False
) -> int | None:
    """`value` as an int, a whole number >= 1 (an int, not a float, with `exact`); None passes with `none_means`."""
    if value is None and none_means is not None:
        return None
    try:
        whole = (
            not isinstance(value, bool) and int(value) == value and (not exact or isinstance(value, numbers.Integral))
        )
    except (TypeError, ValueError, OverflowError):
        whole = False
    if not whole or value < 1:
        accepted = "an integer >= 1" if none_means is None else f"None ({none_means}) or an integer >= 1"
        raise ValueError(f"`{name}` must be {accepted}{_hint(hint)}. Received: {name}={value!r}.")
    return int(value)


def check_bool(name: str, value: Any) -> bool:
    """`value`, True or False (not a truthy number or string)."""
    if not isinstance(value, bool):
        raise ValueError(f"`{name}` must be True or False. Received: {name}={value!r}.")
    return value


def check_layer_rule(layer_class: Any, layer_base: type, parts: dict[str, Any], optional: Sequence[str] = ()) -> None:
    """TypeError unless ``layer_class`` subclasses ``layer_base`` (the backend's Keras layer) and every part of a
    layer rule is callable (those named in ``optional`` may be None): both backends' ``register_layer_rule``."""
    if not (isinstance(layer_class, type) and issubclass(layer_class, layer_base)):
        raise TypeError(f"`layer_class` must be a Keras layer class. Received: layer_class={layer_class!r}.")
    for name, part in parts.items():
        if not callable(part) and not (name in optional and part is None):
            raise TypeError(f"`{name}` must be callable. Received: {name}={part!r}.")


def check_choice(name: str, value: Any, choices: Sequence[Any], hint: str = "") -> Any:
    """`value`, one of `choices`."""
    if value not in choices:
        raise ValueError(f"`{name}` must be one of {tuple(choices)}{_hint(hint)}. Received: {name}={value!r}.")
    return value


def check_subset(name: str, values: Any, choices: Sequence[Any], *, allow_empty: bool = True) -> tuple:
    """`values` as a tuple of entries of `choices` (non-empty unless `allow_empty`)."""
    values = tuple(values)
    if (not values and not allow_empty) or any(value not in choices for value in values):
        size = "" if allow_empty else "non-empty "
        raise ValueError(f"`{name}` must be a {size}subset of {tuple(choices)}. Received: {name}={values}.")
    return values


def check_step_counts(steps: Any, num_steps: int, *, non_decreasing: bool = False) -> np.ndarray:
    """`steps` as a 1-D int array of whole numbers in [0, `num_steps`] (non-decreasing with `non_decreasing`)."""
    counts = np.asarray(steps)
    try:
        valid = counts.ndim == 1 and bool(np.all((counts == np.floor(counts)) & (counts >= 0) & (counts <= num_steps)))
    except TypeError:
        valid = False
    if not valid or (non_decreasing and np.any(np.diff(counts) < 0)):
        order = "non-decreasing " if non_decreasing else ""
        raise ValueError(
            f"`steps` must be a 1-D {order}sequence of integers in [0, {num_steps}] (the number of noise multipliers). "
            f"Received: steps={steps}."
        )
    return counts.astype(int)


def check_nonnegative_array(name: str, values: Any, *, allow_empty: bool = True) -> np.ndarray:
    """`values` as a 1-D float64 array (non-empty unless `allow_empty`) of entries >= 0 (inf allowed, nan not)."""
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1 or (array.size == 0 and not allow_empty):
        size = "" if allow_empty else "non-empty "
        raise ValueError(f"`{name}` must be a {size}1-D array (one entry per step). Received shape {array.shape}.")
    if not np.all(array >= 0):
        bad = array[~(array >= 0)][0]
        raise ValueError(f"Every entry of `{name}` must be >= 0 (inf allowed). Received an entry {bad}.")
    return array
