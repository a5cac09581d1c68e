"""Tests for keras_dyndp.optimizers.dp_optimizer: the dynamic DP Keras optimizers."""

import warnings

import numpy as np
import pytest
import tensorflow as tf

from keras_dyndp import schedules
from keras_dyndp.optimizers import dp_optimizer
from keras_dyndp.optimizers.dp_optimizer import DynamicDPKerasAdagrad
from keras_dyndp.optimizers.dp_optimizer import DynamicDPKerasAdam
from keras_dyndp.optimizers.dp_optimizer import DynamicDPKerasRMSprop
from keras_dyndp.optimizers.dp_optimizer import DynamicDPKerasSGD

DP_CLASSES = [DynamicDPKerasSGD, DynamicDPKerasAdam, DynamicDPKerasAdagrad, DynamicDPKerasRMSprop]
BASE_CLASSES = [tf.keras.optimizers.SGD, tf.keras.optimizers.Adam, tf.keras.optimizers.Adagrad,
                tf.keras.optimizers.RMSprop]
KERNEL0 = np.array([[0.5, -1.0], [2.0, 0.3], [-0.7, 1.1]], np.float32)


def per_example_mse():
    return tf.keras.losses.MeanSquaredError(reduction=tf.keras.losses.Reduction.NONE)


def noiseless_schedule(clip_norms, sampling_probability=0.1):
    return schedules.DPSchedule(clip_norms, np.zeros(len(clip_norms)), sampling_probability)


def linear_model(kind="sequential"):
    """Dense(2) on 3 inputs with a fixed kernel and zero bias, built three ways."""
    dense_args = dict(kernel_initializer=tf.keras.initializers.Constant(KERNEL0), bias_initializer="zeros")
    if kind == "sequential":
        return tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(2, **dense_args)])
    if kind == "functional":
        inputs = tf.keras.Input((3,))
        return tf.keras.Model(inputs, tf.keras.layers.Dense(2, **dense_args)(inputs))

    class Linear(tf.keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = tf.keras.layers.Dense(2, **dense_args)

        def call(self, inputs):
            return self.dense(inputs)

    return Linear()


def data(num_rows=4, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(num_rows, 3)).astype(np.float32) * 2
    y = rng.normal(size=(num_rows, 2)).astype(np.float32)
    x[1] = 0.0
    y[1] = 0.0  # zero input, zero target, zero bias: example 1 has a zero gradient
    return x, y


def numpy_dp_update(x, y, clip_norm, num_microbatches, normaliser):
    """Mean-of-clipped gradient of the per-example MSE of the linear model at (KERNEL0, 0)."""
    residual = x @ KERNEL0 - y  # d/dpred of mean((pred - y)^2) over 2 outputs is residual
    grad_kernel = np.einsum("bi,bj->bij", x, residual)
    grad_bias = residual
    if num_microbatches is not None:
        grad_kernel = grad_kernel.reshape(num_microbatches, -1, 3, 2).mean(axis=1)
        grad_bias = grad_bias.reshape(num_microbatches, -1, 2).mean(axis=1)
    norms = np.sqrt(np.sum(grad_kernel**2, axis=(1, 2)) + np.sum(grad_bias**2, axis=1))
    factors = np.minimum(1.0, clip_norm / np.maximum(norms, 1e-30))
    return (np.tensordot(factors, grad_kernel, axes=1) / normaliser,
            np.tensordot(factors, grad_bias, axes=1) / normaliser, norms)


@pytest.mark.parametrize(
    "num_microbatches, expected_batch_size, normaliser",
    [(None, None, 4.0), (None, 5.0, 5.0), (2, None, 2.0)],
)
def test_step_matches_numpy_mean_of_clipped_gradients(num_microbatches, expected_batch_size, normaliser):
    x, y = data()
    update_kernel, update_bias, norms = numpy_dp_update(x, y, 1.0, num_microbatches, normaliser)
    assert norms.max() > 1.0  # clipping is active
    if num_microbatches is None:
        assert norms[1] == 0.0 and norms.min() < norms.max()
    model = linear_model()
    optimizer = DynamicDPKerasSGD(schedule=noiseless_schedule([1.0, 1.0]), learning_rate=0.5,
                                  num_microbatches=num_microbatches, expected_batch_size=expected_batch_size)
    model.compile(optimizer=optimizer, loss=per_example_mse())
    model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    kernel, bias = model.get_weights()
    np.testing.assert_allclose(kernel, KERNEL0 - 0.5 * update_kernel, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(bias, -0.5 * update_bias, rtol=1e-5, atol=1e-6)
    assert int(optimizer.dp_step) == 1


@pytest.mark.parametrize("dp_cls, base_cls", list(zip(DP_CLASSES, BASE_CLASSES)))
def test_huge_clip_and_no_noise_is_the_base_optimizer(dp_cls, base_cls):
    x, y = data(num_rows=8, seed=1)
    dp_model, model = linear_model(), linear_model()
    dp_model.compile(optimizer=dp_cls(schedule=noiseless_schedule([1e6] * 2), learning_rate=0.1),
                     loss=per_example_mse())
    model.compile(optimizer=base_cls(learning_rate=0.1), loss=tf.keras.losses.MeanSquaredError())
    dp_model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    for dp_weight, weight in zip(dp_model.get_weights(), model.get_weights()):
        np.testing.assert_allclose(dp_weight, weight, rtol=1e-5, atol=1e-6)
    assert isinstance(dp_model.optimizer, base_cls)


def zero_data_update(optimizer, num_rows):
    """One step on a 100x100 variable whose per-example gradients are all zero: returns the update."""
    variable = tf.Variable(tf.zeros([100, 100]))
    inputs = tf.zeros([num_rows, 100])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(inputs @ variable, axis=1)
    optimizer.minimize(loss, [variable], tape=tape)
    return -variable.numpy()


@pytest.mark.parametrize(
    "num_microbatches, expected_batch_size, expected_std",
    [(None, None, 3.0 / 4), (None, 5.0, 3.0 / 5), (2, None, 2 * 3.0 / 2), (4, None, 3.0 / 4)],
)
def test_noise_std_is_sigma_over_normaliser(num_microbatches, expected_batch_size, expected_std):
    tf.random.set_seed(0)
    schedule = schedules.DPSchedule([1.0, 1.0], [3.0, 3.0], 0.1)
    optimizer = DynamicDPKerasSGD(schedule=schedule, learning_rate=1.0, num_microbatches=num_microbatches,
                                  expected_batch_size=expected_batch_size)
    update = zero_data_update(optimizer, num_rows=4)
    assert np.std(update) == pytest.approx(expected_std, rel=0.1)
    assert abs(np.mean(update)) < 0.05 * expected_std


def test_step_counter_indexes_the_schedule():
    schedule = noiseless_schedule([0.1, 1.0, 10.0])
    optimizer = DynamicDPKerasSGD(schedule=schedule, learning_rate=1.0)
    variable = tf.Variable(tf.zeros([2]))
    direction = tf.constant([[300.0, 400.0]])  # one example, gradient norm 500: always clipped

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(direction * variable, axis=1)
        optimizer.minimize(loss, [variable], tape=tape)

    for k, clip_norm in enumerate([0.1, 1.0, 10.0]):
        assert int(optimizer.dp_step) == k
        assert optimizer.current_clip_norm().numpy() == pytest.approx(clip_norm)
        assert optimizer.current_clip_norm().dtype == tf.float32
        before = variable.numpy()
        step()
        np.testing.assert_allclose(before - variable.numpy(), clip_norm * np.array([0.6, 0.8]), rtol=1e-5)
        if k == 0:
            traces_after_first_step = step.experimental_get_tracing_count()
    assert optimizer.dp_step is optimizer.iterations
    assert step.experimental_get_tracing_count() == traces_after_first_step  # no retracing per step


def test_checkpoint_restore_continues_at_saved_step(tmp_path):
    schedule = noiseless_schedule([0.1, 1.0, 10.0, 10.0])
    x, y = data()
    model = linear_model()
    model.compile(optimizer=DynamicDPKerasAdam(schedule=schedule, learning_rate=0.1), loss=per_example_mse())
    model.fit(x, y, batch_size=2, epochs=1, shuffle=False, verbose=0)
    path = tf.train.Checkpoint(model=model, optimizer=model.optimizer).save(str(tmp_path / "ckpt"))

    restored = linear_model()
    restored.compile(optimizer=DynamicDPKerasAdam(schedule=schedule, learning_rate=0.1), loss=per_example_mse())
    tf.train.Checkpoint(model=restored, optimizer=restored.optimizer).restore(path)
    assert int(restored.optimizer.dp_step) == 2
    assert restored.optimizer.current_clip_norm().numpy() == pytest.approx(10.0)
    model.fit(x[:2], y[:2], batch_size=2, epochs=1, shuffle=False, verbose=0)
    restored.fit(x[:2], y[:2], batch_size=2, epochs=1, shuffle=False, verbose=0)
    assert int(restored.optimizer.dp_step) == 3
    for restored_weight, weight in zip(restored.get_weights(), model.get_weights()):
        np.testing.assert_allclose(restored_weight, weight, rtol=1e-6)


def test_model_save_and_load_round_trip(tmp_path):
    schedule = schedules.DPSchedule([1.0, 0.5, 0.25], [0.5, 0.4, 0.3], 0.01)
    x, y = data()
    model = linear_model("functional")
    model.compile(optimizer=DynamicDPKerasRMSprop(schedule=schedule, learning_rate=0.01, num_microbatches=2),
                  loss=per_example_mse())
    model.fit(x, y, batch_size=4, epochs=1, verbose=0)
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = tf.keras.models.load_model(path, custom_objects={"DynamicDPKerasRMSprop": DynamicDPKerasRMSprop})
    assert type(loaded.optimizer) is DynamicDPKerasRMSprop
    assert loaded.optimizer.get_config() == model.optimizer.get_config()
    assert loaded.optimizer.schedule == schedule
    assert int(loaded.optimizer.dp_step) == 1
    loaded.fit(x, y, batch_size=4, epochs=1, verbose=0)
    assert int(loaded.optimizer.dp_step) == 2


@pytest.mark.parametrize("dp_cls", DP_CLASSES)
def test_get_config_from_config_round_trip(dp_cls):
    schedule = schedules.DPSchedule([1.0, 0.5], [0.5, 0.4], 0.01)
    optimizer = dp_cls(schedule=schedule, learning_rate=0.05, expected_batch_size=32)
    config = optimizer.get_config()
    assert config["schedule"] == schedule.get_config()
    assert config["name"] == dp_cls.__name__
    restored = dp_cls.from_config(config)
    assert restored.get_config() == config
    assert restored.schedule == schedule
    assert restored.expected_batch_size == 32.0
    serialized = tf.keras.optimizers.serialize(optimizer)
    assert serialized["registered_name"] == f"keras_dyndp>{dp_cls.__name__}"
    assert type(tf.keras.optimizers.deserialize(serialized)) is dp_cls


def test_budget_arguments_build_the_calibrated_schedule():
    optimizer = DynamicDPKerasSGD(target_epsilon=1.0, target_delta=1e-5, num_examples=1000, batch_size=10,
                                  epochs=2, method="dynamic", initial_clip=1.5, rho_mu=1.25, rho_c=2.0,
                                  accountant="rdp", learning_rate=0.1)
    expected = schedules.calibrate("dynamic", target_epsilon=1.0, target_delta=1e-5, sampling_probability=0.01,
                                   num_steps=200, initial_clip=1.5, rho_mu=1.25, rho_c=2.0, accountant="rdp")
    assert optimizer.schedule == expected
    assert optimizer.expected_batch_size == 10.0
    assert float(optimizer.learning_rate) == pytest.approx(0.1)


def test_scalar_loss_is_refused_through_fit():
    x, y = data()
    model = linear_model()
    model.compile(optimizer=DynamicDPKerasSGD(schedule=noiseless_schedule([1.0])),
                  loss=tf.keras.losses.MeanSquaredError())
    with pytest.raises(ValueError, match="reduction=tf.keras.losses.Reduction.NONE"):
        model.fit(x, y, batch_size=4, epochs=1, verbose=0)


def test_exhausted_budget_raises():
    x, y = data()
    model = linear_model()
    model.compile(optimizer=DynamicDPKerasSGD(schedule=noiseless_schedule([1.0, 1.0])), loss=per_example_mse())
    model.fit(x, y, batch_size=2, epochs=1, verbose=0)
    weights = model.get_weights()
    with pytest.raises(tf.errors.InvalidArgumentError, match="DP budget exhausted"):
        model.fit(x, y, batch_size=2, epochs=1, verbose=0)
    for after, before in zip(model.get_weights(), weights):
        np.testing.assert_array_equal(after, before)
    assert int(model.optimizer.dp_step) == 2
    assert model.optimizer.current_clip_norm().numpy() == 0.0
    assert model.optimizer.current_noise_stddev().numpy() == 0.0


def test_jit_compile_fit_trains_then_stops_updating_past_the_budget():
    schedule = schedules.DPSchedule([1.0, 1.0], [0.1, 0.1], 0.1)
    x, y = data()
    model = linear_model()
    model.compile(optimizer=DynamicDPKerasSGD(schedule=schedule, learning_rate=0.5), loss=per_example_mse(),
                  jit_compile=True)
    model.fit(x, y, batch_size=2, epochs=1, shuffle=False, verbose=0)
    trained = model.get_weights()
    assert not np.allclose(trained[0], KERNEL0)
    # XLA drops the assert; past T the clip and the noise are 0, so the update is exactly zero.
    model.fit(x, y, batch_size=2, epochs=1, shuffle=False, verbose=0)
    for after, before in zip(model.get_weights(), trained):
        np.testing.assert_array_equal(after, before)
    assert int(model.optimizer.dp_step) == 4


@pytest.mark.parametrize("kind", ["sequential", "functional", "subclassed"])
def test_fit_works_for_every_model_kind(kind):
    x, y = data(num_rows=8)
    model = linear_model(kind)
    schedule = schedules.DPSchedule([1.0] * 4, [0.5] * 4, 0.1)
    model.compile(optimizer=DynamicDPKerasAdam(schedule=schedule, learning_rate=0.01, expected_batch_size=4),
                  loss=per_example_mse(), metrics=["mae"])
    history = model.fit(x, y, batch_size=4, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    assert int(model.optimizer.dp_step) == 2


def test_direct_apply_gradients_is_refused():
    optimizer = DynamicDPKerasSGD(schedule=noiseless_schedule([1.0, 1.0]))
    variable = tf.Variable([1.0, 2.0])
    with pytest.raises(RuntimeError, match="without differential privacy"):
        optimizer.apply_gradients([(tf.constant([0.1, 0.1]), variable)])
    with tf.GradientTape() as tape:
        loss = variable * 2.0
    grads_and_vars = optimizer.compute_gradients(loss, [variable], tape=tape)
    with pytest.raises(RuntimeError, match="without differential privacy"):
        optimizer.apply_gradients([(grad * 10.0, var) for grad, var in grads_and_vars])
    np.testing.assert_array_equal(variable.numpy(), [1.0, 2.0])
    assert int(optimizer.dp_step) == 0


def test_compute_then_apply_unchanged_gradients_is_accepted():
    optimizer = DynamicDPKerasSGD(schedule=noiseless_schedule([1.0, 1.0]), learning_rate=1.0)
    variable = tf.Variable([1.0, 2.0])
    with tf.GradientTape() as tape:
        loss = tf.stack([variable[0] * 0.5, variable[1] * 4.0])  # example gradients (0.5, 0) and (0, 4 -> 1)
    optimizer.apply_gradients(optimizer.compute_gradients(loss, [variable], tape=tape))
    np.testing.assert_allclose(variable.numpy(), [1.0 - 0.25, 2.0 - 0.5])
    assert int(optimizer.dp_step) == 1


def test_empty_batch_releases_only_noise_normalised_by_expected_batch_size():
    tf.random.set_seed(4)
    schedule = schedules.DPSchedule([1.0, 1.0], [2.0, 2.0], 0.1)
    optimizer = DynamicDPKerasSGD(schedule=schedule, learning_rate=1.0, expected_batch_size=4)
    update = zero_data_update(optimizer, num_rows=0)
    assert np.std(update) == pytest.approx(2.0 / 4, rel=0.1)
    assert int(optimizer.dp_step) == 1


def test_fit_on_unknown_cardinality_dataset_with_empty_batch_counts_real_steps_only():
    def batches():
        for num_rows in (2, 0):
            yield np.ones((num_rows, 3), np.float32), np.zeros((num_rows, 2), np.float32)

    dataset = tf.data.Dataset.from_generator(
        batches, output_signature=(tf.TensorSpec([None, 3]), tf.TensorSpec([None, 2])))
    model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(4), tf.keras.layers.Dense(2)])
    schedule = schedules.DPSchedule([1.0] * 5, [0.5] * 5, 0.1)
    model.compile(optimizer=DynamicDPKerasSGD(schedule=schedule, learning_rate=0.1, expected_batch_size=2),
                  loss=per_example_mse())
    model.fit(dataset, epochs=1, verbose=0)
    # Keras's base optimizers count 3 here: the counter ran when the exhausted iterator aborted the third call.
    assert int(model.optimizer.dp_step) == 2
    assert all(np.all(np.isfinite(weight)) for weight in model.get_weights())


def test_apply_clipped_gradient_sum_adds_noise_normalises_and_advances():
    tf.random.set_seed(3)
    schedule = schedules.DPSchedule([1.0, 1.0, 1.0], [0.0, 2.0, 2.0], 0.1)
    optimizer = DynamicDPKerasSGD(schedule=schedule, learning_rate=1.0, expected_batch_size=8)
    small, large = tf.Variable(tf.zeros([3])), tf.Variable(tf.zeros([100, 100]))
    optimizer.apply_clipped_gradient_sum([tf.constant([8.0, 4.0, 0.0]), None], 3, [small, large])
    np.testing.assert_allclose(small.numpy(), [-1.0, -0.5, 0.0])
    np.testing.assert_array_equal(large.numpy(), 0.0)
    assert optimizer.current_noise_stddev().numpy() == pytest.approx(2.0)
    tf.function(optimizer.apply_clipped_gradient_sum)([tf.zeros([3]), tf.zeros([100, 100])], 3, [small, large])
    assert np.std(large.numpy()) == pytest.approx(2.0 / 8, rel=0.1)
    assert int(optimizer.dp_step) == 2


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(num_microbatches=0), ValueError, "`num_microbatches` must be None .* integer >= 1"),
        (dict(num_microbatches=1.5), ValueError, "num_microbatches"),
        (dict(num_microbatches=True), ValueError, "num_microbatches"),
        (dict(expected_batch_size=0), ValueError, "`expected_batch_size` must be None .* > 0"),
        (dict(expected_batch_size=-3.0), ValueError, "expected_batch_size"),
        (dict(expected_batch_size=float("nan")), ValueError, "expected_batch_size"),
        (dict(schedule=None), ValueError, "Received neither"),
        (dict(schedule=[1.0, 2.0]), TypeError, "`schedule` must be a keras_dyndp.schedules.DPSchedule"),
        (dict(target_epsilon=1.0), ValueError, "not both"),
        (dict(rho_mu=2.0), ValueError, "not both"),
        (dict(schedule=None, target_epsilon=1.0, target_delta=1e-5), ValueError, "needs num_examples"),
        (dict(schedule=None, target_epsilon=1.0, target_delta=1e-5, num_examples=100, batch_size=10, epochs=1,
              method="vanilla", initial_clip=1.0, expected_batch_size=20), ValueError, "expected_batch_size"),
        (dict(decay=0.1), ValueError, "decay"),
    ],
)
def test_bad_arguments(kwargs, error, match):
    arguments = dict(schedule=noiseless_schedule([1.0]))
    arguments.update(kwargs)
    with pytest.raises(error, match=match):
        DynamicDPKerasSGD(**arguments)


def test_factory_rejects_non_optimizer_and_legacy_classes():
    with pytest.raises(TypeError, match="base_cls"):
        dp_optimizer.make_dynamic_dp_optimizer_class(tf.keras.optimizers.legacy.SGD)
    with pytest.raises(TypeError, match="base_cls"):
        dp_optimizer.make_dynamic_dp_optimizer_class(object)


def test_more_than_one_replica_is_refused(monkeypatch):
    class TwoReplicas:
        num_replicas_in_sync = 2

    monkeypatch.setattr(tf.distribute, "get_strategy", lambda: TwoReplicas())
    with pytest.raises(ValueError, match="single replica"):
        DynamicDPKerasSGD(schedule=noiseless_schedule([1.0]))


def _issue_budget(**overrides):
    """The issue's short run: p = 0.01 (batch 1 of 100), T = 20, epsilon 1, delta 1e-5."""
    budget = dict(target_epsilon=1.0, target_delta=1e-5, num_examples=100, batch_size=1, steps=20, method="vanilla",
                  initial_clip=1.0)
    budget.update(overrides)
    return budget


def test_budget_arguments_default_to_the_rigorous_pld():
    optimizer = DynamicDPKerasSGD(**_issue_budget())
    assert optimizer.schedule.calibration == schedules.Calibration("pld", 1.0, 1e-5)
    assert 0.999 <= optimizer.schedule.epsilon(1e-5, "pld") <= 1.0


def test_gdp_clt_calibration_warns_once_with_the_pld_epsilon():
    with pytest.warns(schedules.GdpCltUnderstatementWarning) as from_budget:
        optimizer = DynamicDPKerasSGD(**_issue_budget(accountant="gdp_clt"))
    assert len(from_budget) == 1
    assert "calibrated to epsilon = 1 (delta = 1e-05) under the GDP-CLT" in str(from_budget[0].message)
    assert "PLD epsilon is 4.198" in str(from_budget[0].message)
    assert from_budget[0].filename == __file__  # Attributed to the line that builds the optimizer.
    with pytest.warns(schedules.GdpCltUnderstatementWarning, match="PLD epsilon is 4.198") as from_schedule:
        DynamicDPKerasSGD(schedule=optimizer.schedule)
    assert len(from_schedule) == 1
    # No warning for a rigorous calibration, a hand-built schedule, or a GDP-CLT one within 5% of its PLD.
    schedules_without_warning = [
        DynamicDPKerasSGD(**_issue_budget()).schedule,
        schedules.DPSchedule(optimizer.schedule.clip_norms, optimizer.schedule.noise_stddevs, 0.01),
        schedules.calibrate("vanilla", target_epsilon=1.2, target_delta=1e-5, sampling_probability=250 / 60000,
                            num_steps=4800, initial_clip=1.0, accountant="gdp_clt"),  # PLD 1.25.
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error", schedules.GdpCltUnderstatementWarning)
        for schedule in schedules_without_warning:
            DynamicDPKerasSGD(schedule=schedule)
