"""Tests for keras_dyndp.schedules: DPSchedule, the paper's calibrated schedules and its baselines."""

import dataclasses
import math

import dp_accounting
import numpy as np
import pytest

from keras_dyndp import schedules
from keras_dyndp.accounting import cdp
from keras_dyndp.accounting import fast_pld
from keras_dyndp.accounting import gdp
from keras_dyndp.accounting import registry

P = 250 / 60000
T = 4800
DELTA = 1e-5


def _calibrate(method, epsilon=1.2, **kwargs):
    """The paper's calibration (GDP-CLT) unless `accountant` is given: its worked numbers are exact there."""
    args = dict(
        target_epsilon=epsilon,
        target_delta=DELTA,
        sampling_probability=P,
        num_steps=T,
        initial_clip=1.5,
        rho_mu=1 / 0.3,
        rho_c=1 / 0.5,
        accountant="gdp_clt",
    )
    args.update(kwargs)
    return schedules.calibrate(method, **args)


def _short_paper_run():
    """The GDP-CLT's worst case of docs/accounting.md: p 0.01, T 20, epsilon 1 (its PLD epsilon is 4.20)."""
    return _calibrate("vanilla", epsilon=1.0, sampling_probability=0.01, num_steps=20, initial_clip=1.0)


def test_vanilla_matches_paper_worked_numbers():
    schedule = _calibrate("vanilla")
    np.testing.assert_allclose(schedule.noise_multipliers, 1.1258165, rtol=1e-6)
    np.testing.assert_allclose(schedule.clip_norms, 1.5)


@pytest.mark.parametrize("method", schedules.METHODS)
@pytest.mark.parametrize("epsilon", [0.05, 1.2, 8.0])
def test_calibration_hits_gdp_clt_target(method, epsilon):
    schedule = _calibrate(method, epsilon=epsilon)
    spent = schedule.epsilon(DELTA, "gdp_clt")
    assert spent <= epsilon
    assert spent == pytest.approx(epsilon, rel=1e-6)
    assert gdp.clt_mu(P, schedule.mus) == pytest.approx(gdp.mu_from_epsilon(epsilon, DELTA), rel=1e-9)


def test_growing_mu_shape():
    schedule = _calibrate("growing_mu", rho_mu=4.0)
    t = np.arange(1, T + 1)
    np.testing.assert_allclose(schedule.clip_norms, 1.5)
    mu0 = schedule.mus[0] / 4.0 ** (1 / T)
    np.testing.assert_allclose(schedule.mus, mu0 * 4.0 ** (t / T), rtol=1e-12)
    mu_tot = gdp.mu_from_epsilon(1.2, DELTA)
    assert P**2 * np.sum(np.expm1((4.0 ** (t / T) * mu0) ** 2)) == pytest.approx(mu_tot**2, rel=1e-12)


def test_sensitivity_decay_has_closed_form_mu0():
    schedule = _calibrate("sensitivity_decay", rho_c=2.0)
    t = np.arange(1, T + 1)
    mu_tot = gdp.mu_from_epsilon(1.2, DELTA)
    mu0 = math.sqrt(math.log(mu_tot**2 / (P**2 * T) + 1))
    np.testing.assert_allclose(schedule.mus, mu0, rtol=1e-12)
    np.testing.assert_allclose(schedule.clip_norms, 1.5 * 2.0 ** (-t / T), rtol=1e-12)
    np.testing.assert_allclose(schedule.noise_stddevs, 1.5 / mu0 * 2.0 ** (-t / T), rtol=1e-12)


def test_dynamic_follows_algorithm_2():
    rho_mu, rho_c = 1 / 0.8, 1 / 0.3
    schedule = _calibrate("dynamic", rho_mu=rho_mu, rho_c=rho_c)
    growing = _calibrate("growing_mu", rho_mu=rho_mu)
    t = np.arange(1, T + 1)
    mu0 = growing.mus[0] / rho_mu ** (1 / T)  # Alg. 2 takes mu_0 from Alg. 1.
    np.testing.assert_allclose(schedule.clip_norms, 1.5 * rho_c ** (-t / T), rtol=1e-12)
    np.testing.assert_allclose(schedule.noise_stddevs, 1.5 / mu0 * (rho_mu * rho_c) ** (-t / T), rtol=1e-10)


def test_rho_one_reduces_to_vanilla():
    vanilla = _calibrate("vanilla")
    for method in ("growing_mu", "sensitivity_decay", "dynamic"):
        np.testing.assert_allclose(
            _calibrate(method, rho_mu=1.0, rho_c=1.0).noise_stddevs, vanilla.noise_stddevs, rtol=1e-12
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


def test_event_is_run_length_encoded_and_composes_like_steps():
    constant = _calibrate("vanilla")
    event = constant.to_dp_event()
    assert isinstance(event, dp_accounting.SelfComposedDpEvent) and event.count == T
    dynamic = _calibrate("dynamic", num_steps=20)
    event = dynamic.to_dp_event(steps=7)
    assert isinstance(event, dp_accounting.ComposedDpEvent) and len(event.events) == 7
    assert isinstance(dynamic.to_dp_event(steps=0), dp_accounting.NoOpDpEvent)


def test_epsilon_grows_with_steps_and_accountants_agree_roughly():
    schedule = _calibrate("vanilla", num_steps=200, sampling_probability=0.02)
    eps = [schedule.epsilon(DELTA, "gdp_clt", steps=s) for s in (0, 50, 100, 200)]
    assert eps[0] == 0.0 and eps[1] < eps[2] < eps[3]
    rdp = schedule.epsilon(DELTA, accountant="rdp")
    pld = schedule.epsilon(DELTA, accountant="pld")
    # Rigorous accountants sit near the CLT value; RDP is the loosest of the two rigorous ones.
    assert 0.8 * eps[3] < pld <= rdp < 1.6 * eps[3]


def test_epsilon_passes_accountant_options():
    schedule = _calibrate("vanilla", num_steps=200, sampling_probability=0.02)
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
    schedule = _calibrate("dynamic", num_steps=50)
    assert schedules.DPSchedule.from_json(schedule.to_json()) == schedule
    assert schedules.DPSchedule.from_config(schedule.get_config()) == schedule


def test_schedule_is_immutable():
    schedule = _calibrate("vanilla", num_steps=10)
    with pytest.raises(ValueError):
        schedule.clip_norms[0] = 5.0
    with pytest.raises(AttributeError):
        schedule.sampling_probability = 0.5


def test_sampling_from_epochs_matches_tf_privacy_convention():
    assert schedules.sampling_from_epochs(60000, 250, epochs=20) == (250 / 60000, 4800)
    assert schedules.sampling_from_epochs(60000, 256, epochs=60) == (256 / 60000, 14063)
    assert schedules.sampling_from_epochs(100, 10, steps=7) == (0.1, 7)


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
        _calibrate("dynamic", **override)


@pytest.mark.parametrize("method", schedules.BASELINES)
def test_calibrate_builds_the_baselines_with_noise_decay_rho_mu(method):
    schedule = _calibrate(method, epsilon=0.5, num_steps=50, rho_mu=1.25)
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
        _calibrate("tcdp", sampling_probability=0.5, num_steps=10)
    with pytest.raises(ValueError, match="`accountant` must be one of"):
        _calibrate("zcdp", accountant="zcdp")


def test_bad_method_and_schedule_arguments():
    with pytest.raises(ValueError, match="method"):
        _calibrate("adaptive")
    with pytest.raises(ValueError, match="clip_norms"):
        schedules.DPSchedule([1.0, -1.0], [1.0, 1.0], 0.1)
    with pytest.raises(ValueError, match="noise_stddevs"):
        schedules.DPSchedule([1.0, 1.0], [1.0], 0.1)
    with pytest.raises(ValueError, match="steps"):
        _calibrate("vanilla", num_steps=10).epsilon(DELTA, steps=11)
    with pytest.raises(ValueError, match="epochs"):
        schedules.sampling_from_epochs(100, 10)
    with pytest.raises(ValueError, match="batch_size"):
        schedules.sampling_from_epochs(100, 200, epochs=1)


@pytest.mark.parametrize("accountant", ["rdp", "pld"])
def test_rigorous_calibration_meets_target_without_overshoot(accountant):
    schedule = _calibrate("dynamic", epsilon=1.0, accountant=accountant, num_steps=100, sampling_probability=0.01)
    spent = schedule.epsilon(DELTA, accountant=accountant)
    assert 0.999 <= spent <= 1.0
    # The rigorous accountants charge more than the CLT, so the rigorous schedule is noisier than the paper's.
    paper = _calibrate("dynamic", epsilon=1.0, num_steps=100, sampling_probability=0.01)
    assert np.all(schedule.noise_stddevs > paper.noise_stddevs)
    np.testing.assert_allclose(
        schedule.noise_stddevs / paper.noise_stddevs, schedule.noise_stddevs[0] / paper.noise_stddevs[0], rtol=1e-9
    )


def test_rigorous_epsilons_match_dp_accounting_per_step():
    schedule = _calibrate("dynamic", num_steps=30, sampling_probability=0.05)
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


def test_calibration_metadata_round_trips_and_equality_ignores_it():
    schedule = _calibrate("dynamic", num_steps=30)
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


def test_gdp_clt_understatement_reports_the_pld_epsilon_of_the_same_schedule():
    paper = _short_paper_run()
    text = schedules.gdp_clt_understatement(paper)
    assert "epsilon = 1 (delta = 1e-05) under the GDP-CLT" in text and "PLD epsilon is 4.198, 4.20x the target" in text
    assert "accountant='pld'" in text
    # Within 5%: the paper's worked example (GDP-CLT 1.2, PLD 1.25) is not flagged.
    assert schedules.gdp_clt_understatement(_calibrate("vanilla")) is None
    rigorous = schedules.calibrate(
        "vanilla", target_epsilon=1.0, target_delta=DELTA, sampling_probability=0.01, num_steps=20, initial_clip=1.0
    )
    assert schedules.gdp_clt_understatement(rigorous) is None
    by_hand = schedules.DPSchedule(paper.clip_norms, paper.noise_stddevs, 0.01)
    assert schedules.gdp_clt_understatement(by_hand) is None


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


_BUDGET = dict(target_epsilon=2.0, target_delta=DELTA, num_examples=1000, batch_size=50, method="dynamic")


def test_privacy_budget_calibrates_the_schedule_calibrate_builds():
    budget = schedules.PrivacyBudget(**_BUDGET, initial_clip=1.5, epochs=2, rho_mu=1.25, rho_c=2.0, accountant="rdp")
    assert budget.sampling() == (0.05, 40)
    schedule = budget.calibrate()
    expected = schedules.calibrate(
        "dynamic",
        target_epsilon=2.0,
        target_delta=DELTA,
        sampling_probability=0.05,
        num_steps=40,
        initial_clip=1.5,
        rho_mu=1.25,
        rho_c=2.0,
        accountant="rdp",
    )
    assert schedule == expected and schedule.calibration == expected.calibration
    assert schedules.PrivacyBudget(**_BUDGET, initial_clip=1.5, steps=40).calibrate().calibration.accountant == "pld"


def test_privacy_budget_is_frozen_and_needs_its_budget():
    budget = schedules.PrivacyBudget(**_BUDGET, initial_clip=1.5, steps=40)
    with pytest.raises(AttributeError):
        budget.target_epsilon = 100.0
    with pytest.raises(TypeError, match="initial_clip"):
        schedules.PrivacyBudget(**_BUDGET, steps=40)
    with pytest.raises(TypeError):  # Keyword-only: a budget's numbers are not confused by position.
        schedules.PrivacyBudget(2.0, DELTA, 1000, 50, "vanilla", 1.0, 2)


@pytest.mark.parametrize(
    "change, match",
    [
        ({"steps": 40, "epochs": 1}, "Give exactly one of `epochs` and `steps`"),
        ({"steps": 40, "batch_size": 2000}, "`batch_size` must be <= num_examples=1000"),
        ({"steps": 0}, "`steps` must be"),
        ({"steps": 40, "method": "growing"}, "`method` must be one of"),
        ({"steps": 40, "rho_mu": 0.5}, "`rho_mu` must be"),
        ({"steps": 40, "initial_clip": 0.0}, "`initial_clip` must be"),
        ({"steps": 40, "accountant": "prv"}, "`accountant` must be one of"),
        ({"steps": 40, "target_epsilon": -1.0}, "`target_epsilon` must be"),
        ({"steps": 40, "target_delta": 1.0}, "`target_delta` must be"),
    ],
)
def test_privacy_budget_refuses_a_bad_argument_before_calibrating(monkeypatch, change, match):
    monkeypatch.setattr(schedules, "calibrate", lambda *args, **kwargs: pytest.fail("calibrated"))
    with pytest.raises(ValueError, match=match):
        schedules.PrivacyBudget(**{**_BUDGET, "initial_clip": 1.5, **change})


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


def test_a_budget_whose_delta_is_one_over_n_or_more_is_refused_before_calibrating():
    """The review's new user: target_delta=0.5 trained to the end and logged epsilon_pld 51.8."""
    budget = dict(target_epsilon=2.0, num_examples=40, batch_size=4, method="vanilla", initial_clip=1.0, steps=10)
    with pytest.raises(ValueError, match=r"`target_delta` must be below 1/N = 1/40 = 0.025 .*target_delta=0.5\."):
        schedules.PrivacyBudget(**budget, target_delta=0.5)
    schedules.PrivacyBudget(**budget, target_delta=1e-5)
