"""Step time of a small transformer: keras_dyndp's default DP step (``make_private(model)``, method 'auto': ghost
clipping through the EinsumDense, LayerNormalization, Dense and Embedding rules) against non-private SGD, on Keras 3's
TensorFlow or JAX backend, interleaved in one process.

The model (docs/performance.md, "Transformers"): Embedding(10000, d) over L tokens; two blocks of
MultiHeadAttention(4 heads, d / 4 each), Add, LayerNormalization, Dense(2d, relu), Dense(d), Add,
LayerNormalization; GlobalAveragePooling1D; Dense(2); d = 64, L = 64. On TensorFlow each path trains through Keras's
own ``model.train_function`` on one repeated batch (oneDNN on: ``TF_ENABLE_ONEDNN_OPTS=1`` is set before TensorFlow
is imported); on JAX through its train step compiled as ``fit`` compiles it (``jax_step_time``'s stepper). Warm-up
steps are excluded; each repetition runs both paths in turn (`interleaved.step_table`): median ms per step and the
median of the within-repetition ratios to the non-private step.

Usage:
    python benchmarks/transformer_step_time.py --backend tensorflow --batch_size 32 --steps 10 --repeats 7
    python benchmarks/transformer_step_time.py --backend jax --batch_size 32 --steps 10 --repeats 7
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
import warnings

PARSER = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
PARSER.add_argument("--backend", choices=["tensorflow", "jax"], default="tensorflow")
PARSER.add_argument("--batch_size", type=int, default=32)
PARSER.add_argument("--length", type=int, default=64, help="tokens per example (L)")
PARSER.add_argument("--width", type=int, default=64, help="model width (d)")
PARSER.add_argument("--steps", type=int, default=10, help="timed steps per path and repetition")
PARSER.add_argument("--warmup_steps", type=int, default=3)
PARSER.add_argument("--repeats", type=int, default=7)
ARGS = PARSER.parse_args()
os.environ["KERAS_BACKEND"] = ARGS.backend
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

import interleaved  # noqa: E402  (benchmarks/interleaved.py)
import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_dyndp  # noqa: E402
from keras_dyndp import schedules  # noqa: E402
from keras_dyndp.batch_sizes import SamplingWarning  # noqa: E402

VOCABULARY = 10_000
HEADS = 4


def transformer(length: int, width: int) -> keras.Model:
    """The benchmark's functional transformer (module docstring), from Keras's own layers."""
    layers = keras.layers
    inputs = keras.Input((length,), dtype="int32")
    h = layers.Embedding(VOCABULARY, width)(inputs)
    for _ in range(2):
        h = layers.LayerNormalization()(layers.Add()([h, layers.MultiHeadAttention(HEADS, width // HEADS)(h, h)]))
        feed_forward = layers.Dense(width)(layers.Dense(2 * width, activation="relu")(h))
        h = layers.LayerNormalization()(layers.Add()([h, feed_forward]))
    return keras.Model(inputs, layers.Dense(2)(layers.GlobalAveragePooling1D()(h)))


def build(path: str) -> keras.Model:
    keras.utils.set_random_seed(0)
    model = transformer(ARGS.length, ARGS.width)
    if path == "nonprivate":
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss=loss)
        return model
    model = keras_dyndp.make_private(model)
    num_steps = 100_000
    schedule = schedules.DPSchedule(np.ones(num_steps), np.ones(num_steps), ARGS.batch_size / 25_000)
    model.compile(
        optimizer=keras_dyndp.DynamicDPKerasSGD(
            schedule=schedule, expected_batch_size=ARGS.batch_size, learning_rate=0.05
        ),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none"),
    )
    return model


def tensorflow_step(model: keras.Model, x: np.ndarray, y: np.ndarray):
    """``steps -> seconds per step`` through Keras's own train function on one repeated batch."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    iterator = iter(tf.data.Dataset.from_tensors((x, y)).repeat())
    model.make_train_function()
    train_function = model.train_function

    def run(steps: int) -> float:
        start = time.perf_counter()
        for _ in range(steps):
            logs = train_function(iterator)
        np.asarray(logs["loss"] if logs and "loss" in logs else model.optimizer.iterations.numpy())
        return (time.perf_counter() - start) / steps

    return run


def jax_step(model: keras.Model, x: np.ndarray, y: np.ndarray):
    """``steps -> seconds per step`` of the train step compiled as ``fit`` compiles it."""
    import jax_step_time  # pylint: disable=import-outside-toplevel  (benchmarks/jax_step_time.py)

    return jax_step_time._Stepper(model, x, y).run  # pylint: disable=protected-access


def device_description() -> str:
    cpu = platform.processor() or platform.machine()
    with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
        cpu = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), cpu)
    return f"CPU: {cpu}, {os.cpu_count()} logical cores"


def main() -> None:
    rng = np.random.default_rng(0)
    x = rng.integers(0, VOCABULARY, (ARGS.batch_size, ARGS.length)).astype("int32")
    y = rng.integers(0, 2, ARGS.batch_size).astype("int32")
    step = tensorflow_step if ARGS.backend == "tensorflow" else jax_step
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SamplingWarning)  # one fixed batch, not Poisson batches: expected here
        runs = {path: step(build(path), x, y) for path in ("nonprivate", "dyndp_auto")}
        table = interleaved.step_table(runs, ARGS.steps, ARGS.repeats, ARGS.warmup_steps, ARGS.backend)
    versions = f"Python {sys.version.split()[0]}, Keras {keras.__version__} on {ARGS.backend}"
    print(f"\n{device_description()}; {versions}; B {ARGS.batch_size}, L {ARGS.length}, d {ARGS.width}")
    print("| path | ms / step | ratio to non-private |\n|---|---|---|")
    for path, (milliseconds, ratio) in table.items():
        print(f"| {path} | {milliseconds:.1f} | {ratio:.2f}x |")


if __name__ == "__main__":
    main()
