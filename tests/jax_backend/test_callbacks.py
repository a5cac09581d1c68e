"""Tests for keras_dyndp.jax_backend.callbacks: BudgetStop ends fit at the schedule's last step."""

import pytest

jax = pytest.importorskip("jax")
keras = pytest.importorskip("keras")
if keras.backend.backend() != "jax":
    pytest.skip("Keras is not running on JAX (set KERAS_BACKEND=jax)", allow_module_level=True)

import numpy as np  # noqa: E402

from keras_dyndp import schedules  # noqa: E402
from keras_dyndp.jax_backend import BudgetStop  # noqa: E402
from keras_dyndp.jax_backend import DynamicDPKerasSGD  # noqa: E402
from keras_dyndp.jax_backend import make_private  # noqa: E402

LOSS = keras.losses.MeanSquaredError(reduction="none")


def _model(num_steps):
    model = make_private(keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]))
    schedule = schedules.DPSchedule(np.ones(num_steps), np.full(num_steps, 0.5), 0.5)
    model.compile(optimizer=DynamicDPKerasSGD(schedule=schedule, learning_rate=0.1), loss=LOSS)
    return model


@pytest.mark.parametrize("steps_per_epoch, epochs", [(3, 4), (5, 1)])
def test_budget_stop_ends_fit_at_the_last_step(steps_per_epoch, epochs):
    x, y = np.ones((4 * steps_per_epoch, 3), "float32"), np.zeros((4 * steps_per_epoch, 2), "float32")
    model = _model(num_steps=5)
    model.fit(x, y, batch_size=4, epochs=epochs, verbose=0, callbacks=[BudgetStop()])
    assert int(model.optimizer.dp_step.numpy()) == min(5, steps_per_epoch * epochs)


def test_budget_stop_refuses_a_model_without_a_dp_optimizer():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(ValueError, match="BudgetStop needs a model compiled with a keras_dyndp JAX DP optimizer"):
        model.fit(np.ones((4, 3)), np.zeros((4, 2)), batch_size=4, verbose=0, callbacks=[BudgetStop()])
