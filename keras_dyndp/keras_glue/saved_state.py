"""How a DP optimizer's state lies in a ``.keras`` / ``.weights.h5`` file (`SavedDPState`), on every backend. Keras
saves an optimizer's variables by position. The DP state that is not a slot of the base optimizer goes after the slots,
so a file's positions stay those of files saved before that state existed: the steps released (``released_steps``),
then, with adaptive clipping, the clip norm C_t it has reached (``adaptive_clip_norm``)."""

from __future__ import annotations

from keras_dyndp.core import step_checks


class SavedDPState:
    """The saving and loading of a DP optimizer's variables (a mixin of `keras_dyndp.optimizer_base.DPOptimizerBase`,
    which sets ``_released_steps``, ``_schedule_fingerprint`` and ``_adaptive_clip_norm``, None if not adaptive)."""

    _adaptive_clip_norm = None  # adaptive clipping's C_t, a variable the backend builds

    def _saved_last(self) -> list:
        """The variables a file holds after the others, in this order: the steps released, then C_t."""
        return [self._released_steps] + ([] if self._adaptive_clip_norm is None else [self._adaptive_clip_norm])

    def _saved_in_place(self) -> list:
        """The variables a file holds at their positions: all but `_saved_last`."""
        last = self._saved_last()
        return [variable for variable in self.variables if not any(variable is other for other in last)]

    def save_own_variables(self, store) -> None:
        """Keras's ``.keras`` / ``.weights.h5`` saving: `_saved_in_place`, then `_saved_last`."""
        in_place = self._saved_in_place()
        for i, variable in enumerate([*in_place, *self._saved_last()]):
            store[str(i)] = variable.numpy()

    def load_own_variables(self, store) -> None:
        """Keras's ``.keras`` / ``.weights.h5`` loading. With adaptive clipping, C_t is read from the file's last
        entry when it holds one (else it starts at C_0: a file saved without adaptive clipping). A file saved before
        keras_dyndp counted released steps (that variable fewer) loads with the counter standing for them
        (`step_checks.UNRECORDED_RELEASED`); one saved before the schedule fingerprint existed (both fewer), also with
        the fingerprint unrecorded, so a counter past 0 is refused until `record_schedule_fingerprint`. (Keras would
        skip every variable and restart the schedule at step 0.)"""
        in_place = self._saved_in_place()
        size = len(store.keys())  # the entries "0", "1", ... read here: C_t, the last, taken off
        if self._adaptive_clip_norm is not None and size == len(in_place) + 2:
            size -= 1
            self._adaptive_clip_norm.assign(store[str(size)])
        no_fingerprint = [variable for variable in in_place if variable is not self._schedule_fingerprint]
        for layout, with_released in ((in_place, True), (in_place, False), (no_fingerprint, False)):
            if size == len(layout) + with_released and all(
                tuple(store[str(i)].shape) == tuple(variable.shape) for i, variable in enumerate(layout)
            ):
                for i, variable in enumerate(layout):
                    variable.assign(store[str(i)])
                released = store[str(len(layout))] if with_released else step_checks.UNRECORDED_RELEASED
                self._released_steps.assign(released)
                if layout is no_fingerprint:
                    self._schedule_fingerprint.assign(list(step_checks.UNRECORDED_FINGERPRINT))
                return
        super().load_own_variables(store)
