"""Checkpoints of a research run under ``<model_dir>``: saved every epoch, numbered by the DP step counter, and
restored only into a run of the same task, method, schedule and clipping (fixed or adaptive): another would void the
accounting."""

from __future__ import annotations

import dataclasses
import json
import os

import tensorflow as tf

from keras_dyndp import schedules
from keras_dyndp.tf_backend.keras_compat import keras
from research import run_config


def checkpoint_step(model_dir: str | None) -> int:
    """The step of the latest checkpoint under `model_dir` (its number, see `SaveCheckpoint`); 0 if none."""
    latest = None if model_dir is None else tf.train.latest_checkpoint(os.path.join(model_dir, "checkpoints"))
    return 0 if latest is None else int(latest.rsplit("-", 1)[1])


class SaveCheckpoint(keras.callbacks.Callback):
    """Saves model + optimizer at every epoch end and at the end of training, numbered by the step counter."""

    def __init__(self, manager: tf.train.CheckpointManager, counter: tf.Variable):
        super().__init__()
        self._manager = manager
        self._counter = counter
        self._saved_step: int | None = None

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self.on_train_end()

    def on_train_end(self, logs: dict | None = None) -> None:
        step = int(self._counter.numpy())
        if step != self._saved_step:  # Training that ends at an epoch end saves that step once.
            self._manager.save(checkpoint_number=step)
            self._saved_step = step


def restore_or_start(
    model_dir: str,
    task_name: str,
    config: run_config.RunConfig,
    schedule: schedules.DPSchedule | None,
    checkpoint: tf.train.Checkpoint,
) -> tf.train.CheckpointManager:
    """Restores the latest checkpoint of `model_dir` after checking it belongs to the same schedule.

    A new `model_dir` gets `run_config.json` (the config and the schedule) for later checks.

    Raises:
      FlagError: if `model_dir` holds a run of another task, method, schedule or clipping (fixed or adaptive).
    """
    os.makedirs(model_dir, exist_ok=True)
    manager = tf.train.CheckpointManager(checkpoint, os.path.join(model_dir, "checkpoints"), max_to_keep=2)
    saved_path = os.path.join(model_dir, "run_config.json")
    if os.path.exists(saved_path):
        with open(saved_path) as handle:
            saved = json.load(handle)
        if (saved.get("task"), saved.get("method")) != (task_name, config.method):
            raise run_config.FlagError(
                f"--model_dir={model_dir} holds a {saved.get('task')} run with --method={saved.get('method')}, "
                f"not {task_name} with --method={config.method}; use another --model_dir."
            )
        saved_adaptive = bool(saved.get("flags", {}).get("adaptive_clipping", False))
        if saved_adaptive != config.adaptive_clipping:
            raise run_config.FlagError(
                f"--model_dir={model_dir} holds a run with --adaptive_clipping={saved_adaptive}, not "
                f"{config.adaptive_clipping}: its clip norms are another mechanism's. Use another --model_dir."
            )
        if schedule is not None and schedules.DPSchedule.from_config(saved["schedule"]) != schedule:
            raise run_config.FlagError(
                f"--model_dir={model_dir} holds a run with a different DP schedule "
                f"({schedules.DPSchedule.from_config(saved['schedule'])!r}) than these flags give ({schedule!r}); "
                "resuming would continue its step counter on another schedule and void the accounting. Rerun "
                "with the original flags or use another --model_dir."
            )
    else:
        with open(saved_path, "w") as handle:
            saved = {
                "task": task_name,
                "method": config.method,
                "schedule": None if schedule is None else schedule.get_config(),
                "flags": dataclasses.asdict(config),
            }
            json.dump(saved, handle, indent=1)
    if manager.latest_checkpoint:
        checkpoint.restore(manager.latest_checkpoint).assert_existing_objects_matched()
    return manager
