"""Tests for keras_dyndp.keras_glue.epoch_logs: values that join the next epoch logs once, and the hook's removal."""

import numpy as np

from keras_dyndp import backend
from keras_dyndp.keras_glue import epoch_logs

if backend.keras_backend() == "jax":
    import keras
else:
    from keras_dyndp.tf_backend.keras_compat import keras


class _Model:
    def _get_metrics_result_or_logs(self, logs):
        return {"loss": logs["loss"]}


def test_values_join_the_next_epoch_logs_once_and_the_hook_is_removed():
    model = _Model()
    epoch_logs.add(model, {"epsilon": 1.5})
    epoch_logs.add(model, {"epsilon": 2.0})  # the latest values win; one hook
    assert model._get_metrics_result_or_logs({"loss": 0.3}) == {"loss": 0.3, "epsilon": 2.0}
    assert model._get_metrics_result_or_logs({"loss": 0.2}) == {"loss": 0.2}
    epoch_logs.remove_hook(model)
    assert "_get_metrics_result_or_logs" not in vars(model)
    epoch_logs.remove_hook(model)  # nothing to remove


def test_an_instance_override_is_restored():
    model = _Model()
    own = lambda logs: {"own": 1}  # noqa: E731
    model._get_metrics_result_or_logs = own
    epoch_logs.add(model, {"epsilon": 1.0})
    assert model._get_metrics_result_or_logs({}) == {"own": 1, "epsilon": 1.0}
    epoch_logs.remove_hook(model)
    assert model._get_metrics_result_or_logs is own


def test_from_the_step_makes_the_epoch_logs_the_steps_own_until_turned_off():
    model = _Model()
    epoch_logs.from_the_step(model, True)
    assert model._get_metrics_result_or_logs({"dp_step": 3.0}) == {"dp_step": 3.0}
    epoch_logs.add(model, {"epsilon": 1.0})
    assert model._get_metrics_result_or_logs({"dp_step": 3.0}) == {"dp_step": 3.0, "epsilon": 1.0}
    epoch_logs.remove_hook(model)
    epoch_logs.from_the_step(model, False)
    assert "_get_metrics_result_or_logs" not in vars(model)
    keras_2_model = object()  # No such method: nothing to do.
    epoch_logs.from_the_step(keras_2_model, True)


def test_added_values_reach_callbacks_listed_before_the_one_adding():
    x, y = np.zeros((8, 4), np.float32), np.zeros((8, 2), np.float32)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.SGD(), loss="mse", metrics=["mae"])
    seen = []

    class Adder(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self._supports_tf_logs = True

        def on_train_batch_end(self, batch, logs=None):
            if batch + 1 == self.params["steps"]:
                epoch_logs.add(self.model, {"extra": float(batch)}, logs)

        def on_train_end(self, logs=None):
            epoch_logs.remove_hook(self.model)

    listed_first = keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: seen.append(dict(logs)))
    history = model.fit(
        x, y, batch_size=4, epochs=2, verbose=0, validation_data=(x, y), callbacks=[listed_first, Adder()]
    )
    assert [logs["extra"] for logs in seen] == [1.0, 1.0]
    assert history.history["extra"] == [1.0, 1.0]
    assert "val_extra" not in history.history and {"loss", "mae", "val_loss"} <= set(history.history)
    history = model.fit(x, y, batch_size=4, epochs=1, verbose=0)  # Removed: a later fit logs no extra key.
    assert "extra" not in history.history
