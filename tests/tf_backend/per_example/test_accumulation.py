"""accumulation: a batch clipped in k physical batches gives the one-pass sums and outputs; the optimizer's
accumulation_steps is checked and reaches make_private's step, with the noise added once per logical step."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import tensorflow as tf

from keras_dyndp import schedules
from keras_dyndp.tf_backend import DynamicDPKerasSGD
from keras_dyndp.tf_backend.keras_compat import keras
from keras_dyndp.tf_backend.per_example import accumulation
from keras_dyndp.tf_backend.per_example import clipped_sum
from keras_dyndp.tf_backend.train_step import make_private

LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
# The steps are compared with the noise off (allow_degenerate_noise=True), which warns by design.
pytestmark = pytest.mark.filterwarnings("ignore::keras_dyndp.optimizer_base.DegenerateNoiseWarning")


def model_and_batch(num_rows: int, vectorized_layer: bool):
    rng = np.random.default_rng(0)
    keras.utils.set_random_seed(0)  # The same initial weights in every call.
    layers = [keras.Input((6,)), keras.layers.Dense(5, activation="tanh")]
    if vectorized_layer:
        layers.append(keras.layers.PReLU())  # No ghost rule: the vectorized path.
    layers.append(keras.layers.Dense(3))
    model = keras.Sequential(layers)
    x = rng.normal(size=(num_rows, 6)).astype(np.float32)
    y = rng.integers(0, 3, num_rows)
    weight = rng.uniform(0.5, 1.5, num_rows).astype(np.float32)
    weight[::4] = 0.0  # Padding rows.
    return model, x, y, weight


@pytest.mark.parametrize("num_rows,num_physical_batches", [(10, 1), (10, 3), (10, 5), (3, 4), (0, 2)])
@pytest.mark.parametrize("vectorized_layer", [False, True])
def test_physical_batches_give_the_one_pass_sums_and_outputs(num_rows, num_physical_batches, vectorized_layer):
    model, x, y, weight = model_and_batch(num_rows, vectorized_layer)
    variables = model.trainable_variables
    expected = clipped_sum.clipped_gradient_sum_with_outputs(model, LOSS, x, y, weight, 0.3, variables)
    actual = tf.function(
        lambda: accumulation.clipped_sum_in_physical_batches(
            functools.partial(
                clipped_sum.clipped_gradient_sum_with_outputs, model, LOSS, clip_norm=0.3, var_list=variables
            ),
            variables,
            x,
            y,
            weight,
            num_physical_batches,
        )
    )()
    for expected_sum, actual_sum in zip(expected[0], actual[0]):
        np.testing.assert_allclose(actual_sum, expected_sum, atol=1e-6)
    for expected_part, actual_part in zip(expected[1:], actual[1:]):
        assert actual_part.shape == expected_part.shape
        np.testing.assert_allclose(actual_part, expected_part, rtol=1e-5, atol=1e-6)


def fit_once(accumulation_steps: int, noise: float, batch: int = 12) -> np.ndarray:
    """One make_private step on `batch` rows from the same initial weights; returns the weight change."""
    model, x, y, _ = model_and_batch(batch, vectorized_layer=False)
    initial = [np.asarray(weight) for weight in model.get_weights()]
    schedule = schedules.DPSchedule([0.3], [noise], 0.1)
    optimizer = DynamicDPKerasSGD(
        schedule=schedule,
        learning_rate=1.0,
        expected_batch_size=batch,
        accumulation_steps=accumulation_steps,
        allow_degenerate_noise=True,
    )
    make_private(model).compile(optimizer=optimizer, loss=LOSS)
    # A dataset: fit refuses arrays for an optimizer with expected_batch_size (it takes this one with a warning).
    model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(batch), epochs=1, verbose=0)
    assert int(optimizer.dp_step.numpy()) == 1
    return np.concatenate([(after - before).ravel() for after, before in zip(model.get_weights(), initial)])


@pytest.mark.filterwarnings("ignore::keras_dyndp.tf_backend.SamplingWarning")
def test_accumulated_step_equals_one_pass():
    """(The noise added once per accumulated step, std sigma / B: tests/tf_backend/test_distribution.py.)"""
    np.testing.assert_allclose(fit_once(4, 0.0), fit_once(1, 0.0), atol=1e-6)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(accumulation_steps=0), "accumulation_steps"),
        (dict(accumulation_steps=2.0), "accumulation_steps"),
        (dict(accumulation_steps=True), "accumulation_steps"),
        (dict(accumulation_steps=2, num_microbatches=4), "microbatches"),
    ],
)
def test_bad_accumulation_arguments_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DynamicDPKerasSGD(schedule=schedules.DPSchedule([1.0], [1.0], 0.1), public_batch_size=True, **kwargs)


def test_accumulation_survives_get_config():
    optimizer = DynamicDPKerasSGD(
        schedule=schedules.DPSchedule([1.0], [1.0], 0.1), public_batch_size=True, accumulation_steps=3
    )
    assert DynamicDPKerasSGD.from_config(optimizer.get_config()).accumulation_steps == 3


def test_the_optimizers_own_path_refuses_accumulation():
    model, x, y, _ = model_and_batch(4, vectorized_layer=False)
    optimizer = DynamicDPKerasSGD(
        schedule=schedules.DPSchedule([1.0], [1.0], 0.1), public_batch_size=True, accumulation_steps=2
    )
    with tf.GradientTape() as tape:
        losses = LOSS(y, model(x))
    with pytest.raises(ValueError, match="make_private"):
        optimizer.compute_gradients(losses, model.trainable_variables, tape=tape)
