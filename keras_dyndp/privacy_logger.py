"""The backend-neutral part of `PrivacyLogger`: what it logs, when, and its arguments.

`PrivacyLoggerMixin` holds the callback's logic: account the steps taken (`DPSchedule.epsilon`) at the last batch of
each epoch and at the step that spends the budget, put the values into the epoch's logs, log every ``log_every``
steps. Each backend's ``PrivacyLogger`` (`keras_dyndp.callbacks` for TensorFlow, `keras_dyndp.jax_backend.callbacks`
for JAX) is ``class PrivacyLogger(PrivacyLoggerMixin, <its Keras>.callbacks.Callback)`` and provides the hooks at
the end of the mixin: finding the DP optimizer, reaching the epoch logs, writing TensorBoard scalars.
"""

import importlib.util
import os
from collections.abc import Mapping
from typing import Any

from absl import logging

from keras_dyndp import validation
from keras_dyndp.accounting import registry


class PrivacyLoggerMixin:
    """Logs epsilon spent so far (GDP-CLT and a rigorous accountant), C_t and sigma_t at each epoch end.

    Keys written into the epoch ``logs`` (hence ``History.history``):
    ``'epsilon_gdp_clt'``, ``'epsilon_<accountant>'`` (unless ``accountant='gdp_clt'``), ``'clip_norm'`` and
    ``'noise_stddev'`` of the last step taken (step ``dp_step - 1``; step 0 before any step) and ``'dp_step'``.
    The epsilons are those of the first ``dp_step`` steps of the schedule, at ``delta``.

    The order of the ``callbacks`` list does not matter. Callbacks run in list order, so keys added in
    ``on_epoch_end`` would reach only the callbacks listed after this one. This callback therefore accounts at the
    last batch of each epoch (known from ``params['steps']``) and at the step that spends the budget, and puts the
    keys into the logs that ``fit`` then builds for the epoch, before any callback's ``on_epoch_end`` (the
    backend's ``_add_to_epoch_logs``: on Keras 2 the last batch's logs, which it asks for unconverted with
    ``_supports_tf_logs``; on Keras 3 the model's epoch-logs method, `keras_dyndp.epoch_logs`). An epoch that ends
    early for another reason (another callback stopping training, a dataset of unknown length) gets the keys in
    ``on_epoch_end``, which reaches the callbacks listed after this one.

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
        self._writer: Any = None  # The backend's summary writer, when log_dir is given.
        self._last_logged_step: int | None = None
        self._batch_values: dict[str, float] | None = None  # Added to the last batch's logs, for the epoch.
        self._supports_tf_logs = True  # Keras then passes the batch logs dict itself, which becomes the epoch's.

    def privacy_logs(self) -> dict[str, float]:
        """The values this callback logs, for the current state of the model's optimizer.

        Raises:
          RuntimeError: if the optimizer's step counter was restored from a run under another schedule (its steps'
            epsilon is not this schedule's: `DPOptimizerBase.check_restored_schedule`).
        """
        optimizer = self._dp_optimizer()
        optimizer.check_restored_schedule()
        schedule = optimizer.schedule
        steps = min(int(optimizer.dp_step.numpy()), schedule.num_steps)
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
            self._write_scalars({key: value for key, value in values.items() if key != "dp_step"}, step)

    def on_train_begin(self, logs: dict | None = None) -> None:
        optimizer = self._dp_optimizer()
        schedule = optimizer.schedule
        # Refuse now what the epoch-end accounting would refuse.
        optimizer.check_restored_schedule()
        schedule.check_accountable("gdp_clt")
        schedule.check_accountable(self.accountant, **self.accountant_options)
        if self.log_dir is not None and self._writer is None:
            self._writer = self._create_writer(os.path.join(self.log_dir, "privacy"))

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._batch_values = None

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        optimizer = self._dp_optimizer()
        steps = int(optimizer.dp_step.numpy())
        epoch_steps = (getattr(self, "params", None) or {}).get("steps")
        ends_epoch = epoch_steps is not None and batch + 1 >= epoch_steps
        if ends_epoch or steps >= optimizer.schedule.num_steps:
            self._batch_values = self.privacy_logs()
            self._add_to_epoch_logs(logs, self._batch_values)
        if self.log_every != "epoch" and steps // self.log_every != (self._last_logged_step or 0) // self.log_every:
            self._report(self._batch_values if self._batch_values is not None else self.privacy_logs())

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        values = self._batch_values
        if values is None or values["dp_step"] != int(self._dp_optimizer().dp_step.numpy()):
            values = self.privacy_logs()
        if logs is not None:
            logs.update(values)
        self._report(values)

    def on_train_end(self, logs: dict | None = None) -> None:
        self._remove_epoch_logs_hook()
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    # What each backend provides.

    def _dp_optimizer(self) -> Any:
        """The model's keras_dyndp DP optimizer (with ``schedule`` and ``dp_step``); raises ValueError otherwise."""
        raise NotImplementedError

    def _add_to_epoch_logs(self, batch_logs: dict | None, values: dict[str, float]) -> None:
        """Makes ``values`` part of the logs every callback's ``on_epoch_end`` receives for this epoch."""
        raise NotImplementedError

    def _remove_epoch_logs_hook(self) -> None:
        """Undoes what `_add_to_epoch_logs` installed on the model."""
        raise NotImplementedError

    def _create_writer(self, directory: str) -> Any:
        """A summary writer for ``directory`` (with ``close()``)."""
        raise NotImplementedError

    def _write_scalars(self, values: dict[str, float], step: int) -> None:
        """Writes ``values`` as scalars ``privacy/<key>`` at ``step``."""
        raise NotImplementedError
