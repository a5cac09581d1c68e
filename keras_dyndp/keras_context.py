"""The Keras model training with a DP optimizer, found on the current thread's call stack: for the cases where
Keras hands the optimizer no model.

A Keras optimizer receives only ``(loss, var_list, tape)`` or gradients. `calling_model` finds the model whose train
step (or ``load_model``'s ``compile_from_config``) is calling it: the optimizer's ``build`` restores
``make_private`` on a reloaded model, and a DP optimizer refuses Keras's own train step, naming ``make_private``, and
checks the model of a custom one. It reads no data: ``make_private``'s ``fit`` hands its ``x`` to the checks.

It only reads frames of the current thread and keeps no reference to one. In a custom training loop there is no such
frame: it returns None and the callers say so.
"""

from __future__ import annotations

import inspect
from typing import Any

# Deep enough for Keras's fit -> tf.function tracing -> distribution -> train_step -> optimizer chain (~40 frames).
_MAX_FRAMES = 200


def calling_model(optimizer: Any, model_class: type, caller: str | None = None) -> Any:
    """The nearest model (an instance of `model_class`, the backend's ``keras.Model``) on the call stack whose
    ``optimizer`` is `optimizer`, or None; with `caller`, found in a frame of a method of that name only. A model
    compiled under mixed precision holds `optimizer` inside a LossScaleOptimizer (its ``inner_optimizer``): it counts
    too."""
    frame = inspect.currentframe()
    try:
        for _ in range(_MAX_FRAMES):
            frame = frame.f_back if frame is not None else None
            if frame is None:
                return None
            candidate = frame.f_locals.get("self")
            if not isinstance(candidate, model_class) or caller not in (None, frame.f_code.co_name):
                continue
            compiled = getattr(candidate, "optimizer", None)
            if compiled is not None and optimizer in (compiled, getattr(compiled, "inner_optimizer", compiled)):
                return candidate
        return None
    finally:
        del frame
