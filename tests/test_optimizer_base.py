"""Tests for keras_dyndp.optimizer_base: the DP optimizers' arguments, checks and config, on no backend at all."""

import warnings

import numpy as np
import pytest

from keras_dyndp import optimizer_base
from keras_dyndp import schedules

BUDGET = dict(
    target_epsilon=2.0,
    target_delta=1e-5,
    num_examples=1000,
    batch_size=50,
    epochs=2,
    method="dynamic",
    initial_clip=1.5,
)


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


def test_microbatches_double_the_sensitivity_whatever_their_number():
    schedule = schedules.DPSchedule(np.ones(2), np.ones(2), 0.1)
    assert _Optimizer(schedule=schedule).sensitivity_in_clip_norms == 1.0
    for num_microbatches in (1, 7):
        assert _Optimizer(schedule=schedule, num_microbatches=num_microbatches).sensitivity_in_clip_norms == 2.0


def test_config_round_trip_keeps_schedule_and_private_train_step():
    schedule = schedules.DPSchedule(np.array([2.0, 1.0]), np.array([3.0, 1.5]), 0.1)
    optimizer = _Optimizer(schedule=schedule, expected_batch_size=7.0, rescale_to_unit_norm=True, noise_seed=4)
    optimizer._private_train_step = {"method": "auto", "training_metrics": False}
    config = optimizer.get_config()
    assert "noise_seed" not in config  # never serialised
    restored = _Optimizer.from_config(config)
    np.testing.assert_array_equal(restored.schedule.clip_norms, [2.0, 1.0])
    np.testing.assert_array_equal(restored.schedule.noise_stddevs, [3.0, 1.5])
    assert restored.expected_batch_size == 7.0 and restored.rescale_to_unit_norm
    assert restored._private_train_step == {"method": "auto", "training_metrics": False}
    assert restored.noise_seed_given is None


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({}, "Give either `schedule`"),
        ({**BUDGET, "schedule": schedules.DPSchedule(np.ones(2), np.ones(2), 0.1)}, "not both"),
        ({"target_epsilon": 1.0}, "needs target_delta, num_examples, batch_size, method, initial_clip"),
        ({**BUDGET, "num_microbatches": 0}, "`num_microbatches` must be None"),
        ({**BUDGET, "accumulation_steps": 0}, "`accumulation_steps` must be an integer >= 1"),
        ({**BUDGET, "accumulation_steps": 2, "num_microbatches": 4}, "Use one of them"),
        ({**BUDGET, "expected_batch_size": 10}, "`expected_batch_size` is `batch_size`"),
        ({**BUDGET, "rescale_to_unit_norm": 1}, "`rescale_to_unit_norm` must be True or False"),
        ({**BUDGET, "gradient_accumulation_steps": 2}, "do not support `gradient_accumulation_steps`"),
    ],
)
def test_bad_arguments_are_refused_naming_them(kwargs, message):
    with pytest.raises(ValueError, match=message):
        _Optimizer(**kwargs)


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


def test_gradient_guard_accepts_only_the_issued_gradients_once():
    guard = optimizer_base.GradientGuard()
    grads = [object(), object()]
    assert not guard.check_and_clear(grads)
    guard.issue(grads)
    assert not guard.check_and_clear([grads[0], object()])  # and the issue is spent
    guard.issue(grads)
    assert guard.check_and_clear(list(grads))
    assert not guard.check_and_clear(grads)
