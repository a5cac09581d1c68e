"""Tests for keras_dyndp.accounting.cdp: zCDP / tCDP accounting and noise calibration of the noise-decay baselines."""

import math

import numpy as np
import pytest

from keras_dyndp.accounting import cdp
from keras_dyndp.accounting import fast_rdp

P, T, DELTA = 250 / 60000, 4800, 1e-5


def test_zcdp_conversion_round_trip():
    for epsilon in (0.1, 1.2, 9.0):
        rho = cdp.zcdp_rho_from_epsilon(epsilon, DELTA)
        assert cdp.zcdp_epsilon_from_rho(rho, DELTA) == pytest.approx(epsilon, rel=1e-12)
    assert cdp.zcdp_epsilon([1.0, 2.0], DELTA) == pytest.approx(0.625 + 2 * math.sqrt(0.625 * math.log(1 / DELTA)))


@pytest.mark.parametrize("decay", cdp.DECAYS)
@pytest.mark.parametrize("epsilon", [0.4, 1.2])
def test_zcdp_noise_hits_target(decay, epsilon):
    multipliers = cdp.zcdp_noise_multipliers(epsilon, DELTA, P, T, noise_decay=2.0, decay=decay)
    achieved = cdp.zcdp_epsilon(multipliers, DELTA)
    assert achieved <= epsilon and achieved == pytest.approx(epsilon, rel=1e-10)
    shape = cdp.decay_shape(T, 2.0, decay)
    np.testing.assert_allclose(multipliers / multipliers[0], shape / shape[0], rtol=1e-12)
    assert shape[-1] == pytest.approx(0.5) and multipliers.shape == (T,)


def test_zcdp_has_no_epoch_parallel_composition():
    # Yu et al.'s parallel composition within an epoch needs disjoint batches, which Poisson sampling does not give.
    with pytest.raises(TypeError, match="steps_per_epoch"):
        cdp.zcdp_noise_multipliers(1.2, DELTA, P, T, steps_per_epoch=240)
    with pytest.raises(TypeError, match="steps_per_epoch"):
        cdp.zcdp_epsilon([1.0], DELTA, steps_per_epoch=1)


@pytest.mark.parametrize("epsilon", [0.1, 0.4, 1.2, 2.0])
def test_tcdp_noise_hits_target(epsilon):
    multipliers = cdp.tcdp_noise_multipliers(epsilon, DELTA, P, T, noise_decay=1.25)
    achieved = cdp.tcdp_epsilon(P, multipliers, DELTA)
    assert achieved <= epsilon and achieved == pytest.approx(epsilon, rel=1e-9)
    assert multipliers[-1] >= math.sqrt(20)  # Every step inside the theorem's rho_t <= 0.1.
    # Amplification by subsampling: far less noise than zCDP without it, more than the rigorous RDP needs.
    zcdp = cdp.zcdp_noise_multipliers(epsilon, DELTA, P, T, noise_decay=1.25)
    assert multipliers[0] < zcdp[0] / 10
    assert fast_rdp.rdp_epsilon(P, multipliers, DELTA) < epsilon / 5


def test_tcdp_accounts_replace_one_neighbours():
    # Replacing one example moves the clipped sum by 2C: rho_t = (2C)^2 / (2 sigma^2) = 2 / z^2 = 0.08 at z = 5,
    # amplified to 13 p^2 rho_t, with omega = log(1/p) / (4 rho_t).
    rho, omega = cdp.tcdp_parameters(P, np.full(10, 5.0))
    assert rho == pytest.approx(10 * 13 * P**2 * 0.08, rel=1e-12)
    assert omega == pytest.approx(math.log(1 / P) / (4 * 0.08), rel=1e-12)
    # A step with z = inf costs nothing.
    assert cdp.tcdp_parameters(P, [math.inf, 5.0]) == cdp.tcdp_parameters(P, [5.0])
    # Small omega: the Renyi bound is used at alpha = omega.
    log_inv_delta = math.log(1 / DELTA)
    assert cdp.tcdp_epsilon_from_parameters(0.01, 3.0, DELTA) == pytest.approx(0.03 + log_inv_delta / 2)


@pytest.mark.parametrize("sampling_probability", [0.2, 0.5, 1.0])
def test_tcdp_refuses_sampling_fractions_above_the_theorems(sampling_probability):
    with pytest.raises(ValueError, match=r"`sampling_probability` must be <= 0.1 .* s in \(0, 0.1\]"):
        cdp.tcdp_epsilon(sampling_probability, np.full(5, 10.0), DELTA)
    with pytest.raises(ValueError, match="`sampling_probability` must be <= 0.1"):
        cdp.tcdp_noise_multipliers(1.0, DELTA, sampling_probability, 50)
    assert cdp.tcdp_epsilon(0.1, np.full(5, 10.0), DELTA) > 0  # The theorem's boundary s = 0.1 is inside.


def test_tcdp_refuses_steps_with_rho_above_the_theorems():
    boundary = math.sqrt(20)  # rho_t = 2 / z^2 = 0.1.
    assert cdp.tcdp_epsilon(P, [boundary * (1 + 1e-12)], DELTA) > 0
    with pytest.raises(ValueError, match=r"Step 2 has z_t = 4\.4 \(rho_t = 0\.103306\)"):
        cdp.tcdp_parameters(P, [10.0, 4.4, 10.0])
    with pytest.raises(ValueError, match="z_t >= sqrt"):
        cdp.tcdp_parameters(P, [0.0])


def test_tcdp_calibration_stays_inside_the_theorem_and_warns_when_it_cannot_spend_the_target():
    with pytest.warns(UserWarning, match="below the target 8"):
        multipliers = cdp.tcdp_noise_multipliers(8.0, DELTA, P, T, noise_decay=1.25)
    assert multipliers[-1] == pytest.approx(math.sqrt(20), rel=1e-12)
    assert multipliers[-1] >= math.sqrt(20)
    assert 2.0 < cdp.tcdp_epsilon(P, multipliers, DELTA) < 2.2


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(target_epsilon=0.0), "target_epsilon"),
        (dict(target_epsilon=math.inf), "target_epsilon"),
        (dict(target_delta=1.0), "target_delta"),
        (dict(sampling_probability=0.0), "sampling_probability"),
        (dict(num_steps=0), "num_steps"),
        (dict(noise_decay=0.5), "noise_decay"),
        (dict(decay="linear"), "decay"),
    ],
)
@pytest.mark.parametrize("name", cdp.NAMES)
def test_bad_arguments(name, kwargs, match):
    arguments = (
        dict(
            target_epsilon=1.0,
            target_delta=DELTA,
            sampling_probability=P,
            num_steps=100,
            noise_decay=2.0,
            decay="exponential",
        )
        | kwargs
    )
    with pytest.raises(ValueError, match=match):
        cdp.calibrate_noise(name, **arguments)


def test_bad_accounting_arguments():
    with pytest.raises(ValueError, match="noise_multipliers"):
        cdp.zcdp_epsilon([], DELTA)
    with pytest.raises(ValueError, match=r"`delta` must be in \(0, 1\)"):
        cdp.tcdp_epsilon(P, [10.0], 2.0)
    with pytest.raises(ValueError, match=r"`name` must be one of \('zcdp', 'tcdp'\)"):
        cdp.baseline_epsilon("rdp", P, [10.0], DELTA)
    with pytest.raises(ValueError, match=r"`name` must be one of \('zcdp', 'tcdp'\)"):
        cdp.calibrate_noise("rdp", 1.0, DELTA, P, 10)


@pytest.mark.parametrize("name", cdp.NAMES)
def test_baseline_epsilon_of_a_prefix_grows_to_the_target(name):
    multipliers = cdp.calibrate_noise(name, 0.5, DELTA, P, 50)
    epsilons = [cdp.baseline_epsilon(name, P, multipliers[:steps], DELTA) for steps in (1, 10, 25, 50)]
    assert epsilons == sorted(epsilons) and epsilons[0] < epsilons[-1]
    assert epsilons[-1] == cdp.baseline_epsilon(name, P, multipliers, DELTA) == pytest.approx(0.5)
    assert epsilons[-1] <= 0.5
