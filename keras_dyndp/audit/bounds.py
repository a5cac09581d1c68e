"""Empirical privacy auditing in one training run: lower bounds on epsilon from canary membership guesses.

Setting (Steinke, Nasr, Jagielski, "Privacy auditing with one (1) training run", NeurIPS 2023): m canaries, each
included in training independently with probability 1/2; after the run an auditor scores every canary, guesses IN
for the highest scores, OUT for the lowest and abstains on the rest. If the training run is (epsilon, delta)-DP with
respect to each canary, many correct guesses are unlikely, so a large number of correct guesses REJECTS the claim.

What the numbers mean: ``epsilon_one_run`` is the largest epsilon whose (epsilon, delta)-DP claim is rejected at the
given confidence, i.e. with probability at least ``confidence`` over the canaries' coin flips and the training
randomness, the run's true epsilon at ``delta`` is at least that number. ``epsilon_fdp`` is the same statement for
the Gaussian family: the run is not mu-GDP for any mu up to the largest rejected one, reported as that mu-GDP
curve's epsilon at ``delta``.

What they do NOT mean: a lower bound is not a guarantee. A bound below the accountant's epsilon proves nothing about
privacy (a weak attack or few canaries give small bounds for any mechanism); only a bound ABOVE the claim is
evidence, at the stated confidence, that the implementation leaks more than its accounting says. The confidence is
per audit: among many audits of a correct implementation about ``1 - confidence`` of them are expected to exceed
the claim by chance. The scores must come from an attack fixed before the canaries' coin flips are seen (the scores
may depend on the run, never on the labels). ``epsilon_fdp`` assumes the Gaussian trade-off shape (see
`fdp_mu_lower_bound`): not being mu-GDP does not by itself refute (epsilon(mu, delta), delta)-DP at one delta.

Backend-neutral: numpy and scipy only.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Sequence

import numpy as np
import scipy.optimize
import scipy.special
import scipy.stats

from keras_dyndp import validation

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


# ----------------------------------------------------------------------------------------------------- checks


def _check_counts(num_guesses, num_correct, num_canaries) -> tuple[int, int, int]:
    m = validation.check_int("num_canaries", num_canaries, 1)
    r = validation.check_int("num_guesses", num_guesses, 0, m)
    v = validation.check_int("num_correct", num_correct, 0, r)
    return r, v, m


def _check_scores(name: str, scores) -> np.ndarray:
    array = np.asarray(scores, dtype=np.float64)
    if array.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array of finite scores, got shape {array.shape}")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name} must be a 1-D array of finite scores, got non-finite values")
    return array


# ---------------------------------------------------------------------------------------- Steinke et al. 2023


def one_run_p_value(num_guesses, num_correct, num_canaries, epsilon, delta=0.0) -> float:
    """The p-value of ``num_correct`` correct guesses out of ``num_guesses`` under (epsilon, delta)-DP.

    Steinke, Nasr, Jagielski (2023), Theorem 3 / Proposition 5.2: with m canaries included independently with
    probability 1/2, guesses T in {-1, 0, +1}^m with ||T||_1 <= r and W the number of correct guesses, an
    (eps, delta)-DP mechanism gives, for every v,

        P[W >= v] <= f(v) + 2 m delta * max_{i = 1..v} (f(v - i) - f(v)) / i,
        f(u) = P[Binomial(r, q) >= u],  q = e^eps / (1 + e^eps).

    This returns that bound, capped at 1, made monotone in epsilon: writing c = 2 m delta, the bound equals
    max_i [(1 - c/i) f(v) + c f(v - i)/i]; for terms with c > i the negative part is dropped (never smaller, so
    still a valid p-value), and the result is non-decreasing in epsilon, so the bisection in
    `one_run_epsilon_lower_bound` finds the first epsilon that is not rejected. With 2 m delta <= 1 (the usual case)
    nothing is dropped and the value is the paper's bound exactly; with delta = 0 it is f(v).
    """
    r, v, m = _check_counts(num_guesses, num_correct, num_canaries)
    delta = validation.check_delta(delta, allow_zero=True)
    return _one_run_p_value(r, v, m, float(epsilon), delta)


def _one_run_p_value(r: int, v: int, m: int, epsilon: float, delta: float) -> float:
    if v == 0:
        return 1.0
    q = scipy.special.expit(epsilon)
    tail_v = float(scipy.stats.binom.sf(v - 1, r, q))  # f(v) = P[B >= v]
    if delta == 0.0:
        return min(tail_v, 1.0)
    c = 2.0 * m * delta
    i = np.arange(1, v + 1)
    tails = scipy.stats.binom.sf(v - i - 1, r, q)  # f(v - i)
    terms = np.maximum(0.0, 1.0 - c / i) * tail_v + c * tails / i
    return float(min(1.0, np.max(terms)))


def one_run_epsilon_lower_bound(num_guesses, num_correct, num_canaries, delta=0.0, confidence=0.95) -> float:
    """Largest epsilon whose (epsilon, delta)-DP claim ``num_correct`` correct of ``num_guesses`` guesses rejects.

    Steinke, Nasr, Jagielski, "Privacy auditing with one (1) training run" (NeurIPS 2023): under (eps, delta)-DP,
    with ``num_canaries`` = m canaries each included independently with probability 1/2 and r guesses, the number
    of correct guesses is stochastically dominated by Binomial(r, e^eps / (1 + e^eps)) up to the delta term of
    their Theorem 3 / Proposition 5.2 (see `one_run_p_value` for the exact form used). The claim is rejected when
    the p-value is at most ``1 - confidence``; the bound is found by bisection in epsilon (tolerance 1e-6, rounded
    down), and is 0 when even epsilon = 0 is not rejected.

    A LOWER bound at ``confidence``: with probability at least ``confidence`` the true epsilon at ``delta`` is at
    least the returned value. It is never a guarantee of privacy.
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
            return ceiling if rejects(ceiling) else _bisect(rejects, low, ceiling)
    return _bisect(rejects, low, high)


def _bisect(rejects, low: float, high: float) -> float:
    while high - low > _TOL:
        mid = 0.5 * (low + high)
        if rejects(mid):
            low = mid
        else:
            high = mid
    return low


# ------------------------------------------------------------------------------------ Mahloujifar et al. 2024


def gdp_epsilon(mu, delta) -> float:
    """Epsilon of mu-GDP at ``delta`` (Dong, Roth, Su 2022, Corollary 2.13), the GDP dual.

    The smallest eps >= 0 with  delta >= Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)  (computed in logs).
    """
    mu = validation.check_float("mu", mu, 0.0, inclusive=True)
    delta = validation.check_delta(delta)
    if mu == 0.0:
        return 0.0
    log_delta = math.log(delta)

    def gap(eps: float) -> float:  # log delta(eps) - log delta, decreasing in eps
        log_a = scipy.special.log_ndtr(-eps / mu + mu / 2.0)
        log_b = eps + scipy.special.log_ndtr(-eps / mu - mu / 2.0)
        if log_b >= log_a:
            return -math.inf
        return float(log_a + math.log1p(-math.exp(log_b - log_a)) - log_delta)

    if gap(0.0) <= 0.0:
        return 0.0
    high = 1.0
    while gap(high) > 0.0:
        high *= 2.0
    return float(scipy.optimize.brentq(gap, 0.0, high, xtol=1e-10))


def _fdp_rejects(mu: float, r: int, v: int, m: int, alpha: float) -> bool:
    """Whether ``v`` correct of ``r`` guesses among ``m`` canaries reject mu-GDP at significance ``alpha``.

    The numerical tail bound of Mahloujifar, Melis, Chaudhuri, "Auditing f-differential privacy in one run" (2024),
    the recursion of their guessing-game analysis (``audit_rh_with_cap`` in their code; jax_privacy's
    ``auditing._epsilon_one_run_fdp`` runs the same recursion). Suppose that with probability at least alpha the
    auditor gets at least v correct. Start from the mass of correct and incorrect guesses that this forces per
    canary, ``tp = alpha v / m`` and ``fp = alpha (r - v) / m``; for i = v-1, ..., 0, f-DP forces the incorrect
    mass up to the inverse blow-up of the correct mass, ``fp' = max(fp, Phi(Phi^-1(tp) - mu))`` (for G_mu the
    smallest FPR of a test with TPR ``tp``), and moving that much mass redistributes correct guesses,
    ``tp' = min(1, tp + i / (r - i) (fp' - fp))``; the recursion stops when fp no longer moves. If the forced
    total ``tp + fp`` exceeds the guesses made per canary, r / m, the supposition is impossible: reject.
    """
    if v == 0:
        return False
    tp = alpha * v / m
    fp = alpha * (r - v) / m
    for i in range(v - 1, -1, -1):
        needed = float(scipy.special.ndtr(scipy.special.ndtri(tp) - mu))
        if needed <= fp:
            break
        tp = min(tp + i / (r - i) * (needed - fp), 1.0)
        fp = needed
    return tp + fp > r / m


def fdp_mu_lower_bound(num_guesses, num_correct, num_canaries, confidence=0.95) -> float:
    """Largest mu whose mu-GDP claim ``num_correct`` correct of ``num_guesses`` guesses rejects at ``confidence``.

    Implements the f-DP one-run bound of Mahloujifar, Melis, Chaudhuri, "Auditing f-differential privacy in one
    run" (2024) for the Gaussian family f = G_mu (trade-off curve G_mu(x) = Phi(Phi^-1(1 - x) - mu)): the full
    recursive tail bound (see `_fdp_rejects`), not a simplification. Guesses may be IN or OUT (G_mu is symmetric,
    so both directions of a guess face the same trade-off curve). Rejection is monotone in mu (a larger mu is a
    weaker claim), so the largest rejected mu is found by bisection (tolerance 1e-6, rounded down); 0 when mu = 0
    (perfect privacy) is not rejected.

    A LOWER bound: with probability at least ``confidence`` the run is not mu-GDP for the returned mu. It says
    nothing about the privacy of a run whose bound is small.
    """
    r, v, m = _check_counts(num_guesses, num_correct, num_canaries)
    alpha = 1.0 - validation.check_delta(confidence, "confidence")
    return _bisect_largest_rejected(lambda mu: _fdp_rejects(mu, r, v, m, alpha), _MU_MAX)


def fdp_epsilon_lower_bound(num_guesses, num_correct, num_canaries, delta, confidence=0.95) -> float:
    """`fdp_mu_lower_bound` converted to epsilon at ``delta`` by the GDP dual (`gdp_epsilon`).

    With mu* the largest rejected mu, returns epsilon(mu*, delta) = the eps solving
    delta = Phi(-eps/mu* + mu*/2) - e^eps Phi(-eps/mu* - mu*/2). This is the same conversion as jax_privacy's
    ``epsilon_one_run_fdp`` (which tests the Gaussian mechanism calibrated to (eps, delta)).

    Read it as: at ``confidence``, the run is less private than every Gaussian mechanism with epsilon up to the
    returned value at ``delta``. It is a lower bound on the run's epsilon at ``delta`` when the run's trade-off
    curve has the Gaussian shape (DP-SGD's is close to it), not for an arbitrary (eps, delta)-DP mechanism: use
    `one_run_epsilon_lower_bound` for a statement free of that assumption. ``delta`` must be in (0, 1): at
    delta = 0 every mu > 0 has epsilon = infinity.
    """
    delta = validation.check_delta(delta)
    return gdp_epsilon(fdp_mu_lower_bound(num_guesses, num_correct, num_canaries, confidence), delta)


# -------------------------------------------------------------------------------------------------- scores


@dataclasses.dataclass(frozen=True)
class AuditResult:
    """One audit: m canaries, r guesses of which ``num_correct`` right, both lower bounds at ``confidence``.

    ``epsilon_fdp`` is ``math.inf`` when ``delta`` is 0 and mu_fdp > 0 (see `fdp_epsilon_lower_bound`).
    ``num_guesses_grid`` is the grid searched with its Bonferroni split (one value when ``num_guesses`` was given).
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


def _guess_grid(m: int) -> tuple[int, ...]:
    return tuple(sorted({max(1, round(fraction * m)) for fraction in _GUESS_FRACTIONS}))


def _count_correct(labels_by_score: np.ndarray, r: int, two_sided: bool) -> int:
    """Correct guesses: IN for the k_plus highest scores, OUT for the k_minus lowest (k_plus + k_minus = r)."""
    k_minus = r // 2 if two_sided else 0
    k_plus = r - k_minus
    m = labels_by_score.size
    correct_in = int(np.sum(labels_by_score[m - k_plus :])) if k_plus else 0
    correct_out = int(k_minus - np.sum(labels_by_score[:k_minus]))
    return correct_in + correct_out


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

    Higher score = more likely included. The canaries are ranked by score (ties broken uniformly at random with
    ``seed``, so that the order of the two arrays leaks nothing); with r guesses the auditor guesses IN for the
    k_plus = r - r // 2 highest and OUT for the k_minus = r // 2 lowest (``two_sided=False``: k_plus = r,
    k_minus = 0), as in Steinke et al., and abstains on the rest.

    Choosing r: an int is used as given (choose it before seeing these scores, e.g. on another run). A sequence, or
    None for the default grid of m x (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0), is searched with a
    Bonferroni split: each grid point is tested at significance (1 - confidence) / len(grid), so the best point,
    chosen on the same scores, is still valid at ``confidence`` (union bound over the grid). The reported r is the
    grid point with the largest f-DP bound (ties: the larger one-run bound, then the smaller r); both bounds are
    reported at that r.
    """
    in_scores = _check_scores("in_scores", in_scores)
    out_scores = _check_scores("out_scores", out_scores)
    confidence = validation.check_delta(confidence, "confidence")
    delta = validation.check_delta(delta, allow_zero=True)
    m = in_scores.size + out_scores.size
    if m == 0:
        raise ValueError("in_scores and out_scores must hold at least one canary between them, got none")
    if num_guesses is None:
        grid = _guess_grid(m)
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

    best = None
    for r in grid:
        v = _count_correct(labels_by_score, r, two_sided)
        mu = fdp_mu_lower_bound(r, v, m, grid_confidence)
        eps_one_run = one_run_epsilon_lower_bound(r, v, m, delta, grid_confidence)
        key = (mu, eps_one_run, -r)
        if best is None or key > best[0]:
            best = (key, r, v, mu, eps_one_run)
    _, r, v, mu, eps_one_run = best
    if delta > 0.0:
        eps_fdp = gdp_epsilon(mu, delta)
    else:
        eps_fdp = math.inf if mu > 0.0 else 0.0
    return AuditResult(
        num_canaries=m,
        num_guesses=r,
        num_correct=v,
        epsilon_one_run=eps_one_run,
        epsilon_fdp=eps_fdp,
        confidence=confidence,
        delta=delta,
        mu_fdp=mu,
        num_guesses_grid=grid,
    )
