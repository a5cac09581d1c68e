"""Tests for fit's data check on JAX (`keras_dyndp.jax_backend.train_step`) of the Poisson batches' cap: a cap whose
truncation voids the target delta is refused before the first step, an accepted one recorded for the report."""

import pytest

jax = pytest.importorskip("jax")
keras = pytest.importorskip("keras")
if keras.backend.backend() != "jax":
    pytest.skip("Keras is not running on JAX (set KERAS_BACKEND=jax)", allow_module_level=True)

import numpy as np  # noqa: E402

import keras_dyndp  # noqa: E402
from keras_dyndp import schedules  # noqa: E402
from keras_dyndp.core import batch_sizes  # noqa: E402
from keras_dyndp.jax_backend import DynamicDPKerasSGD  # noqa: E402
from keras_dyndp.jax_backend import make_private  # noqa: E402

N, P = 40, 0.1


def _model():
    model = make_private(keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]))
    schedule = schedules.calibrate(
        "vanilla", target_epsilon=2.0, target_delta=1e-5, sampling_probability=P, num_steps=40, initial_clip=1.0
    )
    optimizer = DynamicDPKerasSGD(schedule=schedule, expected_batch_size=N * P, learning_rate=0.01)
    model.compile(
        optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    )
    return model


def _arrays():
    x = np.random.default_rng(0).normal(size=(N, 3)).astype(np.float32)
    return x, (x[:, 0] > 0).astype(np.int32)


def test_batches_capped_to_void_the_delta_are_refused_before_the_first_step_naming_the_default_cap():
    """The review's run: max_batch_size=2 at N 40, p 0.1 truncated 79% of the batches (added delta >= 4.75), and
    PrivacyLogger logged epsilon_pld 2.087 at delta 1e-5."""
    x, y = _arrays()
    model = _model()
    default = batch_sizes.default_max_batch_size(N, P)
    expected = rf"max_batch_size=2 truncates 0.791 of the batches .* target delta 1e-05.* default cap, {default},"
    for fit in (model.fit, lambda batches, **kwargs: keras.Model.fit(model, batches, **kwargs)):  # unbound too
        with pytest.raises(ValueError, match=expected):
            fit(keras_dyndp.poisson_batches(x, y, sampling_probability=P, max_batch_size=2, seed=0), verbose=0)
    assert int(model.optimizer.dp_step.numpy()) == 0 and model.optimizer.overflow_probability is None
    model.fit(keras_dyndp.poisson_batches(x, y, sampling_probability=P, steps_per_epoch=2, seed=0), verbose=0)
    size_range = model.optimizer.batch_size_range  # a size outside it stops training: counted too
    expected = batch_sizes.overflow_probability(N, P, default, size_range)
    assert model.optimizer.overflow_probability == expected < 1e-11
