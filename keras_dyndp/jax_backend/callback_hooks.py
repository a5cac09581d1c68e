"""What `keras_dyndp.callbacks` does its own way on JAX: the steps per execution of Keras 3's JAX loop, the optimizer
inside a loss-scale wrapper, printing, and no TensorBoard writer (TensorFlow writes the summaries)."""

from __future__ import annotations

import functools
from typing import Any

import keras

print_message = functools.partial(print, flush=True)


def steps_per_execution(model: Any) -> int | None:
    """The steps the model's train function runs per call; None before ``compile``."""
    return int(model.steps_per_execution) if getattr(model, "compiled", False) else None


def set_steps_per_execution(model: Any, steps: int) -> None:
    """Sets the steps per call of the train function (Keras 3's JAX loop reads it at every call)."""
    model.steps_per_execution = steps


def unwrap_optimizer(optimizer: Any) -> Any:
    """The optimizer inside a ``LossScaleOptimizer``, or ``optimizer`` itself."""
    return optimizer.inner_optimizer if isinstance(optimizer, keras.optimizers.LossScaleOptimizer) else optimizer


def check_log_dir(directory: str) -> None:
    """Refuses ``PrivacyLogger(log_dir=...)``: its summaries are TensorFlow's."""
    raise ValueError(
        "PrivacyLogger(log_dir=...) writes TensorBoard summaries with TensorFlow, which the JAX backend does not "
        "use: leave log_dir None. The values are in History and in every callback's epoch logs, so "
        "keras.callbacks.TensorBoard(log_dir) (it needs the tensorflow package installed) writes them, wherever "
        f"it stands in the callbacks. Received: log_dir={directory!r}."
    )


def create_writer(directory: str) -> Any:
    """Never called: `check_log_dir` refuses every ``log_dir``."""
    raise NotImplementedError(directory)


def write_scalars(writer: Any, values: dict[str, float], step: int) -> None:
    """Never called: `check_log_dir` refuses every ``log_dir``."""
    raise NotImplementedError(writer, values, step)
