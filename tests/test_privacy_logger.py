"""Tests for keras_dyndp.privacy_logger: the logger's logic with stand-ins for Keras, the model and a backend."""

import types

import numpy as np
import pytest

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


def _logger(steps_taken, **kwargs):
    logger = _Logger(delta=1e-5, **kwargs)
    optimizer = types.SimpleNamespace(schedule=SCHEDULE, dp_step=_Step(steps_taken))
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
