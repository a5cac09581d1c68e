"""Tests for keras_dyndp.keras_glue.restarts: the warning of a schedule that starts over, on no backend at all."""

import types
import warnings

import numpy as np
import pytest

from keras_dyndp.keras_glue import restarts


class _Counter:
    """Stands in for an optimizer's ``dp_step`` variable."""

    def __init__(self, value):
        self.value = value

    def numpy(self):
        return np.int64(self.value)


def _optimizer(steps):
    return types.SimpleNamespace(dp_step=_Counter(steps))


class _Model:
    name = "model"


def test_a_new_optimizer_at_step_zero_after_steps_taken_on_the_model_warns_with_the_steps():
    model, first = _Model(), _optimizer(3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        restarts.warn_on_schedule_restart(model, first)  # the model's first DP optimizer
        restarts.warn_on_schedule_restart(model, first)  # built again: the same counter
    with pytest.warns(restarts.ScheduleRestartWarning, match="took 3 DP steps .* starts over"):
        restarts.warn_on_schedule_restart(model, _optimizer(0))


@pytest.mark.parametrize("previous_steps, new_steps", [(0, 0), (3, 2)])
def test_no_warning_when_no_step_was_taken_or_the_new_optimizer_resumes(previous_steps, new_steps):
    model = _Model()
    restarts.warn_on_schedule_restart(model, _optimizer(previous_steps))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        restarts.warn_on_schedule_restart(model, _optimizer(new_steps))
