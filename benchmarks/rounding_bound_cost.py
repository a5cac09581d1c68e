"""What the ghost norms' rounding guarantee and the factor-0 selects cost: the DP step with them against the same
step without them (the code before the rounding bound of 2026-12-01: squared norms as computed, a plain contraction
of the factors), interleaved in one run, on the Keras backend this process runs (``KERAS_BACKEND``: tensorflow or jax).

Each variant is its own copy of the same model, ``make_private(model)`` with ``DynamicDPKerasSGD`` (ghost clipping
wherever rules cover the layers), compiled by its first ``train_on_batch`` call; the "before" copy is traced with
`keras_dyndp.rules.ghost_cost.bounded_squared_norms` returning the computed squares and the backend's ``kept_rows`` the
rows unchanged, and runs that compiled step afterwards. Timing: `interleaved.step_table` (every variant in each
repetition; the median time and the median of the ratios within a repetition). Models: cnn, lstm, text
(benchmarks/models.py) and ``sequence``, a Dense(256) over 8 positions of 256 features then mean pooling (the Gram
form, where the bound's ||a_t|| ||g_t|| costs most).

Usage:
    python benchmarks/rounding_bound_cost.py --models cnn,lstm,text,sequence --batch_size 256 --repeats 7
    KERAS_BACKEND=jax python benchmarks/rounding_bound_cost.py ...
"""

from __future__ import annotations

import contextlib
import os
import platform
import time
import warnings

import interleaved
import models
import numpy as np
from absl import app
from absl import flags

import keras_dyndp
from keras_dyndp.rules import ghost_cost
from keras_dyndp.rules import layer_rules
from keras_dyndp.schedules import DPSchedule

JAX = keras_dyndp.keras_backend() == "jax"
if JAX:
    import jax
    import keras
else:
    from keras_dyndp.tf_backend.keras_compat import keras

FLAGS = flags.FLAGS
flags.DEFINE_list("models", ["cnn", "lstm", "text", "sequence"], "Models among cnn, lstm, text, sequence.")
flags.DEFINE_integer("batch_size", 256, "Examples per step.")
flags.DEFINE_integer("calls", 5, "Timed steps per variant in each repetition.")
flags.DEFINE_integer("repeats", 7, "Interleaved repetitions; the median is reported.")


def _layers(name: str) -> list:
    if name == "sequence":
        return [
            keras.layers.InputLayer((8, 256)),
            keras.layers.Dense(256, activation="relu"),
            keras.layers.GlobalAveragePooling1D(),
            keras.layers.Dense(10),
        ]
    return models.LAYERS[name](keras)


def _data(name: str) -> tuple[np.ndarray, np.ndarray]:
    if name == "sequence":
        rng = np.random.default_rng(0)
        x = rng.normal(size=(FLAGS.batch_size, 8, 256)).astype(np.float32)
        return x, rng.integers(0, 10, size=FLAGS.batch_size).astype(np.int32)
    return models.make_data(name, FLAGS.batch_size)


@contextlib.contextmanager
def _without_bound_and_selects():
    """While tracing: no rounding bound on the squared norms, no select of factor-0 rows."""
    saved = ghost_cost.bounded_squared_norms, layer_rules.kept_rows
    ghost_cost.bounded_squared_norms = lambda xp, squared, *args: squared
    layer_rules.kept_rows = lambda tensor, factors: tensor
    try:
        yield
    finally:
        ghost_cost.bounded_squared_norms, layer_rules.kept_rows = saved


def _steps(name: str, before: bool):
    """A function ``steps -> seconds per step`` of compiled DP steps of model ``name`` (traced before returning)."""
    keras.utils.set_random_seed(0)
    model = keras_dyndp.make_private(keras.Sequential(_layers(name)))
    steps = 100_000
    schedule = DPSchedule(np.full(steps, 1.0), np.full(steps, 1.1), FLAGS.batch_size / 60_000)
    model.compile(
        optimizer=keras_dyndp.DynamicDPKerasSGD(
            schedule=schedule, expected_batch_size=FLAGS.batch_size, learning_rate=0.1
        ),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none"),
    )
    x, y = _data(name)
    with _without_bound_and_selects() if before else contextlib.nullcontext():
        model.train_on_batch(x, y)

    def run(steps: int) -> float:
        start = time.perf_counter()
        for _ in range(steps):
            model.train_on_batch(x, y)  # returns numpy values: the step has finished
        return (time.perf_counter() - start) / max(steps, 1)

    return run


def _machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            cpu = next(line.split(":", 1)[1].strip() for line in handle if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    if JAX:
        return (
            f"{cpu}, {os.cpu_count()} cores, JAX {jax.__version__} ({jax.default_backend()}), Keras {keras.__version__}"
        )
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    onednn = os.environ.get("TF_ENABLE_ONEDNN_OPTS", "TF's default")
    return f"{cpu}, {os.cpu_count()} cores, TensorFlow {tf.__version__} (oneDNN: {onednn})"


def main(argv: list[str]) -> None:
    del argv
    warnings.simplefilter("ignore")  # SamplingWarning: fixed batches, not Poisson samples (timing only)
    print(f"# DP step with vs without the rounding bound and selects, batch {FLAGS.batch_size}: {_machine()}")
    rows = []
    for name in FLAGS.models:
        runs = {"before": _steps(name, before=True), "after": _steps(name, before=False)}
        table = interleaved.step_table(runs, FLAGS.calls, FLAGS.repeats, warmup=1, label=name)
        rows.append(f"| {name} | {table['before'][0]:.1f} | {table['after'][0]:.1f} | {table['after'][1]:.3f} |")
    print("\n".join(["| model | before (ms) | after (ms) | after / before |", "|---|---|---|---|", *rows]))


if __name__ == "__main__":
    app.run(main)
