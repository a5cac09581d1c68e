"""A research run's batches and Keras epochs: Poisson-sampled or shuffled batches, the run's T steps spread over
``--epochs`` Keras epochs, the ``fit`` calls that take them, and the seeds derived afresh at each start or resume."""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf

import keras_dyndp
from keras_dyndp import datasets
from research import run_config


def epoch_lengths(config: run_config.RunConfig, num_steps: int, num_train: int) -> list[int]:
    """Steps of each Keras epoch: the run's T steps spread over round(--epochs) epochs, longer epochs first.

    T = round(epochs * N / B) is rarely a multiple of the epoch count, so the epochs take q or q + 1 steps; the
    progress bar then counts the epochs the flag asked for ("Epoch 30/30", not a 31st epoch of the remainder).
    A shuffled epoch is one pass of at most N // B batches, so shuffled runs take more epochs where T needs them.
    """
    num_epochs = max(1, round(config.epochs))
    if config.sampling != "poisson":
        num_epochs = max(num_epochs, math.ceil(num_steps / (num_train // config.batch_size)))
    num_epochs = min(num_epochs, max(num_steps, 1))
    shorter, longer_count = divmod(num_steps, num_epochs)
    return [shorter + 1] * longer_count + [shorter] * (num_epochs - longer_count)


def train_batches(
    config: run_config.RunConfig,
    data: datasets.TaskData,
    p: float,
    seed: int | None,
    num_steps: int,
    start_step: int = 0,
) -> tf.data.Dataset:
    """`num_steps` (at most one epoch's) batches (x, y, sample_weight), Poisson-sampled or shuffled.

    Poisson batches are padded to the next multiple of `config.pad_to_multiple` rows (0: every batch to the cap,
    `keras_dyndp.core.batch_sizes.default_max_batch_size`); called in a `tf.distribute` strategy's scope,
    `keras_dyndp.poisson_batches` rounds the multiple and the cap up to multiples of its replicas, so that each global
    batch splits evenly across them. `start_step`: the optimizer's step they start at (`keras_dyndp.poisson_batches`
    refuses a seeded resume at another step).
    """
    if config.sampling == "poisson":
        return keras_dyndp.poisson_batches(
            data.x_train,
            data.y_train,
            sampling_probability=p,
            seed=seed,
            start_step=start_step,
            steps_per_epoch=num_steps,
            pad_to_multiple=config.pad_to_multiple or None,
        )
    return keras_dyndp.shuffled_batches(data.x_train, data.y_train, config.batch_size, seed=seed).take(num_steps)


def epoch_segments(start_step: int, stop_step: int, lengths: list[int]) -> list[tuple[int, int, int]]:
    """The `model.fit` calls that take steps [start_step, stop_step) in Keras epochs of the given lengths.

    Each is ``(initial_epoch, epochs, steps)``: Keras epochs ``initial_epoch .. epochs - 1`` of ``steps`` steps
    each. Consecutive epochs of one length share a call; a run that starts or stops inside an epoch gets that epoch
    as a call of its own with only the steps it takes, so the progress bar shows the true count ("7/7", not
    "11/11" for a last epoch cut short) and epoch numbers continue across calls.
    """
    segments: list[tuple[int, int, int]] = []
    epoch_start = 0
    for epoch, length in enumerate(lengths):
        steps = min(stop_step, epoch_start + length) - max(start_step, epoch_start)
        epoch_start += length
        if steps <= 0:
            continue
        if segments and segments[-1][1] == epoch and segments[-1][2] == steps:
            segments[-1] = (segments[-1][0], epoch + 1, steps)
        else:
            segments.append((epoch, epoch + 1, steps))
    return segments


BATCH_STREAM, NOISE_STREAM = 0, 1


def derived_seed(seed: int | None, start_step: int, stream: int) -> int | None:
    """A fresh seed for each (seed, resume point, stream): a resumed run must not replay the batches or the noise.

    `stream` (`BATCH_STREAM` or `NOISE_STREAM`) keeps the batches' and the noise's seeds apart. None stays None
    (OS entropy).
    """
    return None if seed is None else int(np.random.SeedSequence([seed, start_step, stream]).generate_state(1)[0])
