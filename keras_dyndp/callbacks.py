"""Keras callbacks that report the privacy spent so far and stop training when the budget is used up.

Both callbacks read two attributes of the model's keras_dyndp DP optimizer (a `DynamicDPOptimizerMixin`):
``optimizer.schedule`` (the `keras_dyndp.schedules.DPSchedule` of T steps) and ``optimizer.dp_step`` (int64
variable, the number of DP steps already taken). Accounting itself is `DPSchedule.epsilon`; nothing is re-derived here.

* `PrivacyLogger` writes the epsilon of the steps taken so far, and the clip norm and noise std of the last step,
  into the epoch ``logs``, so they land in ``History.history``, TensorBoard, CSVLogger and the progress bar's
  epoch line, wherever it stands in the ``callbacks`` list (see its docstring). With ``log_dir`` it also writes
  TensorBoard scalars itself (x axis: DP steps).
* `BudgetStop` sets ``model.stop_training`` once ``dp_step`` reaches T (shortening the last call of a
  ``steps_per_execution`` loop to end exactly there), so ``fit`` ends gracefully instead of hitting the
  optimizer's in-graph guard, and refuses to start training on a spent schedule.
"""

import tensorflow as tf

from keras_dyndp import keras_compat
from keras_dyndp import optimizer_base
from keras_dyndp import privacy_logger
from keras_dyndp.optimizers.dp_optimizer import DynamicDPOptimizerMixin


def _dp_optimizer(model: keras_compat.keras.Model | None, caller: str) -> DynamicDPOptimizerMixin:
    """The model's optimizer (inside a mixed precision LossScaleOptimizer), checked to be a keras_dyndp one."""
    optimizer = keras_compat.unwrap_optimizer(getattr(model, "optimizer", None))
    if not isinstance(optimizer, DynamicDPOptimizerMixin):
        received = "no optimizer" if optimizer is None else type(optimizer).__name__
        raise ValueError(
            f"{caller} needs a keras_dyndp DP optimizer (with `schedule` and `dp_step`), e.g. "
            f"keras_dyndp.optimizers.DynamicDPKerasSGD; got {received}."
        )
    return optimizer


def _steps_taken(optimizer: DynamicDPOptimizerMixin) -> int:
    return int(optimizer.dp_step.numpy())


class PrivacyLogger(privacy_logger.PrivacyLoggerMixin, keras_compat.keras.callbacks.Callback):
    __doc__ = privacy_logger.PrivacyLoggerMixin.__doc__

    def _dp_optimizer(self) -> DynamicDPOptimizerMixin:
        return _dp_optimizer(self.model, type(self).__name__)

    def _add_to_epoch_logs(self, batch_logs: dict | None, values: dict[str, float]) -> None:
        keras_compat.add_to_epoch_logs(self.model, batch_logs, values)

    def _remove_epoch_logs_hook(self) -> None:
        keras_compat.remove_epoch_logs_hook(self.model)

    def _create_writer(self, directory: str) -> tf.summary.SummaryWriter:
        return tf.summary.create_file_writer(directory)

    def _write_scalars(self, values: dict[str, float], step: int) -> None:
        with self._writer.as_default():
            for key, value in values.items():
                tf.summary.scalar(f"privacy/{key}", value, step=step)
        self._writer.flush()


class BudgetStop(keras_compat.keras.callbacks.Callback):
    """Stops ``fit`` exactly when the optimizer has taken all T steps of its schedule (the budget is spent).

    Checked after every batch. With ``steps_per_execution`` = k > 1, Keras runs k steps per call and the callbacks
    see only every k-th step; when fewer than k steps of the budget remain, the next call would run past T into the
    optimizer's in-graph guard and ``fit`` would end in an InvalidArgumentError, losing the epoch's History and
    epsilon. So before each call the callback shortens that call to the remaining steps (Keras's
    ``steps_per_execution`` variable, restored at the end of training), and ``fit`` ends gracefully at T, printing one
    line after the progress bar (unless ``verbose=0``). Training on an already spent schedule is refused at ``fit``
    start.
    """

    def __init__(self):
        super().__init__()
        self.stopped_at_step: int | None = None
        self._steps_per_execution: int | None = None  # Keras's value, while this callback has shortened it.

    def _spent(self) -> tuple[bool, int, int]:
        optimizer = _dp_optimizer(self.model, type(self).__name__)
        steps, total = _steps_taken(optimizer), optimizer.schedule.num_steps
        return steps >= total, steps, total

    def on_train_begin(self, logs: dict | None = None) -> None:
        spent, steps, total = self._spent()
        if spent:
            raise RuntimeError(
                f"BudgetStop: the privacy budget is already spent: the optimizer has taken "
                f"{steps} of the schedule's {total} DP steps. Training more would exceed the "
                "accounted budget; build a new schedule (and a new optimizer) to continue."
            )

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        steps_per_execution = keras_compat.steps_per_execution(self.model)
        if steps_per_execution is None:
            return
        _, steps, total = self._spent()
        if total - steps < steps_per_execution:
            if self._steps_per_execution is None:
                self._steps_per_execution = steps_per_execution
            keras_compat.set_steps_per_execution(self.model, max(total - steps, 1))

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        spent, steps, total = self._spent()
        if spent and not self.model.stop_training:
            self.model.stop_training = True
            self.stopped_at_step = steps

    def on_train_end(self, logs: dict | None = None) -> None:
        _, steps, total = self._spent()
        if self.stopped_at_step == steps and (self.params or {}).get("verbose", 1):
            keras_compat.print_msg(optimizer_base.budget_spent_line(steps, total))
        if self._steps_per_execution is not None:
            keras_compat.set_steps_per_execution(self.model, self._steps_per_execution)
            self._steps_per_execution = None
