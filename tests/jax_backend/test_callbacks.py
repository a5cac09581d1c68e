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
from keras_dyndp.jax_backend import PrivacyLogger  # noqa: E402
from keras_dyndp.jax_backend import make_private  # noqa: E402

pytestmark = [
    # Tests that measure the clipped sum without noise, and arrays with public_batch_size=True (fixed-size batches
    # by declaration): both warned by design.
    pytest.mark.filterwarnings("ignore::keras_dyndp.optimizer_base.DegenerateNoiseWarning"),
    pytest.mark.filterwarnings("ignore:model.fit received x of type ndarray:keras_dyndp.batch_sizes.SamplingWarning"),
]

LOSS = keras.losses.MeanSquaredError(reduction="none")


def _model(num_steps):
    model = make_private(keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]))
    schedule = schedules.DPSchedule(np.ones(num_steps), np.full(num_steps, 0.5), 0.5)
    model.compile(optimizer=DynamicDPKerasSGD(schedule=schedule, public_batch_size=True, learning_rate=0.1), loss=LOSS)
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


def test_privacy_logger_puts_the_accountants_epsilon_into_every_callbacks_epoch_logs():
    seen = []
    before = keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: seen.append(dict(logs)))
    x, y = np.ones((12, 3), "float32"), np.zeros((12, 2), "float32")
    model = _model(num_steps=6)
    history = model.fit(
        x, y, batch_size=4, epochs=2, verbose=0, callbacks=[before, PrivacyLogger(delta=1e-5), BudgetStop()]
    )
    schedule = model.optimizer.schedule
    for epoch, steps in enumerate((3, 6)):
        expected = schedule.epsilon(1e-5, accountant="pld", steps=steps)
        assert history.history["epsilon_pld"][epoch] == pytest.approx(expected)
        assert seen[epoch]["epsilon_pld"] == pytest.approx(expected)  # listed before the logger, still sees it
        assert history.history["dp_step"][epoch] == steps
    assert history.history["epsilon_gdp_clt"][1] == pytest.approx(schedule.epsilon(1e-5, accountant="gdp_clt"))


def test_privacy_logger_refuses_log_dir_and_bad_arguments():
    with pytest.raises(ValueError, match="log_dir.*TensorFlow"):
        PrivacyLogger(delta=1e-5, log_dir="/tmp/logs")
    with pytest.raises(ValueError, match="`log_every` must be 'epoch' or an integer >= 1"):
        PrivacyLogger(delta=1e-5, log_every=0)


def test_budget_stop_ends_fit_with_an_ordinary_line_after_the_progress_bar(capsys):
    x, y = np.ones((8, 3), "float32"), np.zeros((8, 2), "float32")
    model = _model(num_steps=3)
    with pytest.warns(UserWarning, match="not keras_dyndp.jax_backend.PoissonBatches"):  # arrays, public batch size
        model.fit(x, y, batch_size=4, epochs=3, verbose=2, callbacks=[BudgetStop()])
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1] == "BudgetStop: the privacy budget is spent (3 of the schedule's 3 DP steps); training ended."
    assert "dp_step" in lines[-2]  # after the progress bar's last line
