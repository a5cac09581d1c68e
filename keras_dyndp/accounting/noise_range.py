"""The noise multipliers z = sigma / C the accountants can represent, checked before any of them allocates or divides
(outside a bounded range they fail unhelpfully: division by zero, RDP series that never end, a PLD grid growing as
1 / z^2). Each accountant first raises a ValueError naming the step, the value and the range: z = 0 (epsilon inf) and
z = inf (no loss) are exact; otherwise MIN_NOISE_MULTIPLIER <= z <= MAX_NOISE_MULTIPLIER (below 1e-4 one step is
(epsilon > 1e7)-DP; above 1e4 its GDP mu is below 1e-4), and for the PLD z >= `pld_min_noise_multiplier`, whose
one-step grid (`pld_grid_points`) fits MAX_PLD_GRID_POINTS, as composed PLDs must (`check_pld_grid_points`)."""

from __future__ import annotations

import math

import numpy as np
from scipy import special

MIN_NOISE_MULTIPLIER = 1e-4
MAX_NOISE_MULTIPLIER = 1e4
MAX_PLD_GRID_POINTS = 2**21
# t with CDF(-t) = exp(-50) / 2: the PLD keeps a Gaussian step's x within +-t standard deviations.
GAUSSIAN_TAIL_STDDEVS = float(-special.ndtri(0.5 * math.exp(-50.0)))


class NoiseOutOfRangeError(ValueError):
    """A noise multiplier (or a composition) outside what the chosen accountant can represent."""


def pld_grid_points(noise_multiplier: float, value_discretization_interval: float) -> float:
    """Upper estimate of one Gaussian step's PLD grid length: (1 / z^2 + 2 t / z) / interval, + 3 for the rounding
    of both ends outward and the last point."""
    span = noise_multiplier**-2 + 2 * GAUSSIAN_TAIL_STDDEVS / noise_multiplier
    return span / value_discretization_interval + 3


def pld_min_noise_multiplier(value_discretization_interval: float) -> float:
    """Smallest z >= MIN_NOISE_MULTIPLIER whose one-step PLD grid fits `MAX_PLD_GRID_POINTS`: the root of
    `pld_grid_points(z, interval)` = MAX_PLD_GRID_POINTS, a quadratic in 1 / z."""
    tail = GAUSSIAN_TAIL_STDDEVS
    inverse = math.sqrt(tail**2 + (MAX_PLD_GRID_POINTS - 3) * value_discretization_interval) - tail
    return max(MIN_NOISE_MULTIPLIER, 1.0 / inverse)


def out_of_range_message(
    noise_multiplier: float, step: int | None, accountant: str, min_noise_multiplier: float = MIN_NOISE_MULTIPLIER
) -> str:
    """The error text for one noise multiplier outside [min_noise_multiplier, MAX_NOISE_MULTIPLIER]."""
    where = "" if step is None else f" of step {step} (0-based)"
    text = (
        f"The noise multiplier{where} is {noise_multiplier:g}; the {accountant!r} accountant accepts 0 (no "
        f"noise: epsilon is infinite), inf, or values in [{min_noise_multiplier:.4g}, "
        f"{MAX_NOISE_MULTIPLIER:g}]. Outside that range a step has no meaningful privacy (below) or a privacy "
        "loss below float resolution (above): check the schedule's noise_stddevs / clip_norms."
    )
    if min_noise_multiplier > MIN_NOISE_MULTIPLIER:
        text += (
            f" The PLD's lower end keeps its grid within MAX_PLD_GRID_POINTS = {MAX_PLD_GRID_POINTS} points; "
            "a larger value_discretization_interval lowers it, and the 'rdp' accountant accepts down to "
            f"{MIN_NOISE_MULTIPLIER:g}."
        )
    return text


def check_noise_multipliers(
    noise_multipliers: np.ndarray, accountant: str, min_noise_multiplier: float = MIN_NOISE_MULTIPLIER
) -> np.ndarray:
    """Returns `noise_multipliers` (1-D, >= 0 already checked) if each is 0, inf or in range, else raises
    NoiseOutOfRangeError naming the first offending step and the accepted range."""
    regular = (noise_multipliers > 0) & np.isfinite(noise_multipliers)
    outside = regular & ((noise_multipliers < min_noise_multiplier) | (noise_multipliers > MAX_NOISE_MULTIPLIER))
    if np.any(outside):
        step = int(np.argmax(outside))
        raise NoiseOutOfRangeError(
            out_of_range_message(float(noise_multipliers[step]), step, accountant, min_noise_multiplier)
        )
    return noise_multipliers


def check_trained_noise_multipliers(noise_multipliers: np.ndarray, argument: str) -> None:
    """Raises NoiseOutOfRangeError (naming `argument`, the first step outside) unless every z_t is in the range a DP
    optimizer may train in, [MIN_NOISE_MULTIPLIER, MAX_NOISE_MULTIPLIER]: no epsilon is meaningful outside it."""
    outside = ~((noise_multipliers >= MIN_NOISE_MULTIPLIER) & (noise_multipliers <= MAX_NOISE_MULTIPLIER))
    if np.any(outside):
        step = int(np.argmax(outside))
        raise NoiseOutOfRangeError(
            f"`{argument}`: the noise multiplier sigma_t / C_t of step {step} (0-based) is "
            f"{float(noise_multipliers[step]):g}; a DP optimizer trains only with noise multipliers in "
            f"[{MIN_NOISE_MULTIPLIER:g}, {MAX_NOISE_MULTIPLIER:g}], where the accountants can represent every step. "
            "Below it a step has no meaningful privacy (0: none at all, epsilon is infinite), above it a privacy "
            "loss below float resolution. Check the schedule's noise_stddevs / clip_norms (or the budget "
            "arguments); a test that measures the clipped sum without noise passes allow_degenerate_noise=True."
        )


def check_pld_grid_points(num_points: int, what: str) -> None:
    """Raises NoiseOutOfRangeError before a PLD of more than `MAX_PLD_GRID_POINTS` points is allocated."""
    if num_points > MAX_PLD_GRID_POINTS:
        raise NoiseOutOfRangeError(
            f"The PLD of {what} needs {num_points} grid points, more than MAX_PLD_GRID_POINTS = "
            f"{MAX_PLD_GRID_POINTS} (~{8 * num_points / 2**20:.0f} MiB per array): its privacy loss is so large "
            "that its epsilon is far beyond any meaningful budget. Use more noise, or the 'rdp' accountant."
        )
