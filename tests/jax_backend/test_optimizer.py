"""Tests for keras_dyndp.jax_backend.optimizer: config, save/load, resume, noise source, rescaling, refusals."""

import warnings

import pytest

jax = pytest.importorskip("jax")
keras = pytest.importorskip("keras")
if keras.backend.backend() != "jax":
    pytest.skip("Keras is not running on JAX (set KERAS_BACKEND=jax)", allow_module_level=True)

import numpy as np  # noqa: E402

from keras_dyndp import schedules  # noqa: E402
from keras_dyndp.jax_backend import DynamicDPKerasAdam  # noqa: E402
from keras_dyndp.jax_backend import DynamicDPKerasSGD  # noqa: E402
from keras_dyndp.jax_backend import JaxDPOptimizerMixin  # noqa: E402
from keras_dyndp.jax_backend import make_private  # noqa: E402
from keras_dyndp.jax_backend import train_step  # noqa: E402
from keras_dyndp.noise_seed import NoiseSeedWarning  # noqa: E402

LOSS = keras.losses.MeanSquaredError(reduction="none")


def _schedule(num_steps=4, clip=1.0, noise=2.0, p=0.5):
    return schedules.DPSchedule(np.full(num_steps, clip), np.full(num_steps, noise), p)


def _model(seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((5,)), keras.layers.Dense(40)])


def _data():
    x = np.linspace(-1, 1, 40, dtype="float32").reshape(8, 5)
    return x, np.zeros((8, 40), "float32")


def _kernel(model):
    return np.asarray(model.trainable_variables[0].value).copy()


def _private(optimizer, seed=0):
    model = make_private(_model(seed))
    model.compile(optimizer=optimizer, loss=LOSS)
    return model


def test_budget_arguments_and_config_round_trip():
    optimizer = DynamicDPKerasAdam(
        target_epsilon=2.0, target_delta=1e-5, num_examples=1000, batch_size=50, epochs=2, method="dynamic",
        initial_clip=1.5, rho_mu=1.25, rho_c=2.0, learning_rate=0.01,
    )  # fmt: skip
    assert isinstance(optimizer, JaxDPOptimizerMixin) and isinstance(optimizer, keras.optimizers.Adam)
    assert optimizer.schedule.num_steps == 40 and optimizer.expected_batch_size == 50.0
    assert optimizer.batch_size_range[0] < 50 < optimizer.batch_size_range[1]
    restored = DynamicDPKerasAdam.from_config(optimizer.get_config())
    np.testing.assert_array_equal(restored.schedule.noise_stddevs, optimizer.schedule.noise_stddevs)
    assert float(np.asarray(restored.learning_rate)) == pytest.approx(0.01) and restored.expected_batch_size == 50.0


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"loss_scale_factor": 2.0}, "do not support `loss_scale_factor`"),
    ],
)
def test_what_the_jax_backend_cannot_do_is_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DynamicDPKerasSGD(schedule=_schedule(), **kwargs)


def test_save_and_load_keep_the_schedule_counter_and_private_step():
    x, y = _data()
    model = _private(DynamicDPKerasSGD(schedule=_schedule(), learning_rate=0.1))
    model.fit(x, y, batch_size=8, epochs=2, verbose=0)
    path = f"{pytest.importorskip('tempfile').mkdtemp()}/model.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    assert type(loaded.optimizer) is DynamicDPKerasSGD and int(loaded.optimizer.dp_step.numpy()) == 2
    np.testing.assert_array_equal(loaded.optimizer.schedule.clip_norms, model.optimizer.schedule.clip_norms)
    assert train_step.is_private(loaded)  # restored at load from the optimizer's config
    loaded.fit(x, y, batch_size=8, epochs=2, verbose=0)
    assert int(loaded.optimizer.dp_step.numpy()) == 4  # the schedule continues where it stopped


def test_a_resumed_run_clips_with_the_schedules_value_at_the_restored_step():
    x, y = _data()
    schedule = schedules.DPSchedule(np.array([5.0, 5.0, 0.01, 0.01]), np.zeros(4), 0.5)
    model = _private(DynamicDPKerasSGD(schedule=schedule, learning_rate=1.0))
    model.fit(x, y, batch_size=8, epochs=2, verbose=0)
    path = f"{pytest.importorskip('tempfile').mkdtemp()}/model.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    before = _kernel(loaded)
    loaded.fit(x, y, batch_size=8, epochs=1, verbose=0)
    # Step 2 clips every example to C_2 = 0.01: the kernel moves by at most 8 * 0.01 / 8 in norm, and by about that
    # (every example's gradient is far larger); with C_0 = 5 at that step it moved by 0.084.
    moved = np.linalg.norm(_kernel(loaded) - before)
    assert 0.005 < moved <= 0.01 * (1 + 1e-5)


def test_noise_is_fresh_after_a_restore_and_never_follows_the_global_seed():
    x, y = _data()
    updates = []
    for _ in range(2):
        model = _private(DynamicDPKerasSGD(schedule=_schedule(noise=5.0), learning_rate=1.0))  # same weights
        keras.utils.set_random_seed(0)  # the global seed does not reach the DP noise
        before = _kernel(model)
        model.fit(x, y, batch_size=8, epochs=1, verbose=0)
        updates.append(_kernel(model) - before)
    assert not np.allclose(updates[0], updates[1])
    # One optimizer rewound to the same state draws new noise: its generator is not part of the state.
    model = _private(DynamicDPKerasSGD(schedule=_schedule(noise=5.0), learning_rate=1.0))
    state = [np.asarray(v.value).copy() for v in model.variables + model.optimizer.variables]
    first = None
    for _ in range(2):
        for variable, value in zip(model.variables + model.optimizer.variables, state):
            variable.assign(value)
        model.fit(x, y, batch_size=8, epochs=1, verbose=0)
        update = _kernel(model) - state[0]
        assert first is None or not np.allclose(update, first)
        first = update


def test_a_noise_seed_reproduces_the_noise_and_warns_at_the_caller():
    x, y = _data()
    updates = []
    for _ in range(2):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            optimizer = DynamicDPKerasSGD(schedule=_schedule(noise=5.0), learning_rate=1.0, noise_seed=11)
        (warning,) = [w for w in caught if issubclass(w.category, NoiseSeedWarning)]
        assert warning.filename == __file__
        model = _private(optimizer)
        before = _kernel(model)
        model.fit(x, y, batch_size=8, epochs=1, verbose=0)
        updates.append(_kernel(model) - before)
    np.testing.assert_array_equal(updates[0], updates[1])
    assert "noise_seed" not in optimizer.get_config()


def test_rescale_to_unit_norm_divides_the_sum_by_the_clip_norm_as_well():
    x, y = _data()
    deltas = []
    for rescale in (False, True):
        model = _private(
            DynamicDPKerasSGD(schedule=_schedule(clip=0.25, noise=0.0), learning_rate=1.0, rescale_to_unit_norm=rescale)
        )
        before = _kernel(model)
        model.fit(x, y, batch_size=8, epochs=1, verbose=0)
        deltas.append(_kernel(model) - before)
    assert np.abs(deltas[0]).max() > 0
    np.testing.assert_allclose(deltas[1], deltas[0] / 0.25, rtol=1e-4, atol=1e-6)
