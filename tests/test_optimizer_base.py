"""Tests for keras_dyndp.optimizer_base: the DP optimizers' arguments, checks and config, on no backend at all."""

import warnings

import numpy as np
import pytest

from keras_dyndp import optimizer_base
from keras_dyndp import schedules
from keras_dyndp.core import step_checks
from keras_dyndp.keras_glue import private_model

BUDGET = dict(
    target_epsilon=2.0,
    target_delta=1e-5,
    num_examples=1000,
    batch_size=50,
    epochs=2,
    method="dynamic",
    initial_clip=1.5,
)


SCHEDULE = schedules.DPSchedule(np.ones(2), np.ones(2), 0.1)


class _Base:
    """Stands in for a Keras optimizer: keyword arguments and a config."""

    def __init__(self, name=None, learning_rate=0.1, gradient_accumulation_steps=None):
        self.name, self.learning_rate = name, learning_rate
        del gradient_accumulation_steps

    def get_config(self):
        return {"name": self.name, "learning_rate": self.learning_rate}

    @classmethod
    def from_config(cls, config, custom_objects=None):
        del custom_objects
        return cls(**config)


class _Optimizer(optimizer_base.DPOptimizerBase, _Base):
    def _build_dp_state(self, noise_seed):
        self.noise_seed_given = noise_seed


def test_budget_arguments_calibrate_under_pld_to_the_target():
    optimizer = _Optimizer(**BUDGET, rho_mu=1.25, rho_c=2.0, learning_rate=0.5)
    schedule = optimizer.schedule
    assert schedule.num_steps == 40 and schedule.sampling_probability == pytest.approx(0.05)
    np.testing.assert_allclose(schedule.clip_norms, 1.5 * 2.0 ** (-np.arange(1, 41) / 40))  # C_0 rho_c^(-(k+1)/T)
    epsilon = schedule.epsilon(1e-5, accountant="pld")
    assert 1.95 < epsilon <= 2.0
    assert optimizer.expected_batch_size == 50.0 and optimizer.learning_rate == 0.5
    assert optimizer.name == "_Optimizer" and optimizer.noise_seed_given is None


def test_a_privacy_budget_as_the_schedule_trains_as_its_budget_arguments_do_and_round_trips():
    budget = schedules.PrivacyBudget(**BUDGET, rho_mu=1.25, rho_c=2.0)
    optimizer = _Optimizer(schedule=budget)
    assert optimizer.schedule == _Optimizer(**BUDGET, rho_mu=1.25, rho_c=2.0).schedule == budget.calibrate()
    assert optimizer.expected_batch_size == 50.0
    restored = _Optimizer.from_config(optimizer.get_config())
    assert restored.schedule == optimizer.schedule and restored.expected_batch_size == 50.0


def test_config_round_trip_keeps_schedule_and_private_train_step():
    schedule = schedules.DPSchedule(np.array([2.0, 1.0]), np.array([3.0, 1.5]), 0.1)
    optimizer = _Optimizer(schedule=schedule, expected_batch_size=7.0, rescale_to_unit_norm=True, noise_seed=4)
    optimizer.private_config = private_model.PrivateConfig("auto", training_metrics=False)
    config = optimizer.get_config()
    assert "noise_seed" not in config  # never serialised
    restored = _Optimizer.from_config(config)
    np.testing.assert_array_equal(restored.schedule.clip_norms, [2.0, 1.0])
    np.testing.assert_array_equal(restored.schedule.noise_stddevs, [3.0, 1.5])
    assert restored.expected_batch_size == 7.0 and restored.rescale_to_unit_norm and not restored.public_batch_size
    assert restored.private_config == private_model.PrivateConfig("auto", training_metrics=False)
    assert config["private_train_step"] == {"method": "auto", "training_metrics": False}
    assert restored.noise_seed_given is None


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({}, "Give either `schedule`"),
        ({**BUDGET, "schedule": schedules.DPSchedule(np.ones(2), np.ones(2), 0.1)}, "not both"),
        ({"target_epsilon": 1.0}, "needs target_delta, num_examples, batch_size, method, initial_clip"),
        (
            {k: v for k, v in BUDGET.items() if k not in ("method", "initial_clip")},
            r"needs method, initial_clip as well: pass e.g. method='vanilla' \(one of vanilla, growing_mu, .*\), "
            r"initial_clip=1.0 \(C_0, the clip norm of the first step\)",
        ),
        ({**BUDGET, "num_microbatches": 0}, "`num_microbatches` must be None"),
        ({**BUDGET, "accumulation_steps": 0}, "`accumulation_steps` must be an integer >= 1"),
        ({**BUDGET, "accumulation_steps": 2, "num_microbatches": 4}, "Use one of them"),
        ({**BUDGET, "expected_batch_size": 10}, "`expected_batch_size` is `batch_size`"),
        ({**BUDGET, "public_batch_size": True}, "sizes are private.*Leave public_batch_size out"),
        ({"schedule": SCHEDULE, "public_batch_size": 1}, "`public_batch_size` must be True or False"),
        ({"schedule": SCHEDULE, "expected_batch_size": 5, "public_batch_size": True}, "not both"),
        ({"schedule": SCHEDULE, "expected_batch_size": 0}, "`expected_batch_size` must be a finite number > 0"),
        ({**BUDGET, "rescale_to_unit_norm": 1}, "`rescale_to_unit_norm` must be True or False"),
        ({**BUDGET, "gradient_accumulation_steps": 2}, "do not support `gradient_accumulation_steps`"),
    ],
)
def test_bad_arguments_are_refused_naming_them(kwargs, message):
    with pytest.raises(ValueError, match=message):
        _Optimizer(**kwargs)


def test_a_schedule_without_a_normaliser_is_refused_unless_the_batch_sizes_are_stated_public():
    """The normaliser never follows the data: p N (given, or the budget's batch_size), or rows stated public."""
    with pytest.raises(ValueError, match=r"needs `expected_batch_size` = p\*N \(here p\*N = 0.1 \* the number"):
        _Optimizer(schedule=SCHEDULE)
    with pytest.raises(ValueError, match="needs `expected_batch_size`"):
        _Optimizer(schedule=SCHEDULE, num_microbatches=4)  # The batch-size check needs N here too.
    public = _Optimizer(schedule=SCHEDULE, public_batch_size=True)
    assert public.expected_batch_size is None and public.normalises_by_rows
    restored = _Optimizer.from_config(public.get_config())
    assert restored.public_batch_size and restored.expected_batch_size is None
    assert not _Optimizer(schedule=SCHEDULE, public_batch_size=True, num_microbatches=2).normalises_by_rows
    budget = _Optimizer(**BUDGET)
    assert budget.expected_batch_size == 50.0 and not budget.public_batch_size and not budget.normalises_by_rows


def test_a_target_delta_of_one_over_n_or_more_is_refused_at_construction():
    with pytest.raises(ValueError, match=r"`target_delta` must be below 1/N = 1/1000 = 0.001 .*target_delta=0.5\."):
        _Optimizer(**{**BUDGET, "target_delta": 0.5})
    calibrated = schedules.calibrate(
        "vanilla", target_epsilon=2.0, target_delta=0.05, sampling_probability=0.1, num_steps=4, initial_clip=1.0
    )  # calibrate knows p, not N
    # N = expected_batch_size / p = 40: the schedule's target delta 0.05 is above 1/40.
    with pytest.raises(ValueError, match=r"`schedule.calibration.target_delta` must be below 1/N = 1/40 = 0.025"):
        _Optimizer(schedule=calibrated, expected_batch_size=4)
    _Optimizer(schedule=calibrated, expected_batch_size=1)  # N = 10: 0.05 is below 1/10
    _Optimizer(schedule=calibrated, public_batch_size=True)  # N unknown


def test_a_schedule_of_another_type_is_refused():
    with pytest.raises(TypeError, match="`schedule` must be a keras_dyndp.schedules.DPSchedule"):
        _Optimizer(schedule=[1.0, 2.0])


def test_gdp_clt_understatement_warning_points_at_the_caller():
    budget = {**BUDGET, "accountant": "gdp_clt", "epochs": None, "steps": 3, "batch_size": 500}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _Optimizer(**budget)
    understatements = [w for w in caught if issubclass(w.category, schedules.GdpCltUnderstatementWarning)]
    assert len(understatements) == 1 and understatements[0].filename == __file__


def test_noise_outside_the_accountants_range_is_refused_at_construction_unless_allowed():
    degenerate = schedules.DPSchedule(np.ones(3), np.array([1.0, 0.0, 1.0]), 0.1)
    with pytest.raises(ValueError, match=r"`schedule`: the noise multiplier .* of step 1 .* is 0; .*\[0.0001, 10000\]"):
        _Optimizer(schedule=degenerate, expected_batch_size=5)
    with pytest.raises(ValueError, match="`allow_degenerate_noise` must be True or False"):
        _Optimizer(schedule=degenerate, expected_batch_size=5, allow_degenerate_noise=1)
    with pytest.warns(optimizer_base.DegenerateNoiseWarning, match="no meaningful differential privacy") as caught:
        allowed = _Optimizer(schedule=degenerate, expected_batch_size=5, allow_degenerate_noise=True)
    assert caught[0].filename == __file__  # attributed to the constructor's caller
    with pytest.warns(optimizer_base.DegenerateNoiseWarning):  # Rebuilt from its config, it warns again.
        assert _Optimizer.from_config(allowed.get_config()).get_config()["allow_degenerate_noise"] is True
    _Optimizer(schedule=SCHEDULE, expected_batch_size=5)  # z = 1: accepted, no warning


def test_a_step_counter_runs_only_under_the_schedule_its_fingerprint_records():
    other = schedules.DPSchedule(np.ones(2), np.full(2, 0.01), 0.1)
    refusal = step_checks.restored_schedule_refusal
    for recorded in (SCHEDULE.fingerprint, other.fingerprint, step_checks.UNRECORDED_FINGERPRINT):
        assert refusal(0, recorded, SCHEDULE) is None  # step 0: nothing spent yet
    assert refusal(5, SCHEDULE.fingerprint, SCHEDULE) is None
    assert "another DP schedule" in refusal(5, other.fingerprint, SCHEDULE)
    assert refusal(5, other.fingerprint, SCHEDULE).endswith("Steps taken (dp_step): 5.")
    assert "no schedule fingerprint was saved" in refusal(5, step_checks.UNRECORDED_FINGERPRINT, SCHEDULE)
