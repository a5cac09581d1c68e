"""Tests for keras_dyndp.accounting.gdp: duality, its inverses and the extended CLT."""

import math

import numpy as np
import pytest
from scipy import stats

from keras_dyndp.accounting import gdp

MNIST_P = 250 / 60000
MNIST_STEPS = 4800


def test_worked_numbers_from_design():
    mu_tot = gdp.mu_from_epsilon(1.2, 1e-5)
    assert mu_tot == pytest.approx(0.3163786, abs=1e-7)
    noise_multiplier = 1 / math.sqrt(math.log1p((mu_tot / MNIST_P) ** 2 / MNIST_STEPS))
    assert noise_multiplier == pytest.approx(1.1258165, abs=1e-7)
    mus = np.full(MNIST_STEPS, 1 / noise_multiplier)
    assert gdp.clt_mu(MNIST_P, mus) == pytest.approx(mu_tot, rel=1e-12)


def test_delta_matches_direct_formula():
    for epsilon, mu in [(0.5, 0.3), (1.0, 1.0), (3.0, 2.5), (0.0, 0.7)]:
        direct = stats.norm.cdf(-epsilon / mu + mu / 2) - math.exp(epsilon) * stats.norm.cdf(-epsilon / mu - mu / 2)
        assert gdp.delta_from_mu(epsilon, mu) == pytest.approx(direct, rel=1e-10)


def test_delta_at_zero_epsilon_and_infinite_mu():
    assert gdp.delta_from_mu(0.0, 1.0) == pytest.approx(2 * stats.norm.cdf(0.5) - 1, rel=1e-12)
    assert gdp.delta_from_mu(3.0, math.inf) == 1.0


@pytest.mark.parametrize("epsilon", [0.01, 0.1, 1.0, 8.0, 50.0])
@pytest.mark.parametrize("delta", [1e-12, 1e-8, 1e-5, 0.1])
def test_round_trip_over_robust_box(epsilon, delta):
    mu = gdp.mu_from_epsilon(epsilon, delta)
    assert mu > 0
    assert gdp.delta_from_mu(epsilon, mu) == pytest.approx(delta, rel=1e-9)
    assert gdp.epsilon_from_mu(mu, delta) == pytest.approx(epsilon, rel=1e-9)


@pytest.mark.parametrize("epsilon", [1e-4, 200.0, 1e4])
def test_inversion_outside_box_has_no_fixed_bracket(epsilon):
    mu = gdp.mu_from_epsilon(epsilon, 1e-5)
    assert gdp.epsilon_from_mu(mu, 1e-5) == pytest.approx(epsilon, rel=1e-8)


def test_monotonicity():
    mus = [gdp.mu_from_epsilon(epsilon, 1e-5) for epsilon in (0.1, 0.5, 1.0, 2.0, 10.0)]
    assert np.all(np.diff(mus) > 0)
    epsilons = [gdp.epsilon_from_mu(0.5, delta) for delta in (1e-10, 1e-6, 1e-3)]
    assert np.all(np.diff(epsilons) < 0)


def test_epsilon_zero_when_delta_is_already_met():
    assert gdp.epsilon_from_mu(1e-6, 1e-3) == 0.0


def test_epsilon_infinite_for_infinite_mu():
    assert gdp.epsilon_from_mu(math.inf, 1e-5) == math.inf


def test_clt_mu_heterogeneous_formula():
    mus = np.linspace(0.5, 2.0, 37)
    expected = 0.01 * math.sqrt(sum(math.exp(m * m) - 1 for m in mus))
    assert gdp.clt_mu(0.01, mus) == pytest.approx(expected, rel=1e-12)
    assert gdp.clt_mu(0.01, []) == 0.0
    assert gdp.clt_mu(0.01, [0.0, 0.0]) == 0.0
    assert gdp.clt_mu(0.01, [1.0, 40.0]) == math.inf


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: gdp.mu_from_epsilon(0.0, 1e-5), "`epsilon`"),
        (lambda: gdp.mu_from_epsilon(-1.0, 1e-5), "`epsilon`"),
        (lambda: gdp.mu_from_epsilon(math.inf, 1e-5), "`epsilon`"),
        (lambda: gdp.mu_from_epsilon(1.0, 0.0), "`delta`"),
        (lambda: gdp.mu_from_epsilon(1.0, 1.0), "`delta`"),
        (lambda: gdp.epsilon_from_mu(0.0, 1e-5), "`mu`"),
        (lambda: gdp.epsilon_from_mu(-0.5, 1e-5), "`mu`"),
        (lambda: gdp.epsilon_from_mu(math.nan, 1e-5), "`mu`"),
        (lambda: gdp.epsilon_from_mu(1.0, 1.5), "`delta`"),
        (lambda: gdp.delta_from_mu(-1.0, 1.0), "`epsilon`"),
        (lambda: gdp.delta_from_mu(1.0, 0.0), "`mu`"),
        (lambda: gdp.clt_mu(0.0, [1.0]), "`sampling_probability`"),
        (lambda: gdp.clt_mu(1.5, [1.0]), "`sampling_probability`"),
        (lambda: gdp.clt_mu(0.5, [1.0, -1.0]), "`mus`"),
        (lambda: gdp.clt_mu(0.5, [math.nan]), "`mus`"),
    ],
)
def test_invalid_arguments_raise(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_gdp_clt_epsilons_at_is_clt_mu_of_each_prefix():
    mus = np.array([0.5, 0.8, 1.1, 0.0, 1.3])
    steps = [0, 1, 3, 4, 5]
    epsilons = gdp.gdp_clt_epsilons_at(0.05, mus, 1e-5, steps)
    assert epsilons[0] == 0.0
    for k, epsilon in zip(steps[1:], epsilons[1:]):
        assert epsilon == pytest.approx(gdp.epsilon_from_mu(gdp.clt_mu(0.05, mus[:k]), 1e-5), rel=1e-12)
    assert epsilons[2] == epsilons[3]  # A step with mu = 0 (infinite noise) costs nothing.


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: gdp.gdp_clt_epsilons_at(0.0, [1.0], 1e-5, [1]), r"`sampling_probability` must be in \(0, 1\]"),
        (lambda: gdp.gdp_clt_epsilons_at(0.1, [-1.0], 1e-5, [1]), "`mus`"),
        (lambda: gdp.gdp_clt_epsilons_at(0.1, [1.0], 1.0, [1]), r"`delta` must be in \(0, 1\)"),
    ],
)
def test_gdp_clt_epsilons_at_checks_arguments(call, match):
    with pytest.raises(ValueError, match=match):
        call()
