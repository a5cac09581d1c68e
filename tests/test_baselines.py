"""Tests for keras_dyndp.baselines: zCDP / tCDP accounting and calibration of the noise-decay baselines."""

import math

import numpy as np
import pytest

from keras_dyndp import baselines

P, T, DELTA = 250 / 60000, 4800, 1e-5


def test_zcdp_conversion_round_trip():
    for epsilon in (0.1, 1.2, 9.0):
        rho = baselines.zcdp_rho_from_epsilon(epsilon, DELTA)
        assert baselines.zcdp_epsilon_from_rho(rho, DELTA) == pytest.approx(epsilon, rel=1e-12)
    assert baselines.zcdp_epsilon([1.0, 2.0], DELTA) == pytest.approx(
        0.625 + 2 * math.sqrt(0.625 * math.log(1 / DELTA)))


@pytest.mark.parametrize("decay", baselines.DECAYS)
@pytest.mark.parametrize("epsilon", [0.4, 1.2])
def test_zcdp_schedule_hits_target(decay, epsilon):
    schedule = baselines.zcdp_schedule(epsilon, DELTA, P, T, 1.5, noise_decay=2.0, decay=decay)
    achieved = baselines.zcdp_epsilon(schedule.noise_multipliers, DELTA)
    assert achieved <= epsilon and achieved == pytest.approx(epsilon, rel=1e-10)
    shape = baselines.decay_shape(T, 2.0, decay)
    np.testing.assert_allclose(schedule.noise_multipliers / schedule.noise_multipliers[0], shape / shape[0], rtol=1e-12)
    assert shape[-1] == pytest.approx(0.5)
    np.testing.assert_array_equal(schedule.clip_norms, 1.5)
    assert schedule.sampling_probability == P and schedule.num_steps == T


def test_zcdp_epoch_parallel_composition_needs_less_noise():
    sequential = baselines.zcdp_schedule(1.2, DELTA, P, T, 1.0)
    parallel = baselines.zcdp_schedule(1.2, DELTA, P, T, 1.0, steps_per_epoch=240)
    assert baselines.zcdp_epsilon(parallel.noise_multipliers, DELTA, steps_per_epoch=240) == pytest.approx(1.2)
    # 20 epochs instead of 4800 steps: about sqrt(240) times less noise.
    ratio = sequential.noise_multipliers[0] / parallel.noise_multipliers[0]
    assert ratio == pytest.approx(math.sqrt(240), rel=0.05)


@pytest.mark.parametrize("epsilon", [0.1, 0.4, 1.2, 8.0])
def test_tcdp_schedule_hits_target(epsilon):
    schedule = baselines.tcdp_schedule(epsilon, DELTA, P, T, 1.5, noise_decay=1 / 0.3)
    achieved = baselines.tcdp_epsilon(P, schedule.noise_multipliers, DELTA)
    # At 8.0 the first steps leave the amplification conditions right above the calibrated z_0 (epsilon jumps
    # there), so the safe side of the jump is slightly below the target.
    assert achieved <= epsilon and achieved == pytest.approx(epsilon, rel=1e-6 if epsilon < 8 else 0.01)
    # Amplification by subsampling: far less noise than zCDP without it, more than the rigorous RDP needs.
    zcdp = baselines.zcdp_schedule(epsilon, DELTA, P, T, 1.5, noise_decay=1 / 0.3)
    assert schedule.noise_multipliers[0] < zcdp.noise_multipliers[0] / 10
    assert schedule.epsilon(DELTA, "rdp") < epsilon


def test_tcdp_parameters_and_conversion():
    rho, omega = baselines.tcdp_parameters(P, np.full(10, 5.0))
    assert rho == pytest.approx(10 * 13 * P**2 * 0.02)
    assert omega == pytest.approx(math.log(1 / P) / (4 * 0.02))
    # Without subsampling (p = 1) a Gaussian step is (1 / (2 z^2), inf)-tCDP: the zCDP numbers.
    assert baselines.tcdp_parameters(1.0, [1.0, 2.0]) == (0.625, math.inf)
    assert baselines.tcdp_epsilon(1.0, [1.0, 2.0], DELTA) == pytest.approx(baselines.zcdp_epsilon([1.0, 2.0], DELTA))
    # Steps outside the amplification conditions (rho_t > 0.1) are not amplified.
    assert baselines.tcdp_parameters(P, [1.0]) == (0.5, math.inf)
    # Small omega: the Renyi bound is used at alpha = omega.
    log_inv_delta = math.log(1 / DELTA)
    assert baselines.tcdp_epsilon_from_parameters(0.01, 3.0, DELTA) == pytest.approx(0.03 + log_inv_delta / 2)


@pytest.mark.parametrize("kwargs, match", [
    (dict(target_epsilon=0.0), "target_epsilon"),
    (dict(target_epsilon=math.inf), "target_epsilon"),
    (dict(target_delta=1.0), "target_delta"),
    (dict(sampling_probability=0.0), "sampling_probability"),
    (dict(num_steps=0), "num_steps"),
    (dict(initial_clip=-1.0), "initial_clip"),
    (dict(noise_decay=0.5), "noise_decay"),
    (dict(decay="linear"), "decay"),
])
@pytest.mark.parametrize("builder", [baselines.zcdp_schedule, baselines.tcdp_schedule])
def test_bad_arguments(builder, kwargs, match):
    arguments = dict(target_epsilon=1.0, target_delta=DELTA, sampling_probability=P, num_steps=100,
                     initial_clip=1.0, noise_decay=2.0, decay="exponential") | kwargs
    with pytest.raises(ValueError, match=match):
        builder(**arguments)


def test_bad_accounting_arguments():
    with pytest.raises(ValueError, match="noise_multipliers"):
        baselines.zcdp_epsilon([], DELTA)
    with pytest.raises(ValueError, match="delta"):
        baselines.tcdp_epsilon(P, [1.0], 2.0)
    with pytest.raises(ValueError, match="steps_per_epoch"):
        baselines.zcdp_rho([1.0], steps_per_epoch=0)
    with pytest.raises(ValueError, match="name"):
        baselines.baseline_epsilon("rdp", baselines.zcdp_schedule(1.0, DELTA, P, 10, 1.0), DELTA)
    with pytest.raises(ValueError, match=r"`steps` must be in \[1, 10\]"):
        baselines.baseline_epsilon("zcdp", baselines.zcdp_schedule(1.0, DELTA, P, 10, 1.0), DELTA, steps=11)


@pytest.mark.parametrize("name", ["zcdp", "tcdp"])
def test_baseline_epsilon_of_a_prefix_grows_to_the_target(name):
    builder = baselines.zcdp_schedule if name == "zcdp" else baselines.tcdp_schedule
    schedule = builder(1.0, DELTA, P, 50, 1.0)
    epsilons = [baselines.baseline_epsilon(name, schedule, DELTA, steps=steps) for steps in (1, 10, 25, 50)]
    assert epsilons == sorted(epsilons) and epsilons[0] < epsilons[-1]
    assert epsilons[-1] == baselines.baseline_epsilon(name, schedule, DELTA) <= 1.0  # tCDP can stop below: jumps.
