"""RDP accounting of heterogeneous Poisson-subsampled Gaussian steps, vectorised over noise multipliers, where
`dp_accounting.rdp.RdpAccountant` loops over steps in Python: its definition of dp_accounting >= 0.5 (Mironov, Talwar
and Zhang 2019, "Renyi Differential Privacy of the Sampled Gaussian Mechanism", Sec. 3.3) whatever version is installed,
over the orders `DEFAULT_RDP_ORDERS` (dp_accounting's) or any > 1:

* integer alpha: A_alpha = sum_{i=0..alpha} C(alpha, i) (1 - q)^(alpha - i) q^i exp((i^2 - i) / (2 z^2)), exact;
* fractional alpha: A_alpha = A_0 + A_1, the paper's two series with |C(alpha, i)| (an upper bound: the exact series
  alternate beyond i = alpha), summed in log space until, at some i >= 1, both series' terms decrease and the larger
  is below e^-30 times the sum; a series not stopped after 1000 terms gives that order RDP inf;
* a step's RDP is log(A_alpha) / (alpha - 1); it adds over steps; epsilon is dp_accounting's `rdp.compute_epsilon`.

Each distinct z is computed once; cumulative sums give epsilons after many step counts at once (`rdp_epsilons_at`)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from dp_accounting import rdp
from scipy import special

from keras_dyndp.accounting import noise_range
from keras_dyndp.core import validation

ArrayLike = Sequence[float] | np.ndarray

DEFAULT_RDP_ORDERS = tuple(1 + x / 10 for x in range(1, 100)) + tuple(range(11, 64)) + (128, 256, 512, 1024)

_SERIES_RELATIVE_LOG_STOP = -30.0
_MAX_SERIES_TERMS = 1000
# Array elements per vectorised block: big enough to amortise numpy overhead, small enough for the cache.
_BLOCK_ELEMENTS = 2**16
_MIN_SERIES_BLOCK = 8  # Fractional-order series terms per block (most pairs stop after 10 to 60 terms).


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
    """log A_alpha (the module docstring's binomial sum, in log space) for every sigma (finite, > 0), 0 < q < 1."""
    i = np.arange(alpha + 1, dtype=np.float64)
    log_coef = (
        special.gammaln(alpha + 1)
        - special.gammaln(i + 1)
        - special.gammaln(alpha - i + 1)
        + i * np.log(q)
        + (alpha - i) * np.log(1 - q)
    )
    inverse_two_variances = 1 / (2 * sigmas**2)
    log_a, chunk = np.empty(sigmas.size), max(1, _BLOCK_ELEMENTS // (alpha + 1))
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


def _log_series_factor(k, inverse_two_variances, offsets, sigmas):
    """(k^2 - k) / (2 sigma^2) + log(erfc(offset / (sqrt(2) sigma)) / 2), broadcast: a series term's sigma part."""
    return (k * k - k) * inverse_two_variances + np.log(0.5) + _log_erfc(offsets / (np.sqrt(2) * sigmas))


def _log_s1_sigma_part(
    j_table: np.ndarray,
    alpha_inverse: np.ndarray,
    sigma_inverse: np.ndarray,
    sigmas: np.ndarray,
    z0: np.ndarray,
    inverse_two_variances: np.ndarray,
) -> np.ndarray:
    """`_log_series_factor` of the A_1 series (k = j = alpha - i from `j_table`, offset z0 - j) per running pair
    (alpha row `alpha_inverse[k]`, sigma `sigma_inverse[k]`) and term; the costly log_ndtr runs once per (sigma,
    distinct j, to 1e-9) when that is less work (evenly spaced orders share many j)."""
    keys, first, j_inverse = np.unique(np.round(j_table * 1e9), return_index=True, return_inverse=True)
    if sigmas.size * keys.size < alpha_inverse.size * j_table.shape[1]:
        j = j_table.reshape(-1)[first][None, :]
        table = _log_series_factor(j, inverse_two_variances[:, None], z0[:, None] - j, sigmas[:, None])
        return table[sigma_inverse[:, None], j_inverse.reshape(j_table.shape)[alpha_inverse]]
    j = j_table[alpha_inverse]
    return _log_series_factor(
        j, inverse_two_variances[sigma_inverse][:, None], z0[sigma_inverse][:, None] - j, sigmas[sigma_inverse][:, None]
    )


def _log_a_fractional(q: float, sigmas: np.ndarray, alphas: np.ndarray) -> np.ndarray:
    """log A_alpha [len(alphas), len(sigmas)] of the fractional-order series (inf where one has not stopped) for
    0 < q < 1: all (alpha, sigma) pairs a block of terms at a time, in chunks of sigmas that stay cache-resident."""
    chunk = max(1, _BLOCK_ELEMENTS // (_MIN_SERIES_BLOCK * alphas.size))
    if sigmas.size > chunk:
        parts = [_log_a_fractional(q, sigmas[begin : begin + chunk], alphas) for begin in range(0, sigmas.size, chunk)]
        return np.concatenate(parts, axis=1)
    num_alphas, num_sigmas = alphas.size, sigmas.size
    z0, inverse_two_variances = sigmas**2 * np.log(1 / q - 1) + 0.5, 1 / (2 * sigmas**2)
    log_q, log_1mq = np.log(q), np.log1p(-q)
    # Running pairs, flattened; each pair is (alpha index, sigma index) with its sum so far and its last terms.
    alpha_index, sigma_index = np.repeat(np.arange(num_alphas), num_sigmas), np.tile(np.arange(num_sigmas), num_alphas)
    log_a = np.full(alpha_index.size, -np.inf)
    last_log_s0, last_log_s1 = log_a.copy(), log_a.copy()
    result, pair_id = np.full(alpha_index.size, np.inf), np.arange(alpha_index.size)
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
        log_s0_sigma_table = _log_series_factor(
            i[None, :], block_inverse_two_variances[:, None], i[None, :] - block_z0[:, None], block_sigmas[:, None]
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
    """RDP [len(noise_multipliers), len(orders)] of one Poisson-subsampled Gaussian step per noise multiplier: row k is
    log(A_alpha) / (alpha - 1) at z = noise_multipliers[k] (module docstring; q = 1: alpha / (2 z^2)). A z out of range
    raises `noise_range.NoiseOutOfRangeError` naming its step.

    Args:
      sampling_probability: q, the chance that each example joins a step's Poisson batch, in [0, 1] (0: RDP 0).
      noise_multipliers: z_t = sigma_t / C_t of each step, a 1-D array [T]: 0 (RDP inf), inf (RDP 0) or in [1e-4, 1e4].
      orders: the Renyi orders alpha, a non-empty 1-D sequence of floats > 1; None (default): `DEFAULT_RDP_ORDERS`.
    """
    q = validation.check_probability(sampling_probability, allow_zero=True)
    noise_multipliers, orders = _check_noise_multipliers(noise_multipliers), check_orders(orders)
    unique_sigmas, inverse = np.unique(noise_multipliers, return_inverse=True)
    return _unique_rdp(q, unique_sigmas, orders)[inverse]


def rdp_epsilons_at(
    sampling_probability: float,
    noise_multipliers: ArrayLike,
    delta: float,
    steps: Sequence[int],
    orders: ArrayLike | None = None,
) -> np.ndarray:
    """Exact RDP epsilon of the first s steps for each s of `steps` (in [0, T]), as `RdpAccountant(orders)`
    composing them one by one reports; delta in [0, 1], the other arguments as `poisson_subsampled_gaussian_rdp`.

    Args:
      sampling_probability: q in [0, 1], as `poisson_subsampled_gaussian_rdp`'s.
      noise_multipliers: z_t [T], as `poisson_subsampled_gaussian_rdp`'s.
      delta: the delta the epsilons are reported at, in [0, 1] (0 gives epsilon inf, as dp_accounting's).
      steps: the step counts s to report, a 1-D sequence of integers in [0, T] (0: epsilon 0), in any order.
      orders: the Renyi orders, as `poisson_subsampled_gaussian_rdp`'s (None: `DEFAULT_RDP_ORDERS`).
    """
    delta = validation.check_delta(delta, allow_ends=True)  # As dp_accounting: epsilon inf at 0.
    noise_multipliers, orders = _check_noise_multipliers(noise_multipliers), check_orders(orders)
    steps = validation.check_step_counts(steps, noise_multipliers.size)
    per_step = poisson_subsampled_gaussian_rdp(sampling_probability, noise_multipliers, orders)
    cumulative = np.vstack([np.zeros((1, orders.size)), np.cumsum(per_step, axis=0)])
    return np.array([rdp.compute_epsilon(orders, cumulative[step], delta)[0] for step in steps], dtype=np.float64)


def rdp_epsilon(
    sampling_probability: float, noise_multipliers: ArrayLike, delta: float, orders: ArrayLike | None = None
) -> float:
    """Exact RDP epsilon of all the steps (inf if some z is 0), as `RdpAccountant(orders)` composing
    `PoissonSampledDpEvent(q, GaussianDpEvent(z))` for each z reports (module docstring); arguments as
    `rdp_epsilons_at`.

    Args:
      sampling_probability: q in [0, 1], as `poisson_subsampled_gaussian_rdp`'s.
      noise_multipliers: z_t [T], as `poisson_subsampled_gaussian_rdp`'s.
      delta: in [0, 1], as `rdp_epsilons_at`'s.
      orders: the Renyi orders, as `poisson_subsampled_gaussian_rdp`'s (None: `DEFAULT_RDP_ORDERS`).
    """
    q = validation.check_probability(sampling_probability, allow_zero=True)
    noise_multipliers = _check_noise_multipliers(noise_multipliers)
    delta = validation.check_delta(delta, allow_ends=True)  # As dp_accounting: epsilon inf at 0.
    orders = check_orders(orders)
    unique_sigmas, counts = np.unique(noise_multipliers, return_counts=True)
    total = np.sum(counts[:, None] * _unique_rdp(q, unique_sigmas, orders), axis=0)
    return float(rdp.compute_epsilon(orders, total, delta)[0])
