"""Tests for keras_dyndp.accounting.fast_pld: its own PLD construction against dp_accounting's public API, and the
direction (an upper bound) and size of grouping against dp_accounting's PLDAccountant."""

import math

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.pld import privacy_loss_distribution

from keras_dyndp.accounting import fast_pld

DELTA = 1e-5


@pytest.mark.parametrize(
    "noise_multiplier, sampling_probability, num_times",
    [(1.1258, 250 / 60000, 300), (0.7, 0.02, 7), (2.0, 1.0, 3), (40.0, 0.004, 1), (0.3, 0.5, 2)],
)
def test_subsampled_gaussian_pld_matches_dp_accounting(noise_multiplier, sampling_probability, num_times):
    expected = privacy_loss_distribution.from_gaussian_mechanism(
        noise_multiplier, sampling_prob=sampling_probability, value_discretization_interval=1e-3
    )
    if num_times > 1:
        expected = expected.self_compose(num_times)
    actual = fast_pld.subsampled_gaussian_pld(noise_multiplier, sampling_probability, 1e-3, num_times)
    for delta in (1e-3, DELTA):
        assert actual.get_epsilon_for_delta(delta) == pytest.approx(expected.get_epsilon_for_delta(delta), rel=1e-9)
    # Connect-the-dots divides delta differences by e^interval - 1 ~ 1e-3, so float rounding of the deltas
    # (computed with different but equivalent CDF calls) shows up as ~1e-13 absolute in the PMF.
    for epsilon in (0.0, 0.5, 2.0):
        assert actual.get_delta_for_epsilon(epsilon) == pytest.approx(
            expected.get_delta_for_epsilon(epsilon), rel=1e-9, abs=1e-12
        )


def _accountant_epsilons(p, multipliers, steps):
    """dp_accounting's PLDAccountant (same grid) composing the steps one by one, in order (no grouping): its
    epsilon after each of `steps` (increasing) steps."""
    accountant = pld_privacy_accountant.PLDAccountant(
        value_discretization_interval=fast_pld.DEFAULT_VALUE_DISCRETIZATION_INTERVAL
    )
    epsilons = []
    for step, value in enumerate(multipliers, start=1):
        accountant.compose(dp_event.PoissonSampledDpEvent(p, dp_event.GaussianDpEvent(float(value))))
        if step in steps:
            epsilons.append(accountant.get_epsilon(DELTA))
    return epsilons


@pytest.mark.parametrize(
    "p, multipliers",
    [
        (0.02, np.linspace(1.1, 0.8, 30)),  # Decreasing noise.
        (0.05, np.linspace(0.8, 1.6, 20)),  # Increasing noise.
        (0.01, np.random.default_rng(1).uniform(0.6, 2.0, 25)),
    ],
)
def test_grouped_is_upper_bound_of_dp_accounting_within_two_percent(p, multipliers):
    (exact,) = _accountant_epsilons(p, multipliers, [multipliers.size])
    # Ungrouped (every step its own group), the same construction gives the accountant's epsilon.
    assert fast_pld.pld_epsilon(p, multipliers, DELTA, tolerance=0.0) == pytest.approx(exact, rel=1e-6)
    grouped = fast_pld.pld_epsilon(p, multipliers, DELTA)
    assert exact <= grouped <= 1.02 * exact
    # Coarser grouping is looser, but still an upper bound.
    assert (
        exact
        < fast_pld.pld_epsilon(p, multipliers, DELTA, max_groups=5)
        < fast_pld.pld_epsilon(p, multipliers, DELTA, max_groups=2)
    )


def test_grouping_rounds_down_and_respects_limits():
    rng = np.random.default_rng(0)
    multipliers = rng.uniform(0.6, 3.0, size=500)
    values, counts = fast_pld.group_noise_multipliers(multipliers, max_groups=12)
    assert counts.sum() == 500 and values.size <= 12 and np.all(np.diff(values) > 0)
    # Step i of the sorted array belongs to the group starting at or before it: its value is never above the step's.
    owner = np.repeat(values, counts)
    assert np.all(owner <= np.sort(multipliers))


def test_equal_multipliers_are_grouped_exactly():
    multipliers = np.repeat([1.3, 0.9, 1.1], [100, 50, 25])
    values, counts = fast_pld.group_noise_multipliers(multipliers, tolerance=0.0)
    np.testing.assert_array_equal(values, [0.9, 1.1, 1.3])
    np.testing.assert_array_equal(counts, [50, 25, 100])


def test_constant_schedule_matches_self_composition():
    p = 250 / 60000
    expected = fast_pld.subsampled_gaussian_pld(1.1258165, p, num_times=4800).get_epsilon_for_delta(DELTA)
    assert fast_pld.pld_epsilon(p, np.full(4800, 1.1258165), DELTA) == pytest.approx(expected, rel=1e-12)


def test_epsilons_at_are_cumulative_upper_bounds():
    p, multipliers = 0.02, np.linspace(1.2, 0.7, 20)
    epsilons = fast_pld.pld_epsilons_at(p, multipliers, DELTA, [0, 10, 15, 20, 20])
    assert epsilons[0] == 0.0 and np.all(np.diff(epsilons) >= 0) and epsilons[-1] == epsilons[-2]
    for exact, epsilon in zip(_accountant_epsilons(p, multipliers, [10, 20]), epsilons[[1, 3]]):
        assert exact <= epsilon <= 1.02 * exact


def test_special_noise_multipliers():
    assert fast_pld.pld_epsilon(0.01, [1.0, 0.0, 1.0], DELTA) == math.inf
    assert fast_pld.pld_epsilon(0.0, [1.0, 0.0], DELTA) == 0.0
    with_inf = fast_pld.pld_epsilon(0.01, [1.0, math.inf, 1.0], DELTA)
    assert with_inf == pytest.approx(fast_pld.pld_epsilon(0.01, [1.0, 1.0], DELTA), rel=1e-12)
    np.testing.assert_array_equal(fast_pld.pld_epsilons_at(0.01, [1.0, 0.0, 1.0], DELTA, [1, 2, 3])[1:], math.inf)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(sampling_probability=1.5), "sampling_probability"),
        (dict(noise_multipliers=[[1.0]]), "noise_multipliers"),
        (dict(noise_multipliers=[1.0, -1.0]), "noise_multipliers"),
        (dict(noise_multipliers=[1.0, math.nan]), "noise_multipliers"),
        (dict(delta=0.0), "delta"),
        (dict(max_groups=0), "max_groups"),
        (dict(value_discretization_interval=0.0), "value_discretization_interval"),
        (dict(tolerance=-0.1), "tolerance"),
    ],
)
def test_bad_arguments(kwargs, match):
    arguments = dict(sampling_probability=0.01, noise_multipliers=[1.0, 2.0], delta=DELTA) | kwargs
    with pytest.raises(ValueError, match=match):
        fast_pld.pld_epsilon(**arguments)


def test_bad_steps():
    with pytest.raises(ValueError, match="steps"):
        fast_pld.pld_epsilons_at(0.01, [1.0, 2.0], DELTA, [2, 1])
    with pytest.raises(ValueError, match="steps"):
        fast_pld.pld_epsilons_at(0.01, [1.0, 2.0], DELTA, [3])
