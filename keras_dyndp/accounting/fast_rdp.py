"""Exact RDP accounting of heterogeneous Poisson-subsampled Gaussian steps, vectorised over noise multipliers.

A dynamic DP-SGD schedule has a different noise multiplier z_t = sigma_t / C_t at every step. Composing its T
steps one by one with `dp_accounting.rdp.RdpAccountant` costs ~50 ms per step (~245 s for T = 4800), because
each step re-evaluates the subsampled-Gaussian RDP at ~200 orders with scalar Python loops.

This module computes the same numbers (Mironov, Talwar and Zhang 2019, the formulas and default orders of
`dp_accounting.rdp.rdp_privacy_accountant`) for all steps at once: the RDP of a step depends only on
(q, z, order), so equal z are computed once (`np.unique`), and each order's series is evaluated with numpy for
every distinct z together:

* integer orders: log A_alpha = logsumexp_i [log C(alpha, i) + i log q + (alpha - i) log(1 - q) + (i^2 - i)/(2 z^2)];
* fractional orders: the two erfc series of `_compute_log_a_frac`, summed block by block with dp_accounting's
  exact stopping rule (stop after the first term whose log is < -30), for all (order, z) pairs still running.

The RDP curves are then summed over steps and converted to epsilon by dp_accounting's own
`compute_epsilon`. Cumulative sums over steps give epsilon after any number of steps almost for free
(`rdp_epsilons_at`), which is what per-epoch logging needs.
"""

from typing import Optional, Sequence, Union

import numpy as np
from dp_accounting.rdp import rdp_privacy_accountant
from scipy import special

from keras_dyndp.accounting import noise_range

ArrayLike = Union[Sequence[float], np.ndarray]

DEFAULT_RDP_ORDERS = tuple(rdp_privacy_accountant.DEFAULT_RDP_ORDERS)

# dp_accounting stops the fractional-order series after the first term whose log is below this.
_SERIES_LOG_TERM_STOP = -30.0
# Work per vectorised block (array elements): big enough to amortise numpy overhead, small enough for the cache.
_BLOCK_ELEMENTS = 2**16
# Fractional-order series: terms per block never fewer than this (most pairs stop after 8 to 30 terms).
_MIN_SERIES_BLOCK = 8


def _check_sampling_probability(sampling_probability: float) -> float:
    sampling_probability = float(sampling_probability)
    if not 0 <= sampling_probability <= 1:
        raise ValueError(
            "`sampling_probability` must be in [0, 1]. "
            f"Received: sampling_probability={sampling_probability}."
        )
    return sampling_probability


def _check_noise_multipliers(noise_multipliers: ArrayLike) -> np.ndarray:
    noise_multipliers = np.asarray(noise_multipliers, dtype=np.float64)
    if noise_multipliers.ndim != 1:
        raise ValueError(
            "`noise_multipliers` must be 1-D (one noise multiplier per step). "
            f"Received shape {noise_multipliers.shape}."
        )
    if not np.all(noise_multipliers >= 0):  # Also rejects NaN.
        bad = noise_multipliers[~(noise_multipliers >= 0)][0]
        raise ValueError(f"Every entry of `noise_multipliers` must be >= 0 (inf allowed). Received an entry {bad}.")
    return noise_range.check_noise_multipliers(noise_multipliers, "rdp")


def _check_orders(orders: Optional[ArrayLike]) -> np.ndarray:
    orders = np.asarray(DEFAULT_RDP_ORDERS if orders is None else orders, dtype=np.float64)
    if orders.ndim != 1 or orders.size == 0 or not np.all(orders > 1):
        raise ValueError(f"`orders` must be a non-empty 1-D sequence of RDP orders > 1. Received: orders={orders}.")
    return orders


def _log_a_integer(q: float, sigmas: np.ndarray, alpha: int) -> np.ndarray:
    """Vectorised `_compute_log_a_int`: log A_alpha for every sigma (finite, > 0), integer alpha, 0 < q < 1."""
    i = np.arange(alpha + 1, dtype=np.float64)
    log_coef = (special.gammaln(alpha + 1) - special.gammaln(i + 1) - special.gammaln(alpha - i + 1)
                + i * np.log(q) + (alpha - i) * np.log(1 - q))
    inverse_two_variances = 1 / (2 * sigmas**2)
    log_a = np.empty(sigmas.size)
    chunk = max(1, _BLOCK_ELEMENTS // (alpha + 1))
    for begin in range(0, sigmas.size, chunk):
        exponents = np.multiply.outer(inverse_two_variances[begin:begin + chunk], i * i - i)
        exponents += log_coef
        peak = exponents.max(axis=1)
        exponents -= peak[:, None]
        np.exp(exponents, out=exponents)
        log_a[begin:begin + chunk] = peak + np.log(exponents.sum(axis=1))
    return log_a


def _log_erfc(x: np.ndarray) -> np.ndarray:
    """log(erfc(x)), as dp_accounting's `_log_erfc`."""
    return np.log(2) + special.log_ndtr(-x * 2**0.5)


def _log_s1_sigma_part(j_table: np.ndarray, alpha_inverse: np.ndarray, sigma_inverse: np.ndarray,
                       sigmas: np.ndarray, z0: np.ndarray, inverse_two_variances: np.ndarray) -> np.ndarray:
    """(j^2 - j) / (2 sigma^2) + log_e1 of the A1 series for each running pair (rows) and term (columns).

    `j_table` [alphas, terms] holds j = alpha - i; pair k has alpha row `alpha_inverse[k]` and sigma
    `sigmas[sigma_inverse[k]]` (with its z0 and 1 / (2 sigma^2)). log_e1 = log(erfc((z0 - j) / (sqrt(2) sigma)) / 2)
    is the costly part (log_ndtr). With an evenly spaced order grid (dp_accounting's default fractional orders
    are 1.1, 1.2, ..., 10.9) many (alpha, i) give the same j, so it is evaluated once per (sigma, distinct j)
    whenever that is less work; j values equal to within 1e-9 are merged (far below the rounding of the result).
    """
    keys, first, j_inverse = np.unique(np.round(j_table * 1e9), return_index=True, return_inverse=True)
    if sigmas.size * keys.size < alpha_inverse.size * j_table.shape[1]:
        j = j_table.reshape(-1)[first][None, :]
        table = ((j * j - j) * inverse_two_variances[:, None] + np.log(0.5)
                 + _log_erfc((z0[:, None] - j) / (np.sqrt(2) * sigmas[:, None])))
        return table[sigma_inverse[:, None], j_inverse.reshape(j_table.shape)[alpha_inverse]]
    j = j_table[alpha_inverse]
    return ((j * j - j) * inverse_two_variances[sigma_inverse][:, None] + np.log(0.5)
            + _log_erfc((z0[sigma_inverse][:, None] - j) / (np.sqrt(2) * sigmas[sigma_inverse][:, None])))


def _log_a_fractional(q: float, sigmas: np.ndarray, alphas: np.ndarray) -> np.ndarray:
    """Vectorised `_compute_log_a_frac` for every (alpha, sigma) pair; returns [len(alphas), len(sigmas)].

    Each pair's two series are summed until (and including) the first index i whose larger log term is below
    -30, exactly the stopping rule of dp_accounting, so the results agree with it to rounding. (dp_accounting
    accumulates the two series A0 and A1 separately and adds them at the end; both series share the signs of
    binom(alpha, i), so they are accumulated together here, which only changes rounding.) Sigmas are processed
    in chunks so that the working arrays stay small (cache-resident).
    """
    chunk = max(1, _BLOCK_ELEMENTS // (_MIN_SERIES_BLOCK * alphas.size))
    return np.concatenate(
        [_log_a_fractional_chunk(q, sigmas[begin:begin + chunk], alphas) for begin in range(0, sigmas.size, chunk)],
        axis=1)


def _log_a_fractional_chunk(q: float, sigmas: np.ndarray, alphas: np.ndarray) -> np.ndarray:
    """`_log_a_fractional` for one chunk of sigmas."""
    num_alphas, num_sigmas = alphas.size, sigmas.size
    z0 = sigmas**2 * np.log(1 / q - 1) + 0.5
    inverse_two_variances = 1 / (2 * sigmas**2)
    # Running pairs, flattened; each pair is (alpha index, sigma index).
    alpha_index = np.repeat(np.arange(num_alphas), num_sigmas)
    sigma_index = np.tile(np.arange(num_sigmas), num_alphas)
    log_a = np.full(alpha_index.size, -np.inf)
    result = np.empty(alpha_index.size)
    pair_id = np.arange(alpha_index.size)
    start = 0
    while pair_id.size:
        block_size = max(_MIN_SERIES_BLOCK, _BLOCK_ELEMENTS // pair_id.size)
        i = np.arange(start, start + block_size, dtype=np.float64)
        # Tables over (running alpha, i) and (running sigma, i), gathered per running pair below.
        running_alphas, alpha_inverse = np.unique(alpha_index, return_inverse=True)
        running_sigmas, sigma_inverse = np.unique(sigma_index, return_inverse=True)
        block_alphas, block_sigmas = alphas[running_alphas], sigmas[running_sigmas]
        block_z0, block_inverse_two_variances = z0[running_sigmas], inverse_two_variances[running_sigmas]
        coef = special.binom(block_alphas[:, None], i[None, :])
        log_coef = np.log(np.abs(coef))
        j_table = block_alphas[:, None] - i[None, :]
        log_t0_table = log_coef + i[None, :] * np.log(q) + j_table * np.log(1 - q)
        log_t1_table = log_coef + j_table * np.log(q) + i[None, :] * np.log(1 - q)
        # log_s0 = log_t0 + (i^2 - i) / (2 sigma^2) + log_e0; the last two depend on (sigma, i) only.
        log_s0_sigma_table = (
            np.multiply.outer(block_inverse_two_variances, i * i - i) + np.log(0.5)
            + _log_erfc((i[None, :] - block_z0[:, None]) / (np.sqrt(2) * block_sigmas[:, None])))

        log_s0 = log_t0_table[alpha_inverse] + log_s0_sigma_table[sigma_inverse]
        log_s1 = log_t1_table[alpha_inverse] + _log_s1_sigma_part(
            j_table, alpha_inverse, sigma_inverse, block_sigmas, block_z0, block_inverse_two_variances)

        log_s_max = np.maximum(log_s0, log_s1)
        stops = log_s_max < _SERIES_LOG_TERM_STOP
        finished = stops.any(axis=1)
        last_included = np.where(finished, np.argmax(stops, axis=1), block_size - 1)
        signs = np.where(np.arange(block_size)[None, :] <= last_included[:, None], np.sign(coef)[alpha_inverse], 0.0)
        # log(exp(log_a) + sum_i signs_i (exp(log_s0_i) + exp(log_s1_i))), shifted to avoid overflow.
        shift = np.maximum(log_a, log_s_max.max(axis=1))
        log_s0 -= shift[:, None]
        log_s1 -= shift[:, None]
        total = np.exp(log_a - shift) + np.sum(signs * (np.exp(log_s0) + np.exp(log_s1)), axis=1)
        log_a = shift + np.log(total)

        result[pair_id[finished]] = log_a[finished]
        running = ~finished
        pair_id, alpha_index, sigma_index, log_a = (
            pair_id[running], alpha_index[running], sigma_index[running], log_a[running])
        start += block_size
    return result.reshape(num_alphas, num_sigmas)


def _unique_rdp(q: float, unique_sigmas: np.ndarray, orders: np.ndarray) -> np.ndarray:
    """RDP [len(unique_sigmas), len(orders)] of one step per (distinct) noise multiplier; arguments validated."""
    rdp = np.zeros((unique_sigmas.size, orders.size))
    if q == 0:
        return rdp
    regular = (unique_sigmas > 0) & np.isfinite(unique_sigmas)
    rdp[unique_sigmas == 0] = np.inf
    sigmas = unique_sigmas[regular]
    if not sigmas.size:
        return rdp
    if q == 1:
        rdp[regular] = orders[None, :] / (2 * sigmas[:, None] ** 2)
        return rdp
    regular_rdp = np.full((sigmas.size, orders.size), np.inf)  # Stays inf for an infinite order.
    is_integer = np.array([float(order).is_integer() for order in orders])
    for column in np.flatnonzero(is_integer):
        alpha = int(orders[column])
        regular_rdp[:, column] = _log_a_integer(q, sigmas, alpha) / (alpha - 1)
    fractional = np.flatnonzero(~is_integer & np.isfinite(orders))
    if fractional.size:
        alphas = orders[fractional]
        regular_rdp[:, fractional] = (_log_a_fractional(q, sigmas, alphas) / (alphas[:, None] - 1)).T
    rdp[regular] = regular_rdp
    return rdp


def poisson_subsampled_gaussian_rdp(
    sampling_probability: float, noise_multipliers: ArrayLike, orders: Optional[ArrayLike] = None
) -> np.ndarray:
    """Returns the RDP of one Poisson-subsampled Gaussian step for each noise multiplier, at each order.

    Row k equals dp_accounting's `_compute_rdp_poisson_subsampled_gaussian(q, noise_multipliers[k], orders)`.

    Args:
        sampling_probability: Poisson sampling probability q, in [0, 1].
        noise_multipliers: 1-D array of noise multipliers z (noise std / clip norm), each 0 (gives inf), inf
            (gives 0) or in `noise_range`'s [MIN_NOISE_MULTIPLIER, MAX_NOISE_MULTIPLIER] = [1e-4, 1e4].
        orders: RDP orders (> 1); defaults to dp_accounting's `DEFAULT_RDP_ORDERS`.

    Returns:
        Array [len(noise_multipliers), len(orders)] of RDP values.

    Raises:
        ValueError: If an argument is outside its domain (`noise_range.NoiseOutOfRangeError` for a noise
            multiplier, naming its step).
    """
    q = _check_sampling_probability(sampling_probability)
    noise_multipliers = _check_noise_multipliers(noise_multipliers)
    orders = _check_orders(orders)
    unique_sigmas, inverse = np.unique(noise_multipliers, return_inverse=True)
    return _unique_rdp(q, unique_sigmas, orders)[inverse]


def _check_delta(delta: float) -> float:
    delta = float(delta)
    if not 0 <= delta <= 1:
        raise ValueError(f"`delta` must be in [0, 1]. Received: delta={delta}.")
    return delta


def rdp_epsilons_at(
    sampling_probability: float,
    noise_multipliers: ArrayLike,
    delta: float,
    steps: Sequence[int],
    orders: Optional[ArrayLike] = None,
) -> np.ndarray:
    """Returns the exact RDP epsilon after each of `steps` steps of a heterogeneous DP-SGD schedule.

    epsilon after s steps composes steps 0..s-1 (noise multipliers `noise_multipliers[:s]`), as
    `dp_accounting.rdp.RdpAccountant` composing them one by one would report.

    Args:
        sampling_probability: Poisson sampling probability q, in [0, 1].
        noise_multipliers: 1-D array [T], the noise multiplier of each step: 0, inf or in [1e-4, 1e4].
        delta: Target delta, in [0, 1].
        steps: Step counts, each in [0, T] (e.g. the step count at each epoch boundary).
        orders: RDP orders (> 1); defaults to dp_accounting's `DEFAULT_RDP_ORDERS`.

    Returns:
        Array of epsilons, one per entry of `steps`.

    Raises:
        ValueError: If an argument is outside its domain (`noise_range.NoiseOutOfRangeError` for a noise
            multiplier, naming its step).
    """
    delta = _check_delta(delta)
    noise_multipliers = _check_noise_multipliers(noise_multipliers)
    orders = _check_orders(orders)
    steps = np.asarray(steps)
    if steps.ndim != 1 or not np.issubdtype(steps.dtype, np.integer) or np.any(steps < 0) or np.any(
            steps > noise_multipliers.size):
        raise ValueError(
            f"`steps` must be a 1-D sequence of integers in [0, {noise_multipliers.size}] (the number of noise "
            f"multipliers). Received: steps={steps}."
        )
    per_step = poisson_subsampled_gaussian_rdp(sampling_probability, noise_multipliers, orders)
    cumulative = np.vstack([np.zeros((1, orders.size)), np.cumsum(per_step, axis=0)])
    return np.array([rdp_privacy_accountant.compute_epsilon(orders, cumulative[step], delta)[0]
                     for step in steps], dtype=np.float64)


def rdp_epsilon(
    sampling_probability: float,
    noise_multipliers: ArrayLike,
    delta: float,
    orders: Optional[ArrayLike] = None,
) -> float:
    """Returns the exact RDP epsilon of composing Poisson-subsampled Gaussian steps with distinct noise multipliers.

    Equal (to rounding) to `dp_accounting.rdp.RdpAccountant(orders)` composing
    `PoissonSampledDpEvent(sampling_probability, GaussianDpEvent(z))` for each z in `noise_multipliers`, then
    `get_epsilon(delta)`; about 100x faster for a schedule with all-distinct z.

    Args:
        sampling_probability: Poisson sampling probability q, in [0, 1].
        noise_multipliers: 1-D array [T] of per-step noise multipliers sigma_t / C_t: 0, inf or in [1e-4, 1e4].
        delta: Target delta, in [0, 1].
        orders: RDP orders (> 1); defaults to dp_accounting's `DEFAULT_RDP_ORDERS`.

    Returns:
        epsilon (inf if some noise multiplier is 0).

    Raises:
        ValueError: If an argument is outside its domain (`noise_range.NoiseOutOfRangeError` for a noise
            multiplier, naming its step).
    """
    q = _check_sampling_probability(sampling_probability)
    noise_multipliers = _check_noise_multipliers(noise_multipliers)
    delta = _check_delta(delta)
    orders = _check_orders(orders)
    unique_sigmas, counts = np.unique(noise_multipliers, return_counts=True)
    total = np.sum(counts[:, None] * _unique_rdp(q, unique_sigmas, orders), axis=0)
    return float(rdp_privacy_accountant.compute_epsilon(orders, total, delta)[0])
