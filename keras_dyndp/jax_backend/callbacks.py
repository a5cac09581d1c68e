"""The JAX backend's callbacks: `PrivacyLogger` (the shared `keras_dyndp.privacy_logger` logic) and `BudgetStop`."""

from __future__ import annotations

from typing import Any

import keras

from keras_dyndp import epoch_logs
from keras_dyndp import optimizer_base
from keras_dyndp import privacy_logger
from keras_dyndp.jax_backend.optimizer import JaxDPOptimizerMixin


def _dp_optimizer(model: Any, caller: str) -> JaxDPOptimizerMixin:
    optimizer = getattr(model, "optimizer", None)
    if not isinstance(optimizer, JaxDPOptimizerMixin):
        raise ValueError(
            f"{caller} needs a model compiled with a keras_dyndp JAX DP optimizer. Received: optimizer={optimizer!r}."
        )
    return optimizer


class PrivacyLogger(privacy_logger.PrivacyLoggerMixin, keras.callbacks.Callback):
    __doc__ = (privacy_logger.PrivacyLoggerMixin.__doc__ or "") + (
        "\n    On JAX, ``log_dir`` is refused: TensorBoard summaries need TensorFlow (the epoch logs still reach"
        "\n    ``History`` and any callback).\n"
    )

    def __init__(self, *args, **kwargs):
        if kwargs.get("log_dir") is not None:
            raise ValueError(
                "PrivacyLogger(log_dir=...) writes TensorBoard summaries with TensorFlow, which the JAX backend does "
                "not use: leave log_dir None. The values are in History and in every callback's epoch logs, so "
                "keras.callbacks.TensorBoard(log_dir) (it needs the tensorflow package installed) writes them, "
                f"wherever it stands in the callbacks. Received: log_dir={kwargs['log_dir']!r}."
            )
        super().__init__(*args, **kwargs)

    def _dp_optimizer(self) -> JaxDPOptimizerMixin:
        return _dp_optimizer(self.model, type(self).__name__)

    def _add_to_epoch_logs(self, batch_logs: dict | None, values: dict[str, float]) -> None:
        del batch_logs  # Keras 3 builds the epoch logs itself.
        epoch_logs.add(self.model, values)

    def _remove_epoch_logs_hook(self) -> None:
        epoch_logs.remove_hook(self.model)


class BudgetStop(keras.callbacks.Callback):
    """Stops training once ``model.optimizer.dp_step`` reaches ``schedule.num_steps`` (the budget is spent).

    Checked after every batch (``steps_per_execution`` batches on Keras 3), so training ends at the schedule's last
    step rather than at the next step, which the optimizer would refuse; then prints one line after the progress bar
    (unless ``verbose=0``).
    """

    def __init__(self):
        super().__init__()
        self.stopped_at_step: int | None = None

    def on_train_batch_end(self, batch, logs=None):
        del batch, logs  # Unused.
        optimizer = _dp_optimizer(self.model, type(self).__name__)
        steps = int(optimizer.dp_step.numpy())
        if steps >= optimizer.schedule.num_steps and not self.model.stop_training:
            self.model.stop_training = True
            self.stopped_at_step = steps

    def on_train_end(self, logs=None):
        del logs  # Unused.
        optimizer = _dp_optimizer(self.model, type(self).__name__)
        steps = int(optimizer.dp_step.numpy())
        if self.stopped_at_step == steps and (self.params or {}).get("verbose", 1):
            print(optimizer_base.budget_spent_line(steps, optimizer.schedule.num_steps), flush=True)
