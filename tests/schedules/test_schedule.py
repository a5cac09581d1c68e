"""Tests for keras_dyndp.schedules.schedule: DPSchedule (its events, epsilons, fingerprint, config) and
sampling_from_epochs."""

import math

import dp_accounting
import numpy as np
import pytest
from paper_runs import DELTA
from paper_runs import P
from paper_runs import T
from paper_runs import calibrate

from keras_dyndp import schedules
from keras_dyndp.accounting import fast_pld
from keras_dyndp.accounting import registry


def test_event_is_run_length_encoded_and_composes_like_steps():
    constant = calibrate("vanilla")
    event = constant.to_dp_event()
    assert isinstance(event, dp_accounting.SelfComposedDpEvent) and event.count == T
    dynamic = calibrate("dynamic", num_steps=20)
    event = dynamic.to_dp_event(steps=7)
    assert isinstance(event, dp_accounting.ComposedDpEvent) and len(event.events) == 7
    assert isinstance(dynamic.to_dp_event(steps=0), dp_accounting.NoOpDpEvent)


def test_epsilon_grows_with_steps_and_accountants_agree_roughly():
    schedule = calibrate("vanilla", num_steps=200, sampling_probability=0.02)
    eps = [schedule.epsilon(DELTA, "gdp_clt", steps=s) for s in (0, 50, 100, 200)]
    assert eps[0] == 0.0 and eps[1] < eps[2] < eps[3]
    rdp = schedule.epsilon(DELTA, accountant="rdp")
    pld = schedule.epsilon(DELTA, accountant="pld")
    # Rigorous accountants sit near the CLT value; RDP is the loosest of the two rigorous ones.
    assert 0.8 * eps[3] < pld <= rdp < 1.6 * eps[3]


def test_epsilon_passes_accountant_options():
    schedule = calibrate("vanilla", num_steps=200, sampling_probability=0.02)
    final = schedule.epsilon(DELTA, "pld", **registry.get("pld").final_options)
    assert final < schedule.epsilon(DELTA, "pld")
    assert final == pytest.approx(
        fast_pld.pld_epsilon(0.02, schedule.noise_multipliers, DELTA, value_discretization_interval=1e-4), rel=1e-12
    )
    assert schedule.epsilon(DELTA, "rdp", orders=[2, 8, 32]) >= schedule.epsilon(DELTA, "rdp")
    with pytest.raises(ValueError, match="Options of the 'gdp_clt' accountant"):
        schedule.epsilon(DELTA, "gdp_clt", orders=[2])
    with pytest.raises(ValueError, match="`value_discretization_interval` must be > 0"):
        schedule.epsilon(DELTA, "pld", value_discretization_interval=-1.0)


def test_fingerprint_is_equal_exactly_for_equal_schedules():
    clip, noise = np.array([2.0, 1.0, 0.5]), np.array([3.0, 0.0, 1.0])
    schedule = schedules.DPSchedule(clip, noise, 0.01)
    calibration = schedules.Calibration("pld", 1.0, 1e-5)
    same = [
        schedules.DPSchedule(clip.copy(), noise.copy(), 0.01),
        schedules.DPSchedule(clip, np.where(noise == 0, -0.0, noise), 0.01),  # -0.0 == 0.0
        schedules.DPSchedule(clip, noise, 0.01, calibration=calibration),
        schedules.DPSchedule.from_json(schedule.to_json()),
    ]
    different = [
        schedules.DPSchedule(clip * (1 + 1e-15), noise, 0.01),
        schedules.DPSchedule(clip, noise + [0.0, 0.0, 1e-12], 0.01),
        schedules.DPSchedule(clip, noise, 0.0100001),
        schedules.DPSchedule(clip[:2], noise[:2], 0.01),
    ]
    for other in same:
        assert other == schedule and other.fingerprint == schedule.fingerprint
    for other in different:
        assert other != schedule and other.fingerprint != schedule.fingerprint
    first, second = schedule.fingerprint
    assert first % 2 == 1 and all(-(2**31) <= word < 2**31 for word in (first, second))  # never (0, 0); int32


def test_check_accountable_uses_the_options_noise_floor():
    schedule = schedules.DPSchedule([1.0], [0.05], 0.1)  # z = 0.05: above the PLD floor at 1e-3, below it at 1e-4.
    schedule.check_accountable("pld")
    with pytest.raises(ValueError, match="the 'pld' accountant accepts"):
        schedule.check_accountable("pld", value_discretization_interval=1e-4)


def test_zero_noise_means_infinite_epsilon():
    schedule = schedules.DPSchedule([1.0, 1.0], [0.0, 0.0], 0.1)
    assert schedule.epsilon(DELTA) == math.inf
    assert np.all(np.isinf(schedule.mus))


def test_json_and_config_round_trip():
    schedule = calibrate("dynamic", num_steps=50)
    assert schedules.DPSchedule.from_json(schedule.to_json()) == schedule
    assert schedules.DPSchedule.from_config(schedule.get_config()) == schedule


def test_schedule_is_immutable():
    schedule = calibrate("vanilla", num_steps=10)
    with pytest.raises(ValueError):
        schedule.clip_norms[0] = 5.0
    with pytest.raises(AttributeError):
        schedule.sampling_probability = 0.5


def test_sampling_from_epochs_matches_tf_privacy_convention():
    assert schedules.sampling_from_epochs(60000, 250, epochs=20) == (250 / 60000, 4800)
    assert schedules.sampling_from_epochs(60000, 256, epochs=60) == (256 / 60000, 14063)
    assert schedules.sampling_from_epochs(100, 10, steps=7) == (0.1, 7)


def test_rigorous_epsilons_match_dp_accounting_per_step():
    schedule = calibrate("dynamic", num_steps=30, sampling_probability=0.05)
    rdp = dp_accounting.rdp.RdpAccountant()
    for z in schedule.noise_multipliers:
        rdp.compose(dp_accounting.PoissonSampledDpEvent(0.05, dp_accounting.GaussianDpEvent(z)))
    expected = rdp.get_epsilon(DELTA)
    # Equal on dp_accounting >= 0.5; on 0.4.3, whose fractional orders are tighter, never below it (test_fast_rdp).
    assert expected * (1 - 1e-9) <= schedule.epsilon(DELTA, accountant="rdp") <= expected * (1 + 1e-4)
    pld = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-3)
    pld.compose(schedule.to_dp_event())
    exact = pld.get_epsilon(DELTA)
    assert exact <= schedule.epsilon(DELTA, accountant="pld") <= 1.02 * exact


def test_calibration_metadata_round_trips_and_equality_ignores_it():
    schedule = calibrate("dynamic", num_steps=30)
    assert schedule.calibration == schedules.Calibration("gdp_clt", 1.2, DELTA)
    for restored in (
        schedules.DPSchedule.from_json(schedule.to_json()),
        schedules.DPSchedule.from_config(schedule.get_config()),
    ):
        assert restored.calibration == schedule.calibration and restored == schedule
    by_hand = schedules.DPSchedule(schedule.clip_norms, schedule.noise_stddevs, P)
    assert by_hand.calibration is None and "calibration" not in by_hand.get_config()
    assert by_hand == schedule  # Same mechanism, same privacy: a saved pre-metadata schedule still matches.
    assert "calibration=Calibration(accountant='gdp_clt'" in repr(schedule)
    with pytest.raises(TypeError, match="calibration"):
        schedules.DPSchedule([1.0], [1.0], 0.1, calibration={"accountant": "pld"})
    with pytest.raises(ValueError, match="accountant"):
        schedules.Calibration("moments", 1.0, DELTA)
    with pytest.raises(ValueError, match="target_delta"):
        schedules.Calibration("pld", 1.0, 1.5)


@pytest.mark.parametrize("noise_multiplier", [1e-3, 1e-300, 1e300])
@pytest.mark.parametrize("accountant", ["pld", "rdp", "gdp_clt"])
def test_extreme_noise_fails_fast_or_is_accounted(accountant, noise_multiplier):
    schedule = schedules.DPSchedule([1.0, 1.0, 1.0], [1.0, noise_multiplier, 1.0], 0.01)
    if noise_multiplier == 1e-3 and accountant != "pld":
        # Within [1e-4, 1e4]: RDP bounds it (a huge epsilon), the GDP-CLT overflows to inf; both in milliseconds.
        schedule.check_accountable(accountant)
        assert schedule.epsilon(DELTA, accountant) > 1e5
        return
    for check in (lambda: schedule.epsilon(DELTA, accountant), lambda: schedule.check_accountable(accountant)):
        with pytest.raises(ValueError, match=r"noise multiplier of step 1 \(0-based\) is .* accepts 0 .* values in \["):
            check()
