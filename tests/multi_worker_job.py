"""One worker of the 2-process MultiWorkerMirroredStrategy test (tests/test_multi_worker.py), over localhost.

Usage: TF_CONFIG=... python multi_worker_job.py OUT_DIR. Writes OUT_DIR/worker<i>.npz with what the test compares.
Every run goes through model.fit under the strategy; the global batch is 8 rows split 4 + 4 over the workers. From
a memmap on disk (one copy per worker) read through a counting source: the rows each worker read and was fed.
"""

from __future__ import annotations

import json
import os
import sys
import warnings

import numpy as np
import tensorflow as tf
from counting_source import CountingSource

STRATEGY = tf.distribute.MultiWorkerMirroredStrategy()

import keras_dyndp  # noqa: E402
import keras_dyndp.tf_backend.data  # noqa: E402
from keras_dyndp import schedules  # noqa: E402
from keras_dyndp.tf_backend import DynamicDPKerasSGD  # noqa: E402
from keras_dyndp.tf_backend import SamplingWarning  # noqa: E402
from keras_dyndp.tf_backend.keras_compat import keras  # noqa: E402
from keras_dyndp.tf_backend.train_step import make_private  # noqa: E402

BATCH, NUM_INPUTS, NUM_CLASSES, LEARNING_RATE = 8, 60, 80, 0.5


def examples(num_rows: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.normal(size=(num_rows, NUM_INPUTS)).astype(np.float32), rng.integers(0, NUM_CLASSES, num_rows)


def train(schedule, dataset, *, accumulation_steps=1, checkpoint_dir=None, strategy=STRATEGY):
    with strategy.scope():
        model = make_private(
            keras.Sequential(
                [
                    keras.Input((NUM_INPUTS,)),
                    keras.layers.Dense(NUM_CLASSES, kernel_initializer=keras.initializers.GlorotUniform(2)),
                ]
            )
        )
        optimizer = DynamicDPKerasSGD(
            schedule=schedule,
            learning_rate=LEARNING_RATE,
            expected_batch_size=BATCH,
            accumulation_steps=accumulation_steps,
            allow_degenerate_noise=True,  # The clipped sums are compared with the noise off.
        )
        model.compile(
            optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
        )
        optimizer.build(model.trainable_variables)
        checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
        if checkpoint_dir is not None and tf.train.latest_checkpoint(checkpoint_dir):
            checkpoint.restore(tf.train.latest_checkpoint(checkpoint_dir)).assert_existing_objects_matched()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SamplingWarning)
        model.fit(dataset, epochs=1, verbose=0)
    if checkpoint_dir is not None:
        checkpoint.save(os.path.join(checkpoint_dir, "ckpt"))
    return np.concatenate([np.ravel(w) for w in model.get_weights()]), int(optimizer.dp_step.numpy())


def batches(x, y):
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)


def on_demand(out_dir: str, task: int, x: np.ndarray, y: np.ndarray, pad_to_multiple: int | None = None) -> dict:
    """3 steps of Poisson batches (seed 7) of a memmap distributed by the strategy: the rows this worker read, the
    rows it was fed, and the global samples and batch rows (from the step seeds, as `keras_dyndp.tf_backend.data`
    draws them). With ``pad_to_multiple`` the batches have no static size (tf.distribute's other rebatching)."""
    from keras_dyndp.data import sources  # pylint: disable=import-outside-toplevel

    path = os.path.join(out_dir, f"rows{task}.npy")
    np.save(path, np.arange(1, len(x) + 1, dtype=np.float32)[:, None].repeat(2, 1))
    source = CountingSource(np.load(path, mmap_mode="r"), y)
    with STRATEGY.scope():
        batches = keras_dyndp.poisson_batches(
            source, sampling_probability=0.3, steps_per_epoch=3, seed=7, pad_to_multiple=pad_to_multiple
        )
    source.reads.clear()  # The first example, read to learn the shapes.
    fed = []
    for batch_x, _, weights in STRATEGY.experimental_distribute_dataset(batches):
        local_x, local_weights = (np.concatenate(STRATEGY.experimental_local_results(v)) for v in (batch_x, weights))
        fed.append(local_x[local_weights > 0, 0].astype(np.int64) - 1)
    cap = keras_dyndp.tf_backend.data.poisson_sampling(batches).max_batch_size
    step_seeds = tf.data.Dataset.random(seed=7, rerandomize_each_iteration=True).batch(2, drop_remainder=True)
    samples, rows = np.full((3, cap), -1), np.full(3, cap)
    for step, step_seed in enumerate(step_seeds.take(3)):
        selected, chosen = sources.draw(np.random.default_rng(step_seed.numpy().view(np.uint64)), len(x), 0.3, cap)
        samples[step, : len(chosen)] = chosen
        if pad_to_multiple:  # the multiple is lcm(pad_to_multiple, 2 replicas)
            rows[step] = min(cap, max(1, -(-selected // pad_to_multiple)) * pad_to_multiple)
    reads = np.asarray(sum(source.reads, []), np.int64)
    return {"reads": reads, "fed": np.concatenate(fed), "samples": samples, "rows": rows}


def main(out_dir: str) -> None:
    task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    results = {}
    varying = schedules.DPSchedule(0.05 * 3.0 ** np.arange(3), np.zeros(3), 0.1)
    x, y = examples(3 * BATCH)
    # sigma = 0, clip varying by step: the update of 3 global steps, and the same from 2 steps + checkpoint + 1.
    results["noiseless"], results["steps"] = train(varying, batches(x, y))
    results["noiseless_accumulated_2"], _ = train(varying, batches(x, y), accumulation_steps=2)
    checkpoint_dir = os.path.join(out_dir, f"checkpoints{task}")  # One per worker: each saves its own copy.
    train(varying, batches(x[: 2 * BATCH], y[: 2 * BATCH]), checkpoint_dir=checkpoint_dir)
    results["resumed"], results["resumed_steps"] = train(
        varying, batches(x[2 * BATCH :], y[2 * BATCH :]), checkpoint_dir=checkpoint_dir
    )
    # Step 0 noiseless, step 1 sigma = 4: the difference is one step's noise.
    noisy = schedules.DPSchedule([1.0, 1.0], [0.0, 4.0], 0.1)
    quiet = schedules.DPSchedule([1.0, 1.0], [0.0, 0.0], 0.1)
    x2, y2 = examples(2 * BATCH)
    results["noise"] = train(noisy, batches(x2, y2))[0] - train(quiet, batches(x2, y2))[0]
    # The one-device reference, computed by each worker outside the strategy.
    results["reference"], _ = train(varying, batches(x, y), strategy=tf.distribute.OneDeviceStrategy("/cpu:0"))
    # Poisson batches with an OS-drawn seed: the workers must sample the same ones.
    with STRATEGY.scope():
        poisson = keras_dyndp.poisson_batches(x, y, sampling_probability=0.3, steps_per_epoch=2)
    results["poisson_rows"] = np.concatenate([np.ravel(batch[0]) for batch in poisson])
    for name, multiple in (("source", None), ("padded_source", 2)):
        results.update({f"{name}_{key}": value for key, value in on_demand(out_dir, task, x, y, multiple).items()})
    np.savez(os.path.join(out_dir, f"worker{task}.npz"), **results)


if __name__ == "__main__":
    main(sys.argv[1])
