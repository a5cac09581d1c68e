"""The Keras model training with a DP optimizer, found on the current thread's call stack, since Keras hands an
optimizer only ``(loss, var_list, tape)`` or gradients: to restore ``make_private`` on a reloaded model, refuse
Keras's own train step and check the model of a custom one. It reads no data and keeps no frame; in a custom training
loop it finds None.
"""

from __future__ import annotations

import inspect
from typing import Any

# Deep enough for Keras's fit -> tf.function tracing -> distribution -> train_step -> optimizer chain (~40 frames).
_MAX_FRAMES = 200


def calling_model(optimizer: Any, model_class: type, caller: str | None = None) -> Any:
    """The nearest ``model_class`` instance on the call stack whose ``optimizer`` (or its ``inner_optimizer``, under
    mixed precision) is `optimizer`, or None; with `caller`, found in a frame of a method of that name only."""
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
