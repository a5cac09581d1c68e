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

import importlib.util
import os
from collections.abc import Mapping
from typing import Any

import tensorflow as tf
from absl import logging

from keras_dyndp import keras_compat
from keras_dyndp import validation
from keras_dyndp.accounting import registry
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


class PrivacyLogger(keras_compat.keras.callbacks.Callback):
    """Logs epsilon spent so far (GDP-CLT and a rigorous accountant), C_t and sigma_t at each epoch end.

    Keys written into the epoch ``logs`` (hence ``History.history``):
    ``'epsilon_gdp_clt'``, ``'epsilon_<accountant>'`` (unless ``accountant='gdp_clt'``), ``'clip_norm'`` and
    ``'noise_stddev'`` of the last step taken (step ``dp_step - 1``; step 0 before any step) and ``'dp_step'``.
    The epsilons are those of the first ``dp_step`` steps of the schedule, at ``delta``.

    The order of the ``callbacks`` list does not matter. Callbacks run in list order, so keys added in
    ``on_epoch_end`` would reach only the callbacks listed after this one. This callback therefore accounts at the
    last batch of each epoch (known from ``params['steps']``) and at the step that spends the budget, and puts the
    keys into the logs that ``fit`` then builds for the epoch, before any callback's ``on_epoch_end``
    (`keras_dyndp.keras_compat.add_to_epoch_logs`: on Keras 2 the last batch's logs, which it asks for unconverted
    with ``_supports_tf_logs``; on Keras 3 the model's epoch-logs method). An epoch that ends early for another
    reason (another callback stopping training, a dataset of unknown length) gets the keys in ``on_epoch_end``,
    which reaches the callbacks listed after this one.

    Args:
        accountant: Rigorous accountant reported beside the GDP-CLT: 'pld' (default: the tightest, and the one the
            library calibrates under by default, so the last value of a full run is the target epsilon; 0.04-0.7 s
            per call for the paper's T = 4800 dynamic schedule at epsilon 1.2, ~4 s at epsilon 8) or 'rdp' (a looser
            bound, ~10-20% above the PLD); 'gdp_clt' reports the GDP-CLT approximation only.
        delta: Target delta in (0, 1), required.
        log_every: 'epoch', or a positive integer k: additionally account every k DP steps (absl INFO log, and
            TensorBoard scalars when ``log_dir`` is given). Each accounting call costs as above.
        log_dir: Optional directory; scalars ``privacy/<key>`` are written to ``<log_dir>/privacy`` with the DP
            step as the x axis (needs the tensorboard package, which TensorFlow 2.16+ does not install).
        accountant_options: Options of ``accountant`` (`keras_dyndp.accounting.registry`), passed to
            `DPSchedule.epsilon`; e.g. ``registry.get('pld').final_options`` (a 1e-4 PLD grid, ~10x slower) for
            final numbers. None: its defaults.
    """

    def __init__(
        self,
        accountant: str = registry.DEFAULT_ACCOUNTANT,
        *,
        delta: float,
        log_every: str | int = "epoch",
        log_dir: str | None = None,
        accountant_options: Mapping[str, Any] | None = None,
    ):
        super().__init__()
        options = registry.get(accountant).check_options(accountant_options or {})
        delta = validation.check_delta(delta)
        if log_every != "epoch" and (isinstance(log_every, bool) or not isinstance(log_every, int) or log_every < 1):
            raise ValueError(f"`log_every` must be 'epoch' or an integer >= 1. Received: log_every={log_every!r}.")
        if log_dir is not None and importlib.util.find_spec("tensorboard") is None:
            raise ImportError(
                "PrivacyLogger(log_dir=...) writes TensorBoard summaries, which needs the tensorboard "
                "package (TensorFlow 2.16+ does not install it): pip install tensorboard. "
                f"Received: log_dir={log_dir!r}."
            )
        self.accountant = accountant
        self.accountant_options = options
        self.delta = delta
        self.log_every = log_every
        self.log_dir = log_dir
        self._writer: tf.summary.SummaryWriter | None = None
        self._last_logged_step: int | None = None
        self._batch_values: dict[str, float] | None = None  # Added to the last batch's logs, for the epoch.
        self._supports_tf_logs = True  # Keras then passes the batch logs dict itself, which becomes the epoch's.

    def privacy_logs(self) -> dict[str, float]:
        """The values this callback logs, for the current state of the model's optimizer."""
        optimizer = _dp_optimizer(self.model, type(self).__name__)
        schedule = optimizer.schedule
        steps = min(_steps_taken(optimizer), schedule.num_steps)
        last = min(max(steps - 1, 0), schedule.num_steps - 1)
        values = {"epsilon_gdp_clt": schedule.epsilon(self.delta, accountant="gdp_clt", steps=steps)}
        if self.accountant != "gdp_clt":
            values[f"epsilon_{self.accountant}"] = schedule.epsilon(
                self.delta, accountant=self.accountant, steps=steps, **self.accountant_options
            )
        values["clip_norm"] = float(schedule.clip_norms[last])
        values["noise_stddev"] = float(schedule.noise_stddevs[last])
        values["dp_step"] = float(steps)
        return values

    def _report(self, values: dict[str, float]) -> None:
        step = int(values["dp_step"])
        self._last_logged_step = step
        logging.info(
            "keras_dyndp privacy after %d of %d DP steps (delta=%g): %s",
            step,
            self.model.optimizer.schedule.num_steps,
            self.delta,
            ", ".join(f"{key}={value:.6g}" for key, value in values.items() if key != "dp_step"),
        )
        if self._writer is not None:
            with self._writer.as_default():
                for key, value in values.items():
                    if key != "dp_step":
                        tf.summary.scalar(f"privacy/{key}", value, step=step)
            self._writer.flush()

    def on_train_begin(self, logs: dict | None = None) -> None:
        schedule = _dp_optimizer(self.model, type(self).__name__).schedule
        # Refuse now what the epoch-end accounting would refuse.
        schedule.check_accountable("gdp_clt")
        schedule.check_accountable(self.accountant, **self.accountant_options)
        if self.log_dir is not None and self._writer is None:
            self._writer = tf.summary.create_file_writer(os.path.join(self.log_dir, "privacy"))

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._batch_values = None

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        optimizer = _dp_optimizer(self.model, type(self).__name__)
        steps = _steps_taken(optimizer)
        epoch_steps = (getattr(self, "params", None) or {}).get("steps")
        ends_epoch = epoch_steps is not None and batch + 1 >= epoch_steps
        if ends_epoch or steps >= optimizer.schedule.num_steps:
            self._batch_values = self.privacy_logs()
            keras_compat.add_to_epoch_logs(self.model, logs, self._batch_values)
        if self.log_every != "epoch" and steps // self.log_every != (self._last_logged_step or 0) // self.log_every:
            self._report(self._batch_values if self._batch_values is not None else self.privacy_logs())

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        values = self._batch_values
        if values is None or values["dp_step"] != _steps_taken(_dp_optimizer(self.model, type(self).__name__)):
            values = self.privacy_logs()
        if logs is not None:
            logs.update(values)
        self._report(values)

    def on_train_end(self, logs: dict | None = None) -> None:
        keras_compat.remove_epoch_logs_hook(self.model)
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class BudgetStop(keras_compat.keras.callbacks.Callback):
    """Stops ``fit`` exactly when the optimizer has taken all T steps of its schedule (the budget is spent).

    Checked after every batch. With ``steps_per_execution`` = k > 1, Keras runs k steps per call and the callbacks
    see only every k-th step; when fewer than k steps of the budget remain, the next call would run past T into the
    optimizer's in-graph guard and ``fit`` would end in an InvalidArgumentError, losing the epoch's History and
    epsilon. So before each call the callback shortens that call to the remaining steps (Keras's
    ``steps_per_execution`` variable, restored at the end of training), and ``fit`` ends gracefully at T. Training on
    an already spent schedule is refused at ``fit`` start.
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
            logging.warning(
                "BudgetStop: privacy budget spent: %d of the schedule's %d DP steps taken; stopping training.",
                steps,
                total,
            )

    def on_train_end(self, logs: dict | None = None) -> None:
        if self._steps_per_execution is not None:
            keras_compat.set_steps_per_execution(self.model, self._steps_per_execution)
            self._steps_per_execution = None
