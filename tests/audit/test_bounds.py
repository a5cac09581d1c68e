"""keras_dyndp.audit: the one-run lower bounds (Steinke et al. 2023; Mahloujifar et al. 2024) from counts and scores.

Numpy and scipy only. The validity tests simulate mechanisms whose privacy is known exactly (randomized response,
which is eps-DP and nothing better; the Gaussian shift, which is mu-GDP) and count how often the bound exceeds the
truth: at confidence 0.95 that must happen in at most about 5% of the runs.
"""

import dataclasses
import math

import numpy as np
import pytest
import scipy.stats

from keras_dyndp.audit import bounds as audit

M = 1000
DELTA = 1e-5


def _gaussian_scores(mu, m, rng):
    included = rng.integers(0, 2, m).astype(bool)
    scores = rng.normal(size=m) + mu * included
    return scores[included], scores[~included]


def _labels_by_score(in_scores, out_scores, rng):
    scores = np.concatenate([in_scores, out_scores])
    labels = np.concatenate([np.ones(len(in_scores), np.int64), np.zeros(len(out_scores), np.int64)])
    return labels[np.lexsort((rng.permutation(scores.size), scores))]


# ------------------------------------------------------------------------------------------------- (a) scale


def test_all_correct_gives_a_large_bound_and_coin_flips_give_zero():
    assert audit.one_run_epsilon_lower_bound(M, M, M) > 5.0
    assert audit.one_run_epsilon_lower_bound(M, M, M, delta=DELTA) > 5.0
    assert audit.fdp_mu_lower_bound(M, M, M) > 2.0
    assert audit.fdp_epsilon_lower_bound(M, M, M, delta=DELTA) > 10.0
    for correct in (480, 500, 520):
        assert audit.one_run_epsilon_lower_bound(M, correct, M, delta=DELTA) < 0.05
        assert audit.fdp_epsilon_lower_bound(M, correct, M, delta=DELTA) < 0.05
    assert audit.one_run_epsilon_lower_bound(M, 0, M) == 0.0
    assert audit.fdp_mu_lower_bound(M, 0, M) == 0.0


def test_delta_zero_bound_is_the_binomial_tail_inverse():
    # At the bound, P[Binomial(r, q) >= v] = 1 - confidence with q = e^eps / (1 + e^eps).
    eps = audit.one_run_epsilon_lower_bound(200, 190, M, confidence=0.9)
    q = 1.0 / (1.0 + math.exp(-eps))
    assert scipy.stats.binom.sf(189, 200, q) == pytest.approx(0.1, rel=1e-4)


def test_gdp_epsilon_matches_the_dual():
    mu, delta = 1.7, 1e-5
    eps = audit.gdp_epsilon(mu, delta)
    norm = scipy.stats.norm
    assert norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2) == pytest.approx(delta)
    assert 8.0 < eps < 8.4  # mu = 1.7 is about (8.2, 1e-5)-DP
    assert audit.gdp_epsilon(0.0, delta) == 0.0


# ------------------------------------------------------------------------------------------ (b) monotonicity


@pytest.mark.parametrize("delta", [0.0, DELTA, 1e-3])
def test_monotone_in_num_correct(delta):
    one_run = [audit.one_run_epsilon_lower_bound(200, v, M, delta) for v in range(100, 201, 10)]
    assert all(a <= b for a, b in zip(one_run, one_run[1:], strict=False))
    assert one_run[-1] > one_run[0]
    if delta > 0:
        fdp = [audit.fdp_epsilon_lower_bound(200, v, M, delta) for v in range(100, 201, 10)]
        assert all(a <= b for a, b in zip(fdp, fdp[1:], strict=False))
        assert fdp[-1] > fdp[0]


def test_monotone_in_confidence():
    confidences = (0.5, 0.8, 0.9, 0.95, 0.99, 0.999)
    one_run = [audit.one_run_epsilon_lower_bound(300, 280, M, DELTA, c) for c in confidences]
    fdp = [audit.fdp_epsilon_lower_bound(300, 280, M, DELTA, c) for c in confidences]
    assert all(a >= b for a, b in zip(one_run, one_run[1:], strict=False))
    assert all(a >= b for a, b in zip(fdp, fdp[1:], strict=False))
    assert one_run[0] > one_run[-1] and fdp[0] > fdp[-1]


def test_p_value_is_monotone_in_epsilon_even_with_large_delta():
    # 2 m delta = 20 > 1: the paper's bound is not monotone in eps there; the p-value used is.
    p_values = [audit.one_run_p_value(100, 90, M, eps, 1e-2) for eps in np.linspace(0, 6, 61)]
    assert all(a <= b for a, b in zip(p_values, p_values[1:], strict=False))


# -------------------------------------------------------------------------------------------- (c) validity


def test_one_run_bound_is_valid_on_randomized_response():
    # Randomized response is exactly eps-DP (delta = 0) and the correct-guess count is exactly Binomial(r, q):
    # the sharpest case of Steinke et al.'s bound. Rejection rate of the true eps must be <= 5% (+ binomial slack).
    eps_true, r, seeds = 1.0, 200, 2000
    rng = np.random.default_rng(0)
    flip = 1.0 / (1.0 + math.exp(eps_true))
    rejections = 0
    for _ in range(seeds):
        included = rng.integers(0, 2, M)
        scores = np.where(rng.random(M) < flip, 1 - included, included).astype(float)
        labels_by_score = _labels_by_score(scores[included == 1], scores[included == 0], rng)
        correct = audit._count_correct(labels_by_score, r, two_sided=True)
        rejections += audit.one_run_p_value(r, correct, M, eps_true) <= 0.05
    rate = rejections / seeds
    assert rate <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / seeds)
    assert rate > 0.01  # and the test has teeth: the bound is tight for randomized response


@pytest.mark.parametrize(
    "mu_true, r, alpha, min_fdp_rate",
    [(1.0, 200, 0.05, 0.0), (2.0, 200, 0.05, 0.0), (0.5, 100, 0.5, 0.1), (2.0, 300, 0.5, 0.03)],
)
def test_both_bounds_are_valid_on_the_gaussian_mechanism(mu_true, r, alpha, min_fdp_rate):
    # Scores N(mu, 1) if included, N(0, 1) if not: exactly mu-GDP per canary, hence (eps(mu, delta), delta)-DP.
    # At confidence 0.95 neither bound comes near the truth with m = 1000 (0 rejections in 200 runs); at
    # confidence 0.5 the f-DP bound rejects the truth in 10-20% of the runs, below the allowed 50%: the check has
    # teeth there.
    seeds = 200
    eps_true = audit.gdp_epsilon(mu_true, DELTA)
    rng = np.random.default_rng(1)
    one_run_rejections = fdp_rejections = 0
    for seed in range(seeds):
        in_scores, out_scores = _gaussian_scores(mu_true, M, rng)
        correct = audit._count_correct(_labels_by_score(in_scores, out_scores, rng), r, two_sided=True)
        one_run_rejections += audit.one_run_p_value(r, correct, M, eps_true, DELTA) <= alpha
        fdp_rejections += audit._fdp_rejects(mu_true, r, correct, M, alpha)
        if seed < 5:  # the predicate and the bound agree: bound > truth exactly when the truth is rejected
            assert (audit.fdp_mu_lower_bound(r, correct, M, 1 - alpha) > mu_true) == audit._fdp_rejects(
                mu_true, r, correct, M, alpha
            )
    slack = 3 * math.sqrt(alpha * (1 - alpha) / seeds)
    assert one_run_rejections / seeds <= alpha + slack
    assert min_fdp_rate <= fdp_rejections / seeds <= alpha + slack


def test_audit_from_scores_is_valid_with_the_grid():
    # The Bonferroni-split grid search on the same scores: the bound exceeds the truth in at most ~5% of the runs.
    mu_true, seeds = 1.0, 60
    eps_true = audit.gdp_epsilon(mu_true, DELTA)
    rng = np.random.default_rng(2)
    exceed_fdp = exceed_one_run = 0
    for seed in range(seeds):
        result = audit.audit_from_scores(*_gaussian_scores(mu_true, M, rng), delta=DELTA, seed=seed)
        exceed_fdp += result.epsilon_fdp > eps_true
        exceed_one_run += result.epsilon_one_run > eps_true
    assert exceed_fdp <= 0.05 * seeds + 3 * math.sqrt(0.05 * 0.95 * seeds)
    assert exceed_one_run <= 0.05 * seeds + 3 * math.sqrt(0.05 * 0.95 * seeds)


# -------------------------------------------------------------------------------------------- (d) the scale


def test_issue_scale_ideal_gaussian_scores():
    # mu = 1.7 (about (8.2, 1e-5)-GDP), 1000 canaries. Literature: about 5.1 (f-DP) and 3.0 (Steinke
    # et al.) at the best number of guesses. Oracle best r over a fine grid (no correction), median of 5 seeds:
    # measured about 4.8-5.4 and 3.0-3.3; with the honest 9-point Bonferroni grid about 3.6-4.2 and 2.5-2.8.
    mu, seeds = 1.7, 5
    oracle_one_run, oracle_fdp, honest_one_run, honest_fdp = [], [], [], []
    for seed in range(seeds):
        rng = np.random.default_rng(seed)
        in_scores, out_scores = _gaussian_scores(mu, M, rng)
        labels_by_score = _labels_by_score(in_scores, out_scores, rng)
        counts = [(r, audit._count_correct(labels_by_score, r, True)) for r in range(20, 601, 20)]
        oracle_one_run.append(max(audit.one_run_epsilon_lower_bound(r, v, M, DELTA) for r, v in counts))
        oracle_fdp.append(max(audit.fdp_epsilon_lower_bound(r, v, M, DELTA) for r, v in counts))
        result = audit.audit_from_scores(in_scores, out_scores, delta=DELTA, seed=seed)
        honest_one_run.append(result.epsilon_one_run)
        honest_fdp.append(result.epsilon_fdp)
    assert 2.5 < np.median(oracle_one_run) < 3.6
    assert 4.3 < np.median(oracle_fdp) < 5.8
    assert 2.0 < np.median(honest_one_run) <= np.median(oracle_one_run)
    assert 3.0 < np.median(honest_fdp) <= np.median(oracle_fdp)
    assert max(oracle_fdp) < audit.gdp_epsilon(mu, DELTA)


# ------------------------------------------------------------------------------------------- audit_from_scores


def test_audit_from_scores_result_fields():
    rng = np.random.default_rng(3)
    in_scores, out_scores = _gaussian_scores(3.0, 400, rng)
    result = audit.audit_from_scores(in_scores, out_scores, delta=DELTA, confidence=0.9, num_guesses=100)
    assert result.num_canaries == 400 and result.num_guesses == 100 and result.num_guesses_grid == (100,)
    assert result.confidence == 0.9 and result.delta == DELTA
    assert result.epsilon_one_run == audit.one_run_epsilon_lower_bound(100, result.num_correct, 400, DELTA, 0.9)
    assert result.epsilon_fdp == pytest.approx(audit.fdp_epsilon_lower_bound(100, result.num_correct, 400, DELTA, 0.9))
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.num_guesses = 3
    grid = audit.audit_from_scores(in_scores, out_scores, delta=DELTA, num_guesses=[50, 100, 200])
    assert grid.num_guesses_grid == (50, 100, 200) and grid.num_guesses in (50, 100, 200)
    at_zero_delta = audit.audit_from_scores(in_scores, out_scores, delta=0.0, num_guesses=100)
    assert at_zero_delta.epsilon_fdp == math.inf and at_zero_delta.epsilon_one_run > 0


def test_ties_leak_nothing_about_the_labels():
    # All scores equal: whatever the order of the arrays, the guesses are coin flips.
    result = audit.audit_from_scores(np.zeros(500), np.ones(500) * 0.0, delta=DELTA, num_guesses=1000)
    assert result.epsilon_one_run == 0.0 and result.epsilon_fdp == 0.0
    correct = [
        audit.audit_from_scores(np.zeros(500), np.zeros(500), delta=DELTA, num_guesses=100, seed=s).num_correct
        for s in range(20)
    ]
    assert 35 < np.mean(correct) < 65


def test_one_sided_guesses_only_guess_in():
    in_scores, out_scores = np.arange(10.0, 20.0), np.arange(10.0)
    two = audit.audit_from_scores(in_scores, out_scores, delta=DELTA, num_guesses=10)
    one = audit.audit_from_scores(in_scores, out_scores, delta=DELTA, num_guesses=10, two_sided=False)
    assert two.num_correct == one.num_correct == 10


# ------------------------------------------------------------------------------------------------ (e) checks


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"confidence": 1.0}, r"`confidence` must be in \(0, 1\)"),
        ({"confidence": 0.0}, r"`confidence` must be in \(0, 1\)"),
        ({"delta": 1.0}, r"`delta` must be in \[0, 1\)"),
        ({"delta": -1e-9}, r"`delta` must be in \[0, 1\)"),
        ({"num_correct": 11}, r"`num_correct` must be an integer in \[0, 10\]"),
        ({"num_correct": -1}, r"`num_correct` must be an integer in \[0, 10\]"),
        ({"num_guesses": 101}, r"`num_guesses` must be an integer in \[0, 100\]"),
        ({"num_canaries": 0}, r"`num_canaries` must be an integer >= 1"),
        ({"num_guesses": 2.5}, r"`num_guesses` must be an integer"),
    ],
)
def test_one_run_bad_input(kwargs, match):
    arguments = {"num_guesses": 10, "num_correct": 5, "num_canaries": 100, "delta": 0.0, "confidence": 0.95}
    arguments.update(kwargs)
    with pytest.raises(ValueError, match=match):
        audit.one_run_epsilon_lower_bound(**arguments)


def test_fdp_bad_input():
    with pytest.raises(ValueError, match=r"`delta` must be in \(0, 1\)"):
        audit.fdp_epsilon_lower_bound(10, 5, 100, delta=0.0)
    with pytest.raises(ValueError, match=r"`confidence` must be in \(0, 1\)"):
        audit.fdp_mu_lower_bound(10, 5, 100, confidence=1.5)
    with pytest.raises(ValueError, match=r"`num_correct` must be an integer in \[0, 10\]"):
        audit.fdp_mu_lower_bound(10, 11, 100)
    with pytest.raises(ValueError, match=r"`mu` must be a finite number >= 0"):
        audit.gdp_epsilon(-1.0, 1e-5)
    for epsilon in (-0.5, float("nan")):
        with pytest.raises(ValueError, match=r"`epsilon` must be >= 0"):
            audit.one_run_p_value(10, 5, 100, epsilon)


@pytest.mark.parametrize(
    "in_scores, out_scores, kwargs, match",
    [
        ([1.0, np.nan], [0.0], {}, "in_scores must be a 1-D array of finite scores"),
        ([1.0], [[0.0]], {}, "out_scores must be a 1-D array of finite scores"),
        ([1.0], [np.inf], {}, "out_scores must be a 1-D array of finite scores"),
        ([], [], {}, "at least one canary"),
        ([1.0], [0.0], {"num_guesses": 3}, r"`num_guesses` must be an integer in \[1, 2\]"),
        ([1.0], [0.0], {"num_guesses": 0}, r"`num_guesses` must be an integer in \[1, 2\]"),
        ([1.0], [0.0], {"num_guesses": []}, "non-empty sequence"),
        ([1.0], [0.0], {"confidence": 1.0}, r"`confidence` must be in \(0, 1\)"),
        ([1.0], [0.0], {"delta": 1.0}, r"`delta` must be in \[0, 1\)"),
    ],
)
def test_audit_from_scores_bad_input(in_scores, out_scores, kwargs, match):
    kwargs = {"delta": DELTA, **kwargs}
    with pytest.raises(ValueError, match=match):
        audit.audit_from_scores(in_scores, out_scores, **kwargs)


@pytest.mark.parametrize("num_guesses", [50, 150, 400])
def test_bounds_equal_jax_privacys_on_the_same_scores_where_it_is_installed(num_guesses):
    jax_privacy_auditing = pytest.importorskip("jax_privacy.auditing")  # not a dependency: skipped without it
    rng = np.random.default_rng(0)
    member = rng.random(1000) < 0.5
    scores = rng.normal(size=1000) + 1.7 * member
    ranked = np.sort(scores)[::-1]
    threshold = jax_privacy_auditing.Explicit((ranked[num_guesses - 1] + ranked[num_guesses]) / 2)
    auditor = jax_privacy_auditing.CanaryScoreAuditor(scores[member], scores[~member])
    ours = audit.audit_from_scores(
        scores[member], scores[~member], delta=1e-5, confidence=0.95, num_guesses=num_guesses, two_sided=False
    )
    assert ours.epsilon_one_run == pytest.approx(
        auditor.epsilon_one_run(0.05, 1e-5, threshold_strategy=threshold), rel=1e-5
    )
    assert ours.epsilon_fdp == pytest.approx(
        auditor.epsilon_one_run_fdp(0.05, 1e-5, threshold_strategy=threshold), rel=1e-5
    )
