"""Tests of keras_dyndp.keras_glue.saved_state: the DP state's place in a saved file, with adaptive clipping and in
files saved before the steps released or the schedule fingerprint existed (numpy stand-ins for the variables)."""

import numpy as np
import pytest

from keras_dyndp.core import step_checks
from keras_dyndp.keras_glue.saved_state import SavedDPState


class _Variable:
    def __init__(self, value):
        self.value = np.asarray(value)

    @property
    def shape(self):
        return self.value.shape

    def numpy(self):
        return self.value

    def assign(self, value):
        self.value = np.asarray(value)


class _Optimizer(SavedDPState):
    """iterations, fingerprint, a slot, the steps released (and C_t): the layout of a built DP optimizer."""

    def __init__(self, adaptive: bool):
        self._schedule_fingerprint = _Variable([0, 0])
        self._released_steps = _Variable(0)
        self.iterations, self.slot = _Variable(0), _Variable(np.zeros(3))
        self._adaptive_clip_norm = _Variable(1.0) if adaptive else None
        own = [] if self._adaptive_clip_norm is None else [self._adaptive_clip_norm]
        self.variables = [self.iterations, self._schedule_fingerprint, self._released_steps, *own, self.slot]


def _saved(adaptive: bool) -> dict:
    optimizer = _Optimizer(adaptive)
    optimizer.iterations.assign(7)
    optimizer._schedule_fingerprint.assign([3, 5])
    optimizer._released_steps.assign(7)
    optimizer.slot.assign([1.0, 2.0, 3.0])
    if adaptive:
        optimizer._adaptive_clip_norm.assign(0.25)
    store = {}
    optimizer.save_own_variables(store)
    return store


def test_the_steps_released_then_the_clip_norm_go_after_the_slots():
    store = _saved(adaptive=True)
    assert [float(np.sum(store[str(i)])) for i in range(len(store))] == [7.0, 8.0, 6.0, 7.0, 0.25]


@pytest.mark.parametrize("adaptive", [False, True])
def test_a_saved_optimizer_loads_back_whole(adaptive):
    loaded = _Optimizer(adaptive)
    loaded.load_own_variables(_saved(adaptive))
    assert int(loaded.iterations.value) == int(loaded._released_steps.value) == 7
    np.testing.assert_array_equal(loaded.slot.value, [1.0, 2.0, 3.0])
    assert not adaptive or float(loaded._adaptive_clip_norm.value) == 0.25


def test_a_file_saved_without_adaptive_clipping_leaves_c_0():
    loaded = _Optimizer(adaptive=True)
    loaded.load_own_variables(_saved(adaptive=False))
    assert float(loaded._adaptive_clip_norm.value) == 1.0 and int(loaded._released_steps.value) == 7


def test_a_file_from_before_the_fingerprint_and_the_steps_released_loads_them_unrecorded():
    store = _saved(adaptive=False)
    old = {"0": store["0"], "1": store["2"]}  # iterations and the slot only
    loaded = _Optimizer(adaptive=False)
    loaded.load_own_variables(old)
    assert int(loaded._released_steps.value) == step_checks.UNRECORDED_RELEASED
    assert tuple(loaded._schedule_fingerprint.value) == step_checks.UNRECORDED_FINGERPRINT
    np.testing.assert_array_equal(loaded.slot.value, [1.0, 2.0, 3.0])
