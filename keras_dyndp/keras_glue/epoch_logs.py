"""Values that join the epoch logs every callback's ``on_epoch_end`` receives, on every Keras and backend (keys a
callback adds in its ``on_epoch_end`` reach only the callbacks after it). Keras 3's ``fit`` builds the epoch logs with
``model._get_metrics_result_or_logs`` before them all, so `add` wraps that method on the instance."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# Keras 3's Trainer method that builds fit's epoch logs; Keras offers no public hook for them, so the instance's own
# attribute of that name (its __dict__ entry, read and written only here) replaces it.
_KERAS_METHOD = "_get_metrics_result_or_logs"


class _EpochLogsHook:
    """``model._get_metrics_result_or_logs`` plus the values waiting for the next epoch logs."""

    def __init__(self, original: Callable[[Any], dict], replaced: Callable[[Any], dict] | None):
        self.original = original
        self.replaced = replaced  # The instance's own attribute that this hook replaced, if any.
        self.pending: dict | None = None

    def __call__(self, logs):
        result = self.original(logs)
        if self.pending is not None:
            result = {**result, **self.pending}
            self.pending = None
        return result


def add(model: Any, values: dict[str, float], batch_logs: dict | None = None) -> None:
    """Makes ``values`` part of the next epoch logs ``fit`` builds for ``model`` (once). Keras 2 (no such method) copies
    the logs of the epoch's last batch into them: call it from that ``on_train_batch_end`` with its ``batch_logs``, in
    a callback with ``_supports_tf_logs = True`` (Keras 2 then passes the very dict it copies)."""
    if not hasattr(model, _KERAS_METHOD):
        if batch_logs is not None:
            batch_logs.update(values)
        return
    hook = vars(model).get(_KERAS_METHOD)
    if not isinstance(hook, _EpochLogsHook):
        hook = _EpochLogsHook(model._get_metrics_result_or_logs, replaced=hook)  # noqa: SLF001  (_KERAS_METHOD)
        _set_instance_hook(model, hook)
    hook.pending = dict(values)


def remove_hook(model: Any) -> None:
    """Removes what `add` installed on ``model`` (at the end of training)."""
    hook = vars(model).get(_KERAS_METHOD)
    if isinstance(hook, _EpochLogsHook):
        _set_instance_hook(model, hook.replaced)


def from_the_step(model: Any, on: bool) -> None:
    """Keras 3: whether (``on``) ``fit``'s epoch logs are the train step's own logs instead of ``model.metrics``'
    results (which fail when ``training_metrics=False`` never built them). Keras 2 uses the step's logs already."""
    if not hasattr(model, _KERAS_METHOD):
        return
    current = vars(model).get(_KERAS_METHOD)
    if on and current is None:
        _set_instance_hook(model, _logs_of_the_step)
    elif not on and current is _logs_of_the_step:
        _set_instance_hook(model, None)


def _logs_of_the_step(logs: dict) -> dict:
    return logs


def _set_instance_hook(model: Any, hook: Callable[[Any], dict] | None) -> None:
    """Replaces Keras 3's ``Trainer._get_metrics_result_or_logs`` on ``model`` by ``hook`` (None: Keras's again)."""
    if hook is not None:
        vars(model)[_KERAS_METHOD] = hook  # A plain callable: nothing for Keras's attribute tracking to record.
    else:
        vars(model).pop(_KERAS_METHOD, None)
