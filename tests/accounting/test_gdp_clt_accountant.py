"""Tests for GdpCltAccountant: upstream conformance suite, TF-Privacy agreement, heterogeneous and mixed events."""

import importlib.util
import math
import pathlib

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting import privacy_accountant
from dp_accounting import privacy_accountant_test

from keras_dyndp.accounting import gdp
from keras_dyndp.accounting.gdp_clt_accountant import GdpCltAccountant


def _load_tf_privacy_gdp_accountant():
    """Loads TF-Privacy's pure numpy/scipy gdp_accountant.py without importing TensorFlow (saves ~6 s).

    Returns None where tensorflow-privacy is not installed (it supports no TensorFlow after 2.15, so only the
    comparison stack has it).
    """
    package = importlib.util.find_spec("tensorflow_privacy")
    if package is None:
        return None
    package_dir = pathlib.Path(package.submodule_search_locations[0])
    spec = importlib.util.spec_from_file_location(
        "tfp_gdp_accountant", package_dir / "privacy" / "analysis" / "gdp_accountant.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tf_privacy_gdp = _load_tf_privacy_gdp_accountant()


class GdpCltAccountantConformanceTest(privacy_accountant_test.PrivacyAccountantTest):
    """dp_accounting's own PrivacyAccountant conformance suite (unsupported, no events, no-op, non-private)."""

    def _make_test_accountants(self):
        return [GdpCltAccountant()]


def _sampled_gaussian(probability, noise_multiplier):
    return dp_event.PoissonSampledDpEvent(probability, dp_event.GaussianDpEvent(noise_multiplier))


@pytest.mark.skipif(tf_privacy_gdp is None, reason="tensorflow-privacy is not installed (comparison stack only)")
@pytest.mark.parametrize(
    "epochs, noise_multiplier, num_examples, batch_size, delta",
    [
        (20, 1.1258165, 60000, 250, 1e-5),
        (16, 1.1, 60000, 240, 1e-5),
        (4, 0.8, 25000, 500, 4e-6),
        (60, 4.0, 50000, 100, 1e-6),
    ],
)
def test_constant_schedule_matches_tf_privacy(epochs, noise_multiplier, num_examples, batch_size, delta):
    steps = epochs * num_examples // batch_size
    assert steps * batch_size == epochs * num_examples
    accountant = GdpCltAccountant().compose(_sampled_gaussian(batch_size / num_examples, noise_multiplier), steps)
    expected = tf_privacy_gdp.compute_eps_poisson(epochs, noise_multiplier, num_examples, batch_size, delta)
    assert accountant.get_epsilon(delta) == pytest.approx(expected, rel=1e-6)


def test_worked_example_is_epsilon_1_2():
    accountant = GdpCltAccountant().compose(_sampled_gaussian(250 / 60000, 1.1258165), 4800)
    assert accountant.get_epsilon(1e-5) == pytest.approx(1.2, rel=1e-6)
    assert accountant.get_delta(1.2) == pytest.approx(1e-5, rel=1e-5)


def test_heterogeneous_equals_clt_mu_and_orders_agree():
    probability = 0.01
    noise_multipliers = np.linspace(2.0, 0.7, 60)
    expected_mu = gdp.clt_mu(probability, 1 / noise_multipliers)
    events = [_sampled_gaussian(probability, z) for z in noise_multipliers]

    one_by_one = GdpCltAccountant()
    for event in events:
        one_by_one.compose(event)
    composed = GdpCltAccountant().compose(dp_event.ComposedDpEvent(events))
    nested = GdpCltAccountant().compose(
        dp_event.ComposedDpEvent([dp_event.ComposedDpEvent(events[:20]), dp_event.ComposedDpEvent(events[20:])])
    )
    for accountant in (one_by_one, composed, nested):
        assert accountant.mu == pytest.approx(expected_mu, rel=1e-12)
        assert accountant.get_epsilon(1e-5) == pytest.approx(gdp.epsilon_from_mu(expected_mu, 1e-5), rel=1e-12)


def test_self_composed_equals_one_by_one_and_composed():
    event = _sampled_gaussian(0.02, 1.3)
    one_by_one = GdpCltAccountant()
    for _ in range(100):
        one_by_one.compose(event)
    self_composed = GdpCltAccountant().compose(dp_event.SelfComposedDpEvent(event, 100))
    counted = GdpCltAccountant().compose(event, 100)
    composed = GdpCltAccountant().compose(dp_event.ComposedDpEvent([event] * 100))
    nested = GdpCltAccountant().compose(
        dp_event.SelfComposedDpEvent(dp_event.ComposedDpEvent([dp_event.SelfComposedDpEvent(event, 5)] * 4), 5)
    )
    reference = one_by_one.get_epsilon(1e-6)
    for accountant in (self_composed, counted, composed, nested):
        assert accountant.get_epsilon(1e-6) == pytest.approx(reference, rel=1e-12)


def test_mixed_sampling_probabilities_follow_extended_clt():
    accountant = GdpCltAccountant()
    accountant.compose(_sampled_gaussian(0.01, 1.0), 300)
    accountant.compose(_sampled_gaussian(0.05, 2.0), 50)
    expected_mu = math.sqrt(300 * 0.01**2 * math.expm1(1.0) + 50 * 0.05**2 * math.expm1(0.25))
    assert accountant.mu == pytest.approx(expected_mu, rel=1e-12)
    # A single probability is exactly Corollary 1.
    single = GdpCltAccountant().compose(_sampled_gaussian(0.01, 1.0), 300)
    assert single.mu == pytest.approx(gdp.clt_mu(0.01, np.ones(300)), rel=1e-12)


def test_unsampled_gaussian_composes_exactly_and_adds_in_quadrature():
    exact = GdpCltAccountant().compose(dp_event.GaussianDpEvent(2.0), 4)
    assert exact.mu == pytest.approx(1.0)
    assert exact.get_epsilon(1e-5) == pytest.approx(gdp.epsilon_from_mu(1.0, 1e-5), rel=1e-12)
    # p = 1 is an un-sampled Gaussian.
    assert GdpCltAccountant().compose(_sampled_gaussian(1.0, 2.0), 4).mu == pytest.approx(1.0)

    both = GdpCltAccountant()
    both.compose(dp_event.GaussianDpEvent(2.0), 4)
    both.compose(_sampled_gaussian(0.01, 1.0), 300)
    clt_part = gdp.clt_mu(0.01, np.ones(300))
    assert both.mu == pytest.approx(math.sqrt(1.0 + clt_part**2), rel=1e-12)


def test_zero_probability_costs_nothing():
    accountant = GdpCltAccountant().compose(_sampled_gaussian(0.0, 1.0), 10)
    assert accountant.get_epsilon(1e-5) == 0


@pytest.mark.parametrize(
    "event", [dp_event.GaussianDpEvent(0.0), _sampled_gaussian(0.01, 0.0), _sampled_gaussian(0.01, 0.01)]
)
def test_zero_or_tiny_noise_gives_infinite_epsilon(event):
    accountant = GdpCltAccountant().compose(event)
    assert accountant.get_epsilon(1e-5) == math.inf
    assert accountant.get_delta(1.0) == 1.0


def test_non_private_event_gives_infinite_epsilon():
    accountant = GdpCltAccountant().compose(_sampled_gaussian(0.01, 1.0), 10)
    accountant.compose(dp_event.NonPrivateDpEvent())
    assert accountant.get_epsilon(1e-5) == math.inf


@pytest.mark.parametrize(
    "event",
    [
        dp_event.LaplaceDpEvent(1.0),
        dp_event.SampledWithoutReplacementDpEvent(1000, 10, dp_event.GaussianDpEvent(1.0)),
        dp_event.SampledWithReplacementDpEvent(1000, 10, dp_event.GaussianDpEvent(1.0)),
        dp_event.PoissonSampledDpEvent(0.1, dp_event.LaplaceDpEvent(1.0)),
        dp_event.PoissonSampledDpEvent(0.1, dp_event.SelfComposedDpEvent(dp_event.GaussianDpEvent(1.0), 2)),
        dp_event.PoissonSampledDpEvent(1.5, dp_event.GaussianDpEvent(1.0)),
        dp_event.PoissonSampledDpEvent(0.1, dp_event.GaussianDpEvent(-1.0)),
        dp_event.GaussianDpEvent(-2.0),
        dp_event.ComposedDpEvent([_sampled_gaussian(0.1, 1.0), dp_event.LaplaceDpEvent(1.0)]),
    ],
)
def test_unsupported_events_are_rejected(event):
    accountant = GdpCltAccountant()
    assert not accountant.supports(event)
    with pytest.raises(privacy_accountant.UnsupportedEventError):
        accountant.compose(event)
    assert accountant.get_epsilon(1e-5) == 0  # Nothing was composed.


def test_neighboring_relation_and_ledger():
    accountant = GdpCltAccountant()
    assert accountant.neighboring_relation == privacy_accountant.NeighboringRelation.ADD_OR_REMOVE_ONE
    event = _sampled_gaussian(0.01, 1.0)
    accountant.compose(event, 3)
    assert accountant.ledger == dp_event.SelfComposedDpEvent(event, 3)


def test_invalid_targets_raise():
    accountant = GdpCltAccountant().compose(_sampled_gaussian(0.01, 1.0), 10)
    with pytest.raises(ValueError, match="`target_delta`"):
        accountant.get_epsilon(1.5)
    with pytest.raises(ValueError, match="`target_epsilon`"):
        accountant.get_delta(-1.0)
    assert accountant.get_epsilon(0.0) == math.inf
    assert accountant.get_delta(math.inf) == 0.0
