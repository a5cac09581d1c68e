"""Lower bounds on epsilon from canary membership guesses in one training run (numpy and scipy only).

Many correct guesses among m canaries (each included with probability 1/2) reject an (epsilon, delta)-DP claim:
``epsilon_one_run`` (Steinke, Nasr, Jagielski 2023) and ``epsilon_fdp`` (Mahloujifar, Melis, Chaudhuri 2024, for the
Gaussian family) are the largest rejected at ``confidence``. Lower bounds, never guarantees (docs/audit.md).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Sequence

import numpy as np
import scipy.special
import scipy.stats

from keras_dyndp.accounting import gdp
from keras_dyndp.core import validation

__all__ = [
    "AuditResult",
    "audit_from_scores",
    "fdp_epsilon_lower_bound",
    "fdp_mu_lower_bound",
    "gdp_epsilon",
    "one_run_epsilon_lower_bound",
    "one_run_p_value",
]

_EPS_MAX = 100.0  # the bisection's ceiling for epsilon: e^100 / (1 + e^100) is 1 in float64
_MU_MAX = 64.0  # the bisection's ceiling for mu
_TOL = 1e-6
# Default grid of guess fractions (of m) for ``audit_from_scores(num_guesses=None)``: 9 values, Bonferroni over 9.
_GUESS_FRACTIONS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0)


def _check_counts(num_guesses, num_correct, num_canaries) -> tuple[int, int, int]:
    m = validation.check_int("num_canaries", num_canaries, 1)
    r = validation.check_int("num_guesses", num_guesses, 0, m)
    v = validation.check_int("num_correct", num_correct, 0, r)
    return r, v, m


def _check_scores(name: str, scores) -> np.ndarray:
    array = np.asarray(scores, dtype=np.float64)
    if array.ndim != 1 or not np.all(np.isfinite(array)):
        got = f"shape {array.shape}" if array.ndim != 1 else "non-finite values"
        raise ValueError(f"{name} must be a 1-D array of finite scores, got {got}")
    return array


def one_run_p_value(num_guesses, num_correct, num_canaries, epsilon, delta=0.0) -> float:
    """The p-value of ``num_correct`` correct guesses out of ``num_guesses`` under (epsilon, delta)-DP.

    Steinke, Nasr, Jagielski (2023), Theorem 3 / Proposition 5.2: for W correct guesses among r on m canaries,
    P[W >= v] <= f(v) + 2 m delta max_{i = 1..v} (f(v - i) - f(v)) / i, f(u) = P[Binomial(r, e^eps / (1 + e^eps)) >= u].
    Capped at 1 and made monotone in epsilon (for the bisection): with c = 2 m delta, terms of
    max_i [(1 - c/i) f(v) + c f(v - i)/i] with c > i drop their negative part (still valid); exact when c <= 1.

    Args:
        num_guesses: r, the number of guesses made, an int in [0, num_canaries].
        num_correct: v, how many of them are right, an int in [0, num_guesses].
        num_canaries: m, the number of canaries (each included with probability 1/2), an int >= 1.
        epsilon: the epsilon of the (epsilon, delta)-DP claim tested, a float >= 0 (inf: nothing is rejected).
        delta: the delta of the claim, in [0, 1) (default 0).
    """
    r, v, m = _check_counts(num_guesses, num_correct, num_canaries)
    delta = validation.check_delta(delta, allow_zero=True)
    epsilon = validation.check_float("epsilon", epsilon, inclusive=True, allow_inf=True)
    return _one_run_p_value(r, v, m, epsilon, delta)


def _one_run_p_value(r: int, v: int, m: int, epsilon: float, delta: float) -> float:
    if v == 0:
        return 1.0
    q = scipy.special.expit(epsilon)
    tail_v = float(scipy.stats.binom.sf(v - 1, r, q))  # f(v) = P[B >= v]
    if delta == 0.0:
        return min(tail_v, 1.0)
    c, i = 2.0 * m * delta, np.arange(1, v + 1)
    tails = scipy.stats.binom.sf(v - i - 1, r, q)  # f(v - i)
    terms = np.maximum(0.0, 1.0 - c / i) * tail_v + c * tails / i
    return float(min(1.0, np.max(terms)))


def one_run_epsilon_lower_bound(num_guesses, num_correct, num_canaries, delta=0.0, confidence=0.95) -> float:
    """Largest epsilon whose (epsilon, delta)-DP claim is rejected (`one_run_p_value` <= 1 - confidence), by
    bisection (tolerance 1e-6, rounded down); 0 when epsilon = 0 is not rejected.

    Args:
        num_guesses: r, an int in [0, num_canaries], as `one_run_p_value`'s.
        num_correct: v, an int in [0, num_guesses], as `one_run_p_value`'s.
        num_canaries: m, an int >= 1, as `one_run_p_value`'s.
        delta: the delta of the claims tested, in [0, 1) (default 0).
        confidence: the confidence 1 - alpha at which the claim is rejected, in (0, 1) (default 0.95).
    """
    r, v, m = _check_counts(num_guesses, num_correct, num_canaries)
    delta = validation.check_delta(delta, allow_zero=True)
    alpha = 1.0 - validation.check_delta(confidence, "confidence")
    return _bisect_largest_rejected(lambda eps: _one_run_p_value(r, v, m, eps, delta) <= alpha, _EPS_MAX)


def _bisect_largest_rejected(rejects, ceiling: float) -> float:
    """The largest x in [0, ceiling] with ``rejects(x)``, for a predicate true on [0, x*) and false after."""
    if not rejects(0.0):
        return 0.0
    low, high = 0.0, 1.0
    while rejects(high):
        low, high = high, 2.0 * high
        if high > ceiling:
            if rejects(ceiling):
                return ceiling
            high = ceiling
            break
    while high - low > _TOL:
        mid = 0.5 * (low + high)
        low, high = (mid, high) if rejects(mid) else (low, mid)
    return low


def gdp_epsilon(mu, delta) -> float:
    """Epsilon of mu-GDP at ``delta`` (Dong, Roth, Su 2022, Corollary 2.13): the smallest eps >= 0 with
    delta >= Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2) (`keras_dyndp.accounting.gdp.epsilon_from_mu`).

    Args:
        mu: the GDP parameter, a finite float >= 0 (0 gives epsilon 0).
        delta: the delta the epsilon is reported at, in (0, 1).
    """
    mu, delta = validation.check_float("mu", mu, 0.0, inclusive=True), validation.check_delta(delta)
    return 0.0 if mu == 0.0 else gdp.epsilon_from_mu(mu, delta)


def _fdp_rejects(mu: float, r: int, v: int, m: int, alpha: float) -> bool:
    """Whether ``v`` correct of ``r`` guesses among ``m`` canaries reject mu-GDP at significance ``alpha``: the tail
    bound of Mahloujifar et al. (2024) (their ``audit_rh_with_cap``; jax_privacy's ``_epsilon_one_run_fdp``). From
    ``tp = alpha v / m``, ``fp = alpha (r - v) / m``, for i = v-1, ..., 0: ``fp' = max(fp, Phi(Phi^-1(tp) - mu))``,
    ``tp' = min(1, tp + i / (r - i) (fp' - fp))``, until fp stops moving. Reject if ``tp + fp > r / m``."""
    if v == 0:
        return False
    tp, fp = alpha * v / m, alpha * (r - v) / m
    for i in range(v - 1, -1, -1):
        needed = float(scipy.special.ndtr(scipy.special.ndtri(tp) - mu))
        if needed <= fp:
            break
        tp = min(tp + i / (r - i) * (needed - fp), 1.0)
        fp = needed
    return tp + fp > r / m


def fdp_mu_lower_bound(num_guesses, num_correct, num_canaries, confidence=0.95) -> float:
    """Largest mu whose mu-GDP claim ``num_correct`` of ``num_guesses`` guesses rejects at ``confidence``: the
    f-DP one-run bound of Mahloujifar et al. (2024) for f = G_mu(x) = Phi(Phi^-1(1 - x) - mu) (the full recursion,
    `_fdp_rejects`; G_mu is symmetric, so guesses may be IN or OUT), by bisection (1e-6, rounded down).

    Args:
        num_guesses: r, an int in [0, num_canaries], as `one_run_p_value`'s.
        num_correct: v, an int in [0, num_guesses], as `one_run_p_value`'s.
        num_canaries: m, an int >= 1, as `one_run_p_value`'s.
        confidence: the confidence 1 - alpha at which the claim is rejected, in (0, 1) (default 0.95).
    """
    r, v, m = _check_counts(num_guesses, num_correct, num_canaries)
    alpha = 1.0 - validation.check_delta(confidence, "confidence")
    return _bisect_largest_rejected(lambda mu: _fdp_rejects(mu, r, v, m, alpha), _MU_MAX)


def fdp_epsilon_lower_bound(num_guesses, num_correct, num_canaries, delta, confidence=0.95) -> float:
    """`fdp_mu_lower_bound` as epsilon at ``delta`` in (0, 1) (`gdp_epsilon`; as jax_privacy's ``epsilon_one_run_fdp``):
    a lower bound on the run's epsilon only if its trade-off curve has the Gaussian shape.

    Args:
        num_guesses: r, an int in [0, num_canaries], as `one_run_p_value`'s.
        num_correct: v, an int in [0, num_guesses], as `one_run_p_value`'s.
        num_canaries: m, an int >= 1, as `one_run_p_value`'s.
        delta: the delta the epsilon is reported at, in (0, 1).
        confidence: the confidence 1 - alpha at which the claim is rejected, in (0, 1) (default 0.95).
    """
    delta = validation.check_delta(delta)
    return gdp_epsilon(fdp_mu_lower_bound(num_guesses, num_correct, num_canaries, confidence), delta)


@dataclasses.dataclass(frozen=True)
class AuditResult:
    """One audit: m canaries, r guesses of which ``num_correct`` right, both lower bounds at ``confidence``.

    ``epsilon_fdp`` is inf when ``delta`` is 0 and mu_fdp > 0; ``num_guesses_grid`` is the grid searched.

    Attributes:
        num_canaries: m, the number of canaries scored (included and excluded), an int >= 1.
        num_guesses: r, the number of guesses of the reported bounds, an int in [1, m].
        num_correct: v, how many of the r guesses are right, an int in [0, r].
        epsilon_one_run: the one-run lower bound (Steinke et al.) on epsilon at ``delta``, a float in [0, 100].
        epsilon_fdp: the f-DP lower bound (Mahloujifar et al.; Gaussian trade-off) on epsilon at ``delta``, >= 0 or inf.
        confidence: the confidence of the reported bounds, in (0, 1) (split over ``num_guesses_grid`` by Bonferroni).
        delta: the delta both bounds are stated at, in [0, 1).
        mu_fdp: the largest mu-GDP claim rejected (`fdp_mu_lower_bound`), in [0, 64]; ``epsilon_fdp`` is its epsilon.
        num_guesses_grid: the guess counts searched, increasing ints in [1, m] of which r is one (default ()).
    """

    num_canaries: int
    num_guesses: int
    num_correct: int
    epsilon_one_run: float
    epsilon_fdp: float
    confidence: float
    delta: float
    mu_fdp: float = 0.0
    num_guesses_grid: tuple[int, ...] = ()


def _count_correct(labels_by_score: np.ndarray, r: int, two_sided: bool) -> int:
    """Correct guesses: IN for the k_plus highest scores, OUT for the k_minus lowest (k_plus + k_minus = r)."""
    k_minus = r // 2 if two_sided else 0
    k_plus = r - k_minus
    correct_in = int(np.sum(labels_by_score[labels_by_score.size - k_plus :])) if k_plus else 0
    return correct_in + int(k_minus - np.sum(labels_by_score[:k_minus]))


def audit_from_scores(
    in_scores,
    out_scores,
    *,
    delta,
    confidence=0.95,
    num_guesses: int | Sequence[int] | None = None,
    two_sided: bool = True,
    seed: int = 0,
) -> AuditResult:
    """Both one-run lower bounds from the scores of the included (``in_scores``) and excluded (``out_scores``) canaries.

    Higher score = more likely IN; ties broken at random with ``seed``. r guesses: IN for the r - r // 2 highest,
    OUT for the r // 2 lowest (``two_sided=False``: IN for r). ``num_guesses``: an int fixed before seeing these
    scores, or a grid (None: m x ``_GUESS_FRACTIONS``) searched with a Bonferroni split; the reported r has the
    largest f-DP bound (ties: the larger one-run bound, then the smaller r).

    Args:
        in_scores: the included canaries' scores, a 1-D array of finite floats (empty only if ``out_scores`` is not).
        out_scores: the excluded canaries' scores, a 1-D array of finite floats; m = the two sizes' sum, >= 1.
        delta: the delta the bounds are stated at, in [0, 1) (0: ``epsilon_fdp`` is inf once mu_fdp > 0).
        confidence: the confidence of the reported bounds over the whole grid, in (0, 1) (default 0.95).
        num_guesses: r, an int in [1, m]; a non-empty sequence of such ints (a grid); or None (default), the grid
            m x ``_GUESS_FRACTIONS`` (rounded, at least 1).
        two_sided: True (default) guesses OUT for the r // 2 lowest scores too; False guesses IN only.
        seed: the seed of the random tie-breaking between equal scores, an int >= 0 (default 0).
    """
    in_scores, out_scores = _check_scores("in_scores", in_scores), _check_scores("out_scores", out_scores)
    confidence = validation.check_delta(confidence, "confidence")
    delta = validation.check_delta(delta, allow_zero=True)
    m = in_scores.size + out_scores.size
    if m == 0:
        raise ValueError("in_scores and out_scores must hold at least one canary between them, got none")
    if num_guesses is None:
        grid = tuple(sorted({max(1, round(fraction * m)) for fraction in _GUESS_FRACTIONS}))
    elif isinstance(num_guesses, numbers.Integral) and not isinstance(num_guesses, bool):
        grid = (validation.check_int("num_guesses", num_guesses, 1, m),)
    else:
        grid = tuple(sorted({validation.check_int("num_guesses", r, 1, m) for r in num_guesses}))
        if not grid:
            raise ValueError("num_guesses must be None, an integer in [1, num_canaries] or a non-empty sequence")
    scores = np.concatenate([in_scores, out_scores])
    labels = np.concatenate([np.ones(in_scores.size, np.int64), np.zeros(out_scores.size, np.int64)])
    tie_breaker = np.random.default_rng(seed).permutation(m)
    labels_by_score = labels[np.lexsort((tie_breaker, scores))]
    grid_confidence = 1.0 - (1.0 - confidence) / len(grid)

    def bounds_at(r: int) -> tuple:
        v = _count_correct(labels_by_score, r, two_sided)
        mu = fdp_mu_lower_bound(r, v, m, grid_confidence)
        eps_one_run = one_run_epsilon_lower_bound(r, v, m, delta, grid_confidence)
        return (mu, eps_one_run, -r), r, v, mu, eps_one_run

    _, r, v, mu, eps_one_run = max((bounds_at(r) for r in grid), key=lambda bounds: bounds[0])
    eps_fdp = gdp_epsilon(mu, delta) if delta > 0.0 else math.inf if mu > 0.0 else 0.0
    return AuditResult(m, r, v, eps_one_run, eps_fdp, confidence, delta, mu, grid)
