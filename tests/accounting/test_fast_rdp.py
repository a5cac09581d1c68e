"""Tests for keras_dyndp.accounting.fast_rdp: the RDP it states, against numerical integration and against the
installed dp_accounting's public RdpAccountant (equal on 0.5 and later, never below it on 0.4.3)."""

import importlib.metadata
import math

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting import rdp
from dp_accounting.rdp import rdp_privacy_accountant
from scipy import integrate
from scipy import stats

from keras_dyndp.accounting import fast_rdp

MNIST_P = 250 / 60000
# dp_accounting 0.5 changed its fractional-order series to the one fast_rdp implements; 0.4.3 is below it.
INSTALLED_DP_ACCOUNTING_MATCHES = tuple(
    int(part) for part in importlib.metadata.version("dp-accounting").split(".")[:2]
) >= (0, 5)


def _sampled_gaussian(sampling_probability, noise_multiplier):
    return dp_event.PoissonSampledDpEvent(sampling_probability, dp_event.GaussianDpEvent(noise_multiplier))


def _reference_epsilon(sampling_probability, noise_multipliers, delta, orders=None):
    """The installed dp_accounting's RdpAccountant composing the steps one by one."""
    accountant = rdp.RdpAccountant(orders)
    for noise_multiplier in noise_multipliers:
        accountant.compose(_sampled_gaussian(sampling_probability, noise_multiplier))
    return accountant.get_epsilon(delta)


def _assert_matches_installed(actual, reference):
    """Equal to dp_accounting >= 0.5; at least 0.4.3's value (equal up to rounding where its best order is integer)."""
    if INSTALLED_DP_ACCOUNTING_MATCHES:
        assert actual == pytest.approx(reference, rel=1e-6)
    else:
        assert actual >= reference * (1 - 1e-9)


def _integrated_rdp(q, z, alpha):
    """D_alpha((1 - q) N(0, z^2) + q N(1, z^2) || N(0, z^2)) by quadrature, independent of any series.

    A_alpha - 1 = E_{x ~ N(0, z^2)}[(1 - q + q exp((2 x - 1) / (2 z^2)))^alpha - 1], integrated in that form so
    that a small divergence keeps its relative precision; the integrand's mass lies within [-12 z, alpha + 12 z].
    """

    def integrand(x):
        log_power = alpha * np.logaddexp(math.log1p(-q), math.log(q) + (2 * x - 1) / (2 * z**2))
        if log_power < 0.5:
            return stats.norm.pdf(x, scale=z) * math.expm1(log_power)
        return math.exp(stats.norm.logpdf(x, scale=z) + log_power) - stats.norm.pdf(x, scale=z)

    a_minus_one, _ = integrate.quad(
        integrand, -12 * z, alpha + 12 * z, points=[0.0, 0.5, alpha], epsabs=0, epsrel=1e-13, limit=500
    )
    return math.log1p(a_minus_one) / (alpha - 1)


def test_default_orders_are_dp_accountings():
    np.testing.assert_array_equal(fast_rdp.DEFAULT_RDP_ORDERS, rdp_privacy_accountant.DEFAULT_RDP_ORDERS)


@pytest.mark.filterwarnings("ignore::scipy.integrate.IntegrationWarning")
@pytest.mark.parametrize("sampling_probability", [1e-3, 0.02, 0.2])
@pytest.mark.parametrize("noise_multiplier", [0.8, 2.5, 10.0])
def test_per_step_rdp_against_the_renyi_divergence(sampling_probability, noise_multiplier):
    integer_orders, fractional_orders = [2, 3, 8, 20], [1.5, 2.5, 4.5]
    actual = fast_rdp.poisson_subsampled_gaussian_rdp(
        sampling_probability, [noise_multiplier], integer_orders + fractional_orders
    )[0]
    expected = np.array(
        [_integrated_rdp(sampling_probability, noise_multiplier, alpha) for alpha in integer_orders + fractional_orders]
    )
    # Integer orders: the exact divergence. Fractional orders: an upper bound (the series of absolute values), or
    # inf where that series does not stop within 1000 terms.
    np.testing.assert_allclose(actual[:4], expected[:4], rtol=1e-7)
    assert np.all(actual[4:] >= expected[4:] * (1 - 1e-7))


def test_series_that_does_not_stop_drops_its_order():
    # q = 0.05, z = 0.8: at order 1.1 the terms decay polynomially, and 1000 terms do not reach e^-30 of the sum.
    rdp_values = fast_rdp.poisson_subsampled_gaussian_rdp(0.05, [0.8], [1.1, 2.5, 3])[0]
    assert rdp_values[0] == math.inf and np.all(np.isfinite(rdp_values[1:]))
    assert math.isfinite(fast_rdp.rdp_epsilon(0.05, [0.8], 1e-5, [1.1, 2.5, 3]))


@pytest.mark.parametrize(
    "sampling_probability, noise_multipliers",
    [
        (MNIST_P, np.linspace(1.2, 0.6, 20)),  # All distinct, as in a dynamic schedule.
        (0.05, np.linspace(0.6, 0.5, 10)),  # Large epsilon: the best order is small and fractional.
        (0.01, np.linspace(3.0, 5.0, 10)),
    ],
)
def test_heterogeneous_schedule_matches_installed_accountant(sampling_probability, noise_multipliers):
    actual = fast_rdp.rdp_epsilon(sampling_probability, noise_multipliers, 1e-5)
    _assert_matches_installed(actual, _reference_epsilon(sampling_probability, noise_multipliers, 1e-5))


def test_repeated_noise_multipliers_are_grouped_exactly():
    noise_multipliers = np.repeat([1.5, 0.8, 1.1], [300, 50, 7])
    accountant = rdp.RdpAccountant()
    for z, count in [(1.5, 300), (0.8, 50), (1.1, 7)]:
        accountant.compose(_sampled_gaussian(0.01, z), count)
    shuffled = np.random.default_rng(0).permutation(noise_multipliers)
    _assert_matches_installed(fast_rdp.rdp_epsilon(0.01, shuffled, 1e-6), accountant.get_epsilon(1e-6))


def test_custom_orders():
    orders = [1.5, 2.25, 3, 8, 32.5, 64]
    noise_multipliers = [0.7, 1.3, 1.3, 2.0]
    expected = _reference_epsilon(0.05, noise_multipliers, 1e-5, orders)
    _assert_matches_installed(fast_rdp.rdp_epsilon(0.05, noise_multipliers, 1e-5, orders), expected)


def test_epsilons_at_steps_are_prefix_epsilons():
    noise_multipliers = np.linspace(2.0, 0.8, 60)
    steps = [0, 1, 17, 59, 60]
    epsilons = fast_rdp.rdp_epsilons_at(0.02, noise_multipliers, 1e-5, steps)
    assert epsilons.shape == (len(steps),)
    assert epsilons[0] == 0
    for step, epsilon in zip(steps[1:], epsilons[1:]):
        assert epsilon == pytest.approx(fast_rdp.rdp_epsilon(0.02, noise_multipliers[:step], 1e-5), rel=1e-10)
    assert np.all(np.diff(epsilons) > 0)
    _assert_matches_installed(epsilons[2], _reference_epsilon(0.02, noise_multipliers[:17], 1e-5))


def test_special_cases_match_accountant():
    # q = 1: un-sampled Gaussian.
    expected = rdp.RdpAccountant().compose(dp_event.GaussianDpEvent(3.0), 2).get_epsilon(1e-5)
    assert fast_rdp.rdp_epsilon(1.0, [3.0, 3.0], 1e-5) == pytest.approx(expected, rel=1e-12)
    # q = 0 and infinite noise cost nothing; zero noise costs everything.
    assert fast_rdp.rdp_epsilon(0.0, [1.0, 0.5], 1e-5) == 0
    assert fast_rdp.rdp_epsilon(0.1, [math.inf], 1e-5) == 0
    assert fast_rdp.rdp_epsilon(0.1, [1.0, 0.0], 1e-5) == math.inf
    assert fast_rdp.rdp_epsilon(0.1, [], 1e-5) == 0
    assert fast_rdp.rdp_epsilon(0.1, [1.0], 0.0) == math.inf


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: fast_rdp.rdp_epsilon(-0.1, [1.0], 1e-5), "`sampling_probability`"),
        (lambda: fast_rdp.rdp_epsilon(1.1, [1.0], 1e-5), "`sampling_probability`"),
        (lambda: fast_rdp.rdp_epsilon(0.1, [1.0, -1.0], 1e-5), "`noise_multipliers`"),
        (lambda: fast_rdp.rdp_epsilon(0.1, [math.nan], 1e-5), "`noise_multipliers`"),
        (lambda: fast_rdp.rdp_epsilon(0.1, [[1.0]], 1e-5), "`noise_multipliers`"),
        (lambda: fast_rdp.rdp_epsilon(0.1, [1.0], 1.5), "`delta`"),
        (lambda: fast_rdp.rdp_epsilon(0.1, [1.0], 1e-5, orders=[1.0, 2.0]), "`orders`"),
        (lambda: fast_rdp.rdp_epsilon(0.1, [1.0], 1e-5, orders=[]), "`orders`"),
        (lambda: fast_rdp.rdp_epsilons_at(0.1, [1.0], 1e-5, [2]), "`steps`"),
        (lambda: fast_rdp.rdp_epsilons_at(0.1, [1.0], 1e-5, [-1]), "`steps`"),
        (lambda: fast_rdp.rdp_epsilons_at(0.1, [1.0], 1e-5, [0.5]), "`steps`"),
    ],
)
def test_invalid_arguments_raise(call, match):
    with pytest.raises(ValueError, match=match):
        call()
