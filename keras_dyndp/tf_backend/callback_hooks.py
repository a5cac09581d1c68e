"""What `keras_dyndp.callbacks` does its own way on TensorFlow: the steps per execution and the optimizer of Keras 2
or 3 (`keras_compat`), Keras's printing, and the TensorBoard summaries of ``PrivacyLogger(log_dir=...)``."""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import tensorflow as tf

from keras_dyndp.tf_backend import keras_compat

print_message = keras_compat.print_msg
steps_per_execution = keras_compat.steps_per_execution
set_steps_per_execution = keras_compat.set_steps_per_execution
unwrap_optimizer = keras_compat.unwrap_optimizer


def check_log_dir(directory: str) -> None:
    """Refuses a ``log_dir`` where the tensorboard package, which writes the summaries, is not installed."""
    if importlib.util.find_spec("tensorboard") is None:
        raise ImportError(
            "PrivacyLogger(log_dir=...) writes TensorBoard summaries, which needs the tensorboard package "
            f"(TensorFlow 2.16+ does not install it): pip install tensorboard. Received: log_dir={directory!r}."
        )


def create_writer(directory: str) -> Any:
    """The summary writer of ``<directory>/privacy``."""
    return tf.summary.create_file_writer(os.path.join(directory, "privacy"))


def write_scalars(writer: Any, values: dict[str, float], step: int) -> None:
    """Writes ``values`` as the scalars ``privacy/<key>`` at ``step`` and flushes."""
    with writer.as_default():
        for key, value in values.items():
            tf.summary.scalar(f"privacy/{key}", value, step=step)
    writer.flush()
