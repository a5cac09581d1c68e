"""Which Keras model is training with a DP optimizer, and what its `fit` was given: read off the call stack.

A Keras optimizer is handed only ``(loss, var_list, tape)`` by ``Model.train_step``; it never sees the model or the
data. Yet two privacy checks need them before the first step: whether the model has layers that mix examples or
store batch statistics (`keras_dyndp.tf_backend.model_checks`), and whether the data is Poisson-sampled as the
accountants assume (`keras_dyndp.tf_backend.data`). While ``model.fit`` traces (or eagerly runs) its train step, both
are on the Python call stack: the ``train_step`` frame whose ``self`` is the model, and the ``fit`` frame below it with
its ``x``.

These functions only read frames; they never keep a reference to one (frames hold every local of a training
loop). In a custom training loop there is no such frame and they return None: the callers then say so.
"""

from __future__ import annotations

import inspect
import sys
import threading
from typing import Any

# Deep enough for Keras's fit -> tf.function tracing -> distribution -> train_step -> optimizer chain (~40 frames).
_MAX_FRAMES = 200


def _frames(frame=None):
    """The frames from `frame` down the stack; by default from the frame that iterates over them."""
    if frame is None:
        frame = inspect.currentframe()
        frame = frame.f_back if frame is not None else None
    try:
        for _ in range(_MAX_FRAMES):
            if frame is None:
                return
            yield frame
            frame = frame.f_back
    finally:
        del frame


def calling_model(optimizer: Any, model_class: type) -> Any:
    """The nearest model (an instance of `model_class`, the backend's ``keras.Model``) on the call stack whose
    ``optimizer`` is `optimizer`, or None. A model compiled under mixed precision holds `optimizer` inside a
    LossScaleOptimizer (its ``inner_optimizer``): it counts too."""
    for frame in _frames():
        candidate = frame.f_locals.get("self")
        if not isinstance(candidate, model_class):
            continue
        compiled = getattr(candidate, "optimizer", None)
        if compiled is not None and optimizer in (compiled, getattr(compiled, "inner_optimizer", compiled)):
            return candidate
    return None


class FitCall:
    """What `model.fit` received: ``x`` (a dataset, arrays, a generator, ...) and ``batch_size``."""

    def __init__(self, x: Any, batch_size: Any):
        self.x = x
        self.batch_size = batch_size


def _fit_call_in(frames, model: Any) -> FitCall | None:
    for frame in frames:
        if frame.f_code.co_name == "fit" and frame.f_locals.get("self") is model:
            return FitCall(frame.f_locals.get("x"), frame.f_locals.get("batch_size"))
    return None


def fit_call(model: Any) -> FitCall | None:
    """The arguments of the ``model.fit`` call on the stack, or None when `model` is not inside ``fit``.

    Under ``MirroredStrategy`` the train step of each replica is traced in a thread of its own, while ``fit`` waits
    in the thread that started them: when this thread's stack has no ``fit`` of `model`, the other threads' are read.
    """
    call = _fit_call_in(_frames(), model)
    if call is not None:
        return call
    current = threading.get_ident()
    for thread_id, frame in sys._current_frames().items():  # pylint: disable=protected-access
        try:
            if thread_id != current:
                call = _fit_call_in(_frames(frame), model)
                if call is not None:
                    return call
        finally:
            del frame
    return None
