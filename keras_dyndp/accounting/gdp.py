"""Gaussian differential privacy (GDP): duality with (epsilon, delta)-DP and the extended CLT. A mechanism is mu-GDP
when telling neighbouring datasets apart is no easier than N(0, 1) from N(mu, 1); a Gaussian mechanism of sensitivity C
and noise std sigma is (C / sigma)-GDP. `delta_from_mu` is the exact duality (Dong, Roth and Su 2021; paper Eq. 1)
delta(epsilon; mu) = Phi(-epsilon/mu + mu/2) - e^epsilon Phi(-epsilon/mu - mu/2), which `epsilon_from_mu` and
`mu_from_epsilon` invert; `clt_mu` the extended CLT (paper Corollary 1, Eq. 10). delta is evaluated in log space (a
difference of two possibly tiny tails); the inverses run brentq on log(delta) in brackets grown to hold the root."""

import math
from collections.abc import Callable
from collections.abc import Sequence

import numpy as np
from scipy import optimize
from scipy import stats

from keras_dyndp.core import validation

# log(delta) is clamped to this where it underflows, so that brentq sees finite numbers (any delta of interest is
# far above exp(-1e4)).
_LOG_DELTA_FLOOR = -1e4
_XTOL = 1e-15
_RTOL = 4 * np.finfo(float).eps
_MAX_BRACKET_STEPS = 1000  # Doublings or halvings: 2**1000 covers every finite float64 scale.


def _log_delta_from_mu(epsilon: float, mu: float) -> float:
    """log(delta(epsilon; mu)), accurate when delta is tiny; clamped below at `_LOG_DELTA_FLOOR`."""
    log_cdf_plus, log_cdf_minus = stats.norm.logcdf(-epsilon / mu + mu / 2), stats.norm.logcdf(-epsilon / mu - mu / 2)
    # delta = Phi(a) * (1 - exp(epsilon + log Phi(b) - log Phi(a))), and the exponent is < 0 in exact arithmetic.
    exponent = epsilon + log_cdf_minus - log_cdf_plus
    if exponent >= 0:
        return _LOG_DELTA_FLOOR
    return max(float(log_cdf_plus + np.log(-np.expm1(exponent))), _LOG_DELTA_FLOOR)


def _expand(value: float, factor: float, found: Callable[[float], bool], what: str) -> float:
    """The first of value, value * factor, value * factor^2, ... where `found` holds (a bracket's end)."""
    for _ in range(_MAX_BRACKET_STEPS):
        if found(value):
            return value
        value *= factor
    raise ValueError(f"Could not bracket {what}.")


def delta_from_mu(epsilon: float, mu: float) -> float:
    """The smallest delta in [0, 1] with mu-GDP (epsilon, delta)-DP (paper Eq. 1), for epsilon >= 0 finite and
    mu > 0 (`math.inf` gives 1); ValueError otherwise.

    Args:
      epsilon: the epsilon of the (epsilon, delta)-DP claim, a finite float >= 0.
      mu: the GDP parameter (C / sigma for one Gaussian step), a float > 0; `math.inf` (no privacy) gives delta 1.
    """
    epsilon = validation.check_float("epsilon", epsilon, 0.0, inclusive=True)
    mu = validation.check_float("mu", mu, allow_inf=True)
    if math.isinf(mu):
        return 1.0
    log_delta = _log_delta_from_mu(epsilon, mu)
    return 0.0 if log_delta <= _LOG_DELTA_FLOOR else float(np.exp(log_delta))


def epsilon_from_mu(mu: float, delta: float) -> float:
    """The smallest epsilon >= 0 with mu-GDP (epsilon, delta)-DP, for mu > 0 (`math.inf` gives inf) and delta in
    (0, 1); ValueError otherwise.

    Args:
      mu: the GDP parameter, a float > 0, as `delta_from_mu`'s; `math.inf` (no privacy) gives epsilon inf.
      delta: the delta the epsilon is reported at, in (0, 1).
    """
    mu, delta = validation.check_float("mu", mu, allow_inf=True), validation.check_delta(delta)
    if math.isinf(mu):
        return math.inf
    log_target = math.log(delta)

    def excess(epsilon: float) -> float:  # Decreasing in epsilon.
        return _log_delta_from_mu(epsilon, mu) - log_target

    if excess(0.0) <= 0:
        return 0.0
    high = _expand(max(1.0, mu), 2, lambda epsilon: excess(epsilon) < 0, f"epsilon for mu={mu}, delta={delta}")
    low = 0.0 if high == max(1.0, mu) else high / 2
    return float(optimize.brentq(excess, low, high, xtol=_XTOL, rtol=_RTOL))


def mu_from_epsilon(epsilon: float, delta: float) -> float:
    """The mu > 0 with delta_from_mu(epsilon, mu) = delta, for epsilon > 0 finite and delta in (0, 1); ValueError
    otherwise. Tested for epsilon in [0.01, 50] and delta in [1e-12, 0.1]; mu_from_epsilon(1.2, 1e-5) ~= 0.3163786.

    Args:
      epsilon: the epsilon of the (epsilon, delta)-DP budget, a finite float > 0.
      delta: the delta of the budget, in (0, 1).
    """
    epsilon, delta = validation.check_float("epsilon", epsilon), validation.check_delta(delta)
    log_target = math.log(delta)

    def excess(mu: float) -> float:  # Increasing in mu.
        return _log_delta_from_mu(epsilon, mu) - log_target

    what = f"mu for epsilon={epsilon}, delta={delta}"
    high = _expand(1.0, 2, lambda mu: excess(mu) > 0, what)
    low = _expand(high / 2, 0.5, lambda mu: excess(mu) < 0, what)
    return float(optimize.brentq(excess, low, high, xtol=_XTOL, rtol=_RTOL))


def clt_mu(sampling_probability: float, mus: Sequence[float] | np.ndarray) -> float:
    """mu_tot = p * sqrt(sum_t (exp(mu_t^2) - 1)) of Poisson-subsampled mu_t-GDP steps (paper Corollary 1, Eq. 10),
    p in (0, 1], mu_t = C_t / sigma_t >= 0 (inf: non-private; mu_tot inf where exp(mu_t^2) overflows). An asymptotic
    approximation (T -> inf with p sqrt(T) fixed) that can underestimate epsilon (Gopi et al. 2021).

    Args:
      sampling_probability: p, the chance that each example joins a step's Poisson batch, in (0, 1].
      mus: the per-step GDP parameters mu_t = C_t / sigma_t [T], each >= 0 (inf: no noise); any shape, flattened.
    """
    sampling_probability = validation.check_probability(sampling_probability)
    with np.errstate(over="ignore"):
        total = float(np.sum(np.expm1(np.square(validation.check_nonnegative_array("mus", np.reshape(mus, -1))))))
    return sampling_probability * math.sqrt(total)


def gdp_clt_epsilons_at(
    sampling_probability: float, mus: Sequence[float] | np.ndarray, delta: float, steps: Sequence[int] | np.ndarray
) -> np.ndarray:
    """GDP-CLT epsilon (`clt_mu` of the first k steps at `delta`; 0 where it is 0) for each k in [0, T] of `steps`."""
    sampling_probability = validation.check_probability(sampling_probability)
    mus, delta = validation.check_nonnegative_array("mus", np.reshape(mus, -1)), validation.check_delta(delta)
    with np.errstate(over="ignore"):
        cumulative = np.concatenate([[0.0], np.cumsum(np.expm1(mus**2))])
    totals = sampling_probability * np.sqrt(cumulative[np.asarray(steps, dtype=int)])
    return np.array([0.0 if mu == 0 else epsilon_from_mu(mu, delta) for mu in totals])
