"""Step time of keras_dyndp's JAX step on Poisson batches padded to one shape or to multiples of 32 rows.

`keras_dyndp.poisson_batches` (on JAX) pads every batch to ``max_batch_size`` by default (one compiled step), which
for an expected batch of 250 from 54000 examples is 385 rows: the vmapped step computes every padding row.
``pad_to_multiple=32`` pads to the next multiple of 32 instead (a few shapes, each compiled once). This times both
on the paper's CNN (Fashion-MNIST shapes, random images: the time does not depend on them), through ``model.fit``,
one ``fit`` of ``--steps`` batches per path and repetition, interleaved; warm-up (compilation) excluded.

Usage: python benchmarks/jax_poisson_padding.py [--steps 40 --repeats 3 --batch_size 250 --num_examples 54000]
"""

from __future__ import annotations

import os

os.environ["KERAS_BACKEND"] = "jax"

import statistics  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import keras  # noqa: E402
import models  # noqa: E402  (benchmarks/models.py)
import numpy as np  # noqa: E402
from absl import app  # noqa: E402
from absl import flags  # noqa: E402

import keras_dyndp  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_integer("num_examples", 54_000, "N.")
flags.DEFINE_integer("batch_size", 250, "Expected batch size p N.")
flags.DEFINE_integer("steps", 40, "Batches per timed fit.")
flags.DEFINE_integer("repeats", 3, "Interleaved repetitions; the median is reported.")


def main(argv):
    del argv  # Unused.
    rng = np.random.default_rng(0)
    x = rng.random((FLAGS.num_examples, 28, 28, 1), dtype=np.float32)
    y = rng.integers(0, 10, FLAGS.num_examples).astype(np.int32)
    optimizer = keras_dyndp.DynamicDPKerasSGD(
        target_epsilon=2.0,
        target_delta=1 / (10 * FLAGS.num_examples),
        num_examples=FLAGS.num_examples,
        batch_size=FLAGS.batch_size,
        epochs=20,
        method="vanilla",
        initial_clip=1.0,
        learning_rate=0.1,
    )
    model = keras_dyndp.make_private(keras.Sequential(models.cnn_layers(keras)))
    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(True, reduction="none"))
    p = optimizer.schedule.sampling_probability
    paths = {
        "one shape": keras_dyndp.poisson_batches(x, y, sampling_probability=p, steps_per_epoch=FLAGS.steps),
        "pad_to_multiple=32": keras_dyndp.poisson_batches(
            x, y, sampling_probability=p, steps_per_epoch=FLAGS.steps, pad_to_multiple=32
        ),
    }
    for batches in paths.values():
        model.fit(batches, epochs=2, verbose=0)  # compiles every shape it meets
    seconds = {name: [] for name in paths}
    for _ in range(FLAGS.repeats):
        for name, batches in paths.items():
            start = time.perf_counter()
            model.fit(batches, epochs=1, verbose=0)
            seconds[name].append((time.perf_counter() - start) / FLAGS.steps)
    device = jax.devices()[0]
    print(
        f"Keras {keras.__version__} on JAX {jax.__version__} ({device.platform}), p N = {FLAGS.batch_size}, "
        f"N = {FLAGS.num_examples}, cap {paths['one shape'].max_batch_size} rows; medians of {FLAGS.repeats}:"
    )
    for name, values in seconds.items():
        print(f"  {name}: {statistics.median(values):.4f} s per DP step")


if __name__ == "__main__":
    app.run(main)
