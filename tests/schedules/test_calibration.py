"""Tests for keras_dyndp.schedules.calibration: the paper's calibrated schedules, its baselines and the GDP-CLT's
understatement check."""

import dataclasses
import math

import numpy as np
import pytest
from paper_runs import DELTA
from paper_runs import P
from paper_runs import T
from paper_runs import calibrate

from keras_dyndp import schedules
from keras_dyndp.accounting import cdp
from keras_dyndp.accounting import gdp
from keras_dyndp.accounting import registry


def _short_paper_run():
    """The GDP-CLT's worst case of docs/accounting.md: p 0.01, T 20, epsilon 1 (its PLD epsilon is 4.20)."""
    return calibrate("vanilla", epsilon=1.0, sampling_probability=0.01, num_steps=20, initial_clip=1.0)


def test_vanilla_matches_paper_worked_numbers():
    schedule = calibrate("vanilla")
    np.testing.assert_allclose(schedule.noise_multipliers, 1.1258165, rtol=1e-6)
    np.testing.assert_allclose(schedule.clip_norms, 1.5)


@pytest.mark.parametrize("method", schedules.METHODS)
@pytest.mark.parametrize("epsilon", [0.05, 1.2, 8.0])
def test_calibration_hits_gdp_clt_target(method, epsilon):
    schedule = calibrate(method, epsilon=epsilon)
    spent = schedule.epsilon(DELTA, "gdp_clt")
    assert spent <= epsilon
    assert spent == pytest.approx(epsilon, rel=1e-6)
    assert gdp.clt_mu(P, schedule.mus) == pytest.approx(gdp.mu_from_epsilon(epsilon, DELTA), rel=1e-9)


def test_growing_mu_shape():
    schedule = calibrate("growing_mu", rho_mu=4.0)
    t = np.arange(1, T + 1)
    np.testing.assert_allclose(schedule.clip_norms, 1.5)
    mu0 = schedule.mus[0] / 4.0 ** (1 / T)
    np.testing.assert_allclose(schedule.mus, mu0 * 4.0 ** (t / T), rtol=1e-12)
    mu_tot = gdp.mu_from_epsilon(1.2, DELTA)
    assert P**2 * np.sum(np.expm1((4.0 ** (t / T) * mu0) ** 2)) == pytest.approx(mu_tot**2, rel=1e-12)


def test_sensitivity_decay_has_closed_form_mu0():
    schedule = calibrate("sensitivity_decay", rho_c=2.0)
    t = np.arange(1, T + 1)
    mu_tot = gdp.mu_from_epsilon(1.2, DELTA)
    mu0 = math.sqrt(math.log(mu_tot**2 / (P**2 * T) + 1))
    np.testing.assert_allclose(schedule.mus, mu0, rtol=1e-12)
    np.testing.assert_allclose(schedule.clip_norms, 1.5 * 2.0 ** (-t / T), rtol=1e-12)
    np.testing.assert_allclose(schedule.noise_stddevs, 1.5 / mu0 * 2.0 ** (-t / T), rtol=1e-12)


def test_dynamic_follows_algorithm_2():
    rho_mu, rho_c = 1 / 0.8, 1 / 0.3
    schedule = calibrate("dynamic", rho_mu=rho_mu, rho_c=rho_c)
    growing = calibrate("growing_mu", rho_mu=rho_mu)
    t = np.arange(1, T + 1)
    mu0 = growing.mus[0] / rho_mu ** (1 / T)  # Alg. 2 takes mu_0 from Alg. 1.
    np.testing.assert_allclose(schedule.clip_norms, 1.5 * rho_c ** (-t / T), rtol=1e-12)
    np.testing.assert_allclose(schedule.noise_stddevs, 1.5 / mu0 * (rho_mu * rho_c) ** (-t / T), rtol=1e-10)


def test_rho_one_reduces_to_vanilla():
    vanilla = calibrate("vanilla")
    for method in ("growing_mu", "sensitivity_decay", "dynamic"):
        np.testing.assert_allclose(
            calibrate(method, rho_mu=1.0, rho_c=1.0).noise_stddevs, vanilla.noise_stddevs, rtol=1e-12
        )


def test_calibrate_shape_accepts_arrays_and_callables():
    clips = np.linspace(2.0, 1.0, 100)
    from_array = schedules.calibrate_shape(
        clips,
        clips / np.linspace(3.0, 1.0, 100),
        target_epsilon=2.0,
        target_delta=1e-6,
        sampling_probability=0.05,
        num_steps=100,
        accountant="gdp_clt",
    )
    from_callable = schedules.calibrate_shape(
        lambda t: np.linspace(2.0, 1.0, 100),
        lambda t: np.linspace(2.0, 1.0, 100) / np.linspace(3.0, 1.0, 100),
        target_epsilon=2.0,
        target_delta=1e-6,
        sampling_probability=0.05,
        num_steps=100,
        accountant="gdp_clt",
    )
    assert from_array == from_callable
    np.testing.assert_array_equal(from_array.clip_norms, clips)
    # The noise keeps the requested shape: sigma_t proportional to linspace(3, 1).
    ratio = from_array.noise_stddevs / np.linspace(3.0, 1.0, 100)
    np.testing.assert_allclose(ratio, ratio[0], rtol=1e-12)
    assert from_array.epsilon(1e-6, "gdp_clt") == pytest.approx(2.0, rel=1e-6)


@pytest.mark.parametrize(
    "override, argument",
    [
        (dict(target_epsilon=0.0), "target_epsilon"),
        (dict(target_epsilon=-1.0), "target_epsilon"),
        (dict(target_epsilon=math.inf), "target_epsilon"),
        (dict(target_delta=0.0), "target_delta"),
        (dict(target_delta=1.0), "target_delta"),
        (dict(sampling_probability=0.0), "sampling_probability"),
        (dict(sampling_probability=1.5), "sampling_probability"),
        (dict(num_steps=0), "num_steps"),
        (dict(num_steps=2.5), "num_steps"),
        (dict(rho_mu=0.5), "rho_mu"),
        (dict(rho_c=0.9), "rho_c"),
        (dict(initial_clip=0.0), "initial_clip"),
        (dict(initial_clip=-2.0), "initial_clip"),
        (dict(accountant="moments"), "accountant"),
    ],
)
def test_bad_calibration_arguments_name_the_argument(override, argument):
    with pytest.raises(ValueError, match=argument):
        calibrate("dynamic", **override)


@pytest.mark.parametrize("method", schedules.BASELINES)
def test_calibrate_builds_the_baselines_with_noise_decay_rho_mu(method):
    schedule = calibrate(method, epsilon=0.5, num_steps=50, rho_mu=1.25)
    assert schedule == schedules.calibrate_baseline(
        method,
        target_epsilon=0.5,
        target_delta=DELTA,
        sampling_probability=P,
        num_steps=50,
        initial_clip=1.5,
        noise_decay=1.25,
    )
    expected = cdp.calibrate_noise(method, 0.5, DELTA, P, 50, noise_decay=1.25)
    np.testing.assert_allclose(schedule.noise_multipliers, expected, rtol=1e-15)
    np.testing.assert_array_equal(schedule.clip_norms, 1.5)
    assert schedule.sampling_probability == P and schedule.calibration is None
    assert cdp.baseline_epsilon(method, P, schedule.noise_multipliers, DELTA) <= 0.5
    assert schedules.ALL_METHODS == schedules.METHODS + schedules.BASELINES


@pytest.mark.parametrize("decay", ["exponential", "time"])
def test_calibrate_baseline_decays_the_noise_with_a_constant_clip(decay):
    schedule = schedules.calibrate_baseline(
        "zcdp",
        target_epsilon=1.2,
        target_delta=DELTA,
        sampling_probability=P,
        num_steps=T,
        initial_clip=1.5,
        noise_decay=2.0,
        decay=decay,
    )
    np.testing.assert_array_equal(schedule.clip_norms, 1.5)
    assert schedule.noise_multipliers[0] / schedule.noise_multipliers[-1] == pytest.approx(
        2.0 * (cdp.decay_shape(T, 2.0, decay)[0]), rel=1e-12
    )
    assert schedule.num_steps == T


@pytest.mark.parametrize("method", ["tcdp", "vanilla"])
@pytest.mark.parametrize("initial_clip", [0.0, -1.0, math.inf, True, "1"])
def test_calibrate_and_the_baselines_check_the_clip_in_the_same_words(initial_clip, method):
    arguments = dict(target_epsilon=1.0, target_delta=DELTA, sampling_probability=P, num_steps=10)
    message = r"`initial_clip` must be a finite number > 0\. Received: initial_clip="
    with pytest.raises(ValueError, match=message):
        schedules.calibrate(method, initial_clip=initial_clip, **arguments)
    if method == "tcdp":
        with pytest.raises(ValueError, match=message):
            schedules.calibrate_baseline(method, initial_clip=initial_clip, **arguments)


def test_calibrate_refuses_a_baseline_outside_its_accountant():
    with pytest.raises(ValueError, match="`sampling_probability` must be <= 0.1 for the tCDP baseline"):
        calibrate("tcdp", sampling_probability=0.5, num_steps=10)
    with pytest.raises(ValueError, match="`accountant` must be one of"):
        calibrate("zcdp", accountant="zcdp")


def test_bad_method_and_schedule_arguments():
    with pytest.raises(ValueError, match="method"):
        calibrate("adaptive")
    with pytest.raises(ValueError, match="clip_norms"):
        schedules.DPSchedule([1.0, -1.0], [1.0, 1.0], 0.1)
    with pytest.raises(ValueError, match="noise_stddevs"):
        schedules.DPSchedule([1.0, 1.0], [1.0], 0.1)
    with pytest.raises(ValueError, match="steps"):
        calibrate("vanilla", num_steps=10).epsilon(DELTA, steps=11)
    with pytest.raises(ValueError, match="epochs"):
        schedules.sampling_from_epochs(100, 10)
    with pytest.raises(ValueError, match="batch_size"):
        schedules.sampling_from_epochs(100, 200, epochs=1)


@pytest.mark.parametrize("accountant", ["rdp", "pld"])
def test_rigorous_calibration_meets_target_without_overshoot(accountant):
    schedule = calibrate("dynamic", epsilon=1.0, accountant=accountant, num_steps=100, sampling_probability=0.01)
    spent = schedule.epsilon(DELTA, accountant=accountant)
    assert 0.999 <= spent <= 1.0
    # The rigorous accountants charge more than the CLT, so the rigorous schedule is noisier than the paper's.
    paper = calibrate("dynamic", epsilon=1.0, num_steps=100, sampling_probability=0.01)
    assert np.all(schedule.noise_stddevs > paper.noise_stddevs)
    np.testing.assert_allclose(
        schedule.noise_stddevs / paper.noise_stddevs, schedule.noise_stddevs[0] / paper.noise_stddevs[0], rtol=1e-9
    )


def _last_steps_boosted(mu_factor=3.0, boosted=5):
    """The issue's shape: p 250/60000, T 4800, constant clip, the last `boosted` steps at `mu_factor` x mu."""
    shape = np.ones(T)
    shape[-boosted:] = mu_factor
    return shape


def test_default_calibration_is_pld_and_meets_the_target_rigorously():
    # The short run: calibrated to GDP-CLT 1.0 it is PLD 4.20; by default it is now PLD 1.0.
    short = schedules.calibrate(
        "vanilla", target_epsilon=1.0, target_delta=DELTA, sampling_probability=0.01, num_steps=20, initial_clip=1.0
    )
    assert short.calibration == schedules.Calibration("pld", 1.0, DELTA)
    assert 0.999 <= short.epsilon(DELTA, "pld") <= 1.0
    assert short.epsilon(DELTA, "gdp_clt") < 0.5  # What the CLT makes of the rigorously calibrated noise.
    paper = _short_paper_run()
    assert paper.epsilon(DELTA, "pld") == pytest.approx(4.20, abs=0.01)
    # The shape matters too: a long run whose last 5 steps have 3x mu.
    shaped = schedules.calibrate_shape(
        1.0, _last_steps_boosted(), target_epsilon=1.0, target_delta=DELTA, sampling_probability=P, num_steps=T
    )
    assert shaped.calibration.accountant == "pld" and 0.999 <= shaped.epsilon(DELTA) <= 1.0
    clt = schedules.calibrate_shape(
        1.0,
        _last_steps_boosted(),
        target_epsilon=1.0,
        target_delta=DELTA,
        sampling_probability=P,
        num_steps=T,
        accountant="gdp_clt",
    )
    assert clt.epsilon(DELTA, "pld") == pytest.approx(3.78, abs=0.01)


def test_gdp_clt_understatement_reports_the_pld_epsilon_of_the_same_schedule():
    paper = _short_paper_run()
    text = schedules.gdp_clt_understatement(paper)
    assert "epsilon = 1 (delta = 1e-05) under the GDP-CLT" in text and "PLD epsilon is 4.198, 4.20x the target" in text
    assert "accountant='pld'" in text
    # Within 5%: the paper's worked example (GDP-CLT 1.2, PLD 1.25) is not flagged.
    assert schedules.gdp_clt_understatement(calibrate("vanilla")) is None
    rigorous = schedules.calibrate(
        "vanilla", target_epsilon=1.0, target_delta=DELTA, sampling_probability=0.01, num_steps=20, initial_clip=1.0
    )
    assert schedules.gdp_clt_understatement(rigorous) is None
    by_hand = schedules.DPSchedule(paper.clip_norms, paper.noise_stddevs, 0.01)
    assert schedules.gdp_clt_understatement(by_hand) is None


@pytest.mark.parametrize("accountant, target", [("rdp", 1e9), ("rdp", 1e-9), ("gdp_clt", 1e-9)])
def test_calibration_outside_the_accountants_range_raises_calibration_error(accountant, target):
    with pytest.raises(schedules.CalibrationError, match=f"target_epsilon={target}"):
        schedules.calibrate(
            "vanilla",
            target_epsilon=target,
            target_delta=DELTA,
            sampling_probability=1.0,
            num_steps=1,
            initial_clip=1.0,
            accountant=accountant,
        )


def _with_entry(monkeypatch, name, **attributes):
    """Gives the registry's entry `name` these attribute values: the schedules follow attributes, not names."""
    get = registry.get
    monkeypatch.setattr(
        registry,
        "get",
        lambda accountant, argument="accountant": (
            dataclasses.replace(get(accountant, argument), **attributes)
            if accountant == name
            else get(accountant, argument)
        ),
    )


def test_calibration_takes_the_clt_root_only_for_an_accountant_with_clt_calibration(monkeypatch):
    budget = dict(target_epsilon=1.0, target_delta=DELTA, sampling_probability=0.01, num_steps=20, initial_clip=1.0)
    clt_root = schedules.calibrate("vanilla", **budget, accountant="gdp_clt")
    assert gdp.clt_mu(0.01, clt_root.mus) == pytest.approx(gdp.mu_from_epsilon(1.0, DELTA), rel=1e-12)
    _with_entry(monkeypatch, "gdp_clt", clt_calibration=False)
    searched = schedules.calibrate("vanilla", **budget, accountant="gdp_clt")
    assert searched != clt_root and 0.999 <= searched.epsilon(DELTA, "gdp_clt") <= 1.0


def test_only_a_schedule_calibrated_under_an_accountant_that_is_not_rigorous_is_checked(monkeypatch):
    paper = _short_paper_run()
    assert schedules.gdp_clt_understatement(paper) is not None
    _with_entry(monkeypatch, "gdp_clt", rigorous=True)
    assert schedules.gdp_clt_understatement(paper) is None
