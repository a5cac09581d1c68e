"""`BudgetStop` for the JAX backend: stops ``fit`` when the DP optimizer has taken its schedule's last step."""

from __future__ import annotations

import keras

from keras_dyndp.jax_backend.optimizer import JaxDPOptimizerMixin


class BudgetStop(keras.callbacks.Callback):
    """Stops training once ``model.optimizer.dp_step`` reaches ``schedule.num_steps`` (the budget is spent).

    Checked after every batch (``steps_per_execution`` batches on Keras 3), so training ends at the schedule's last
    step rather than at the next step, which the optimizer would refuse.
    """

    def on_train_batch_end(self, batch, logs=None):
        del batch, logs  # Unused.
        optimizer = self.model.optimizer
        if not isinstance(optimizer, JaxDPOptimizerMixin):
            raise ValueError(
                "BudgetStop needs a model compiled with a keras_dyndp JAX DP optimizer. "
                f"Received: optimizer={optimizer!r}."
            )
        if int(optimizer.dp_step.numpy()) >= optimizer.schedule.num_steps:
            self.model.stop_training = True
