"""callbacks: PrivacyLogger's values and logging, BudgetStop, their optimizer checks and model.fit, on the backend in
use (TensorFlow's Keras 2 or 3, or JAX); the TensorBoard parts run on TensorFlow only."""

import importlib.util
import types

import numpy as np
import pytest

import keras_dyndp
from keras_dyndp import callbacks
from keras_dyndp import schedules
from keras_dyndp.accounting import registry
from keras_dyndp.core import batch_sizes

keras = callbacks.keras
ON_JAX = keras_dyndp.keras_backend() == "jax"
DELTA = 1e-5
LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
HAVE_TENSORBOARD = importlib.util.find_spec("tensorboard") is not None
tensorflow_only = pytest.mark.skipif(ON_JAX, reason="TensorBoard summaries are written with TensorFlow")


def _schedule() -> schedules.DPSchedule:
    return schedules.DPSchedule([1.0, 1.0, 0.8, 0.6], [1.0, 0.9, 0.6, 0.4], sampling_probability=0.1)


def _optimizer(schedule: schedules.DPSchedule, steps: int = 0):
    """A keras_dyndp optimizer that has taken `steps` DP steps (as far as the callbacks can tell)."""
    optimizer = keras_dyndp.DynamicDPKerasSGD(schedule=schedule, public_batch_size=True)
    optimizer.dp_step.assign(steps)
    optimizer.record_schedule_fingerprint()  # as the steps would have
    return optimizer


def _attach(callback, optimizer, steps_per_epoch=None):
    """`callback` on a stand-in model (not a Keras model: the epoch values land in the batch logs)."""
    model = types.SimpleNamespace(optimizer=optimizer, stop_training=False)
    callback.set_model(model)
    callback.set_params({"steps": steps_per_epoch, "verbose": 0})
    return model


def _private_model(schedule, num_examples, training_metrics=False, **compile_kwargs):
    model = keras_dyndp.make_private(
        keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]), training_metrics=training_metrics
    )
    optimizer = keras_dyndp.DynamicDPKerasSGD(
        schedule=schedule, expected_batch_size=num_examples * schedule.sampling_probability, learning_rate=0.1
    )
    model.compile(optimizer=optimizer, loss=LOSS, **compile_kwargs)
    return model


def _data(seed, num_examples=40):
    x = np.random.default_rng(seed).normal(size=(num_examples, 3)).astype(np.float32)
    return x, (x[:, 0] > 0).astype(np.int32)  # int64 warns on JAX (Keras traces the batch spec in int32)


@pytest.mark.parametrize("steps", [0, 1, 4])
def test_privacy_logger_values(steps):
    schedule = _schedule()
    logger = callbacks.PrivacyLogger("pld", delta=DELTA)
    _attach(logger, _optimizer(schedule, steps))
    logs = {"loss": 1.0}
    logger.on_train_begin()
    logger.on_epoch_end(0, logs)
    last = max(steps - 1, 0)
    assert logs == pytest.approx(
        {
            "loss": 1.0,
            "epsilon_gdp_clt": schedule.epsilon(DELTA, accountant="gdp_clt", steps=steps),
            "epsilon_pld": schedule.epsilon(DELTA, accountant="pld", steps=steps),
            "delta_total": DELTA,  # no cap known (no fit): nothing added
            "clip_norm": schedule.clip_norms[last],
            "noise_stddev": schedule.noise_stddevs[last],
            "dp_step": float(steps),
        }
    )
    assert (logs["epsilon_gdp_clt"] == 0.0) == (steps == 0)


def test_privacy_logger_gdp_clt_only():
    logger = callbacks.PrivacyLogger("gdp_clt", delta=DELTA)
    _attach(logger, _optimizer(_schedule(), 2))
    assert sorted(logger.privacy_logs()) == ["clip_norm", "delta_total", "dp_step", "epsilon_gdp_clt", "noise_stddev"]


def test_privacy_logger_logs_the_registry_s_always_logged_accountants_first(monkeypatch):
    logger = callbacks.PrivacyLogger("pld", delta=DELTA)
    _attach(logger, _optimizer(_schedule(), 2))
    assert list(logger.privacy_logs())[:2] == ["epsilon_gdp_clt", "epsilon_pld"]
    monkeypatch.setattr(registry, "ALWAYS_LOGGED_ACCOUNTANT_NAMES", ("rdp",))  # An attribute, not a name, decides.
    logger = callbacks.PrivacyLogger("pld", delta=DELTA)
    _attach(logger, _optimizer(_schedule(), 2))
    expected = ["epsilon_rdp", "epsilon_pld", "delta_total", "clip_norm", "noise_stddev", "dp_step"]
    assert list(logger.privacy_logs()) == expected


def test_privacy_logger_defaults_to_the_pld_the_budget_is_calibrated_under():
    schedule = schedules.calibrate(
        "vanilla", target_epsilon=1.0, target_delta=DELTA, sampling_probability=0.1, num_steps=4, initial_clip=1.0
    )
    logger = callbacks.PrivacyLogger(delta=DELTA)
    _attach(logger, _optimizer(schedule, 4))
    logs = logger.privacy_logs()
    assert sorted(logs) == ["clip_norm", "delta_total", "dp_step", "epsilon_gdp_clt", "epsilon_pld", "noise_stddev"]
    assert 0.999 <= logs["epsilon_pld"] <= 1.0  # The whole run spends the target, as calibrated.
    rdp = callbacks.PrivacyLogger("rdp", delta=DELTA)
    _attach(rdp, _optimizer(schedule, 3))
    assert rdp.privacy_logs()["epsilon_rdp"] == pytest.approx(schedule.epsilon(DELTA, "rdp", steps=3))


def test_privacy_logger_passes_accountant_options():
    schedule = _schedule()
    logger = callbacks.PrivacyLogger(delta=DELTA, accountant_options=registry.get("pld").final_options)
    _attach(logger, _optimizer(schedule, 3))
    assert logger.privacy_logs()["epsilon_pld"] == pytest.approx(
        schedule.epsilon(DELTA, "pld", steps=3, value_discretization_interval=1e-4), rel=1e-12
    )
    with pytest.raises(ValueError, match="Options of the 'rdp' accountant"):
        callbacks.PrivacyLogger("rdp", delta=DELTA, accountant_options={"value_discretization_interval": 1e-4})


def test_privacy_logger_refuses_before_training_what_it_could_not_account():
    schedule = schedules.DPSchedule([1.0, 1.0], [1.0, 1e-3], sampling_probability=0.1)  # z = 1e-3: below the PLD's.
    logger = callbacks.PrivacyLogger(delta=DELTA)
    _attach(logger, _optimizer(schedule))
    with pytest.raises(ValueError, match=r"noise multiplier of step 1 \(0-based\) is 0.001; the 'pld' accountant"):
        logger.on_train_begin()
    rdp = callbacks.PrivacyLogger("rdp", delta=DELTA)
    _attach(rdp, _optimizer(schedule))
    rdp.on_train_begin()  # The RDP accounts it (a huge epsilon).


def test_a_step_counter_of_another_schedule_is_never_accounted_under_this_one():
    schedule = _schedule()
    other = schedules.DPSchedule(schedule.clip_norms, schedule.noise_stddevs * 100, 0.1)
    optimizer = keras_dyndp.DynamicDPKerasSGD(schedule=schedule, public_batch_size=True)
    optimizer.dp_step.assign(3)  # a counter restored from a run under `other`
    optimizer._schedule_fingerprint.assign(list(other.fingerprint))  # pylint: disable=protected-access
    logger = callbacks.PrivacyLogger(delta=DELTA)
    _attach(logger, optimizer)
    with pytest.raises(RuntimeError, match="another DP schedule"):
        logger.on_train_begin()
    with pytest.raises(RuntimeError, match="another DP schedule"):
        logger.privacy_logs()
    unrecorded = keras_dyndp.DynamicDPKerasSGD(schedule=schedule, public_batch_size=True)
    _attach(logger, unrecorded)
    logger.privacy_logs()  # before the first step nothing is recorded, nor spent
    unrecorded.dp_step.assign(3)
    with pytest.raises(RuntimeError, match="no schedule fingerprint"):
        logger.privacy_logs()


def test_the_epochs_last_batch_puts_the_values_into_the_epoch_logs_and_log_every_reports(monkeypatch):
    scalars = []
    monkeypatch.setattr(callbacks._HOOKS, "write_scalars", lambda writer, values, step: scalars.append((step, values)))
    optimizer = _optimizer(_schedule(), 2)
    logger = callbacks.PrivacyLogger(delta=DELTA, log_every=1)
    model = _attach(logger, optimizer, steps_per_epoch=2)
    logger.on_train_begin()
    logger._writer = types.SimpleNamespace(close=lambda: None)  # what log_dir does, without TensorBoard
    logger.on_epoch_begin(0)
    batch_logs = {}
    logger.on_train_batch_end(0, batch_logs)  # not the epoch's last batch: nothing for the epoch yet
    assert batch_logs == {} and scalars[-1][0] == 2  # but log_every=1 reports the step
    logger.on_train_batch_end(1, batch_logs)
    assert batch_logs["dp_step"] == 2.0
    logs = {}
    logger.on_epoch_end(0, logs)
    assert logs["epsilon_pld"] == pytest.approx(_schedule().epsilon(DELTA, steps=2))
    logger.on_train_end()
    assert logger._writer is None and "_get_metrics_result_or_logs" not in vars(model)


def test_privacy_logger_rejects_non_dp_optimizer():
    logger = callbacks.PrivacyLogger("pld", delta=DELTA)
    _attach(logger, keras.optimizers.SGD())
    with pytest.raises(
        ValueError, match="PrivacyLogger needs a model compiled with a keras_dyndp DP optimizer.*got SGD"
    ):
        logger.on_train_begin()
    stop = callbacks.BudgetStop()
    _attach(stop, None)
    with pytest.raises(ValueError, match="BudgetStop needs a model compiled with a keras_dyndp DP optimizer.*got no"):
        stop.on_train_batch_end(0)


def test_budget_stop_refuses_a_model_without_a_dp_optimizer_in_fit():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(ValueError, match="BudgetStop needs a model compiled with a keras_dyndp DP optimizer"):
        model.fit(np.ones((4, 3)), np.zeros((4, 2)), batch_size=4, verbose=0, callbacks=[callbacks.BudgetStop()])


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"accountant": "moments"}, "`accountant` must be one of"),
        ({"delta": 0.0}, r"`delta` must be in \(0, 1\)"),
        ({"log_every": 0}, "`log_every` must be 'epoch' or an integer >= 1"),
        ({"log_every": True}, "`log_every`"),
    ],
)
def test_privacy_logger_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        callbacks.PrivacyLogger(**{"delta": DELTA, **kwargs})
    with pytest.raises(TypeError):
        callbacks.PrivacyLogger("rdp", 1e-5)  # delta is keyword-only


def test_privacy_logger_log_dir_says_what_it_needs(monkeypatch, tmp_path):
    if ON_JAX:
        with pytest.raises(ValueError, match="log_dir.*TensorFlow"):
            callbacks.PrivacyLogger(delta=DELTA, log_dir=str(tmp_path))
    else:
        real_find_spec = importlib.util.find_spec
        monkeypatch.setattr(
            importlib.util,
            "find_spec",
            lambda name, *args: None if name == "tensorboard" else real_find_spec(name, *args),
        )
        with pytest.raises(ImportError, match="pip install tensorboard"):
            callbacks.PrivacyLogger(delta=DELTA, log_dir=str(tmp_path))
    callbacks.PrivacyLogger(delta=DELTA)  # Without log_dir it needs no tensorboard.


@tensorflow_only
@pytest.mark.skipif(not HAVE_TENSORBOARD, reason="writing summaries needs the tensorboard package")
def test_privacy_logger_writes_summaries_every_k_steps(tmp_path):
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    optimizer = _optimizer(_schedule())
    logger = callbacks.PrivacyLogger("gdp_clt", delta=DELTA, log_every=2, log_dir=str(tmp_path))
    _attach(logger, optimizer)
    logger.on_train_begin()
    for step in range(1, 4):
        optimizer.dp_step.assign(step)
        logger.on_train_batch_end(step - 1)
    logger.on_epoch_end(0, {})
    logger.on_train_end()
    steps = []
    for event_file in tf.io.gfile.glob(str(tmp_path / "privacy" / "events.*")):
        for event in tf.compat.v1.train.summary_iterator(event_file):
            steps += [event.step for value in event.summary.value if value.tag == "privacy/epsilon_gdp_clt"]
    assert steps == [2, 3]  # every 2 DP steps, then at the epoch end


def test_budget_stop():
    optimizer = _optimizer(_schedule(), 2)
    stop = callbacks.BudgetStop()
    model = _attach(stop, optimizer)
    stop.on_train_begin()
    stop.on_train_batch_end(0)
    assert not model.stop_training and stop.stopped_at_step is None
    optimizer.dp_step.assign(4)
    stop.on_train_batch_end(1)
    assert model.stop_training and stop.stopped_at_step == 4
    with pytest.raises(RuntimeError, match="already spent: the optimizer has released 4 of the schedule's 4"):
        stop.on_train_begin()


def test_fit_logs_epsilon_into_every_callbacks_epoch_logs_and_stops_at_the_budget():
    keras.utils.set_random_seed(0)
    p = 0.25
    x, y = _data(0)
    schedule = schedules.DPSchedule(np.full(6, 1.0), np.linspace(1.0, 0.5, 6), sampling_probability=p)
    model = _private_model(schedule, len(x))
    seen = []
    before = keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: seen.append(dict(logs)))
    budget_stop = callbacks.BudgetStop()
    history = model.fit(
        keras_dyndp.poisson_batches(x, y, sampling_probability=p, seed=0),  # 4 steps per epoch
        epochs=3,
        verbose=0,
        callbacks=[before, callbacks.PrivacyLogger(delta=DELTA), budget_stop],
    )
    assert history.history["dp_step"] == [4.0, 6.0]  # stopped in the second epoch, at T = 6
    assert budget_stop.stopped_at_step == 6
    for epoch, steps in enumerate((4, 6)):
        expected = schedule.epsilon(DELTA, accountant="pld", steps=steps)
        assert history.history["epsilon_pld"][epoch] == pytest.approx(expected)
        assert seen[epoch]["epsilon_pld"] == pytest.approx(expected)  # listed before the logger, still sees it
    assert history.history["epsilon_gdp_clt"][-1] == pytest.approx(schedule.epsilon(DELTA, "gdp_clt"))
    assert history.history["noise_stddev"][-1] == pytest.approx(0.5)


@pytest.mark.filterwarnings("ignore:model.fit received x of type ndarray")  # arrays, public batch size: warned
@pytest.mark.parametrize("steps_per_epoch, epochs", [(3, 4), (5, 1)])
def test_budget_stop_ends_fit_on_arrays_at_the_last_step(steps_per_epoch, epochs):
    x, y = _data(4, num_examples=4 * steps_per_epoch)
    model = keras_dyndp.make_private(keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]))
    schedule = schedules.DPSchedule(np.ones(5), np.full(5, 0.5), 0.5)
    model.compile(optimizer=keras_dyndp.DynamicDPKerasSGD(schedule=schedule, public_batch_size=True), loss=LOSS)
    model.fit(x, y, batch_size=4, epochs=epochs, verbose=0, callbacks=[callbacks.BudgetStop()])
    assert int(model.optimizer.dp_step.numpy()) == min(5, steps_per_epoch * epochs)


def test_budget_stop_ends_a_steps_per_execution_loop_exactly_at_the_budget():
    p = 0.25
    x, y = _data(1)
    schedule = schedules.DPSchedule(np.full(10, 1.0), np.full(10, 0.5), sampling_probability=p)
    model = _private_model(schedule, len(x), training_metrics=True, steps_per_execution=3)
    budget_stop = callbacks.BudgetStop()
    # 4 steps per epoch: calls of 3 and 1 steps. The third epoch starts at step 8 with a call of 3 steps, which
    # would run step 10 past T = 10.
    history = model.fit(
        keras_dyndp.poisson_batches(x, y, sampling_probability=p),
        epochs=5,
        verbose=0,
        callbacks=[callbacks.PrivacyLogger("gdp_clt", delta=DELTA), budget_stop],
    )
    assert history.history["dp_step"] == [4.0, 8.0, 10.0]
    assert len(history.history["loss"]) == 3
    assert history.history["epsilon_gdp_clt"][-1] == pytest.approx(schedule.epsilon(DELTA, "gdp_clt"))
    assert budget_stop.stopped_at_step == 10 == int(model.optimizer.dp_step.numpy())
    assert callbacks._HOOKS.steps_per_execution(model) == 3  # restored for later calls (evaluate, predict)


@tensorflow_only
@pytest.mark.parametrize("steps_per_execution", [1, 3])
def test_privacy_logger_reaches_tensorboard_csv_and_history_wherever_it_is_listed(tmp_path, steps_per_execution):
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    p = 0.25
    x, y = _data(2)
    schedule = schedules.DPSchedule(np.full(12, 1.0), np.full(12, 0.8), sampling_probability=p)
    model = _private_model(schedule, len(x), steps_per_execution=steps_per_execution)
    csv_path = str(tmp_path / "log.csv")
    seen_first = []
    listed_first = [
        keras.callbacks.CSVLogger(csv_path),
        keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: seen_first.append(logs.get("epsilon_gdp_clt"))),
    ]
    if HAVE_TENSORBOARD:
        listed_first.insert(0, keras.callbacks.TensorBoard(str(tmp_path / "tb")))
    history = model.fit(
        keras_dyndp.poisson_batches(x, y, sampling_probability=p),
        epochs=3,
        verbose=0,
        callbacks=[*listed_first, callbacks.PrivacyLogger("gdp_clt", delta=DELTA)],
    )
    assert history.history["dp_step"] == [4.0, 8.0, 12.0]
    with open(csv_path) as handle:
        rows = handle.read().splitlines()
    assert "epsilon_gdp_clt" in rows[0].split(",") and len(rows) == 4
    assert seen_first == pytest.approx(history.history["epsilon_gdp_clt"])
    if not HAVE_TENSORBOARD:
        pytest.skip("TensorBoard part: the tensorboard package is not installed (TensorFlow 2.16+ does not require it)")
    tags = set()
    for event_file in tf.io.gfile.glob(str(tmp_path / "tb" / "train" / "events.*")):
        for event in tf.compat.v1.train.summary_iterator(event_file):
            tags.update(value.tag for value in event.summary.value)
    assert {"epoch_epsilon_gdp_clt", "epoch_dp_step"} <= tags


def test_budget_stop_ends_fit_with_an_ordinary_line_after_the_progress_bar(capsys, caplog):
    p = 0.25
    x, y = _data(3)
    model = _private_model(schedules.DPSchedule(np.ones(6), np.ones(6), sampling_probability=p), len(x))
    with caplog.at_level("WARNING"):
        model.fit(
            keras_dyndp.poisson_batches(x, y, sampling_probability=p, seed=0),  # 4 steps per epoch
            epochs=3,
            verbose=2,
            callbacks=[callbacks.BudgetStop()],
        )
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1] == "BudgetStop: the privacy budget is spent (6 of the schedule's 6 DP steps); training ended."
    assert "dp_step" in lines[-2]  # after the progress bar's last line
    assert not [record for record in caplog.records if "BudgetStop" in record.getMessage()]


def _spent_model(seed: int, num_steps: int = 3):
    """A private model whose optimizer has released all ``num_steps`` steps of its schedule in one fit (p 0.25)."""
    x, y = _data(seed)
    schedule = schedules.DPSchedule(np.ones(num_steps), np.ones(num_steps), sampling_probability=0.25)
    model = _private_model(schedule, len(x))
    batches = keras_dyndp.poisson_batches(x, y, sampling_probability=0.25)  # 4 steps per epoch
    model.fit(batches, epochs=1, verbose=0, callbacks=[callbacks.BudgetStop()])
    assert int(model.optimizer.dp_step.numpy()) == num_steps
    return model, schedule, (x, y)


@pytest.mark.filterwarnings("ignore::keras_dyndp.SamplingWarning")  # train_on_batch's batch: warned
@pytest.mark.parametrize("entry_point", ["fit", "unbound fit", "train_on_batch"])
def test_a_step_counter_set_back_after_the_budget_is_refused_and_the_logger_counts_the_steps_released(entry_point):
    """Issue 52: ``iterations.assign(0)`` after the T steps trained T more (3 + 3 on T = 3), and PrivacyLogger
    logged dp_step 3 and the 3-step epsilon for 6 released steps."""
    model, schedule, (x, y) = _spent_model(5)
    optimizer = model.optimizer
    weights = model.get_weights()
    optimizer.iterations.assign(0)
    batches = keras_dyndp.poisson_batches(x, y, sampling_probability=0.25)
    train = {
        "fit": lambda: model.fit(batches, epochs=1, verbose=0),
        "unbound fit": lambda: keras.Model.fit(model, batches, epochs=1, verbose=0, shuffle=False),
        "train_on_batch": lambda: model.train_on_batch(x[:10], y[:10]),
    }[entry_point]
    with pytest.raises(RuntimeError, match=r"is 0 but the optimizer has released 3 DP steps \(optimizer.released_"):
        train()
    for after, before in zip(model.get_weights(), weights):
        np.testing.assert_array_equal(after, before)
    assert optimizer.released_steps == 3 and int(optimizer.dp_step.numpy()) == 0
    logger = callbacks.PrivacyLogger(delta=DELTA)
    logger.set_model(model)
    values = logger.privacy_logs()
    assert values["dp_step"] == 3.0
    epsilon = next(value for key, value in values.items() if key.startswith("epsilon_pld"))
    assert epsilon == pytest.approx(schedule.epsilon(DELTA, accountant="pld"))
    optimizer.iterations.assign(optimizer.released_steps)  # what the refusal says: the counter set back
    with pytest.raises(keras_dyndp.BudgetExhaustedError, match="all 3 steps of the DPSchedule have been released"):
        model.fit(batches, epochs=1, verbose=0)


def test_a_step_counter_set_back_within_the_budget_is_refused_until_it_counts_the_steps_released():
    x, y = _data(6)
    schedule = schedules.DPSchedule(np.ones(8), np.ones(8), sampling_probability=0.25)
    model = _private_model(schedule, len(x))
    batches = keras_dyndp.poisson_batches(x, y, sampling_probability=0.25)  # 4 steps per epoch
    model.fit(batches, epochs=1, verbose=0)
    model.optimizer.iterations.assign(1)  # the schedule's steps 1-3 would run again
    with pytest.raises(RuntimeError, match="is 1 but the optimizer has released 4 DP steps"):
        model.fit(batches, epochs=1, verbose=0)
    model.optimizer.iterations.assign(model.optimizer.released_steps)
    history = model.fit(batches, epochs=1, verbose=0, callbacks=[callbacks.PrivacyLogger(delta=DELTA)])
    assert history.history["dp_step"] == [8.0] and model.optimizer.released_steps == 8


@pytest.mark.parametrize("with_budget_stop", [True, False])
def test_a_fit_after_the_budget_says_it_is_spent_and_what_to_do_without_suggesting_budget_stop(with_budget_stop):
    """Issue 55: a second fit after the budget, BudgetStop among its callbacks, was told to add BudgetStop."""
    model, _, (x, y) = _spent_model(7)
    batches = keras_dyndp.poisson_batches(x, y, sampling_probability=0.25)
    with pytest.raises(keras_dyndp.BudgetExhaustedError) as raised:
        model.fit(batches, epochs=1, verbose=0, callbacks=[callbacks.BudgetStop()] if with_budget_stop else [])
    message = str(raised.value)
    assert message.startswith("DP budget exhausted: all 3 steps of the DPSchedule have been released")
    assert "A new schedule is a new budget" in message and "model.evaluate and model.predict" in message
    assert "BudgetStop" not in message  # it cannot help a fit that starts on a spent budget


def test_a_fit_that_runs_past_the_budget_without_budget_stop_is_told_to_add_it():
    x, y = _data(8)
    schedule = schedules.DPSchedule(np.ones(3), np.ones(3), sampling_probability=0.25)
    model = _private_model(schedule, len(x))
    with pytest.raises(keras_dyndp.BudgetExhaustedError) as raised:
        model.fit(keras_dyndp.poisson_batches(x, y, sampling_probability=0.25), epochs=1, verbose=0)
    assert str(raised.value).endswith("add keras_dyndp.BudgetStop() to its callbacks.")
    assert model.optimizer.released_steps == 3


def _calibrated(target_delta=1.67e-5, num_steps=4):
    return schedules.calibrate(
        "vanilla",
        target_epsilon=2.0,
        target_delta=target_delta,
        sampling_probability=0.1,
        num_steps=num_steps,
        initial_clip=1.0,
    )


def test_privacy_logger_reads_epsilon_at_the_target_delta_unless_told_and_names_another_delta_in_its_keys():
    """The new user's run: PrivacyLogger(delta=1e-2) beside a target of 1.67e-5 logged 'epsilon_pld' 0.53 where the
    epsilon at the target was 1.95."""
    schedule = _calibrated()
    default = callbacks.PrivacyLogger()
    _attach(default, _optimizer(schedule, 4))
    default.on_train_begin()
    logs = default.privacy_logs()
    assert logs["epsilon_pld"] == pytest.approx(schedule.epsilon(1.67e-5, "pld")) and logs["delta_total"] == 1.67e-5
    same = callbacks.PrivacyLogger(delta=1.67e-5)
    _attach(same, _optimizer(schedule, 4))
    assert same.privacy_logs() == logs
    other = callbacks.PrivacyLogger(delta=1e-2)
    _attach(other, _optimizer(schedule, 4))
    logs = other.privacy_logs()
    assert "epsilon_pld" not in logs and "epsilon_gdp_clt" not in logs
    assert logs["epsilon_pld_at_delta_0.01"] == pytest.approx(schedule.epsilon(1e-2, "pld"))
    assert "epsilon_gdp_clt_at_delta_0.01" in logs and logs["delta_total_at_delta_0.01"] == 1e-2
    shared = set(logs) & set(default.privacy_logs())
    assert shared == {"clip_norm", "noise_stddev", "dp_step"}  # two loggers in one fit: no value overwritten


def test_privacy_logger_needs_a_delta_beside_a_schedule_without_a_target():
    logger = callbacks.PrivacyLogger()
    _attach(logger, _optimizer(_schedule()))
    with pytest.raises(ValueError, match="PrivacyLogger needs `delta`: the optimizer's schedule was built by hand"):
        logger.on_train_begin()


def test_privacy_logger_adds_the_delta_of_the_batches_cap_to_delta_total():
    schedule = _calibrated(target_delta=1e-5, num_steps=40)
    optimizer = _optimizer(schedule, 40)
    optimizer.note_batch_cap(40, 20)  # accepted: below the default cap (24), adding 1.2e-8 at epsilon 2
    logger = callbacks.PrivacyLogger()
    _attach(logger, optimizer)
    logs = logger.privacy_logs()
    eta = batch_sizes.overflow_probability(40, 0.1, 20)
    added = batch_sizes.added_delta(eta, 40, max(logs["epsilon_pld"], logs["epsilon_gdp_clt"]))
    assert optimizer.overflow_probability == eta and 1e-9 < added <= 1e-7
    assert logs["delta_total"] == pytest.approx(1e-5 + added, rel=1e-12)


def test_fit_on_batches_capped_to_void_the_delta_is_refused_before_the_first_step():
    """The review's run: max_batch_size=2 at N 40, p 0.1 truncated 79% of the batches; PrivacyLogger logged
    epsilon_pld 2.087 at delta 1e-5."""
    x, y = _data(5)
    model = _private_model(_calibrated(target_delta=1e-5, num_steps=40), len(x))
    batches = keras_dyndp.poisson_batches(x, y, sampling_probability=0.1, max_batch_size=2, seed=0)
    with pytest.raises(ValueError, match=r"max_batch_size=2 truncates 0.791 of the batches .*default cap, 24,"):
        model.fit(batches, epochs=1, verbose=0, callbacks=[callbacks.PrivacyLogger()])
    assert int(model.optimizer.dp_step.numpy()) == 0
    history = model.fit(
        keras_dyndp.poisson_batches(x, y, sampling_probability=0.1, seed=0),
        epochs=1,
        verbose=0,
        callbacks=[callbacks.PrivacyLogger()],
    )
    assert 0 < model.optimizer.overflow_probability < 1e-11
    assert 1e-5 < history.history["delta_total"][0] < 1e-5 * (1 + batch_sizes.TRUNCATION_DELTA_SHARE)
