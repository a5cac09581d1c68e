"""Tests for keras_dyndp.tf_backend.optimizer: the dynamic DP Keras optimizers."""

import warnings

import numpy as np
import pytest
import tensorflow as tf

from keras_dyndp import callbacks
from keras_dyndp import optimizer_base
from keras_dyndp import schedules
from keras_dyndp.accounting import noise_range
from keras_dyndp.keras_glue import private_model
from keras_dyndp.keras_glue import restarts
from keras_dyndp.tf_backend import keras_compat
from keras_dyndp.tf_backend import microbatches
from keras_dyndp.tf_backend import ops
from keras_dyndp.tf_backend import optimizer as optimizer_module
from keras_dyndp.tf_backend.optimizer import DynamicDPKerasAdagrad
from keras_dyndp.tf_backend.optimizer import DynamicDPKerasAdam
from keras_dyndp.tf_backend.optimizer import DynamicDPKerasRMSprop
from keras_dyndp.tf_backend.optimizer import DynamicDPKerasSGD
from keras_dyndp.tf_backend.train_step import make_private

keras = keras_compat.keras
# Test-only settings this module uses on purpose, named so that no other warning is hidden: noiseless schedules
# (allow_degenerate_noise=True) to compare clipped sums exactly, the optimizer called outside a Keras train step to
# measure one step, and numpy arrays to fit for brevity. The tests of these warnings assert them (pytest.warns).
pytestmark = [
    pytest.mark.filterwarnings("ignore::keras_dyndp.optimizer_base.DegenerateNoiseWarning"),
    pytest.mark.filterwarnings("ignore:keras_dyndp cannot see the batches:keras_dyndp.SamplingWarning"),
    pytest.mark.filterwarnings("ignore:DynamicDPKeras\\w+ is not called from a Keras model's train step:UserWarning"),
    pytest.mark.filterwarnings("ignore:model.fit received x of type:keras_dyndp.SamplingWarning"),
]
DP_CLASSES = [DynamicDPKerasSGD, DynamicDPKerasAdam, DynamicDPKerasAdagrad, DynamicDPKerasRMSprop]
BASE_CLASSES = [keras.optimizers.SGD, keras.optimizers.Adam, keras.optimizers.Adagrad, keras.optimizers.RMSprop]
KERNEL0 = np.array([[0.5, -1.0], [2.0, 0.3], [-0.7, 1.1]], np.float32)


# How a step reaches the optimizer: make_private's fast train step; its step with method="jacobian", which hands the
# per-example losses to the optimizer's own path (minimize: one jacobian); a custom loop calling minimize.
FAST, JACOBIAN, MINIMIZE = "make_private", "jacobian", "minimize"


def per_example_mse():
    return keras.losses.MeanSquaredError(reduction="none")


def compile_on(path, model, optimizer, loss=None, **compile_kwargs):
    """Compiles ``model`` for training on ``path`` (FAST, JACOBIAN or MINIMIZE) and returns it."""
    if path != MINIMIZE:
        model = make_private(model, "auto" if path == FAST else "jacobian")
    model.compile(optimizer=optimizer, loss=per_example_mse() if loss is None else loss, **compile_kwargs)
    return model


def fit_on(path, model, x, y, batch_size):
    """One epoch in order: ``model.fit``, or (MINIMIZE) a custom loop calling the optimizer's minimize."""
    if path != MINIMIZE:
        return model.fit(x, y, batch_size=batch_size, shuffle=False, verbose=0)
    for x_batch, y_batch in batches(x, y, batch_size):
        with tf.GradientTape() as tape:
            losses = model.loss(y_batch, model(x_batch, training=True))
        model.optimizer.minimize(losses, model.trainable_variables, tape=tape)


def noiseless_schedule(clip_norms, sampling_probability=0.1):
    return schedules.DPSchedule(clip_norms, np.zeros(len(clip_norms)), sampling_probability)


def linear_model(kind="sequential"):
    """Dense(2) on 3 inputs with a fixed kernel and zero bias, built three ways."""
    dense_args = dict(kernel_initializer=keras.initializers.Constant(KERNEL0), bias_initializer="zeros")
    if kind == "sequential":
        return keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, **dense_args)])
    if kind == "functional":
        inputs = keras.Input((3,))
        return keras.Model(inputs, keras.layers.Dense(2, **dense_args)(inputs))

    class Linear(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(2, **dense_args)

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


def batches(x, y, batch_size):
    """Batches of ``batch_size`` rows in order, as fit cuts arrays, which it refuses for an optimizer with
    ``expected_batch_size``; a dataset is taken (with a SamplingWarning) and its batch sizes checked."""
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch_size)


def numpy_dp_update(x, y, clip_norm, normaliser, assignment=None):
    """Mean-of-clipped gradient of the per-example MSE of the linear model at (KERNEL0, 0).

    With `assignment` (row -> microbatch), each microbatch's gradient is the sum of its rows' gradients over the
    number of its rows with a non-zero loss.
    """
    residual = x @ KERNEL0 - y  # d/dpred of mean((pred - y)^2) over 2 outputs is residual
    grad_kernel = np.einsum("bi,bj->bij", x, residual)
    grad_bias = residual
    if assignment is not None:
        membership = np.eye(max(assignment) + 1)[assignment].T  # [M, B]
        counts = np.maximum(membership @ (np.mean(residual**2, axis=1) != 0), 1)
        grad_kernel = np.einsum("mb,bij->mij", membership, grad_kernel) / counts[:, None, None]
        grad_bias = membership @ grad_bias / counts[:, None]
    norms = np.sqrt(np.sum(grad_kernel**2, axis=(1, 2)) + np.sum(grad_bias**2, axis=1))
    factors = np.minimum(1.0, clip_norm / np.maximum(norms, 1e-30))
    return (
        np.tensordot(factors, grad_kernel, axes=1) / normaliser,
        np.tensordot(factors, grad_bias, axes=1) / normaliser,
        norms,
    )


@pytest.mark.parametrize("path", [JACOBIAN, FAST])
@pytest.mark.parametrize(
    "num_microbatches, expected_batch_size, normaliser",
    [(None, None, 4.0), (None, 5.0, 5.0), (2, None, 2.0)],
)
def test_step_matches_numpy_mean_of_clipped_gradients(
    num_microbatches, expected_batch_size, normaliser, path, monkeypatch
):
    x, y = data()
    # Microbatch 0 holds examples 0 and 1 (whose loss is 0: it does not count in the mean), microbatch 1 the rest.
    assignment = None if num_microbatches is None else [0, 0, 1, 1]
    if assignment is not None:
        monkeypatch.setattr(microbatches, "random_assignment", lambda *args: tf.constant(assignment))
    update_kernel, update_bias, norms = numpy_dp_update(x, y, 1.0, normaliser, assignment)
    assert norms.max() > 1.0  # clipping is active
    if num_microbatches is None:
        assert norms[1] == 0.0 and norms.min() < norms.max()
    optimizer = DynamicDPKerasSGD(
        schedule=noiseless_schedule([1.0, 1.0]),
        allow_degenerate_noise=True,
        learning_rate=0.5,
        num_microbatches=num_microbatches,
        expected_batch_size=expected_batch_size,
        public_batch_size=expected_batch_size is None,
    )
    model = compile_on(path, linear_model(), optimizer)
    model.fit(batches(x, y, 4), epochs=1, verbose=0)
    kernel, bias = model.get_weights()
    np.testing.assert_allclose(kernel, KERNEL0 - 0.5 * update_kernel, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(bias, -0.5 * update_bias, rtol=1e-5, atol=1e-6)
    assert int(optimizer.dp_step) == 1


@pytest.mark.parametrize("dp_cls, base_cls", list(zip(DP_CLASSES, BASE_CLASSES)))
def test_huge_clip_and_no_noise_is_the_base_optimizer(dp_cls, base_cls):
    x, y = data(num_rows=8, seed=1)
    dp_model = compile_on(
        FAST,
        linear_model(),
        dp_cls(
            schedule=noiseless_schedule([1e6] * 2),
            allow_degenerate_noise=True,
            public_batch_size=True,
            learning_rate=0.1,
        ),
    )
    model = linear_model()
    model.compile(optimizer=base_cls(learning_rate=0.1), loss=keras.losses.MeanSquaredError())
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


def test_rescale_to_unit_norm_divides_the_update_by_the_step_clip():
    """No noise: the rescaled step is the plain step over C_t, sum_i g_i / max(||g_i||, C_t) / n."""
    x, y = data()
    clip = 0.5
    rescaled_optimizer = DynamicDPKerasSGD(
        schedule=noiseless_schedule([clip]),
        allow_degenerate_noise=True,
        public_batch_size=True,
        learning_rate=0.5,
        rescale_to_unit_norm=True,
    )
    assert rescaled_optimizer.rescale_to_unit_norm
    assert not DynamicDPKerasSGD(
        schedule=noiseless_schedule([clip]), allow_degenerate_noise=True, public_batch_size=True
    ).rescale_to_unit_norm
    rescaled = compile_on(FAST, linear_model(), rescaled_optimizer)
    rescaled.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    update_kernel, update_bias, norms = numpy_dp_update(x, y, clip, 4.0 * clip)
    assert norms.max() > clip
    np.testing.assert_allclose(rescaled.get_weights()[0], KERNEL0 - 0.5 * update_kernel, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(rescaled.get_weights()[1], -0.5 * update_bias, rtol=1e-5, atol=1e-6)


def test_rescale_to_unit_norm_noise_std_is_the_step_noise_multiplier_over_normaliser():
    schedule = schedules.DPSchedule([0.5, 2.0], [3.0, 3.0], 0.1)  # z_t = sigma_t / C_t = 6, then 1.5
    optimizer = DynamicDPKerasSGD(
        schedule=schedule, learning_rate=1.0, expected_batch_size=5.0, rescale_to_unit_norm=True
    )
    variable = tf.Variable(tf.zeros([100, 100]))
    for noise_multiplier in (6.0, 1.5):
        before = variable.numpy()
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.zeros([4, 100]) @ variable, axis=1)
        optimizer.minimize(loss, [variable], tape=tape)
        assert np.std(before - variable.numpy()) == pytest.approx(noise_multiplier / 5, rel=0.1)


def test_rescale_to_unit_norm_round_trips_through_get_config():
    optimizer = DynamicDPKerasSGD(
        schedule=noiseless_schedule([1.0]),
        allow_degenerate_noise=True,
        public_batch_size=True,
        rescale_to_unit_norm=True,
    )
    config = optimizer.get_config()
    assert config["rescale_to_unit_norm"] is True
    assert DynamicDPKerasSGD.from_config(config).rescale_to_unit_norm is True
    assert (
        DynamicDPKerasSGD(
            schedule=noiseless_schedule([1.0]), allow_degenerate_noise=True, public_batch_size=True
        ).get_config()["rescale_to_unit_norm"]
        is False
    )


@pytest.mark.parametrize(
    "num_microbatches, expected_batch_size, expected_std",
    # Microbatches: twice the noise at every step, also when there are as many microbatches as rows.
    [(None, None, 3.0 / 4), (None, 5.0, 3.0 / 5), (2, None, 2 * 3.0 / 2), (4, None, 2 * 3.0 / 4)],
)
def test_noise_std_is_sigma_over_normaliser(num_microbatches, expected_batch_size, expected_std):
    schedule = schedules.DPSchedule([1.0, 1.0], [3.0, 3.0], 0.1)
    optimizer = DynamicDPKerasSGD(
        schedule=schedule,
        learning_rate=1.0,
        num_microbatches=num_microbatches,
        expected_batch_size=expected_batch_size,
        public_batch_size=expected_batch_size is None,
    )
    update = zero_data_update(optimizer, num_rows=4)
    assert np.std(update) == pytest.approx(expected_std, rel=0.1)
    assert abs(np.mean(update)) < 0.05 * expected_std


@pytest.mark.parametrize("num_microbatches", [2, 4])
def test_apply_clipped_sum_of_microbatch_sums_noises_as_the_microbatch_path_does(num_microbatches):
    """Sums of microbatch gradients (each clipped to C) handed to apply_clipped_sum: twice the per-example noise over
    M, as `minimize` with microbatches and JAX do (it once took the per-example noise there: too little)."""
    schedule = schedules.DPSchedule([1.0, 1.0], [3.0, 3.0], 0.1)
    optimizer = DynamicDPKerasSGD(
        schedule=schedule, learning_rate=1.0, num_microbatches=num_microbatches, public_batch_size=True
    )
    variable = tf.Variable(tf.zeros([100, 100]))
    optimizer.apply_clipped_sum([tf.zeros([100, 100])], 4, 4, [variable])
    update = -variable.numpy()
    assert np.std(update) == pytest.approx(2 * 3.0 / num_microbatches, rel=0.1)


def test_step_counter_indexes_the_schedule():
    schedule = noiseless_schedule([0.1, 1.0, 10.0])
    optimizer = DynamicDPKerasSGD(
        schedule=schedule, public_batch_size=True, learning_rate=1.0, allow_degenerate_noise=True
    )
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
    model = compile_on(
        FAST,
        linear_model(),
        DynamicDPKerasAdam(schedule=schedule, public_batch_size=True, learning_rate=0.1, allow_degenerate_noise=True),
    )
    model.fit(x, y, batch_size=2, epochs=1, shuffle=False, verbose=0)
    path = tf.train.Checkpoint(model=model, optimizer=model.optimizer).save(str(tmp_path / "ckpt"))

    restored = compile_on(
        FAST,
        linear_model(),
        DynamicDPKerasAdam(schedule=schedule, public_batch_size=True, learning_rate=0.1, allow_degenerate_noise=True),
    )
    status = tf.train.Checkpoint(model=restored, optimizer=restored.optimizer).restore(path)
    assert int(restored.optimizer.dp_step) == 2
    assert restored.optimizer.current_clip_norm().numpy() == pytest.approx(10.0)
    model.fit(x[:2], y[:2], batch_size=2, epochs=1, shuffle=False, verbose=0)
    restored.fit(x[:2], y[:2], batch_size=2, epochs=1, shuffle=False, verbose=0)
    status.assert_consumed()  # Adam's moments too, restored when the optimizer was built.
    assert int(restored.optimizer.dp_step) == 3
    for restored_weight, weight in zip(restored.get_weights(), model.get_weights()):
        np.testing.assert_allclose(restored_weight, weight, rtol=1e-6)


@pytest.mark.parametrize("noise_multiplier", [0.0, 1e-6])
def test_degenerate_noise_is_refused_at_construction(noise_multiplier):
    schedule = schedules.DPSchedule([2.0] * 3, [2.0, 2.0 * noise_multiplier, 2.0], 0.1)  # sigma = z C at step 1
    with pytest.raises(noise_range.NoiseOutOfRangeError, match=r"`schedule`: .* step 1 .*\[0\.0001, 10000\]"):
        DynamicDPKerasSGD(schedule=schedule, expected_batch_size=4)
    config = DynamicDPKerasSGD(
        schedule=noiseless_schedule([2.0] * 3), expected_batch_size=4, allow_degenerate_noise=True
    ).get_config()
    config["allow_degenerate_noise"] = False  # a config (or .keras file) with such a schedule
    with pytest.raises(noise_range.NoiseOutOfRangeError, match="`schedule`"):
        DynamicDPKerasSGD.from_config(config)
    with pytest.warns(optimizer_base.DegenerateNoiseWarning, match="no meaningful"):
        DynamicDPKerasSGD(schedule=schedule, expected_batch_size=4, allow_degenerate_noise=True)
    DynamicDPKerasSGD(schedule=schedules.DPSchedule([2.0] * 3, [2e-4, 2.0, 2e4], 0.1), expected_batch_size=4)


SCHEDULE_A = schedules.DPSchedule([1.0] * 4, [1.0] * 4, 0.5)
SCHEDULE_B = schedules.DPSchedule([1.0] * 4, [0.01] * 4, 0.5)  # same C and p, 100 times less noise


def _saved_under_a(folder, restore_path):
    """Two make_private steps under SCHEDULE_A, saved in ``folder`` by ``restore_path``: the saved path."""
    x, y = data()
    model = _compiled(SCHEDULE_A)
    model.fit(batches(x, y, 2), epochs=1, verbose=0)
    if restore_path == "checkpoint":
        return tf.train.Checkpoint(model=model, optimizer=model.optimizer).save(str(folder / "ckpt"))
    # Keras 3's .weights.h5 and Keras 2's TensorFlow format hold the optimizer's variables.
    saved = str(folder / ("w.weights.h5" if keras_compat.KERAS_MAJOR_VERSION >= 3 else "w"))
    model.save_weights(saved)
    return saved


def _compiled(schedule):
    optimizer = DynamicDPKerasSGD(schedule=schedule, expected_batch_size=2, learning_rate=0.1)
    return compile_on("make_private", linear_model(), optimizer)


@pytest.fixture(name="trained_under_a", scope="module")
def fixture_trained_under_a(tmp_path_factory):
    """``trained_under_a(restore_path)`` -> (restored, (x, y)): `_saved_under_a` once per module and
    ``restore_path`` (the tests only read the files), and ``restored(schedule)``, which restores them into a new
    model with a given schedule."""
    saved = {}

    def trained(restore_path):
        if restore_path not in saved:
            saved[restore_path] = _saved_under_a(tmp_path_factory.mktemp(restore_path), restore_path)

        def restored(schedule):
            new = _compiled(schedule)
            new.optimizer.build(new.trainable_variables)
            if restore_path == "checkpoint":
                tf.train.Checkpoint(model=new, optimizer=new.optimizer).restore(saved[restore_path])
            else:
                new.load_weights(saved[restore_path])
            assert int(new.optimizer.dp_step) == 2
            return new

        return restored, data()

    return trained


@pytest.mark.parametrize("restore_path", ["checkpoint", "weights"])
def test_a_step_counter_restored_into_another_schedule_is_refused(trained_under_a, restore_path):
    restored, (x, y) = trained_under_a(restore_path)
    model = restored(SCHEDULE_B)
    weights = model.get_weights()
    with pytest.raises(tf.errors.InvalidArgumentError, match="written under another DP schedule"):
        model.fit(batches(x[:2], y[:2], 2), epochs=1, verbose=0)
    assert int(model.optimizer.dp_step) == 2
    for weight, before in zip(model.get_weights(), weights):
        np.testing.assert_array_equal(weight, before)
    # PrivacyLogger would report SCHEDULE_B's epsilon for steps taken under SCHEDULE_A: refused before any step.
    logger = callbacks.PrivacyLogger("rdp", delta=1e-5)
    with pytest.raises(RuntimeError, match=r"another DP schedule.*Steps taken \(dp_step\): 2\."):
        model.fit(batches(x[:2], y[:2], 2), epochs=1, verbose=0, callbacks=[logger])
    same = restored(SCHEDULE_A)
    same.fit(batches(x[:2], y[:2], 2), epochs=1, verbose=0, callbacks=[callbacks.PrivacyLogger("rdp", delta=1e-5)])
    assert int(same.optimizer.dp_step) == 3


def test_a_step_counter_without_a_fingerprint_is_refused_until_recorded(trained_under_a):
    restored, (x, y) = trained_under_a("checkpoint")
    model = restored(SCHEDULE_A)
    model.optimizer.schedule_fingerprint.assign([0, 0])  # as restored from a checkpoint written before fingerprints
    with pytest.raises(tf.errors.InvalidArgumentError, match="no schedule fingerprint was saved"):
        model.fit(batches(x[:2], y[:2], 2), epochs=1, verbose=0)
    model.optimizer.record_schedule_fingerprint()
    model.fit(batches(x[:2], y[:2], 2), epochs=1, verbose=0)
    assert int(model.optimizer.dp_step) == 3
    other = restored(SCHEDULE_B)
    with pytest.raises(RuntimeError, match="another DP schedule"):
        other.optimizer.record_schedule_fingerprint()


def test_an_optimizer_file_without_a_fingerprint_loads_its_counter_unrecorded():
    optimizer = DynamicDPKerasSGD(schedule=SCHEDULE_A, expected_batch_size=2, learning_rate=0.1)
    optimizer.dp_step.assign(3)
    # The layout before: the same variables without the fingerprint and the steps released.
    newer = (optimizer.schedule_fingerprint, optimizer._released_steps)  # pylint: disable=protected-access
    older = [variable.numpy() for variable in optimizer.variables if all(variable is not v for v in newer)]
    optimizer.dp_step.assign(0)
    optimizer.load_own_variables({str(i): value for i, value in enumerate(older)})
    assert int(optimizer.dp_step) == 3 and optimizer.released_steps == 3
    with pytest.raises(RuntimeError, match="no schedule fingerprint was saved"):
        optimizer.check_restored_schedule()


@pytest.mark.parametrize("restore_path", ["checkpoint", "weights"])
def test_the_steps_released_are_saved_and_restored_with_the_counter(trained_under_a, restore_path):
    restored, (x, y) = trained_under_a(restore_path)
    model = restored(SCHEDULE_A)
    assert model.optimizer.released_steps == 2
    model.optimizer.iterations.assign(0)
    with pytest.raises(RuntimeError, match="is 0 but the optimizer has released 2 DP steps"):
        model.fit(batches(x[:2], y[:2], 2), epochs=1, verbose=0)


def test_a_file_saved_before_the_steps_released_were_counted_loads_them_as_the_counter():
    optimizer = DynamicDPKerasSGD(schedule=SCHEDULE_A, expected_batch_size=2, learning_rate=0.1)
    optimizer.dp_step.assign(3)
    optimizer.record_schedule_fingerprint()
    released = optimizer._released_steps  # pylint: disable=protected-access
    older = [variable.numpy() for variable in optimizer.variables if variable is not released]  # the layout before
    optimizer.dp_step.assign(0)
    released.assign(7)
    optimizer.load_own_variables({str(i): value for i, value in enumerate(older)})
    assert int(optimizer.dp_step) == 3 and optimizer.released_steps == 3 and int(released.numpy()) == -1
    optimizer.check_restored_schedule()
    optimizer.check_budget_left(None)


def test_a_checkpoint_saved_before_the_steps_released_were_counted_restores_them_as_the_counter(tmp_path):
    """Adam's slots come after the optimizer's own variables, which Keras's checkpoints list by index: a variable
    added among them would shift the slots' indices, and a checkpoint written before it would not restore."""
    x, y = data()

    def compiled():
        optimizer = DynamicDPKerasAdam(schedule=SCHEDULE_A, public_batch_size=True, learning_rate=0.1)
        return compile_on(FAST, linear_model(), optimizer)

    model = compiled()
    model.fit(x, y, batch_size=2, epochs=1, shuffle=False, verbose=0)
    optimizer = model.optimizer
    released = optimizer._released_steps  # pylint: disable=protected-access
    del optimizer._released_steps  # the layout before
    path = tf.train.Checkpoint(model=model, optimizer=optimizer).save(str(tmp_path / "ckpt"))
    optimizer._released_steps = released  # pylint: disable=protected-access
    restored = compiled()
    restored.optimizer.build(restored.trainable_variables)
    tf.train.Checkpoint(model=restored, optimizer=restored.optimizer).restore(path)
    assert int(restored.optimizer.dp_step) == 2 and restored.optimizer.released_steps == 2
    restored.fit(x[:2], y[:2], batch_size=2, epochs=1, shuffle=False, verbose=0)
    assert restored.optimizer.released_steps == 3


def test_a_custom_loop_on_a_step_counter_set_back_is_refused_in_the_graph():
    """Issue 52 on the optimizer's own step (minimize), eagerly and in a tf.function, with XLA (which drops the
    assertion: the step releases nothing)."""
    schedule = schedules.DPSchedule([1.0] * 2, [1.0] * 2, 0.5)
    optimizer = DynamicDPKerasSGD(schedule=schedule, public_batch_size=True, learning_rate=1.0)
    variable = tf.Variable(tf.zeros([2]))

    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.constant([[3.0, 4.0]]) * variable, axis=1)
        optimizer.minimize(loss, [variable], tape=tape)

    step()
    step()
    assert optimizer.released_steps == 2
    optimizer.iterations.assign(0)
    before = variable.numpy()
    for run in (step, tf.function(step)):
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"0(\] \[)? but the optimizer has released (\] \[)?2"):
            run()
    assert optimizer.current_clip_norm().numpy() == 0.0 and optimizer.current_noise_stddev().numpy() == 0.0
    tf.function(step, jit_compile=True)()
    np.testing.assert_array_equal(variable.numpy(), before)
    assert optimizer.released_steps == 3 and int(optimizer.dp_step) == 1  # still apart: every later step refused


def test_model_save_and_load_round_trip(tmp_path):
    schedule = schedules.DPSchedule([1.0, 0.5, 0.25], [0.5, 0.4, 0.3], 0.01)
    x, y = data()
    model = compile_on(
        FAST,
        linear_model("functional"),
        DynamicDPKerasRMSprop(schedule=schedule, public_batch_size=True, learning_rate=0.01, num_microbatches=2),
    )
    model.fit(x, y, batch_size=4, epochs=1, verbose=0)
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.models.load_model(path)  # Registered as 'keras_dyndp>DynamicDPKerasRMSprop'.
    assert type(loaded.optimizer) is DynamicDPKerasRMSprop
    assert loaded.optimizer.get_config() == model.optimizer.get_config()
    assert loaded.optimizer.schedule == schedule
    assert int(loaded.optimizer.dp_step) == 1
    # The file's config holds the schedule, so the saved fingerprint matches the reloaded optimizer's by construction.
    assert tuple(loaded.optimizer.schedule_fingerprint.numpy()) == schedule.fingerprint
    loaded.fit(x, y, batch_size=4, epochs=1, verbose=0)
    assert int(loaded.optimizer.dp_step) == 2


def test_make_private_recorded_in_the_config_is_restored_at_load_only():
    """load_model's compile_from_config restores it (tests/tf_backend/test_train_step.py); a fit that
    builds the optimizer does not, as that fit would skip make_private's data checks: Keras's step is refused."""
    config = DynamicDPKerasSGD(
        schedule=noiseless_schedule([1.0]), allow_degenerate_noise=True, public_batch_size=True
    ).get_config()
    config["private_train_step"] = {"method": "vectorized", "training_metrics": False}
    model = linear_model()
    model.compile(optimizer=DynamicDPKerasSGD.from_config(config), loss=per_example_mse())
    x, y = data()
    with pytest.raises(RuntimeError, match=r"make_private\(model, \*\*\{'method': 'vectorized', 'training_metrics'"):
        model.fit(x, y, batch_size=2, verbose=0)
    assert not private_model.is_private(model) and int(model.optimizer.dp_step) == 0


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
    serialized = keras.optimizers.serialize(optimizer)
    assert serialized["registered_name"] == f"keras_dyndp>{dp_cls.__name__}"
    assert type(keras.optimizers.deserialize(serialized)) is dp_cls


def test_budget_arguments_build_the_calibrated_schedule():
    optimizer = DynamicDPKerasSGD(
        target_epsilon=1.0,
        target_delta=1e-5,
        num_examples=1000,
        batch_size=10,
        epochs=2,
        method="dynamic",
        initial_clip=1.5,
        rho_mu=1.25,
        rho_c=2.0,
        accountant="rdp",
        learning_rate=0.1,
    )
    expected = schedules.calibrate(
        "dynamic",
        target_epsilon=1.0,
        target_delta=1e-5,
        sampling_probability=0.01,
        num_steps=200,
        initial_clip=1.5,
        rho_mu=1.25,
        rho_c=2.0,
        accountant="rdp",
    )
    assert optimizer.schedule == expected
    assert optimizer.expected_batch_size == 10.0
    assert float(optimizer.learning_rate) == pytest.approx(0.1)


@pytest.mark.parametrize("path", [MINIMIZE, FAST])
def test_scalar_loss_is_refused(path):
    x, y = data()
    model = compile_on(
        path,
        linear_model(),
        DynamicDPKerasSGD(schedule=noiseless_schedule([1.0]), allow_degenerate_noise=True, public_batch_size=True),
        loss=keras.losses.MeanSquaredError(),
    )
    with pytest.raises(ValueError, match='reduction="none"'):
        fit_on(path, model, x, y, batch_size=4)


@pytest.mark.parametrize("path", [MINIMIZE, FAST])
def test_exhausted_budget_raises(path):
    x, y = data()
    model = compile_on(
        path,
        linear_model(),
        DynamicDPKerasSGD(schedule=noiseless_schedule([1.0, 1.0]), allow_degenerate_noise=True, public_batch_size=True),
    )
    fit_on(path, model, x, y, batch_size=2)
    weights = model.get_weights()
    # make_private's fit refuses on the host, in one line; the optimizer's own step in its graph (eagerly here).
    refusal = optimizer_base.BudgetExhaustedError if path == FAST else tf.errors.InvalidArgumentError
    with pytest.raises(refusal, match="DP budget exhausted"):
        fit_on(path, model, x, y, batch_size=2)
    for after, before in zip(model.get_weights(), weights):
        np.testing.assert_array_equal(after, before)
    assert int(model.optimizer.dp_step) == 2
    assert model.optimizer.current_clip_norm().numpy() == 0.0
    assert model.optimizer.current_noise_stddev().numpy() == 0.0


def test_jit_compile_fit_trains_then_stops_updating_past_the_budget():
    schedule = schedules.DPSchedule([1.0, 1.0], [0.1, 0.1], 0.1)
    x, y = data()
    model = compile_on(
        FAST,
        linear_model(),
        DynamicDPKerasSGD(schedule=schedule, public_batch_size=True, learning_rate=0.5),
        jit_compile=True,
    )
    assert model.jit_compile
    model.fit(x, y, batch_size=2, epochs=1, shuffle=False, verbose=0)
    trained = model.get_weights()
    assert not np.allclose(trained[0], KERNEL0)
    # XLA drops the assert; past T the clip and the noise are 0, so the update is exactly zero. (make_private's fit
    # refuses a spent schedule on the host before any step; its train_on_batch runs the step.)
    with pytest.raises(optimizer_base.BudgetExhaustedError):
        model.fit(x, y, batch_size=2, epochs=1, shuffle=False, verbose=0)
    model.train_on_batch(x[:2], y[:2])
    for after, before in zip(model.get_weights(), trained):
        np.testing.assert_array_equal(after, before)
    assert int(model.optimizer.dp_step) == 3


@pytest.mark.parametrize("kind", ["sequential", "functional", "subclassed"])
def test_fit_works_for_every_model_kind(kind):
    x, y = data(num_rows=8)
    schedule = schedules.DPSchedule([1.0] * 4, [0.5] * 4, 0.1)
    model = compile_on(
        FAST,
        linear_model(kind),
        DynamicDPKerasAdam(schedule=schedule, learning_rate=0.01, expected_batch_size=4),
        metrics=["mae"],
    )
    history = model.fit(batches(x, y, 4), epochs=1, verbose=0)
    assert history.history["dp_step"] == [2.0]  # No loss of the private batch is logged.
    assert np.all(np.isfinite(model.evaluate(x, y, verbose=0)))
    assert int(model.optimizer.dp_step) == 2


def test_direct_apply_gradients_is_refused():
    optimizer = DynamicDPKerasSGD(
        schedule=noiseless_schedule([1.0, 1.0]), allow_degenerate_noise=True, public_batch_size=True
    )
    variable = tf.Variable([1.0, 2.0])
    with pytest.raises(RuntimeError, match="without differential privacy"):
        optimizer.apply_gradients([(tf.constant([0.1, 0.1]), variable)])
    with tf.GradientTape() as tape:
        loss = variable * 2.0
    grads_and_vars = optimizer.compute_gradients(loss, [variable], tape=tape)
    with pytest.raises(RuntimeError, match="without differential privacy"):
        optimizer.apply_gradients([(grad * 10.0, var) for grad, var in grads_and_vars])
    with pytest.raises(RuntimeError, match=r"(?s)keras_dyndp\.make_private\(model\).*without differential privacy"):
        optimizer.apply([tf.constant([0.1, 0.1])], [variable])  # Keras 3's entry point.
    np.testing.assert_array_equal(variable.numpy(), [1.0, 2.0])
    assert int(optimizer.dp_step) == 0


@pytest.mark.parametrize("policy", ["float32", "mixed_float16"])
def test_keras_default_train_step_is_refused_naming_make_private_before_any_update(policy):
    """Keras 3's step hands over the averaged gradient (refused in apply_gradients), Keras 2's the per-example
    losses (refused in compute_gradients): either way at the first step, before any update."""
    x, y = data()
    keras.mixed_precision.set_global_policy(policy)
    try:
        model = linear_model()
        model.compile(
            optimizer=DynamicDPKerasSGD(
                schedule=noiseless_schedule([1.0, 1.0]), allow_degenerate_noise=True, public_batch_size=True
            ),
            loss=per_example_mse(),
        )
    finally:
        keras.mixed_precision.set_global_policy("float32")
    with pytest.raises(
        RuntimeError,
        match=(
            r"Keras's own train step cannot train with a DP optimizer: call "
            r"model = keras_dyndp\.make_private\(model\) before model\.fit"
        ),
    ):
        model.fit(x, y, batch_size=2, verbose=0)
    np.testing.assert_array_equal(model.get_weights()[0], KERNEL0)
    assert int(keras_compat.unwrap_optimizer(model.optimizer).dp_step) == 0


@pytest.mark.keras2_only(reason="Keras 3's default train step never reaches compute_gradients (test above)")
def test_keras2_train_step_is_refused_in_compute_gradients_unlike_a_custom_one():
    """Keras 2's own step (fit, train_on_batch) would log the private batch's loss and metrics and cannot see the
    sampling; a custom train step calling minimize is the user's (warned that its batches are not seen)."""
    x, y = data(num_rows=8)
    model = compile_on(
        MINIMIZE,
        linear_model(),
        DynamicDPKerasSGD(schedule=noiseless_schedule([1.0] * 4), allow_degenerate_noise=True, public_batch_size=True),
        metrics=["mae"],
    )
    keras_2_reason = "Keras 2's would log the loss and metrics of the private batch without noise"
    with pytest.raises(RuntimeError, match=keras_2_reason):
        model.fit(x, y, batch_size=4, verbose=0)
    with pytest.raises(RuntimeError, match=keras_2_reason):
        model.train_on_batch(x, y)
    assert int(model.optimizer.dp_step) == 0

    def custom_step(data):
        x_batch, y_batch = data
        with tf.GradientTape() as tape:
            losses = model.loss(y_batch, model(x_batch, training=True))
        return {"dp_step": model.optimizer.minimize(losses, model.trainable_variables, tape=tape)}

    model.train_step = custom_step
    model.train_function = None
    with pytest.warns(UserWarning, match="cannot see the batches of this training step"):
        history = model.fit(x, y, batch_size=4, verbose=0)
    assert history.history == {"dp_step": [2]} and int(model.optimizer.dp_step) == 2


@pytest.mark.keras2_only(reason="Keras 3's LossScaleOptimizer has no minimize to call from a custom train step")
def test_keras2_custom_train_step_under_mixed_float16_is_refused():
    """Its LossScaleOptimizer would skip or shrink updates depending on the private batch."""
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = compile_on(
            MINIMIZE,
            linear_model(),
            DynamicDPKerasSGD(schedule=noiseless_schedule([1.0]), allow_degenerate_noise=True, public_batch_size=True),
        )
    finally:
        keras.mixed_precision.set_global_policy("float32")

    def custom_step(data):
        with tf.GradientTape() as tape:
            losses = model.loss(data[1], model(data[0], training=True))
        return {"dp_step": model.optimizer.minimize(losses, model.trainable_variables, tape=tape)}

    model.train_step = custom_step
    with pytest.raises(ValueError, match=r"Mixed precision \('mixed_float16'\).*keras_dyndp\.make_private"):
        model.fit(*data(), batch_size=2, verbose=0)


@pytest.mark.skipif(keras_compat.KERAS_MAJOR_VERSION < 3, reason="Keras 3 optimizer arguments")
@pytest.mark.parametrize("argument", [dict(gradient_accumulation_steps=2), dict(loss_scale_factor=128.0)])
def test_keras3_arguments_that_would_change_the_mechanism_are_refused(argument):
    with pytest.raises(ValueError, match=f"do not support `{next(iter(argument))}`"):
        DynamicDPKerasSGD(
            schedule=noiseless_schedule([1.0]), allow_degenerate_noise=True, public_batch_size=True, **argument
        )


def test_compute_then_apply_unchanged_gradients_is_accepted():
    optimizer = DynamicDPKerasSGD(
        schedule=noiseless_schedule([1.0, 1.0]), allow_degenerate_noise=True, public_batch_size=True, learning_rate=1.0
    )
    variable = tf.Variable([1.0, 2.0])
    with tf.GradientTape() as tape:
        loss = tf.stack([variable[0] * 0.5, variable[1] * 4.0])  # example gradients (0.5, 0) and (0, 4 -> 1)
    optimizer.apply_gradients(optimizer.compute_gradients(loss, [variable], tape=tape))
    np.testing.assert_allclose(variable.numpy(), [1.0 - 0.25, 2.0 - 0.5])
    assert int(optimizer.dp_step) == 1


def test_empty_batch_releases_only_noise_normalised_by_expected_batch_size():
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
        batches, output_signature=(tf.TensorSpec([None, 3]), tf.TensorSpec([None, 2]))
    )
    schedule = schedules.DPSchedule([1.0] * 5, [0.5] * 5, 0.1)
    model = compile_on(
        FAST,
        keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dense(2)]),
        DynamicDPKerasSGD(schedule=schedule, learning_rate=0.1, expected_batch_size=2),
    )
    with pytest.warns(UserWarning) as caught:  # A generator's batches are not Poisson; Keras: "ran out of data".
        model.fit(dataset, epochs=1, verbose=0)
    assert any("not batches returned by keras_dyndp.poisson_batches" in str(warning.message) for warning in caught)
    # Keras's base optimizers count 3 here: the counter ran when the exhausted iterator aborted the third call.
    assert int(model.optimizer.dp_step) == 2
    assert all(np.all(np.isfinite(weight)) for weight in model.get_weights())


def test_apply_clipped_sum_adds_noise_normalises_and_advances():
    schedule = schedules.DPSchedule([1.0, 1.0, 1.0], [0.0, 2.0, 2.0], 0.1)
    optimizer = DynamicDPKerasSGD(
        schedule=schedule, learning_rate=1.0, expected_batch_size=8, allow_degenerate_noise=True
    )
    small, large = tf.Variable(tf.zeros([3])), tf.Variable(tf.zeros([100, 100]))
    optimizer.apply_clipped_sum([tf.constant([8.0, 4.0, 0.0]), None], 3, 3, [small, large])
    np.testing.assert_allclose(small.numpy(), [-1.0, -0.5, 0.0])
    np.testing.assert_array_equal(large.numpy(), 0.0)
    assert optimizer.current_noise_stddev().numpy() == pytest.approx(2.0)
    tf.function(optimizer.apply_clipped_sum)([tf.zeros([3]), tf.zeros([100, 100])], 3, 3, [small, large])
    assert np.std(large.numpy()) == pytest.approx(2.0 / 8, rel=0.1)
    assert int(optimizer.dp_step) == 2


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(num_microbatches=0), ValueError, "`num_microbatches` must be None .* integer >= 1"),
        (dict(num_microbatches=1.5), ValueError, "num_microbatches"),
        (dict(num_microbatches=True), ValueError, "num_microbatches"),
        (dict(expected_batch_size=0), ValueError, "`expected_batch_size` must be a finite number > 0"),
        (dict(expected_batch_size=-3.0), ValueError, "expected_batch_size"),
        (dict(expected_batch_size=float("nan")), ValueError, "expected_batch_size"),
        (dict(schedule=None), ValueError, "Received neither"),
        (dict(schedule=[1.0, 2.0]), TypeError, "`schedule` must be a keras_dyndp.schedules.DPSchedule"),
        (dict(target_epsilon=1.0), ValueError, "not both"),
        (dict(rho_mu=2.0), ValueError, "not both"),
        (dict(schedule=None, target_epsilon=1.0, target_delta=1e-5), ValueError, "needs num_examples"),
        (
            dict(
                schedule=None,
                target_epsilon=1.0,
                target_delta=1e-5,
                num_examples=100,
                batch_size=10,
                epochs=1,
                method="vanilla",
                initial_clip=1.0,
                expected_batch_size=20,
                public_batch_size=False,
            ),
            ValueError,
            "expected_batch_size",
        ),
        (dict(rescale_to_unit_norm="yes"), ValueError, "`rescale_to_unit_norm` must be True or False"),
        (dict(l2_norm_clip=1.0), (TypeError, ValueError), "l2_norm_clip"),  # TF-Privacy's name: not ours.
    ],
)
def test_bad_arguments(kwargs, error, match):
    arguments = dict(schedule=noiseless_schedule([1.0]), allow_degenerate_noise=True, public_batch_size=True)
    arguments.update(kwargs)
    with pytest.raises(error, match=match):
        DynamicDPKerasSGD(**arguments)


def test_factory_rejects_non_optimizer_and_legacy_classes():
    with pytest.raises(TypeError, match="base_cls"):
        optimizer_module.make_dynamic_dp_optimizer_class(keras.optimizers.legacy.SGD)
    with pytest.raises(TypeError, match="base_cls"):
        optimizer_module.make_dynamic_dp_optimizer_class(object)


def test_microbatch_neighbour_moves_the_clipped_sum_by_at_most_2c_over_adversarial_orderings(monkeypatch):
    """sigma = 0; D' = D + x; rows and padding shuffled anew per trial; each example keeps its microbatch."""
    clip_norm, num_microbatches, num_rows = 1.0, 3, 10
    rng = np.random.default_rng(0)
    direction = np.array([1.0, -2.0], np.float32)
    common_input = np.array([1.0, 0.5, -1.0], np.float32)
    # Example a has residual +direction, x has residual -10 direction: opposite gradients, so x joining a alone
    # flips a's clipped microbatch gradient, the worst case 2 C. The other examples have large random gradients.
    inputs = np.concatenate([common_input[None], rng.normal(size=(5, 3)).astype(np.float32) * 3, common_input[None]])
    targets = inputs @ KERNEL0 - np.concatenate(
        [direction[None], rng.normal(size=(5, 2)).astype(np.float32) * 3, -10 * direction[None]]
    )
    example_x = len(inputs) - 1
    assignment = tf.Variable(tf.zeros([num_rows], tf.int32))
    monkeypatch.setattr(microbatches, "random_assignment", lambda *args: assignment.read_value())
    model = linear_model()
    optimizer = DynamicDPKerasSGD(
        schedule=noiseless_schedule([clip_norm]),
        allow_degenerate_noise=True,
        public_batch_size=True,
        num_microbatches=num_microbatches,
    )

    @tf.function
    def clipped_sum(x, y, weights):
        with tf.GradientTape() as tape:
            loss = per_example_mse()(y, model(x)) * weights
        grads_and_vars = optimizer.compute_gradients(loss, model.trainable_variables, tape=tape)
        return tf.concat([tf.reshape(grad, [-1]) for grad, _ in grads_and_vars], 0) * num_microbatches

    def batch(examples, example_microbatch):
        rows = np.full(num_rows, -1)  # -1: a zero-weight padding row
        rows[rng.choice(num_rows, len(examples), replace=False)] = examples
        real = rows >= 0
        x = np.where(real[:, None], inputs[rows], 0.0).astype(np.float32)
        y = np.where(real[:, None], targets[rows], 0.0).astype(np.float32)
        assignment.assign(np.where(real, example_microbatch[rows], rng.integers(0, num_microbatches, num_rows)))
        return clipped_sum(x, y, real.astype(np.float32)).numpy()

    distances = []
    for trial in range(45):
        example_microbatch = rng.integers(0, num_microbatches, len(inputs))
        if trial % 3 == 0:  # The worst case: a and x alone in microbatch 0.
            example_microbatch = np.array([0, 1, 2, 1, 2, 1, 0])
        without_x = batch(np.arange(example_x), example_microbatch)
        with_x = batch(np.arange(example_x + 1), example_microbatch)
        distances.append(np.linalg.norm(with_x - without_x))
    assert max(distances) <= 2 * clip_norm * (1 + 1e-5)
    assert max(distances) > 1.99 * clip_norm  # the bound is attained: 2 sigma of noise is needed, and enough


def noise_of_steps(optimizer, num_steps: int, variable: tf.Variable | None = None) -> np.ndarray:
    """The noise the optimizer adds at each of `num_steps` steps to a zero clipped sum, one row per step."""
    variable = tf.Variable(tf.zeros([2000])) if variable is None else variable
    noises = []
    for _ in range(num_steps):
        before = variable.numpy()
        optimizer.apply_clipped_sum([tf.zeros([2000])], 4, 4, [variable])
        noises.append(before - variable.numpy())
    return np.array(noises)


def unit_noise_optimizer(**kwargs) -> DynamicDPKerasSGD:
    schedule = schedules.DPSchedule(np.ones(6), np.ones(6), 0.1)
    return DynamicDPKerasSGD(schedule=schedule, learning_rate=1.0, expected_batch_size=1.0, **kwargs)


def test_noise_ignores_the_global_seed():
    keras.utils.set_random_seed(0)
    first = noise_of_steps(unit_noise_optimizer(), 1)[0]
    keras.utils.set_random_seed(0)
    second = noise_of_steps(unit_noise_optimizer(), 1)[0]
    assert abs(np.corrcoef(first, second)[0, 1]) < 0.15


def test_resume_from_checkpoint_under_the_same_global_seed_does_not_replay_noise(tmp_path):
    keras.utils.set_random_seed(0)
    optimizer, variable = unit_noise_optimizer(), tf.Variable(tf.zeros([2000]))
    first_run = noise_of_steps(optimizer, 3, variable)
    path = tf.train.Checkpoint(optimizer=optimizer).save(str(tmp_path / "ckpt"))
    first_run = np.concatenate([first_run, noise_of_steps(optimizer, 3, variable)])
    keras.utils.set_random_seed(0)  # as a new process resuming with the same seed would
    resumed = unit_noise_optimizer()
    tf.train.Checkpoint(optimizer=resumed).restore(path)
    assert int(resumed.dp_step) == 3
    resumed_run = noise_of_steps(resumed, 3)
    assert np.std(resumed_run) == pytest.approx(1.0, rel=0.05)
    correlations = np.corrcoef(np.concatenate([first_run, resumed_run]))[6:, :6]
    assert np.max(np.abs(correlations)) < 0.15  # neither steps 0-2 nor steps 3-5 are repeated


def test_checkpoint_and_saved_model_hold_no_noise_state(tmp_path):
    x, y = data()
    dp_model = compile_on(FAST, linear_model(), unit_noise_optimizer(num_microbatches=2))
    plain_model = linear_model()
    plain_model.compile(optimizer=keras.optimizers.SGD(learning_rate=1.0), loss=per_example_mse())
    for model in (dp_model, plain_model):
        model.fit(batches(x, y, 4), epochs=1, verbose=0, shuffle=False)
    paths = [
        tf.train.Checkpoint(model=model, optimizer=model.optimizer).save(str(tmp_path / kind))
        for kind, model in (("dp", dp_model), ("plain", plain_model))
    ]
    # Keras 2 also lists the optimizer's variables by index ("_variables/<i>"), which the fingerprint shifts.
    dp_names, plain_names = (
        {name for name, _ in tf.train.list_variables(path) if not name.startswith("optimizer/_variables/")}
        for path in paths
    )
    # nothing beyond what a plain SGD saves, except the schedule's fingerprint and the steps released
    assert dp_names - plain_names == {
        "optimizer/_schedule_fingerprint/.ATTRIBUTES/VARIABLE_VALUE",
        "optimizer/_released_steps/.ATTRIBUTES/VARIABLE_VALUE",
    }
    assert plain_names < dp_names
    dp_model.save(str(tmp_path / "model.keras"))
    loaded = keras.models.load_model(str(tmp_path / "model.keras"))
    assert len(loaded.optimizer.variables) == len(plain_model.optimizer.variables) + 1  # the steps released by name


@pytest.mark.filterwarnings("ignore::keras_dyndp.SamplingWarning")
def test_a_fresh_optimizer_on_a_reloaded_model_warns_that_the_schedule_restarts(tmp_path):
    def fresh_optimizer():
        schedule = schedules.DPSchedule(np.full(10, 1.0), np.full(10, 1.0), 0.5)
        return DynamicDPKerasSGD(schedule=schedule, public_batch_size=True, learning_rate=0.1)

    x, y = np.ones((4, 3), np.float32), np.ones((4, 1), np.float32)
    model = make_private(keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)]))
    model.compile(optimizer=fresh_optimizer(), loss=per_example_mse())
    model.fit(x, y, batch_size=4, verbose=0)
    model.save(str(tmp_path / "model.keras"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", restarts.ScheduleRestartWarning)
        keras.models.load_model(str(tmp_path / "model.keras")).fit(x, y, batch_size=4, verbose=0)  # Resumes: silent.
    loaded = keras.models.load_model(str(tmp_path / "model.keras"))
    loaded.compile(optimizer=fresh_optimizer(), loss=per_example_mse())
    with pytest.warns(restarts.ScheduleRestartWarning, match="took 1 DP steps .* starts over"):
        loaded.fit(x, y, batch_size=4, verbose=0)


def test_noise_seed_reproduces_the_noise_warns_and_is_not_serialised():
    with pytest.warns(UserWarning, match="noise_seed=5 makes the DP noise reproducible"):
        first = unit_noise_optimizer(noise_seed=5)
    with pytest.warns(UserWarning):
        keras.utils.set_random_seed(1)
        second = unit_noise_optimizer(noise_seed=5)
    np.testing.assert_array_equal(noise_of_steps(first, 2), noise_of_steps(second, 2))
    config = first.get_config()
    assert "noise_seed" not in config
    rebuilt = DynamicDPKerasSGD.from_config(config)  # no warning: it draws OS entropy
    assert abs(np.corrcoef(noise_of_steps(rebuilt, 1)[0], noise_of_steps(unit_noise_optimizer(), 1)[0])[0, 1]) < 0.15


@pytest.mark.parametrize("jit_compile, steps_per_execution", [(True, 2), (False, 2)])
def test_fit_draws_fresh_noise_at_every_step(jit_compile, steps_per_execution):
    # Zero inputs and no bias: every per-example gradient is zero and each epoch's update is noise only.
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2000, use_bias=False, kernel_initializer="zeros")])
    schedule = schedules.DPSchedule(np.ones(20), np.ones(20), 0.5)
    model = compile_on(
        FAST,
        model,
        DynamicDPKerasSGD(schedule=schedule, learning_rate=1.0, expected_batch_size=1.0),
        jit_compile=jit_compile,
        steps_per_execution=steps_per_execution,
    )
    kernels = []
    record = keras.callbacks.LambdaCallback(on_epoch_end=lambda *_: kernels.append(model.get_weights()[0]))
    model.fit(
        batches(np.zeros((4, 3), np.float32), np.zeros((4, 2000), np.float32), 2),
        epochs=3,
        verbose=0,
        callbacks=[record],
    )
    assert int(model.optimizer.dp_step) == 6
    epoch_noise = np.diff(np.stack([np.zeros_like(kernels[0])] + kernels), axis=0).reshape(3, -1)
    # Two steps of independent unit noise per epoch: std sqrt(2) (a repeated draw would give 2).
    assert np.std(epoch_noise) == pytest.approx(np.sqrt(2.0), rel=0.05)
    assert np.max(np.abs(np.corrcoef(epoch_noise) - np.eye(3))) < 0.15


@pytest.mark.parametrize("run_eagerly", [False, True])
def test_batch_normalisation_is_refused_before_the_first_step(run_eagerly):
    x, y = data(num_rows=8)
    model = keras.Sequential([keras.Input((3,)), keras.layers.BatchNormalization(name="norm"), keras.layers.Dense(2)])
    schedule = schedules.DPSchedule([1.0] * 4, [1e6] * 4, 4 / 8)
    model = compile_on(
        FAST,
        model,
        DynamicDPKerasSGD(schedule=schedule, expected_batch_size=4, allow_degenerate_noise=True),
        run_eagerly=run_eagerly,
    )
    # make_private checks before its forward pass: nothing runs, moving_mean included.
    watched = model.variables
    before = [v.numpy() for v in watched]
    with pytest.raises(ValueError, match=r"Layer 'norm' \(BatchNormalization\).*GroupNormalization"):
        model.fit(batches(x, y, 4), verbose=0)
    assert int(model.optimizer.dp_step) == 0
    for old, new in zip(before, watched):
        np.testing.assert_array_equal(old, new.numpy())


def test_custom_training_loop_warns_that_the_model_was_not_checked():
    x, y = data()
    model = linear_model()
    optimizer = DynamicDPKerasSGD(
        schedule=noiseless_schedule([1.0, 1.0]), allow_degenerate_noise=True, public_batch_size=True
    )
    with tf.GradientTape() as tape:
        loss = per_example_mse()(y, model(x))
    with pytest.warns(UserWarning, match=r"keras_dyndp\.check_model\(model, x\)"):
        optimizer.minimize(loss, model.trainable_variables, tape=tape)


def _issue_budget(**overrides):
    """The issue's short run: p = 0.01 (batch 1 of 100), T = 20, epsilon 1, delta 1e-5."""
    budget = dict(
        target_epsilon=1.0,
        target_delta=1e-5,
        num_examples=100,
        batch_size=1,
        steps=20,
        method="vanilla",
        initial_clip=1.0,
    )
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
        DynamicDPKerasSGD(schedule=optimizer.schedule, public_batch_size=True)
    assert len(from_schedule) == 1
    # No warning for a rigorous calibration, a hand-built schedule, or a GDP-CLT one within 5% of its PLD.
    schedules_without_warning = [
        DynamicDPKerasSGD(**_issue_budget()).schedule,
        schedules.DPSchedule(optimizer.schedule.clip_norms, optimizer.schedule.noise_stddevs, 0.01),
        schedules.calibrate(
            "vanilla",
            target_epsilon=1.2,
            target_delta=1e-5,
            sampling_probability=250 / 60000,
            num_steps=4800,
            initial_clip=1.0,
            accountant="gdp_clt",
        ),  # PLD 1.25.
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error", schedules.GdpCltUnderstatementWarning)
        for schedule in schedules_without_warning:
            DynamicDPKerasSGD(schedule=schedule, public_batch_size=True)


def test_adaptive_clipping_needs_the_count_in_a_custom_step_and_moves_the_clip_norm_with_it():
    schedule = schedules.DPSchedule([1.0] * 3, [0.0] * 3, 0.1)
    optimizer = DynamicDPKerasSGD(
        schedule=schedule,
        learning_rate=1.0,
        expected_batch_size=8,
        allow_degenerate_noise=True,
        adaptive_clipping={"target_quantile": 0.5, "learning_rate": 0.2, "count_stddev": 1e-6},
    )
    variable = tf.Variable(tf.zeros([3]))
    with pytest.raises(ValueError, match="apply_clipped_sum needs `centred_count`"):
        optimizer.apply_clipped_sum([tf.zeros([3])], 8, 8, [variable])
    optimizer.apply_clipped_sum([tf.zeros([3])], 8, 8, [variable], centred_count=tf.constant(4.0))  # all unclipped
    assert float(optimizer.adaptive_clip_norm.numpy()) == pytest.approx(np.exp(-0.2 * 0.5), rel=1e-5)
    assert float(optimizer.current_clip_norm()) == pytest.approx(np.exp(-0.2 * 0.5), rel=1e-5)
    assert optimizer.get_config()["adaptive_clipping"] == {
        "target_quantile": 0.5,
        "learning_rate": 0.2,
        "count_stddev": 1e-6,
    }


def test_adaptive_clipping_counts_only_the_rows_with_a_weight():
    norms = tf.constant([0.5, 3.0, 0.5, float("nan"), 0.1])
    rows = tf.constant([True, True, True, True, False])
    assert float(ops.centred_count(norms, 1.0, rows)) == 0.0  # +1/2 +(-1/2) +1/2 +(-1/2: not finite) + 0
    assert float(ops.centred_count(norms, 1.0)) == 0.5


def test_a_custom_loops_minimize_moves_the_adaptive_clip_norm_by_its_rows_count():
    """The optimizer's own path (compute_gradients, a tape's per-example losses): 3 rows with a loss, one of loss 0
    (padding: not counted); gradients of norm 2 against C_0 = 1, all clipped: b = 1/2 - (3 / 2) / 4 over n = 4, and
    C_1 = exp(-0.2 (b - 1/2))."""
    schedule = schedules.DPSchedule([1.0] * 2, [0.0] * 2, 0.1)
    options = {"target_quantile": 0.5, "learning_rate": 0.2, "count_stddev": 1e-6}
    optimizer = DynamicDPKerasSGD(
        schedule=schedule,
        learning_rate=0.0,
        expected_batch_size=4,
        allow_degenerate_noise=True,
        adaptive_clipping=options,
    )
    variable = tf.Variable([0.0, 0.0])
    inputs = tf.constant([[2.0, 0.0], [0.0, 2.0], [2.0, 0.0], [0.0, 0.0]])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(inputs * variable, axis=1) + tf.constant([1.0, 1.0, 1.0, 0.0])
    optimizer.minimize(loss, [variable], tape=tape)
    fraction = -0.5 * 3 / 4 + 0.5  # three clipped rows, the loss-0 row counts nothing, over n = 4
    assert float(optimizer.adaptive_clip_norm.numpy()) == pytest.approx(np.exp(-0.2 * (fraction - 0.5)), rel=1e-5)
