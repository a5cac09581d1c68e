"""RDP accounting of heterogeneous Poisson-subsampled Gaussian steps, vectorised over noise multipliers.

A dynamic DP-SGD schedule has a different noise multiplier z_t = sigma_t / C_t at every step. Composing its T
steps one by one with `dp_accounting.rdp.RdpAccountant` costs ~40 ms per step (~200 s for T = 4800), because
each step re-evaluates the subsampled-Gaussian RDP at ~150 orders with scalar Python loops.

The definition implemented here, independent of the installed dp_accounting version, is the one of
dp_accounting >= 0.5 (Mironov, Talwar and Zhang 2019, "Renyi Differential Privacy of the Sampled Gaussian
Mechanism", Sec. 3.3):

* orders: `DEFAULT_RDP_ORDERS` = 1.1, 1.2, ..., 10.9, 11, 12, ..., 63, 128, 256, 512, 1024 (dp_accounting's
  default orders), or any orders > 1 passed;
* integer order alpha: log A_alpha with the finite binomial sum
  A_alpha = sum_{i=0..alpha} C(alpha, i) (1 - q)^(alpha - i) q^i exp((i^2 - i) / (2 z^2)), exact;
* fractional order alpha: A_alpha = A_0 + A_1, the two series of the paper, each term taken with |C(alpha, i)|,
  which bounds A_alpha from above (the exact series alternate in sign beyond i = alpha). Terms are summed in log
  space until, at some i >= 1, both series' terms have decreased and the larger is below e^-30 times the sum so
  far; an order whose series has not stopped after 1000 terms (small orders with little noise, where the terms
  decay only polynomially) is dropped: its RDP is inf;
* RDP of a step is log(A_alpha) / (alpha - 1); it adds up over steps, and the sum converts to epsilon with
  dp_accounting's public `dp_accounting.rdp.compute_epsilon` (minimised over the orders).

So this module equals `RdpAccountant` of dp_accounting 0.5 and 0.6 to rounding. dp_accounting 0.4.3 summed the
signed fractional series (the exact A_alpha) until a term fell below e^-30 and kept the small orders; at every
order this module's value is at least 0.4.3's (up to float rounding) and it uses no order 0.4.3 lacks, so its
epsilon is never below 0.4.3's either. They differ little, where the best order is small and fractional, i.e. at
large epsilon: 9.0302 vs 0.4.3's 9.0226 (+0.08%) at p = 0.05, z = 0.6, T = 30, delta = 1e-5; 14.157 vs 14.136
(+0.15%) at p = 250/60000, z = 0.5, T = 4800.

Every step's RDP depends only on (q, z, order), so equal z are computed once (`np.unique`), and each order's sum
or series is evaluated with numpy for every distinct z together. Cumulative sums over steps give epsilon after
any number of steps almost for free (`rdp_epsilons_at`), which is what per-epoch logging needs.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from dp_accounting import rdp
from scipy import special

from keras_dyndp import validation
from keras_dyndp.accounting import noise_range

ArrayLike = Sequence[float] | np.ndarray

DEFAULT_RDP_ORDERS = tuple(1 + x / 10 for x in range(1, 100)) + tuple(range(11, 64)) + (128, 256, 512, 1024)

# A fractional-order series stops once its terms are below e^-30 times the sum so far (and decreasing) ...
_SERIES_RELATIVE_LOG_STOP = -30.0
# ... or is given up (the order's RDP is inf) after this many terms.
_MAX_SERIES_TERMS = 1000
# Work per vectorised block (array elements): big enough to amortise numpy overhead, small enough for the cache.
_BLOCK_ELEMENTS = 2**16
# Fractional-order series: terms per block never fewer than this (most pairs stop after 10 to 60 terms).
_MIN_SERIES_BLOCK = 8


def _check_noise_multipliers(noise_multipliers: ArrayLike) -> np.ndarray:
    return noise_range.check_noise_multipliers(
        validation.check_nonnegative_array("noise_multipliers", noise_multipliers), "rdp"
    )


def check_orders(orders: ArrayLike | None) -> np.ndarray:
    """The RDP orders as a float array (`DEFAULT_RDP_ORDERS` for None), or ValueError unless each is > 1."""
    orders = np.asarray(DEFAULT_RDP_ORDERS if orders is None else orders, dtype=np.float64)
    if orders.ndim != 1 or orders.size == 0 or not np.all(orders > 1):
        raise ValueError(f"`orders` must be a non-empty 1-D sequence of RDP orders > 1. Received: orders={orders}.")
    return orders


def _log_a_integer(q: float, sigmas: np.ndarray, alpha: int) -> np.ndarray:
    """log A_alpha (the binomial sum in the module docstring) for every sigma (finite, > 0), integer alpha, 0 < q < 1.

    Summed in log space (shifted by the largest term), one block of sigmas at a time.
    """
    i = np.arange(alpha + 1, dtype=np.float64)
    log_coef = (
        special.gammaln(alpha + 1)
        - special.gammaln(i + 1)
        - special.gammaln(alpha - i + 1)
        + i * np.log(q)
        + (alpha - i) * np.log(1 - q)
    )
    inverse_two_variances = 1 / (2 * sigmas**2)
    log_a = np.empty(sigmas.size)
    chunk = max(1, _BLOCK_ELEMENTS // (alpha + 1))
    for begin in range(0, sigmas.size, chunk):
        exponents = np.multiply.outer(inverse_two_variances[begin : begin + chunk], i * i - i)
        exponents += log_coef
        peak = exponents.max(axis=1)
        exponents -= peak[:, None]
        np.exp(exponents, out=exponents)
        log_a[begin : begin + chunk] = peak + np.log(exponents.sum(axis=1))
    return log_a


def _log_erfc(x: np.ndarray) -> np.ndarray:
    """log(erfc(x)) for any x, through log_ndtr (no underflow)."""
    return np.log(2) + special.log_ndtr(-x * 2**0.5)


def _log_s1_sigma_part(
    j_table: np.ndarray,
    alpha_inverse: np.ndarray,
    sigma_inverse: np.ndarray,
    sigmas: np.ndarray,
    z0: np.ndarray,
    inverse_two_variances: np.ndarray,
) -> np.ndarray:
    """(j^2 - j) / (2 sigma^2) + log_e1 of the A_1 series for each running pair (rows) and term (columns).

    `j_table` [alphas, terms] holds j = alpha - i; pair k has alpha row `alpha_inverse[k]` and sigma
    `sigmas[sigma_inverse[k]]` (with its z0 and 1 / (2 sigma^2)). log_e1 = log(erfc((z0 - j) / (sqrt(2) sigma)) / 2)
    is the costly part (log_ndtr). With an evenly spaced order grid (the default fractional orders are 1.1, 1.2,
    ..., 10.9) many (alpha, i) give the same j, so it is evaluated once per (sigma, distinct j) whenever that is
    less work; j values equal to within 1e-9 are merged (far below the rounding of the result).
    """
    keys, first, j_inverse = np.unique(np.round(j_table * 1e9), return_index=True, return_inverse=True)
    if sigmas.size * keys.size < alpha_inverse.size * j_table.shape[1]:
        j = j_table.reshape(-1)[first][None, :]
        table = (
            (j * j - j) * inverse_two_variances[:, None]
            + np.log(0.5)
            + _log_erfc((z0[:, None] - j) / (np.sqrt(2) * sigmas[:, None]))
        )
        return table[sigma_inverse[:, None], j_inverse.reshape(j_table.shape)[alpha_inverse]]
    j = j_table[alpha_inverse]
    return (
        (j * j - j) * inverse_two_variances[sigma_inverse][:, None]
        + np.log(0.5)
        + _log_erfc((z0[sigma_inverse][:, None] - j) / (np.sqrt(2) * sigmas[sigma_inverse][:, None]))
    )


def _log_a_fractional(q: float, sigmas: np.ndarray, alphas: np.ndarray) -> np.ndarray:
    """log A_alpha of the module docstring's fractional-order series for every (alpha, sigma) pair, 0 < q < 1.

    Returns [len(alphas), len(sigmas)], inf where a series has not stopped within `_MAX_SERIES_TERMS` terms.
    Sigmas are processed in chunks so that the working arrays stay small (cache-resident).
    """
    chunk = max(1, _BLOCK_ELEMENTS // (_MIN_SERIES_BLOCK * alphas.size))
    return np.concatenate(
        [_log_a_fractional_chunk(q, sigmas[begin : begin + chunk], alphas) for begin in range(0, sigmas.size, chunk)],
        axis=1,
    )


def _log_a_fractional_chunk(q: float, sigmas: np.ndarray, alphas: np.ndarray) -> np.ndarray:
    """`_log_a_fractional` for one chunk of sigmas: all (alpha, sigma) pairs, a block of terms at a time."""
    num_alphas, num_sigmas = alphas.size, sigmas.size
    z0 = sigmas**2 * np.log(1 / q - 1) + 0.5
    inverse_two_variances = 1 / (2 * sigmas**2)
    log_q, log_1mq = np.log(q), np.log1p(-q)
    # Running pairs, flattened; each pair is (alpha index, sigma index) with its sum so far and its last terms.
    alpha_index = np.repeat(np.arange(num_alphas), num_sigmas)
    sigma_index = np.tile(np.arange(num_sigmas), num_alphas)
    log_a = np.full(alpha_index.size, -np.inf)
    last_log_s0, last_log_s1 = log_a.copy(), log_a.copy()
    result = np.full(alpha_index.size, np.inf)
    pair_id = np.arange(alpha_index.size)
    start = 0
    while pair_id.size and start < _MAX_SERIES_TERMS:
        block_size = min(max(_MIN_SERIES_BLOCK, _BLOCK_ELEMENTS // pair_id.size), _MAX_SERIES_TERMS - start)
        i = np.arange(start, start + block_size, dtype=np.float64)
        # Tables over (running alpha, i) and (running sigma, i), gathered per running pair below.
        running_alphas, alpha_inverse = np.unique(alpha_index, return_inverse=True)
        running_sigmas, sigma_inverse = np.unique(sigma_index, return_inverse=True)
        block_alphas, block_sigmas = alphas[running_alphas], sigmas[running_sigmas]
        block_z0, block_inverse_two_variances = z0[running_sigmas], inverse_two_variances[running_sigmas]
        j_table = block_alphas[:, None] - i[None, :]
        log_abs_coef = (
            special.gammaln(block_alphas + 1)[:, None] - special.gammaln(i + 1)[None, :] - special.gammaln(j_table + 1)
        )  # log |C(alpha, i)|: gammaln is log |Gamma|.
        log_t0_table = log_abs_coef + i[None, :] * log_q + j_table * log_1mq
        log_t1_table = log_abs_coef + j_table * log_q + i[None, :] * log_1mq
        # log_s0 = log_t0 + (i^2 - i) / (2 sigma^2) + log_e0; the last two depend on (sigma, i) only.
        log_s0_sigma_table = (
            np.multiply.outer(block_inverse_two_variances, i * i - i)
            + np.log(0.5)
            + _log_erfc((i[None, :] - block_z0[:, None]) / (np.sqrt(2) * block_sigmas[:, None]))
        )
        log_s0 = log_t0_table[alpha_inverse] + log_s0_sigma_table[sigma_inverse]
        log_s1 = log_t1_table[alpha_inverse] + _log_s1_sigma_part(
            j_table, alpha_inverse, sigma_inverse, block_sigmas, block_z0, block_inverse_two_variances
        )

        # Sum after each term, and the stopping rule at each term (against the previous term of each series).
        sums = np.logaddexp.accumulate(np.concatenate([log_a[:, None], np.logaddexp(log_s0, log_s1)], axis=1), axis=1)[
            :, 1:
        ]
        decreasing = (log_s0 < np.concatenate([last_log_s0[:, None], log_s0[:, :-1]], axis=1)) & (
            log_s1 < np.concatenate([last_log_s1[:, None], log_s1[:, :-1]], axis=1)
        )
        stops = decreasing & (np.maximum(log_s0, log_s1) < sums + _SERIES_RELATIVE_LOG_STOP)
        finished = stops.any(axis=1)
        result[pair_id[finished]] = sums[finished, np.argmax(stops[finished], axis=1)]

        running = ~finished
        pair_id, alpha_index, sigma_index = pair_id[running], alpha_index[running], sigma_index[running]
        log_a, last_log_s0, last_log_s1 = sums[running, -1], log_s0[running, -1], log_s1[running, -1]
        start += block_size
    return result.reshape(num_alphas, num_sigmas)


def _unique_rdp(q: float, unique_sigmas: np.ndarray, orders: np.ndarray) -> np.ndarray:
    """RDP [len(unique_sigmas), len(orders)] of one step per (distinct) noise multiplier; arguments validated."""
    rdp_values = np.zeros((unique_sigmas.size, orders.size))
    if q == 0:
        return rdp_values
    regular = (unique_sigmas > 0) & np.isfinite(unique_sigmas)
    rdp_values[unique_sigmas == 0] = np.inf
    sigmas = unique_sigmas[regular]
    if not sigmas.size:
        return rdp_values
    if q == 1:
        rdp_values[regular] = orders[None, :] / (2 * sigmas[:, None] ** 2)
        return rdp_values
    regular_rdp = np.full((sigmas.size, orders.size), np.inf)  # Stays inf for an infinite order.
    is_integer = np.array([float(order).is_integer() for order in orders])
    for column in np.flatnonzero(is_integer):
        alpha = int(orders[column])
        regular_rdp[:, column] = _log_a_integer(q, sigmas, alpha) / (alpha - 1)
    fractional = np.flatnonzero(~is_integer & np.isfinite(orders))
    if fractional.size:
        alphas = orders[fractional]
        regular_rdp[:, fractional] = (_log_a_fractional(q, sigmas, alphas) / (alphas[:, None] - 1)).T
    rdp_values[regular] = regular_rdp
    return rdp_values


def poisson_subsampled_gaussian_rdp(
    sampling_probability: float, noise_multipliers: ArrayLike, orders: ArrayLike | None = None
) -> np.ndarray:
    """Returns the RDP of one Poisson-subsampled Gaussian step for each noise multiplier, at each order.

    Row k is log(A_alpha) / (alpha - 1) for z = noise_multipliers[k] at each order alpha (module docstring; inf
    at a fractional order whose series does not stop); q = 1 gives the Gaussian mechanism's alpha / (2 z^2).

    Args:
        sampling_probability: Poisson sampling probability q, in [0, 1].
        noise_multipliers: 1-D array of noise multipliers z (noise std / clip norm), each 0 (gives inf), inf
            (gives 0) or in `noise_range`'s [MIN_NOISE_MULTIPLIER, MAX_NOISE_MULTIPLIER] = [1e-4, 1e4].
        orders: RDP orders (> 1); defaults to `DEFAULT_RDP_ORDERS`.

    Returns:
        Array [len(noise_multipliers), len(orders)] of RDP values.

    Raises:
        ValueError: If an argument is outside its domain (`noise_range.NoiseOutOfRangeError` for a noise
            multiplier, naming its step).
    """
    q = validation.check_probability(sampling_probability, allow_zero=True)
    noise_multipliers = _check_noise_multipliers(noise_multipliers)
    orders = check_orders(orders)
    unique_sigmas, inverse = np.unique(noise_multipliers, return_inverse=True)
    return _unique_rdp(q, unique_sigmas, orders)[inverse]


def rdp_epsilons_at(
    sampling_probability: float,
    noise_multipliers: ArrayLike,
    delta: float,
    steps: Sequence[int],
    orders: ArrayLike | None = None,
) -> np.ndarray:
    """Returns the exact RDP epsilon after each of `steps` steps of a heterogeneous DP-SGD schedule.

    epsilon after s steps composes steps 0..s-1 (noise multipliers `noise_multipliers[:s]`), as
    `dp_accounting.rdp.RdpAccountant(orders)` composing them one by one would report.

    Args:
        sampling_probability: Poisson sampling probability q, in [0, 1].
        noise_multipliers: 1-D array [T], the noise multiplier of each step: 0, inf or in [1e-4, 1e4].
        delta: Target delta, in [0, 1].
        steps: Step counts, each in [0, T] (e.g. the step count at each epoch boundary).
        orders: RDP orders (> 1); defaults to `DEFAULT_RDP_ORDERS`.

    Returns:
        Array of epsilons, one per entry of `steps`.

    Raises:
        ValueError: If an argument is outside its domain (`noise_range.NoiseOutOfRangeError` for a noise
            multiplier, naming its step).
    """
    delta = validation.check_delta(delta, allow_ends=True)  # As dp_accounting: epsilon inf at 0.
    noise_multipliers = _check_noise_multipliers(noise_multipliers)
    orders = check_orders(orders)
    steps = validation.check_step_counts(steps, noise_multipliers.size)
    per_step = poisson_subsampled_gaussian_rdp(sampling_probability, noise_multipliers, orders)
    cumulative = np.vstack([np.zeros((1, orders.size)), np.cumsum(per_step, axis=0)])
    return np.array([rdp.compute_epsilon(orders, cumulative[step], delta)[0] for step in steps], dtype=np.float64)


def rdp_epsilon(
    sampling_probability: float,
    noise_multipliers: ArrayLike,
    delta: float,
    orders: ArrayLike | None = None,
) -> float:
    """Returns the exact RDP epsilon of composing Poisson-subsampled Gaussian steps with distinct noise multipliers.

    Equal (to rounding) to `dp_accounting.rdp.RdpAccountant(orders)` composing
    `PoissonSampledDpEvent(sampling_probability, GaussianDpEvent(z))` for each z in `noise_multipliers`, then
    `get_epsilon(delta)` on dp_accounting >= 0.5, and never below it on 0.4.3 (module docstring); about 100x
    faster for a schedule with all-distinct z.

    Args:
        sampling_probability: Poisson sampling probability q, in [0, 1].
        noise_multipliers: 1-D array [T] of per-step noise multipliers sigma_t / C_t: 0, inf or in [1e-4, 1e4].
        delta: Target delta, in [0, 1].
        orders: RDP orders (> 1); defaults to `DEFAULT_RDP_ORDERS`.

    Returns:
        epsilon (inf if some noise multiplier is 0).

    Raises:
        ValueError: If an argument is outside its domain (`noise_range.NoiseOutOfRangeError` for a noise
            multiplier, naming its step).
    """
    q = validation.check_probability(sampling_probability, allow_zero=True)
    noise_multipliers = _check_noise_multipliers(noise_multipliers)
    delta = validation.check_delta(delta, allow_ends=True)  # As dp_accounting: epsilon inf at 0.
    orders = check_orders(orders)
    unique_sigmas, counts = np.unique(noise_multipliers, return_counts=True)
    total = np.sum(counts[:, None] * _unique_rdp(q, unique_sigmas, orders), axis=0)
    return float(rdp.compute_epsilon(orders, total, delta)[0])
