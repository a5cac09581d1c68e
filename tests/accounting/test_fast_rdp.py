"""Tests for keras_dyndp.accounting.fast_rdp: equality with dp_accounting's RdpAccountant, step by step."""

import math

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant

from keras_dyndp.accounting import fast_rdp

MNIST_P = 250 / 60000


def _reference_epsilon(sampling_probability, noise_multipliers, delta, orders=None):
    accountant = rdp_privacy_accountant.RdpAccountant(orders)
    for noise_multiplier in noise_multipliers:
        accountant.compose(
            dp_event.PoissonSampledDpEvent(sampling_probability, dp_event.GaussianDpEvent(noise_multiplier)))
    return accountant.get_epsilon(delta)


@pytest.mark.parametrize("sampling_probability", [1e-3, 0.02, 0.2])
def test_per_step_rdp_matches_dp_accounting(sampling_probability):
    noise_multipliers = np.array([0.45, 0.9, 2.5, 30.0])
    orders = np.array(fast_rdp.DEFAULT_RDP_ORDERS)
    expected = np.array([
        rdp_privacy_accountant._compute_rdp_poisson_subsampled_gaussian(sampling_probability, z, orders)
        for z in noise_multipliers])
    actual = fast_rdp.poisson_subsampled_gaussian_rdp(sampling_probability, noise_multipliers)
    assert actual.shape == (noise_multipliers.size, orders.size)
    # Values of order 1e-12 are rounding noise in both implementations, hence the absolute tolerance.
    np.testing.assert_allclose(actual, expected, rtol=1e-9, atol=1e-12)


def test_heterogeneous_schedule_matches_accountant_one_by_one():
    noise_multipliers = np.linspace(1.2, 0.6, 20)  # All distinct, as in a dynamic schedule.
    expected = _reference_epsilon(MNIST_P, noise_multipliers, 1e-5)
    assert fast_rdp.rdp_epsilon(MNIST_P, noise_multipliers, 1e-5) == pytest.approx(expected, rel=1e-6)


def test_repeated_noise_multipliers_are_grouped_exactly():
    noise_multipliers = np.repeat([1.5, 0.8, 1.1], [300, 50, 7])
    accountant = rdp_privacy_accountant.RdpAccountant()
    for z, count in [(1.5, 300), (0.8, 50), (1.1, 7)]:
        accountant.compose(dp_event.PoissonSampledDpEvent(0.01, dp_event.GaussianDpEvent(z)), count)
    shuffled = np.random.default_rng(0).permutation(noise_multipliers)
    assert fast_rdp.rdp_epsilon(0.01, shuffled, 1e-6) == pytest.approx(accountant.get_epsilon(1e-6), rel=1e-6)


def test_custom_orders():
    orders = [1.5, 2.25, 3, 8, 32.5, 64]
    noise_multipliers = [0.7, 1.3, 1.3, 2.0]
    expected = _reference_epsilon(0.05, noise_multipliers, 1e-5, orders)
    assert fast_rdp.rdp_epsilon(0.05, noise_multipliers, 1e-5, orders) == pytest.approx(expected, rel=1e-6)


def test_epsilons_at_steps_are_prefix_epsilons():
    noise_multipliers = np.linspace(2.0, 0.8, 60)
    steps = [0, 1, 17, 59, 60]
    epsilons = fast_rdp.rdp_epsilons_at(0.02, noise_multipliers, 1e-5, steps)
    assert epsilons.shape == (len(steps),)
    assert epsilons[0] == 0
    for step, epsilon in zip(steps[1:], epsilons[1:]):
        assert epsilon == pytest.approx(fast_rdp.rdp_epsilon(0.02, noise_multipliers[:step], 1e-5), rel=1e-10)
    assert np.all(np.diff(epsilons) > 0)
    assert epsilons[2] == pytest.approx(_reference_epsilon(0.02, noise_multipliers[:17], 1e-5), rel=1e-6)


def test_special_cases_match_accountant():
    # q = 1: un-sampled Gaussian.
    expected = rdp_privacy_accountant.RdpAccountant().compose(dp_event.GaussianDpEvent(3.0), 2).get_epsilon(1e-5)
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
