"""replicas: the DP step under MirroredStrategy (2 logical CPUs, see conftest) is the one-device step of the global
batch: same update, one noise of std sigma_t, one counter, the global batch-size check."""

from __future__ import annotations

import contextlib
import functools
import warnings

import numpy as np
import pytest
import tensorflow as tf

import keras_dyndp
from keras_dyndp import schedules
from keras_dyndp.optimizer_base import DegenerateNoiseWarning
from keras_dyndp.tf_backend import DynamicDPKerasSGD
from keras_dyndp.tf_backend import SamplingWarning
from keras_dyndp.tf_backend import data
from keras_dyndp.tf_backend import distribution
from keras_dyndp.tf_backend import keras_compat
from keras_dyndp.tf_backend.keras_compat import keras
from keras_dyndp.tf_backend.train_step import make_private

NUM_INPUTS, NUM_CLASSES = 60, 80
BATCH = 8
LEARNING_RATE = 0.5
# Most tests measure the clipped sums with the noise off (allow_degenerate_noise=True); the test of that warning
# asserts it (pytest.warns).
pytestmark = pytest.mark.filterwarnings("ignore::keras_dyndp.optimizer_base.DegenerateNoiseWarning")


def mirrored() -> tf.distribute.Strategy:
    """A new MirroredStrategy on the 2 logical CPUs, reducing through one device.

    TensorFlow's default cross-device ops use collective ops, whose instance keys each strategy object counts from
    the same start: a second strategy in the process whose collectives have other shapes than the first's fails
    ("Shape mismatch in the collective instance"). ReductionToOneDevice has no keys; the examples' strategy (one per
    process, tests/examples/test_scaling.py) and the multi-worker test cover the collective path.
    """
    devices = [device.name for device in tf.config.list_logical_devices("CPU")][:2]
    return tf.distribute.MirroredStrategy(devices, cross_device_ops=tf.distribute.ReductionToOneDevice())


def strategy_of(kind: str) -> tf.distribute.Strategy:
    return mirrored() if kind == "mirrored" else tf.distribute.get_strategy()


def examples(num_rows: int = 2 * BATCH + 1, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.normal(size=(num_rows, NUM_INPUTS)).astype(np.float32), rng.integers(0, NUM_CLASSES, num_rows)


def build_model(method: str = "auto", hidden: bool = False) -> keras.Model:
    layers = [keras.Input((NUM_INPUTS,))]
    if hidden:
        layers.append(keras.layers.Dense(16, activation="tanh", kernel_initializer=keras.initializers.GlorotUniform(1)))
    layers.append(keras.layers.Dense(NUM_CLASSES, kernel_initializer=keras.initializers.GlorotUniform(2)))
    return make_private(keras.Sequential(layers), method=method)


def train(
    kind: str,
    schedule: schedules.DPSchedule,
    dataset: tf.data.Dataset,
    *,
    method: str = "auto",
    accumulation_steps: int = 1,
    num_microbatches: int | None = None,
    expected_batch_size: float | None = BATCH,
    checkpoint_dir: str | None = None,
    adaptive_clipping: dict | None = None,
):
    """Fits on `dataset` under the strategy `kind`; returns the weights and the optimizer."""
    with strategy_of(kind).scope():
        model = build_model(method)
        optimizer = DynamicDPKerasSGD(
            schedule=schedule,
            learning_rate=LEARNING_RATE,
            expected_batch_size=expected_batch_size,
            accumulation_steps=accumulation_steps,
            num_microbatches=num_microbatches,
            allow_degenerate_noise=True,  # Most measure the clipped sums with the noise off (pytestmark).
            adaptive_clipping=adaptive_clipping,
        )
        model.compile(
            optimizer=optimizer,
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none"),
            metrics=["accuracy"],
        )
        optimizer.build(model.trainable_variables)
        if checkpoint_dir is not None:
            checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
            latest = tf.train.latest_checkpoint(checkpoint_dir)
            if latest:
                checkpoint.restore(latest).assert_existing_objects_matched()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SamplingWarning)
        model.fit(dataset, epochs=1, verbose=0, shuffle=False)
    if checkpoint_dir is not None:
        checkpoint.save(f"{checkpoint_dir}/ckpt")
    return [np.asarray(weight) for weight in model.get_weights()], optimizer


def batches(x: np.ndarray, y: np.ndarray) -> tf.data.Dataset:
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)


def varying_clip(num_steps: int, noise: float = 0.0) -> schedules.DPSchedule:
    """Clipping norms that differ at every step (a wrong schedule index changes the update); noise sigma_t."""
    return schedules.DPSchedule(0.05 * 3.0 ** np.arange(num_steps), np.full(num_steps, noise), 0.1)


def max_difference(first, second) -> float:
    return max(float(np.abs(a - b).max()) for a, b in zip(first, second))


@functools.cache
def one_device_update(method: str) -> list[np.ndarray]:
    weights, optimizer = train("default", varying_clip(3), batches(*examples()), method=method)
    assert int(optimizer.dp_step.numpy()) == 3
    return weights


@pytest.mark.parametrize("accumulation_steps,method", [(1, "auto"), (1, "vectorized"), (3, "auto")])
def test_noiseless_update_equals_the_one_device_update_of_the_global_batch(accumulation_steps, method):
    """17 rows in batches of 8, 8, 1: the last step leaves one replica without rows."""
    actual, optimizer = train(
        "mirrored", varying_clip(3), batches(*examples()), method=method, accumulation_steps=accumulation_steps
    )
    assert int(optimizer.dp_step.numpy()) == 3
    assert max_difference(actual, one_device_update(method)) < 1e-5


@pytest.mark.parametrize("accumulation_steps", [1, 3])
def test_the_replicas_agree_on_one_adapted_clip_norm_that_of_the_global_batch(accumulation_steps):
    """Each replica counts its rows unclipped; the counts are summed before the update of C_t (17 rows in batches
    of 8, 8, 1: the last leaves one replica without rows)."""
    options = {"target_quantile": 0.3, "learning_rate": 0.5, "count_stddev": 1e-6}
    runs = [
        train(
            kind,
            varying_clip(3),
            batches(*examples()),
            accumulation_steps=accumulation_steps,
            adaptive_clipping=options,
        )
        for kind in ("default", "mirrored")
    ]
    (one_device, first), (replicas, second) = runs
    clip_norms = [float(optimizer.adaptive_clip_norm.numpy()) for optimizer in (first, second)]
    assert clip_norms[0] != pytest.approx(0.05)  # it moved
    assert clip_norms[1] == pytest.approx(clip_norms[0], rel=1e-5)
    assert max_difference(replicas, one_device) < 1e-5


@pytest.mark.parametrize("kind,accumulation_steps", [("mirrored", 1), ("mirrored", 3), ("default", 3)])
def test_noise_std_is_sigma_t_times_learning_rate_over_the_batch_size(kind, accumulation_steps):
    """Step 0 is noiseless, step 1 (one row: one replica holds none) has sigma_1 = 4: the difference to the
    noiseless run is the noise of step 1 alone, N(0, (sigma_1 lr / B)^2) per coordinate, not sqrt(2) more or less."""
    sigma = 4.0
    noisy = schedules.DPSchedule([1.0, 1.0], [0.0, sigma], 0.1)
    noiseless = schedules.DPSchedule([1.0, 1.0], [0.0, 0.0], 0.1)
    x, y = examples(BATCH + 1)
    reference, _ = train(kind, noiseless, batches(x, y), accumulation_steps=accumulation_steps)
    weights, _ = train(kind, noisy, batches(x, y), accumulation_steps=accumulation_steps)
    noise = np.concatenate([(a - b).ravel() for a, b in zip(weights, reference)])
    assert noise.size > 4000
    assert np.std(noise) == pytest.approx(sigma * LEARNING_RATE / BATCH, rel=0.05)
    assert abs(np.mean(noise)) < 4 * sigma * LEARNING_RATE / BATCH / np.sqrt(noise.size)


def test_checkpoint_and_resume_under_the_strategy_continue_the_schedule(tmp_path):
    x, y = examples(3 * BATCH)  # The resumed fit's first batch must split evenly on Keras 3 (keras-team/keras#19246).
    expected, _ = train("default", varying_clip(3), batches(x, y))
    first_two = tf.data.Dataset.from_tensor_slices((x[: 2 * BATCH], y[: 2 * BATCH])).batch(BATCH)
    train("mirrored", varying_clip(3), first_two, checkpoint_dir=str(tmp_path))
    last = tf.data.Dataset.from_tensor_slices((x[2 * BATCH :], y[2 * BATCH :])).batch(BATCH)
    resumed, optimizer = train("mirrored", varying_clip(3), last, checkpoint_dir=str(tmp_path))
    assert int(optimizer.dp_step.numpy()) == 3
    assert max_difference(resumed, expected) < 1e-5


def test_microbatches_are_formed_per_replica_and_normalised_by_all_of_them():
    """One microbatch per replica (M = 1): the update is the mean over the 2 replicas of their clipped mean
    gradients, i.e. the mean of two one-device M = 1 steps on the halves of the batch."""
    schedule = schedules.DPSchedule([0.3], [0.0], 0.1)
    x, y = examples(BATCH)
    halves = [
        train("default", schedule, tf.data.Dataset.from_tensors((x[rows], y[rows])), num_microbatches=1)[0]
        for rows in (slice(0, BATCH // 2), slice(BATCH // 2, BATCH))
    ]
    actual, _ = train("mirrored", schedule, batches(x, y), num_microbatches=1)
    assert max_difference(actual, [(a + b) / 2 for a, b in zip(*halves)]) < 1e-5


def test_the_batch_size_check_counts_the_examples_of_all_replicas():
    """N = 10000, p = 0.05: a global batch of 500 holds p N examples, while either replica's 250 alone would be
    refused; a global batch above the range is refused although each replica's half is within it."""
    sampling_probability, num_examples, global_batch = 0.05, 10_000, 500
    low, high = data.batch_size_range(num_examples, sampling_probability)
    too_many = high + 2
    assert global_batch // 2 < low < global_batch < high < too_many and too_many // 2 <= high
    schedule = schedules.DPSchedule(np.ones(4), np.zeros(4), sampling_probability)
    expected = sampling_probability * num_examples
    x, y = examples(too_many)
    # Even and uneven splits (Keras 3 needs an even first batch under a strategy: keras-team/keras#19246).
    dataset = tf.data.Dataset.from_tensors((x[:global_batch], y[:global_batch]))
    dataset = dataset.concatenate(tf.data.Dataset.from_tensors((x[: global_batch - 1], y[: global_batch - 1])))
    train("mirrored", schedule, dataset, expected_batch_size=expected)
    with pytest.raises(tf.errors.InvalidArgumentError, match="too many examples"):
        train("mirrored", schedule, tf.data.Dataset.from_tensors((x, y)), expected_batch_size=expected)


def test_fit_on_a_poisson_dataset_is_recognised_from_the_replica_threads():
    x, y = examples(10 * BATCH)
    schedule = schedules.DPSchedule(np.ones(20), np.zeros(20), BATCH / len(x))
    dataset = keras_dyndp.poisson_batches(
        x, y, sampling_probability=BATCH / len(x), max_batch_size=2 * BATCH, steps_per_epoch=3, seed=0
    )
    with mirrored().scope():
        model = build_model()
        model.compile(
            optimizer=DynamicDPKerasSGD(
                schedule=schedule, learning_rate=0.1, expected_batch_size=BATCH, allow_degenerate_noise=True
            ),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none"),
        )
    with warnings.catch_warnings():
        warnings.simplefilter("error", SamplingWarning)
        model.fit(dataset, epochs=1, verbose=0)
    assert int(model.optimizer.dp_step.numpy()) == 3


def train_on_batch_update(x: np.ndarray, y: np.ndarray, schedule: schedules.DPSchedule, entry: str) -> np.ndarray:
    """The change of the weights after one step on the batch (x, y) under the strategy, through ``entry``:
    ``train_on_batch``, or (Keras 3) the train function called with a plain iterator of the batch."""
    noiseless = not schedule.noise_stddevs.any()
    with mirrored().scope():
        model = build_model()
        with pytest.warns(DegenerateNoiseWarning) if noiseless else contextlib.nullcontext():
            optimizer = DynamicDPKerasSGD(
                schedule=schedule,
                learning_rate=LEARNING_RATE,
                expected_batch_size=BATCH,
                allow_degenerate_noise=noiseless,
            )
        model.compile(
            optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
        )
        before = model.get_weights()
    with pytest.warns(SamplingWarning, match=entry if entry == "train_on_batch" else "train_function called directly"):
        if entry == "train_on_batch":
            model.train_on_batch(x, y)
        else:
            model.make_train_function()
            model.train_function(iter(tf.data.Dataset.from_tensors((x, y))))
    return np.concatenate([(after - first).ravel() for after, first in zip(model.get_weights(), before)])


@pytest.mark.parametrize(
    "entry",
    [
        "train_on_batch",
        pytest.param(
            "train_function",
            marks=pytest.mark.skipif(keras_compat.KERAS_MAJOR_VERSION == 2, reason="Keras 3's train function"),
        ),
    ],
)
def test_a_batch_given_directly_is_split_across_the_replicas(entry):
    """Noise off, every example clipped (C = 0.01): removing one example of the batch moves the clipped sum by
    exactly C, as when each example lives on one replica (2 C if every replica received the whole batch)."""
    clip = 0.01
    schedule = schedules.DPSchedule([clip], [0.0], 0.01)
    x, y = examples(BATCH)
    difference = train_on_batch_update(x, y, schedule, entry) - train_on_batch_update(x[1:], y[1:], schedule, entry)
    assert np.linalg.norm(difference) * BATCH / (LEARNING_RATE * clip) == pytest.approx(1.0, abs=1e-3)


def test_train_on_batch_counts_each_row_once():
    """p = 0.5 and p N = 8, so N = 16 and at most 16 examples are accepted: 12 rows pass, 24 would not."""
    schedule = schedules.DPSchedule([1.0], [1.0], 0.5)
    assert data.batch_size_range(16, 0.5)[1] == 16
    x, y = examples(12)
    update = train_on_batch_update(x, y, schedule, "train_on_batch")
    assert np.abs(update).max() > 0


def test_other_strategies_are_refused():
    strategy = tf.distribute.experimental.CentralStorageStrategy(
        [device.name for device in tf.config.list_logical_devices("CPU")][:2]
    )
    with strategy.scope(), pytest.raises(ValueError, match="CentralStorageStrategy"):
        DynamicDPKerasSGD(schedule=varying_clip(1, noise=1.0), public_batch_size=True)


def test_one_replica_helpers_are_the_identity():
    assert distribution.num_replicas() == 1
    assert not distribution.is_multi_worker()
    assert float(distribution.noise_share()) == 1.0
    assert int(distribution.global_sum(tf.constant(3))) == 3
