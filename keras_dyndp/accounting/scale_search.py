"""Calibration search: the largest scale whose epsilon meets a target, with few calls to a costly accountant.

Calibrating a schedule against a rigorous accountant means solving epsilon(x) = target for one scalar x (the log of
the schedule's mu_0), where each evaluation composes the whole schedule (0.1 to several seconds for the PLD of
thousands of distinct steps). epsilon increases with x and is smooth, up to tiny steps from the PLD's grouping and
grid. A generic search (dp_accounting's `mechanism_calibration.calibrate_dp_mechanism`: widen a bracket by
doubling, then brentq to a tolerance on x) spends most of its calls on the bracket and on digits of x that the
accountant does not resolve. Here, on f(x) = log(epsilon(x) / target), whose acceptance window is
[log(1 - rtol), 0]:

1. optionally, a rough pass on a cheap pessimistic stand-in for epsilon (the caller's `rough_epsilon_of`, e.g. the
   same accountant with the noise multipliers rounded down into a few groups) moves the start and measures the
   slope of f;
2. secant steps aim at the middle of the window (while only one point is known, with the caller's guess of the
   slope, e.g. the GDP-CLT's, else 1: epsilon roughly proportional to mu_0; at most a factor e^4 per step), kept
   inside the bracket [largest x under budget, smallest x over budget] once there is one, by bisection when a step
   would leave it or f is infinite;
3. the search stops at the first evaluated x inside the window, or once the bracket is narrower than 1e-9 (f jumps
   across the window), returning the bracket's safe end.

Every returned x was evaluated and meets the target, so no final nudge to the safe side is needed. The search stays
within [lower, upper] (the scales whose noise multipliers the accountant accepts) and raises `CalibrationError`
when the target lies outside what that range can give.
"""

from __future__ import annotations

import math
from collections.abc import Callable

# The result's epsilon is within 0.1% below the target: finer than the PLD's own pessimism (grid ~0.4%, grouping
# <= 2%), and each further digit would cost about one more evaluation of the accountant.
DEFAULT_RTOL = 1e-3
_ROUGH_RTOL = 1e-2
_MAX_EVALUATIONS = 60
_BRACKET_WIDTH = 1e-9
# Where epsilon is infinite (the accountant refused the schedule), the edge is located to this width in x only.
_EDGE_WIDTH = 1e-3
_MAX_STEP = 4.0  # In x = log mu_0: at most a factor e^4 ~ 55 per step before a bracket exists.

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
    """The largest x in [lower, upper], to within `rtol` in epsilon, with epsilon_of(x) <= target_epsilon.

    Args:
      epsilon_of: increasing function of x (e.g. the log of mu_0) giving epsilon >= 0; inf where the accountant
        cannot represent the schedule (treated as over budget).
      target_epsilon: target > 0.
      start: first guess.
      lower, upper: the accepted range of x.
      rough_epsilon_of: optional cheap approximation of `epsilon_of` (ideally pessimistic) for a first pass to 1%.
      slope: guess of d log(epsilon) / dx at `start` for the first step (e.g. that of the GDP-CLT); > 0.
      rtol: the result's epsilon is in [target (1 - rtol), target] unless epsilon jumps across that window.
      what: how error messages name the calibrated object.

    Returns:
      x with epsilon_of(x) <= target_epsilon (evaluated).

    Raises:
      CalibrationError: if even `lower` spends more than the target, if even `upper` (or the edge of where
        epsilon_of is finite) spends less than target (1 - rtol), or if the search does not converge.
    """
    x = min(max(start, lower), upper)
    slope = slope if math.isfinite(slope) and slope > 0 else 1.0
    if rough_epsilon_of is not None:
        try:
            x, slope = _search(rough_epsilon_of, target_epsilon, x, lower, upper, _ROUGH_RTOL, slope, what)
        except CalibrationError:
            pass  # The stand-in is more pessimistic than the real thing: let the real search decide.
    return _search(epsilon_of, target_epsilon, x, lower, upper, rtol, slope, what)[0]


def step_to_safe_side(value: float, is_safe: Callable[[float], bool], step: Callable[[float], float]) -> float:
    """Applies `step` to `value` until `is_safe(value)` holds, and returns that value.

    Closed forms and root finders land within float rounding of a boundary, sometimes a hair on the wrong side
    (e.g. an epsilon 1 ulp above its target); this nudge puts the result on the side the guarantee needs. `step`
    must move toward that side (e.g. `lambda x: x * (1 - 1e-13)`, or `np.nextafter(x, 0.0)`), so the loop ends.
    """
    while not is_safe(value):
        value = step(value)
    return value
