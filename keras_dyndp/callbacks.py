"""`PrivacyLogger` (epsilon spent, C_t and sigma_t into the epoch logs) and `BudgetStop` (ends ``fit`` at the schedule's
last step), on either backend. Both read the DP optimizer's ``schedule`` and ``released_steps``; accounting is
`DPSchedule.epsilon`. What differs per backend is its ``callback_hooks`` module, chosen once, at import."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from absl import logging

from keras_dyndp import backend
from keras_dyndp import optimizer_base
from keras_dyndp.accounting import registry
from keras_dyndp.core import batch_sizes
from keras_dyndp.core import validation
from keras_dyndp.keras_glue import epoch_logs

__all__ = ["BudgetStop", "PrivacyLogger"]

_HOOKS = backend.implementation("callback_hooks")  # the backend's own printing, writer, steps per call
keras = backend.keras_module()


NOT_POISSON_SUFFIX = "_if_poisson"
"""Appended to `PrivacyLogger`'s epsilon keys (``'epsilon_pld_if_poisson'``) once the optimizer has trained on batches
not known to be Poisson samples (`DPOptimizerBase.unverified_sampling`): no key then claims an epsilon for the run."""
NOT_POISSON_NOTE = "NOT the run's epsilon: it assumes Poisson batches, which this run did not use"


def _dp_optimizer(model: Any, caller: str) -> optimizer_base.DPOptimizerBase:
    """The model's optimizer (inside a mixed precision LossScaleOptimizer), checked to be a keras_dyndp one."""
    optimizer = _HOOKS.unwrap_optimizer(getattr(model, "optimizer", None))
    if not isinstance(optimizer, optimizer_base.DPOptimizerBase):
        received = "no optimizer" if optimizer is None else type(optimizer).__name__
        raise ValueError(
            f"{caller} needs a model compiled with a keras_dyndp DP optimizer (with `schedule` and `dp_step`), e.g. "
            f"keras_dyndp.DynamicDPKerasSGD; got {received}."
        )
    return optimizer


class PrivacyLogger(keras.callbacks.Callback):
    """Writes into the epoch ``logs`` (hence History, TensorBoard, CSVLogger) ``'epsilon_gdp_clt'`` (the paper's) and
    ``'epsilon_<accountant>'`` of the DP steps the optimizer has released (``released_steps``) at ``delta``,
    ``'delta_total'`` (``delta`` plus what capping the Poisson batches adds), ``'clip_norm'`` and ``'noise_stddev'`` of
    the last step released, and their number as ``'dp_step'``. A ``delta`` other than the optimizer's calibration target
    is named in every key (``'epsilon_pld_at_delta_0.01'``); once the optimizer has trained on batches not known to be
    Poisson samples, the epsilon keys end in ``'_if_poisson'`` and ``'delta_total'`` is left out, so that no logged
    number claims to cover such a run (docs/privacy.md, "What a reported epsilon covers").

    It accounts at the epoch's last batch or the budget's last step, so its keys reach every callback wherever it stands
    in the ``callbacks`` list (`keras_dyndp.keras_glue.epoch_logs`); an epoch ending early gets them in
    ``on_epoch_end``.

    Args:
        accountant: reported beside the GDP-CLT: 'pld' (default, tightest, the slowest per call), 'rdp'
            (looser than the PLD) or 'gdp_clt' (that only); costs in docs/performance.md, "Accounting cost".
        delta: the delta in (0, 1) of the epsilons. None (default): the optimizer's calibration target delta
            (``schedule.calibration.target_delta``; a schedule built by hand has none, and then needs ``delta``).
        log_every: 'epoch', or an integer k >= 1: also account every k DP steps (absl INFO log; TensorBoard with
            ``log_dir``), each call costing as above.
        log_dir: TensorFlow only (needs the tensorboard package): scalars ``privacy/<key>`` in
            ``<log_dir>/privacy`` over DP steps. On JAX ``keras.callbacks.TensorBoard`` writes the epoch values.
        accountant_options: passed to `DPSchedule.epsilon`, e.g. ``registry.get('pld').final_options`` (a 1e-4 PLD
            grid, slower) for final numbers; None: the defaults.
    """

    def __init__(
        self,
        accountant: str = registry.DEFAULT_ACCOUNTANT,
        *,
        delta: float | None = None,
        log_every: str | int = "epoch",
        log_dir: str | None = None,
        accountant_options: Mapping[str, Any] | None = None,
    ):
        super().__init__()
        options = registry.get(accountant).check_options(accountant_options or {})
        delta = None if delta is None else validation.check_delta(delta)
        if log_every != "epoch" and (isinstance(log_every, bool) or not isinstance(log_every, int) or log_every < 1):
            raise ValueError(f"`log_every` must be 'epoch' or an integer >= 1. Received: log_every={log_every!r}.")
        self.accountant, self.accountant_options, self.delta = accountant, options, delta
        self.log_every, self.log_dir = log_every, log_dir
        # The registry's always logged first, then `accountant`; each with its options.
        self._logged_accountants = dict.fromkeys(registry.ALWAYS_LOGGED_ACCOUNTANT_NAMES, {}) | {accountant: options}
        if log_dir is not None:
            _HOOKS.check_log_dir(log_dir)
        self._writer: Any = None  # The summary writer, during training with log_dir.
        self._last_logged_step: int | None = None
        self._batch_values: dict[str, float] | None = None  # Added to the last batch's logs, for the epoch.
        self._supports_tf_logs = True  # Keras 2 then passes the batch logs dict itself, which becomes the epoch's.

    def delta_of(self, optimizer: optimizer_base.DPOptimizerBase) -> tuple[float, str]:
        """The delta of the logged epsilons and what their keys say of it: ``'_at_delta_<delta>'`` for a ``delta``
        other than the optimizer's calibration target delta, else ``''``.

        Raises:
          ValueError: without ``delta`` beside a schedule that has no calibration target.
        """
        calibration = optimizer.schedule.calibration
        target = None if calibration is None else calibration.target_delta
        if self.delta is None and target is None:
            raise ValueError(
                "PrivacyLogger needs `delta`: the optimizer's schedule was built by hand, without a calibration "
                "target delta to default to. Pass delta= (in (0, 1), below 1/N). Received: delta=None."
            )
        if self.delta is None:
            return target, ""
        return self.delta, "" if target is None or self.delta == target else f"_at_delta_{self.delta:g}"

    def privacy_logs(self) -> dict[str, float]:
        """The values this callback logs, for the current state of the model's optimizer.

        Raises:
          RuntimeError: if the optimizer's step counter was restored from a run under another schedule (its steps'
            epsilon is not this schedule's: `DPOptimizerBase.check_restored_schedule`).
        """
        optimizer = _dp_optimizer(self.model, type(self).__name__)
        optimizer.check_restored_schedule()
        schedule = optimizer.schedule
        steps = min(optimizer.released_steps, schedule.num_steps)
        last = min(max(steps - 1, 0), schedule.num_steps - 1)
        delta, at_delta = self.delta_of(optimizer)
        # Batches not known to be Poisson samples: the epsilon is the schedule's, which assumes them; so named.
        suffix = at_delta + ("" if optimizer.unverified_sampling is None else NOT_POISSON_SUFFIX)
        epsilons = {
            name: schedule.epsilon(delta, accountant=name, steps=steps, **options)
            for name, options in self._logged_accountants.items()
        }
        values = {f"epsilon_{name}{suffix}": epsilon for name, epsilon in epsilons.items()}
        if optimizer.unverified_sampling is None:
            overflow = optimizer.overflow_probability or 0.0
            values[f"delta_total{at_delta}"] = delta + batch_sizes.added_delta(overflow, steps, max(epsilons.values()))
        values.update(clip_norm=float(schedule.clip_norms[last]), noise_stddev=float(schedule.noise_stddevs[last]))
        return values | {"dp_step": float(steps)}

    def _report(self, values: dict[str, float]) -> None:
        step = self._last_logged_step = int(values["dp_step"])
        scalars = {key: value for key, value in values.items() if key != "dp_step"}
        optimizer = _dp_optimizer(self.model, type(self).__name__)
        unverified = optimizer.unverified_sampling
        total, delta = optimizer.schedule.num_steps, self.delta_of(optimizer)[0]
        shown = ", ".join(f"{key}={value:.6g}" for key, value in scalars.items())
        note = "" if unverified is None else f" -- {NOT_POISSON_NOTE} ({unverified})"
        logging.info("keras_dyndp privacy after %d of %d DP steps (delta=%g): %s%s", step, total, delta, shown, note)
        if self._writer is not None:
            _HOOKS.write_scalars(self._writer, scalars, step)

    def on_train_begin(self, logs: dict | None = None) -> None:
        optimizer = _dp_optimizer(self.model, type(self).__name__)
        # Refuse now what the epoch-end accounting would refuse.
        optimizer.check_restored_schedule()
        self.delta_of(optimizer)
        for name, options in self._logged_accountants.items():
            optimizer.schedule.check_accountable(name, **options)
        if self.log_dir is not None and self._writer is None:
            self._writer = _HOOKS.create_writer(self.log_dir)

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._batch_values = None

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        optimizer = _dp_optimizer(self.model, type(self).__name__)
        steps = optimizer.released_steps
        epoch_steps = (getattr(self, "params", None) or {}).get("steps")
        ends_epoch = epoch_steps is not None and batch + 1 >= epoch_steps
        if ends_epoch or steps >= optimizer.schedule.num_steps:
            self._batch_values = self.privacy_logs()
            epoch_logs.add(self.model, self._batch_values, logs)
        if self.log_every != "epoch" and steps // self.log_every != (self._last_logged_step or 0) // self.log_every:
            self._report(self._batch_values if self._batch_values is not None else self.privacy_logs())

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        values = self._batch_values
        if values is None or values["dp_step"] != _dp_optimizer(self.model, type(self).__name__).released_steps:
            values = self.privacy_logs()
        if logs is not None:
            logs.update(values)
        self._report(values)

    def on_train_end(self, logs: dict | None = None) -> None:
        epoch_logs.remove_hook(self.model)
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class BudgetStop(keras.callbacks.Callback):
    """Stops ``fit`` exactly when the optimizer has released all T steps of its schedule, printing one line (unless
    ``verbose=0``); refuses to start on a spent schedule. A ``steps_per_execution`` call that would run past T (into
    the optimizer's refusal, losing the epoch's History) is shortened to the steps left, restored at the end."""

    stops_at_the_budget = True  # What make_private's refusals look for among fit's callbacks.

    def __init__(self):
        super().__init__()
        self.stopped_at_step: int | None = None
        self._steps_per_execution: int | None = None  # Keras's value, while this callback has shortened it.
        self._supports_tf_logs = True  # Else Keras 2 copies the batch logs, and PrivacyLogger's keys would be lost.

    def _spent(self) -> tuple[bool, int, int]:
        optimizer = _dp_optimizer(self.model, type(self).__name__)
        steps, total = optimizer.released_steps, optimizer.schedule.num_steps
        return steps >= total, steps, total

    def on_train_begin(self, logs: dict | None = None) -> None:
        spent, steps, total = self._spent()
        if spent:
            raise RuntimeError(
                f"BudgetStop: the privacy budget is already spent: the optimizer has released {steps} of the "
                f"schedule's {total} DP steps. Training more would exceed the accounted budget. A new schedule is a "
                "new budget, spent on the same data (the two runs' epsilons add up): to train further, compile the "
                "model with a new optimizer built for it. model.evaluate and model.predict take no DP step and still "
                "work."
            )

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        steps_per_execution = _HOOKS.steps_per_execution(self.model)
        if steps_per_execution is None:
            return
        _, steps, total = self._spent()
        if total - steps < steps_per_execution:
            if self._steps_per_execution is None:
                self._steps_per_execution = steps_per_execution
            _HOOKS.set_steps_per_execution(self.model, max(total - steps, 1))

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        spent, steps, _ = self._spent()
        if spent and not self.model.stop_training:
            self.model.stop_training = True
            self.stopped_at_step = steps

    def on_train_end(self, logs: dict | None = None) -> None:
        _, steps, total = self._spent()
        if self.stopped_at_step == steps and (self.params or {}).get("verbose", 1):
            _HOOKS.print_message(optimizer_base.budget_spent_line(steps, total))
        if self._steps_per_execution is not None:
            _HOOKS.set_steps_per_execution(self.model, self._steps_per_execution)
            self._steps_per_execution = None
