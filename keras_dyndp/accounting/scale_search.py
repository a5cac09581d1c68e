"""Calibration search: the largest scale whose epsilon meets a target, with few calls to a costly accountant. It solves
epsilon(x) = target for x = log mu_0, each evaluation composing the whole schedule (epsilon increases with x, smooth up
to tiny steps from the PLD's grouping and grid). A generic search (dp_accounting's `calibrate_dp_mechanism`: bracket by
doubling, then brentq on x) spends most calls on the bracket and on digits the accountant does not resolve. Here, on
f(x) = log(epsilon(x) / target) with acceptance window [log(1 - rtol), 0]: an optional rough pass on a cheap pessimistic
stand-in moves the start and measures f's slope; secant steps aim at the window's middle (at most a factor e^4 per
step), kept inside the bracket [largest x under budget, smallest x over] once there is one, by bisection when a step
would leave it or f is infinite; the search stops at the first x in the window, or returns the bracket's safe end once
it is narrower than 1e-9. Every returned x was evaluated and meets the target; outside [lower, upper] (the scales the
accountant accepts) it raises `CalibrationError`."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable

# Within 0.1% below the target: finer than the PLD's own pessimism (its grid's and its grouping's, docs/performance.md);
# each further digit would cost about one more evaluation.
DEFAULT_RTOL = 1e-3
_ROUGH_RTOL = 1e-2
_MAX_EVALUATIONS = 60
_BRACKET_WIDTH = 1e-9
_EDGE_WIDTH = 1e-3  # Where epsilon is infinite (the accountant refused the schedule), its edge is located to this.
_MAX_STEP = 4.0

EpsilonFunction = Callable[[float], float]


class CalibrationError(ValueError):
    """No schedule of the requested shape meets the target budget under the chosen accountant."""


def _unreachable(target_epsilon: float, what: str, epsilon: float) -> CalibrationError:
    return CalibrationError(
        f"target_epsilon={target_epsilon} cannot be reached: {what} with the least noise the accountant accepts "
        f"(see keras_dyndp.accounting.noise_range) spends only epsilon = {epsilon:.6g}. A target this large means "
        "no meaningful privacy; use a smaller target_epsilon."
    )


def _search(
    epsilon_of: EpsilonFunction,
    target_epsilon: float,
    x: float,
    lower: float,
    upper: float,
    rtol: float,
    slope: float,
    what: str,
) -> tuple[float, float]:
    """(x in the window or the bracket's safe end, the last secant slope of f)."""
    window = math.log1p(-rtol)
    aim = window / 2
    safe: tuple[float, float] | None = None  # Largest x seen with f <= 0, and its f.
    over: tuple[float, float] | None = None  # Smallest x seen with f > 0, and its f.
    previous: tuple[float, float] | None = None
    for _ in range(_MAX_EVALUATIONS):
        epsilon = epsilon_of(x)
        value = -math.inf if epsilon <= 0 else math.log(epsilon / target_epsilon)
        if window <= value <= 0:
            return x, slope
        if value <= 0 and (safe is None or x > safe[0]):
            safe = (x, value)
        elif value > 0 and (over is None or x < over[0]):
            over = (x, value)
        if previous is not None and math.isfinite(value) and math.isfinite(previous[1]) and previous[0] != x:
            secant = (value - previous[1]) / (x - previous[0])
            slope = secant if secant > 0 else slope
        previous = (x, value)
        if safe is not None and over is not None:
            width = over[0] - safe[0]
            if width <= _BRACKET_WIDTH:
                return safe[0], slope
            if math.isinf(over[1]) and width <= _EDGE_WIDTH:
                raise _unreachable(
                    target_epsilon,
                    what + " (at the edge of what the accountant can represent)",
                    target_epsilon * math.exp(safe[1]),
                )
            step = x + (aim - value) / slope if math.isfinite(value) else math.nan
            inside = safe[0] + 1e-3 * width < step < over[0] - 1e-3 * width
            x = step if inside else 0.5 * (safe[0] + over[0])
        elif safe is not None:
            if safe[0] >= upper:
                raise _unreachable(target_epsilon, what, target_epsilon * math.exp(safe[1]))
            step = (aim - value) / slope if math.isfinite(value) else 1.0
            x = min(upper, x + min(max(step, 1e-3), _MAX_STEP))
        else:
            if over[0] <= lower:
                raise CalibrationError(
                    f"target_epsilon={target_epsilon} cannot be met: {what} with the most noise the accountant "
                    f"accepts already spends epsilon = {target_epsilon * math.exp(over[1]):.6g}."
                )
            step = (aim - value) / slope if math.isfinite(value) else -1.0
            x = max(lower, x + max(min(step, -1e-3), -_MAX_STEP))
    raise CalibrationError(
        f"No calibration of {what} to target_epsilon={target_epsilon} found in {_MAX_EVALUATIONS} evaluations."
    )


def largest_scale_within(
    epsilon_of: EpsilonFunction,
    target_epsilon: float,
    *,
    start: float,
    lower: float,
    upper: float,
    rough_epsilon_of: EpsilonFunction | None = None,
    slope: float = 1.0,
    rtol: float = DEFAULT_RTOL,
    what: str = "the schedule",
) -> float:
    """The largest evaluated x in [lower, upper] with epsilon_of(x) <= target_epsilon (in [target (1 - rtol), target]
    unless it jumps that window), searched from `start`. `epsilon_of` increases, inf where the accountant cannot
    represent the schedule; `rough_epsilon_of`: an optional cheap stand-in for a first pass to 1%; `slope`: a guess of
    d log(epsilon) / dx at `start`; `what` names the object in errors. CalibrationError if `lower` spends more than
    the target, `upper` (or epsilon_of's finite edge) less than target (1 - rtol), or the search does not converge."""
    x = min(max(start, lower), upper)
    slope = slope if math.isfinite(slope) and slope > 0 else 1.0
    if rough_epsilon_of is not None:
        with contextlib.suppress(CalibrationError):  # The stand-in is more pessimistic: the real search decides.
            x, slope = _search(rough_epsilon_of, target_epsilon, x, lower, upper, _ROUGH_RTOL, slope, what)
    return _search(epsilon_of, target_epsilon, x, lower, upper, rtol, slope, what)[0]


def bisect(is_low: Callable[[float], bool], low: float, high: float, steps: int) -> tuple[float, float]:
    """At most `steps` halvings of [low, high] keeping `is_low` true at low and false at high; stops once the
    midpoint rounds to an end (float precision)."""
    for _ in range(steps):
        middle = 0.5 * (low + high)
        if middle in (low, high):
            break
        low, high = (middle, high) if is_low(middle) else (low, middle)
    return low, high


def step_to_safe_side(value: float, is_safe: Callable[[float], bool], step: Callable[[float], float]) -> float:
    """Applies `step` (which must move toward the safe side) to `value` until `is_safe(value)`, and returns it: closed
    forms and root finders land within float rounding of a boundary, sometimes a hair on the wrong side."""
    while not is_safe(value):
        value = step(value)
    return value
