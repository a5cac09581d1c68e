"""The warning of a schedule that starts over: a model that took DP steps under one DP optimizer and trains under
another at step 0 (restored with it, or trained in this process), whose epsilon leaves those steps out."""

from __future__ import annotations

import warnings
import weakref
from typing import Any


class ScheduleRestartWarning(UserWarning):
    """A model that took DP steps under one DP optimizer trains under another, whose schedule starts at step 0."""


_DP_STEP_OF_MODEL: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""Per model, the ``dp_step`` of the DP optimizer it was last built with (only the counter: the slots are freed)."""


def warn_on_schedule_restart(model: Any, optimizer: Any) -> None:
    """Warns when ``optimizer``, at step 0, replaces a DP optimizer that took steps on ``model`` (restored with it,
    or trained in this process): the new schedule starts over, and its epsilon leaves out the earlier steps."""
    previous = _DP_STEP_OF_MODEL.get(model)
    _DP_STEP_OF_MODEL[model] = optimizer.dp_step
    if previous is None or previous is optimizer.dp_step:
        return
    steps = int(previous.numpy())
    if steps == 0 or int(optimizer.dp_step.numpy()) != 0:
        return
    warnings.warn(
        f"Model {model.name!r} took {steps} DP steps under its previous DP optimizer (restored by load_model or a "
        f"checkpoint, or trained in this process) and now trains under a new {type(optimizer).__name__} at "
        f"dp_step 0: its schedule starts over, and the epsilon it reports leaves out those {steps} steps, whose "
        "budget was spent on the same data (the two runs' epsilons add up). To resume, keep the restored "
        "optimizer (load_model restores it with its counter: do not compile the model again) or restore the "
        "counter into this one from a checkpoint; to train a second run on purpose, account for both runs.",
        ScheduleRestartWarning,
        stacklevel=3,
    )
