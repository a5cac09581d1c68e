"""A property test of the normalisation rules under accumulation: models whose GroupNormalization,
LayerNormalization and RMS normalisation options are drawn from a seeded generator (groups, channel axis, center,
scale, epsilon, axis lists, rms_scaling) take one make_private step on each method, in one physical batch and in
three, and every step is the clipped sum of the per-example loop."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from brute_force import LOSS
from brute_force import reference

from keras_dyndp import schedules
from keras_dyndp.tf_backend import DynamicDPKerasSGD
from keras_dyndp.tf_backend.keras_compat import keras
from keras_dyndp.tf_backend.train_step import make_private

# The steps are compared with the noise off, which warns by design; the test's own fixed batch warns too.
pytestmark = [
    pytest.mark.filterwarnings("ignore::keras_dyndp.optimizer_base.DegenerateNoiseWarning"),
    pytest.mark.filterwarnings("ignore::keras_dyndp.SamplingWarning"),
    pytest.mark.filterwarnings("ignore:You passed `rms_scaling=True`:UserWarning"),  # Keras 3.9+: deprecated, kept
]

SHAPE = (4, 6)  # [positions, channels] of each example
ROWS = 7  # not a multiple of 3: the last physical batch is padded
CLIP_NORM = 0.05  # below most examples' norms: the clipping shows in the step
LEARNING_RATE = 1e3  # a step far above the weights' float32 rounding
METHODS = ("auto", "ghost", "vectorized")


def _group_norm(rng: np.random.Generator) -> keras.layers.Layer:
    axis = int(rng.choice([-1, 1]))  # channels last (6) or the positions' axis (4)
    channels = SHAPE[-1] if axis == -1 else SHAPE[0]
    groups = int(rng.choice([d for d in (1, 2, 3, 4, 6) if channels % d == 0]))
    center, scale = (bool(b) for b in rng.integers(0, 2, 2))
    return keras.layers.GroupNormalization(groups, axis, float(rng.choice([1e-3, 0.5])), center, scale)


def _layer_norm(rng: np.random.Generator) -> keras.layers.Layer:
    axis = [-1, 1, [1, 2], [-2, -1]][rng.integers(4)]
    center, scale = (bool(b) for b in rng.integers(0, 2, 2))
    options = {"axis": axis, "center": center, "scale": scale, "epsilon": float(rng.choice([1e-6, 0.1]))}
    if "rms_scaling" in keras.layers.LayerNormalization.__init__.__code__.co_varnames:  # Keras 3
        options["rms_scaling"] = bool(rng.integers(2))
    return keras.layers.LayerNormalization(**options)


def _rms_norm(rng: np.random.Generator) -> keras.layers.Layer:
    if not hasattr(keras.layers, "RMSNormalization"):  # Keras 3.9 and later
        return keras.layers.LayerNormalization(center=False)
    return keras.layers.RMSNormalization(axis=[-1, [1, 2]][rng.integers(2)], epsilon=float(rng.choice([1e-6, 0.1])))


def _model(seed: int) -> keras.Model:
    """Dense -> the drawn normalisations, in a drawn order -> Dense; random affine weights (not ones and zeros)."""
    rng = np.random.default_rng(seed)
    keras.utils.set_random_seed(seed)
    norms = [make(rng) for make in (_group_norm, _layer_norm, _rms_norm)]
    inputs = keras.Input(SHAPE)
    hidden = keras.layers.Dense(SHAPE[-1], activation="tanh")(inputs)
    for index in rng.permutation(len(norms)):
        hidden = norms[index](hidden)
    model = keras.Model(inputs, keras.layers.Dense(3)(keras.layers.Flatten()(hidden)))
    for variable in model.trainable_variables:
        variable.assign(rng.normal(size=variable.shape).astype(np.float32))
    return model


def _step(model: keras.Model, method: str, accumulation_steps: int, x, y) -> list[np.ndarray]:
    """The change of each trainable variable in one noiseless step, times -ROWS / LEARNING_RATE: the clipped sum."""
    before = [np.asarray(v, np.float64) for v in model.trainable_variables]
    optimizer = DynamicDPKerasSGD(
        schedule=schedules.DPSchedule([CLIP_NORM], [0.0], 0.5),
        learning_rate=LEARNING_RATE,
        expected_batch_size=ROWS,
        accumulation_steps=accumulation_steps,
        allow_degenerate_noise=True,
    )
    make_private(model, method=method).compile(optimizer=optimizer, loss=LOSS)
    model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(ROWS), epochs=1, verbose=0)
    after = [np.asarray(v, np.float64) for v in model.trainable_variables]
    return [(old - new) * ROWS / LEARNING_RATE for old, new in zip(before, after)]


# Each method on two drawn models in three physical batches (the last padded), on one in a single batch.
@pytest.mark.parametrize("seed,accumulation_steps", [(seed, 3) for seed in range(6)] + [(seed, 1) for seed in range(3)])
def test_drawn_normalisation_options_step_as_the_per_example_loop(seed, accumulation_steps):
    method = METHODS[seed % len(METHODS)]
    model = _model(seed)
    rng = np.random.default_rng(100 + seed)
    x = rng.normal(size=(ROWS, *SHAPE)).astype(np.float32)
    y = rng.integers(0, 3, ROWS).astype(np.int32)
    expected, _ = reference(model, x, y, np.ones(ROWS, np.float32), CLIP_NORM)
    actual = _step(model, method, accumulation_steps, x, y)
    scale = max(np.max(np.abs(total)) for total in expected)
    for variable, total, change in zip(model.trainable_variables, expected, actual):
        np.testing.assert_allclose(change, total, rtol=0, atol=2e-5 * scale, err_msg=f"{variable.name} ({method})")
