"""The research trainers' tests calibrate many runs of the same schedule (mostly the digits task's defaults): while
a module of tests/research runs, `schedules.calibrate` answers each distinct calibration it solved before in this
pytest process from a cache (it is deterministic and its `DPSchedule` immutable), saving about 1 s of accounting
per run on the comparison stack. Other modules call it uncached."""

import functools

import pytest

from keras_dyndp import schedules

_CALIBRATE_ONCE = functools.cache(schedules.calibrate)


@pytest.fixture(name="calibrate_each_schedule_once", autouse=True, scope="module")
def fixture_calibrate_each_schedule_once():
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(schedules, "calibrate", _CALIBRATE_ONCE)
        yield _CALIBRATE_ONCE
