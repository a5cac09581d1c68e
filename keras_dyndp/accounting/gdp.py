"""Gaussian differential privacy (GDP): duality with (epsilon, delta)-DP and the extended CLT.

A mechanism is mu-GDP when distinguishing neighbouring datasets is no easier than distinguishing N(0, 1) from
N(mu, 1). The Gaussian mechanism with sensitivity C and noise standard deviation sigma is (C / sigma)-GDP.

This module gives the conversions the rest of the package needs:

* `delta_from_mu`: the exact duality (Dong, Roth and Su 2021; paper Eq. 1)
  delta(epsilon; mu) = Phi(-epsilon/mu + mu/2) - e^epsilon Phi(-epsilon/mu - mu/2).
* `epsilon_from_mu` and `mu_from_epsilon`: its two inverses.
* `clt_mu`: the extended central limit theorem (paper Corollary 1, Eq. 10) for T Poisson-subsampled steps with
  per-step GDP parameters mu_t: mu_tot = p * sqrt(sum_t (exp(mu_t^2) - 1)).
* `gdp_clt_epsilons_at`: the CLT's epsilon after several step counts, the 'gdp_clt' accountant's curve.

Why the care: delta is a difference of two tail probabilities that can both be tiny, so it is evaluated in log
space (`scipy.stats.norm.logcdf`, `expm1`); the inverses are found with `scipy.optimize.brentq` on log(delta)
inside brackets that expand until they contain the root, never inside a fixed bracket such as [0, 500], which
fails for tiny or huge budgets (opacus issue #775).
"""

import math
from collections.abc import Sequence

import numpy as np
from scipy import optimize
from scipy import stats

from keras_dyndp import validation

# log(delta) is clamped to this value where it underflows to -inf, so that brentq always sees finite numbers.
# Any delta of interest is far above exp(-1e4).
_LOG_DELTA_FLOOR = -1e4
# brentq tolerances: relative precision close to machine precision.
_XTOL = 1e-15
_RTOL = 4 * np.finfo(float).eps
# Maximum number of bracket doublings/halvings (2**1000 covers every finite float64 scale).
_MAX_BRACKET_STEPS = 1000


def _log_delta_from_mu(epsilon: float, mu: float) -> float:
    """log(delta(epsilon; mu)), accurate when delta is tiny; clamped below at `_LOG_DELTA_FLOOR`."""
    log_cdf_plus = stats.norm.logcdf(-epsilon / mu + mu / 2)
    log_cdf_minus = stats.norm.logcdf(-epsilon / mu - mu / 2)
    # delta = Phi(a) * (1 - exp(epsilon + log Phi(b) - log Phi(a))), and the exponent is < 0 in exact arithmetic.
    exponent = epsilon + log_cdf_minus - log_cdf_plus
    if exponent >= 0:
        return _LOG_DELTA_FLOOR
    return max(float(log_cdf_plus + np.log(-np.expm1(exponent))), _LOG_DELTA_FLOOR)


def delta_from_mu(epsilon: float, mu: float) -> float:
    """Returns the smallest delta such that a mu-GDP mechanism is (epsilon, delta)-DP (paper Eq. 1).

    delta = Phi(-epsilon/mu + mu/2) - e^epsilon Phi(-epsilon/mu - mu/2), evaluated in log space.

    Args:
        epsilon: Privacy parameter epsilon, >= 0 and finite.
        mu: GDP parameter, > 0; `math.inf` gives delta = 1.

    Returns:
        delta in [0, 1].

    Raises:
        ValueError: If `epsilon` < 0 or not finite, or `mu` <= 0 or NaN.
    """
    epsilon = validation.check_float("epsilon", epsilon, 0.0, inclusive=True)
    mu = validation.check_float("mu", mu, allow_inf=True)
    if math.isinf(mu):
        return 1.0
    log_delta = _log_delta_from_mu(epsilon, mu)
    return 0.0 if log_delta <= _LOG_DELTA_FLOOR else float(np.exp(log_delta))


def epsilon_from_mu(mu: float, delta: float) -> float:
    """Returns the smallest epsilon >= 0 such that a mu-GDP mechanism is (epsilon, delta)-DP.

    Args:
        mu: GDP parameter, > 0; `math.inf` gives epsilon = inf.
        delta: Target delta, in (0, 1).

    Returns:
        epsilon >= 0 (0 when mu is so small that delta(0; mu) <= delta).

    Raises:
        ValueError: If `mu` <= 0 or NaN, or `delta` is outside (0, 1).
    """
    mu = validation.check_float("mu", mu, allow_inf=True)
    delta = validation.check_delta(delta)
    if math.isinf(mu):
        return math.inf
    log_target = math.log(delta)

    def excess(epsilon: float) -> float:  # Decreasing in epsilon.
        return _log_delta_from_mu(epsilon, mu) - log_target

    if excess(0.0) <= 0:
        return 0.0
    low, high = 0.0, max(1.0, mu)
    for _ in range(_MAX_BRACKET_STEPS):
        if excess(high) < 0:
            break
        low, high = high, 2 * high
    else:
        raise ValueError(f"Could not bracket epsilon for mu={mu}, delta={delta}.")
    return float(optimize.brentq(excess, low, high, xtol=_XTOL, rtol=_RTOL))


def mu_from_epsilon(epsilon: float, delta: float) -> float:
    """Returns the mu such that mu-GDP is exactly (epsilon, delta)-DP, i.e. delta_from_mu(epsilon, mu) = delta.

    Robust (tested) for epsilon in [0.01, 50] and delta in [1e-12, 0.1]; it also works well outside that box.
    Example: mu_from_epsilon(1.2, 1e-5) ~= 0.3163786.

    Args:
        epsilon: Target epsilon, finite and > 0.
        delta: Target delta, in (0, 1).

    Returns:
        mu > 0.

    Raises:
        ValueError: If `epsilon` <= 0 or not finite, or `delta` is outside (0, 1).
    """
    epsilon = validation.check_float("epsilon", epsilon)
    delta = validation.check_delta(delta)
    log_target = math.log(delta)

    def excess(mu: float) -> float:  # Increasing in mu.
        return _log_delta_from_mu(epsilon, mu) - log_target

    high = 1.0
    for _ in range(_MAX_BRACKET_STEPS):
        if excess(high) > 0:
            break
        high *= 2
    else:
        raise ValueError(f"Could not bracket mu for epsilon={epsilon}, delta={delta}.")
    low = high / 2
    for _ in range(_MAX_BRACKET_STEPS):
        if excess(low) < 0:
            break
        low /= 2
    else:
        raise ValueError(f"Could not bracket mu for epsilon={epsilon}, delta={delta}.")
    return float(optimize.brentq(excess, low, high, xtol=_XTOL, rtol=_RTOL))


def clt_mu(sampling_probability: float, mus: Sequence[float] | np.ndarray) -> float:
    """Returns mu_tot of composing Poisson-subsampled mu_t-GDP steps by the extended GDP CLT.

    mu_tot = p * sqrt(sum_t (exp(mu_t^2) - 1))   (paper Corollary 1, Eq. 10).
    With a constant mu it is Bu et al.'s p * sqrt(T (exp(mu^2) - 1)). The CLT is an asymptotic approximation
    (T -> inf with p sqrt(T) fixed) and can underestimate the true epsilon (Gopi et al. 2021, arXiv 2106.02848);
    use an RDP or PLD accountant for a rigorous bound.

    Args:
        sampling_probability: Poisson sampling probability p, in (0, 1].
        mus: Per-step GDP parameters mu_t = C_t / sigma_t, each >= 0 (0: an infinitely noisy step; inf: a
            non-private step).

    Returns:
        mu_tot >= 0 (inf when some mu_t is so large that exp(mu_t^2) overflows).

    Raises:
        ValueError: If `sampling_probability` is outside (0, 1] or some entry of `mus` is negative or NaN.
    """
    sampling_probability = validation.check_probability(sampling_probability)
    with np.errstate(over="ignore"):
        total = float(np.sum(np.expm1(np.square(validation.check_nonnegative_array("mus", np.reshape(mus, -1))))))
    return sampling_probability * math.sqrt(total)


def gdp_clt_epsilons_at(
    sampling_probability: float, mus: Sequence[float] | np.ndarray, delta: float, steps: Sequence[int] | np.ndarray
) -> np.ndarray:
    """GDP-CLT epsilon of the first k steps for each k in `steps`, in one pass.

    mu_k = p sqrt(sum_{t <= k} (exp(mu_t^2) - 1)) (`clt_mu` of the first k steps) is converted at `delta`.

    Args:
        sampling_probability: Poisson sampling probability p, in (0, 1].
        mus: Per-step GDP parameters mu_t = C_t / sigma_t, each >= 0 (as in `clt_mu`).
        delta: Target delta, in (0, 1).
        steps: Step counts k, each an integer in [0, T].

    Returns:
        Array of epsilons, one per entry of `steps` (0 where mu_k = 0).
    """
    sampling_probability = validation.check_probability(sampling_probability)
    mus = validation.check_nonnegative_array("mus", np.reshape(mus, -1))
    delta = validation.check_delta(delta)
    with np.errstate(over="ignore"):
        cumulative = np.concatenate([[0.0], np.cumsum(np.expm1(mus**2))])
    totals = sampling_probability * np.sqrt(cumulative[np.asarray(steps, dtype=int)])
    return np.array([0.0 if mu == 0 else epsilon_from_mu(mu, delta) for mu in totals])
