"""Tests for keras_dyndp.privacy_logger: the logger's logic with stand-ins for Keras, the model and a backend."""

import types

import numpy as np
import pytest

from keras_dyndp import optimizer_base
from keras_dyndp import privacy_logger
from keras_dyndp import schedules

SCHEDULE = schedules.DPSchedule(np.array([3.0, 2.0, 1.0, 0.5]), np.array([3.0, 3.0, 2.0, 2.0]), 0.05)


class _Step:
    def __init__(self, value):
        self.value = value

    def numpy(self):
        return np.int64(self.value)


class _Callback:
    def __init__(self):
        self.model = None


class _Logger(privacy_logger.PrivacyLoggerMixin, _Callback):
    """The mixin with a stand-in backend: epoch logs in a dict, scalars in a list."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.epoch_logs, self.scalars, self.hook_removed = {}, [], False

    def _dp_optimizer(self):
        return self.model.optimizer

    def _add_to_epoch_logs(self, batch_logs, values):
        self.epoch_logs.update(values)

    def _remove_epoch_logs_hook(self):
        self.hook_removed = True

    def _create_writer(self, directory):
        return types.SimpleNamespace(close=lambda: None, directory=directory)

    def _write_scalars(self, values, step):
        self.scalars.append((step, dict(values)))


class _Optimizer:
    """A DP optimizer's state as the logger reads it: schedule, step counter and recorded schedule fingerprint."""

    check_restored_schedule = optimizer_base.DPOptimizerBase.check_restored_schedule

    def __init__(self, steps_taken, fingerprint=SCHEDULE.fingerprint):
        self.schedule = self._schedule = SCHEDULE
        self.dp_step = _Step(steps_taken)
        self._schedule_fingerprint = types.SimpleNamespace(numpy=lambda: np.array(fingerprint, np.int32))


def _logger(steps_taken, fingerprint=SCHEDULE.fingerprint, **kwargs):
    logger = _Logger(delta=1e-5, **kwargs)
    optimizer = _Optimizer(steps_taken, fingerprint)
    logger.model = types.SimpleNamespace(optimizer=optimizer)
    logger.params = {"steps": 2}
    return logger


def test_values_are_the_accountants_for_the_steps_taken_and_the_last_steps_c_and_sigma():
    values = _logger(3).privacy_logs()
    assert values["epsilon_pld"] == pytest.approx(SCHEDULE.epsilon(1e-5, accountant="pld", steps=3))
    assert values["epsilon_gdp_clt"] == pytest.approx(SCHEDULE.epsilon(1e-5, accountant="gdp_clt", steps=3))
    assert (values["clip_norm"], values["noise_stddev"], values["dp_step"]) == (1.0, 2.0, 3.0)
    assert set(_logger(0, accountant="gdp_clt").privacy_logs()) == {
        "epsilon_gdp_clt",
        "clip_norm",
        "noise_stddev",
        "dp_step",
    }


def test_a_step_counter_of_another_schedule_is_never_accounted_under_this_one():
    other = schedules.DPSchedule(SCHEDULE.clip_norms, SCHEDULE.noise_stddevs * 100, 0.05)
    for fingerprint, match in [(other.fingerprint, "another DP schedule"), ((0, 0), "no schedule fingerprint")]:
        logger = _logger(3, fingerprint)
        with pytest.raises(RuntimeError, match=match):
            logger.on_train_begin()
        with pytest.raises(RuntimeError, match=match):
            logger.privacy_logs()
    _logger(0, (0, 0)).privacy_logs()  # before the first step nothing is recorded, nor spent


def test_the_epochs_last_batch_puts_the_values_into_the_epoch_logs_and_log_every_writes_scalars():
    logger = _logger(2, log_every=1)
    logger.on_train_begin()
    logger._writer = logger._create_writer("privacy")  # what log_dir does, without the tensorboard package
    logger.on_epoch_begin(0)
    logger.on_train_batch_end(0, {})  # not the epoch's last batch: nothing for the epoch yet
    assert logger.epoch_logs == {} and logger.scalars[-1][0] == 2  # but log_every=1 reports the step
    logger.on_train_batch_end(1, {})
    assert logger.epoch_logs["dp_step"] == 2.0
    logs = {}
    logger.on_epoch_end(0, logs)
    assert logs["epsilon_pld"] == pytest.approx(SCHEDULE.epsilon(1e-5, steps=2))
    logger.on_train_end()
    assert logger.hook_removed and logger._writer is None


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"log_every": 0}, ValueError, "`log_every` must be 'epoch' or an integer >= 1"),
        ({"log_every": True}, ValueError, "`log_every`"),
        ({"delta": 0.0}, ValueError, "delta"),
        ({"accountant": "moments"}, ValueError, "moments"),
    ],
)
def test_bad_arguments_are_refused(kwargs, error, message):
    with pytest.raises(error, match=message):
        _Logger(**{"delta": 1e-5, **kwargs})
