"""Tests for keras_dyndp.schedules.budget: PrivacyBudget and the optimizers' choice between a schedule and a budget."""

import dataclasses

import pytest

from keras_dyndp import schedules
from keras_dyndp.schedules import budget
from keras_dyndp.schedules import calibration

_BUDGET = dict(target_epsilon=2.0, target_delta=1e-5, num_examples=1000, batch_size=50, method="dynamic")


def test_privacy_budget_calibrates_the_schedule_calibrate_builds():
    budget = schedules.PrivacyBudget(**_BUDGET, initial_clip=1.5, epochs=2, rho_mu=1.25, rho_c=2.0, accountant="rdp")
    assert budget.sampling() == (0.05, 40)
    schedule = budget.calibrate()
    expected = schedules.calibrate(
        "dynamic",
        target_epsilon=2.0,
        target_delta=1e-5,
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
        schedules.PrivacyBudget(2.0, 1e-5, 1000, 50, "vanilla", 1.0, 2)


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
    monkeypatch.setattr(calibration, "calibrate", lambda *args, **kwargs: pytest.fail("calibrated"))
    with pytest.raises(ValueError, match=match):
        schedules.PrivacyBudget(**{**_BUDGET, "initial_clip": 1.5, **change})


def test_a_budget_whose_delta_is_one_over_n_or_more_is_refused_before_calibrating():
    """The review's new user: target_delta=0.5 trained to the end and logged epsilon_pld 51.8."""
    budget = dict(target_epsilon=2.0, num_examples=40, batch_size=4, method="vanilla", initial_clip=1.0, steps=10)
    with pytest.raises(ValueError, match=r"`target_delta` must be below 1/N = 1/40 = 0.025 .*target_delta=0.5\."):
        schedules.PrivacyBudget(**budget, target_delta=0.5)
    schedules.PrivacyBudget(**budget, target_delta=1e-5)


def _budget_arguments(**given):
    return dict.fromkeys(budget.BUDGET_ARGUMENTS) | given


def test_a_privacy_budget_given_as_the_schedule_is_calibrated_as_the_budget_arguments_are():
    privacy_budget = schedules.PrivacyBudget(**_BUDGET, initial_clip=1.5, steps=40, rho_mu=1.25, rho_c=2.0)
    given = dataclasses.asdict(privacy_budget)
    from_arguments = budget.resolve_schedule(None, _budget_arguments(**given), None, False)
    from_budget = budget.resolve_schedule(privacy_budget, _budget_arguments(), None, False)
    assert from_budget == from_arguments == (privacy_budget.calibrate(), 50.0)
    assert budget.resolve_schedule(privacy_budget, _budget_arguments(), 50, False)[1] == 50.0


@pytest.mark.parametrize(
    "schedule_given, arguments, expected_batch_size, public, match",
    [
        ("budget", {"target_epsilon": 1.0}, None, False, "Give either `schedule` or the budget arguments, not both"),
        ("budget", {}, 10, False, r"`expected_batch_size` is `batch_size`.*expected_batch_size=10, batch_size=50"),
        ("budget", {}, None, True, "Leave public_batch_size out. Received: public_batch_size=True"),
        (None, {}, None, False, "Give either `schedule` \\(a DPSchedule or a PrivacyBudget\\) or the budget"),
        (None, {"target_epsilon": 1.0}, None, False, "needs target_delta, num_examples, batch_size, method"),
    ],
)
def test_a_schedule_and_a_budget_are_exclusive_and_a_budget_keeps_its_own_normaliser(
    monkeypatch, schedule_given, arguments, expected_batch_size, public, match
):
    privacy_budget = schedules.PrivacyBudget(**_BUDGET, initial_clip=1.5, steps=40)
    monkeypatch.setattr(calibration, "calibrate", lambda *args, **kwargs: pytest.fail("calibrated"))
    schedule = privacy_budget if schedule_given == "budget" else None
    with pytest.raises(ValueError, match=match):
        budget.resolve_schedule(schedule, _budget_arguments(**arguments), expected_batch_size, public)


def test_a_schedule_of_another_type_names_both_accepted_types():
    with pytest.raises(TypeError, match="`schedule` must be a keras_dyndp.schedules.DPSchedule or a .*PrivacyBudget"):
        budget.resolve_schedule({"target_epsilon": 1.0}, _budget_arguments(), None, False)
