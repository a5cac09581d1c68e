"""Per-step time of DP-SGD paths against non-private SGD, measured interleaved in one process.

Every path trains its own copy of the same model through Keras's own ``model.train_function`` (the function
``model.fit`` calls once per step), fed from an in-memory repeated dataset, so Keras's per-step overhead is in
every row alike. Paths:

* ``nonprivate``: ``keras.optimizers.SGD``, mean loss.
* ``nonprivate_xla``: the same with ``compile(jit_compile=True)``.
* ``dyndp_jacobian``: ``make_private(model, method='jacobian')``, the optimizer's own per-example path (one pfor
  jacobian of the per-example losses, O(B^2)).
* ``dyndp_fast``: ``keras_dyndp.make_private(model)`` with ``method='auto'`` (ghost clipping when every layer
  has a rule); ``dyndp_fast_xla``: the same, XLA-compiled.
* ``dyndp_adaptive``: ``dyndp_fast`` with adaptive clipping (``adaptive_clipping=True``: the count of unclipped
  examples, its noise and the update of C_t; issue 57's goal: within 1.05x of ``dyndp_fast``).
* ``dyndp_vectorized``: ``make_private(model, method='vectorized')`` (``tf.vectorized_map`` over examples).
* ``tfp_dpkerassgd``: TF-Privacy ``DPKerasSGDOptimizer`` with ``num_microbatches`` = batch size (this and
  ``tfp_dpsequential`` run only where tensorflow-privacy is installed: the comparison stack, Keras 2).
* ``tfp_dpsequential``: TF-Privacy ``DPSequential`` with the default fast-clipping layer registry (Dense and
  Embedding; other layers take TF-Privacy's own fallback), ``use_xla=False``.

Warm-up steps (tracing, first runs) are excluded. Each repetition runs every path once, in the same order, and
the table reports the median over repetitions of the mean step time within one repetition and, as the ratio to
``nonprivate``, the median over repetitions of the ratio of the two within one repetition (each repetition's
mean step time per path is printed as it ends and kept in the CSV's ``seconds_per_repetition``). Slow paths (the
jacobian, TF-Privacy's microbatches, the vectorized path (a sequential tf.map_fn for the LSTM) and XLA, which
is slow on this CPU) run ``--slow_steps`` steps per repetition.

Memory: on a GPU, the peak of ``tf.config.experimental.get_memory_info`` over a path's timed steps (after
``reset_memory_stats``). On a CPU, the growth of the process's peak resident set size
(``resource.getrusage(...).ru_maxrss``) while the path was first traced and warmed up: an upper bound for the
first path that needs more than any path before it and 0 for one that fits in the peak reached already, so it
depends on the order of the paths.

Paths that cannot run on this stack are listed in the table as skipped, with the reason.

Strategies (``--strategies``, default ``default``): every path runs once per listed strategy, interleaved with the
others in each repetition, its model, optimizer and compile under the strategy's scope and its batch split across
the replicas (``strategy.experimental_distribute_dataset``); the ratio column is to ``nonprivate`` under the same
strategy. ``default``: one device. ``mirrored``: ``MirroredStrategy`` over the local GPUs or, on a machine without
one, over ``--cpu_replicas`` logical CPU devices split from the one physical CPU (they share its cores: this times
the multi-replica path and its overhead, not a speed-up). Under ``mirrored`` only ``nonprivate`` and ``dyndp_fast``
run.

Backends: ``--backend=tensorflow`` (default) runs this module; ``--backend=jax`` runs
``benchmarks/jax_step_time.py`` instead (Keras 3 on JAX, no TensorFlow: non-private against ``make_private``'s step,
timed the same way), before TensorFlow is imported.

Usage:
    python benchmarks/step_time.py --backend=jax --models cnn --batch_size 256 --steps 20 --repeats 5
    python benchmarks/step_time.py --batch_size 256 --steps 20 --slow_steps 2 --repeats 5 \
        --models cnn,lstm,text --out_csv step_time.csv --out_md step_time.md
    python benchmarks/step_time.py --models cnn --paths nonprivate,dyndp_fast --strategies default,mirrored
    python benchmarks/step_time.py --models transformer,vit --batch_size 32 --steps 10 --slow_steps 1 --repeats 5
"""

from __future__ import annotations

import os
import runpy
import sys

if "--backend=jax" in sys.argv:  # Before TensorFlow is imported: the JAX stack has none.
    sys.argv.remove("--backend=jax")
    runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "jax_step_time.py"), run_name="__main__")
    sys.exit(0)
if "--backend=tensorflow" in sys.argv:
    sys.argv.remove("--backend=tensorflow")

import csv
import functools
import importlib.metadata
import importlib.util
import os
import platform
import resource
import statistics
import time

import models  # benchmarks/models.py (this script's directory is on sys.path)
import numpy as np
import records  # benchmarks/records.py
import tensorflow as tf
from absl import app
from absl import flags

from keras_dyndp import schedules
from keras_dyndp.tf_backend import DynamicDPKerasSGD
from keras_dyndp.tf_backend.keras_compat import keras
from keras_dyndp.tf_backend.per_example import make_private

FLAGS = flags.FLAGS
flags.DEFINE_integer("batch_size", 256, "Examples per step.")
flags.DEFINE_integer("steps", 20, "Timed steps per repetition for the fast paths.")
flags.DEFINE_integer("slow_steps", 2, "Timed steps per repetition for the slow paths (SLOW_PATHS).")
flags.DEFINE_integer("warmup_steps", 3, "Untimed steps per path before the first repetition.")
flags.DEFINE_integer("repeats", 5, "Interleaved repetitions; the median is reported.")
flags.DEFINE_list("models", ["cnn", "lstm", "text"], f"Models among {', '.join(models.NAMES)}.")
flags.DEFINE_list("paths", [], "Paths to run (default: all).")
flags.DEFINE_list("strategies", ["default"], "tf.distribute strategies to compare, among default and mirrored.")
flags.DEFINE_integer(
    "cpu_replicas",
    2,
    "Logical CPU devices for --strategies=mirrored on a machine without a GPU (they share the cores).",
)
flags.DEFINE_string("out_csv", None, "Where to write the CSV table.")
flags.DEFINE_string("out_md", None, "Where to write the markdown table.")
flags.DEFINE_string(
    "record", None, "Where to write the run's record (benchmarks/records.py), e.g. benchmarks/results/x.json."
)

ALL_PATHS = (
    "nonprivate",
    "nonprivate_xla",
    "dyndp_jacobian",
    "dyndp_fast",
    "dyndp_adaptive",
    "dyndp_fast_xla",
    "dyndp_vectorized",
    "tfp_dpkerassgd",
    "tfp_dpsequential",
)
TF_PRIVACY_PATHS = ("tfp_dpkerassgd", "tfp_dpsequential")
STRATEGIES = ("default", "mirrored")
STRATEGY_PATHS = ("nonprivate", "dyndp_fast")  # The paths timed under a strategy other than the default one.
SLOW_PATHS = ("nonprivate_xla", "dyndp_jacobian", "dyndp_fast_xla", "dyndp_vectorized", "tfp_dpkerassgd")
LEARNING_RATE = 0.05
CLIP_NORM = 1.0
NOISE_MULTIPLIER = 1.0

MODELS = models.NAMES


def make_data(name: str, batch_size: int) -> tuple[tf.Tensor, tf.Tensor]:
    x, y = models.make_data(name, batch_size)
    return tf.constant(x), tf.constant(y, tf.int32)


def dp_schedule(batch_size: int) -> schedules.DPSchedule:
    num_steps = 100_000
    return schedules.DPSchedule(
        np.full(num_steps, CLIP_NORM), np.full(num_steps, NOISE_MULTIPLIER * CLIP_NORM), batch_size / 60000
    )


def per_example_loss() -> keras.losses.Loss:
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")  # Keras 2 and 3.


def build(model_name: str, path: str, batch_size: int) -> keras.Model:
    if path == "tfp_dpsequential":
        from tensorflow_privacy.privacy.fast_gradient_clipping import layer_registry
        from tensorflow_privacy.privacy.keras_models import dp_keras_model

        model = dp_keras_model.DPSequential(
            l2_norm_clip=CLIP_NORM,
            noise_multiplier=NOISE_MULTIPLIER,
            layer_registry=layer_registry.make_default_layer_registry(),
            use_xla=False,
            layers=models.LAYERS[model_name](keras),
        )
        model.compile(
            optimizer=keras.optimizers.SGD(LEARNING_RATE),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        return model
    model = models.build(keras, model_name)
    if path in ("nonprivate", "nonprivate_xla"):
        model.compile(
            optimizer=keras.optimizers.SGD(LEARNING_RATE),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            jit_compile=path == "nonprivate_xla",
        )
    elif path == "tfp_dpkerassgd":
        from tensorflow_privacy.privacy.optimizers import dp_optimizer_keras

        model.compile(
            optimizer=dp_optimizer_keras.DPKerasSGDOptimizer(
                l2_norm_clip=CLIP_NORM,
                noise_multiplier=NOISE_MULTIPLIER,
                num_microbatches=batch_size,
                learning_rate=LEARNING_RATE,
            ),
            loss=per_example_loss(),
        )
    else:
        make_private(model, method={"dyndp_jacobian": "jacobian", "dyndp_vectorized": "vectorized"}.get(path, "auto"))
        model.compile(
            optimizer=DynamicDPKerasSGD(
                schedule=dp_schedule(batch_size),
                expected_batch_size=batch_size,
                learning_rate=LEARNING_RATE,
                adaptive_clipping=path == "dyndp_adaptive",
            ),
            loss=per_example_loss(),
            jit_compile=path == "dyndp_fast_xla",
        )
    return model


def unavailable_reason(path: str, strategy: str = "default", model_name: str | None = None) -> str | None:
    """Why `path` cannot run on this stack (under `strategy`, on `model_name`), or None if it can."""
    if path == "tfp_dpsequential" and model_name in models.FUNCTIONAL:
        return "DPSequential takes a Sequential model's layers; this model is functional"
    if strategy != "default" and path not in STRATEGY_PATHS:
        return f"timed under --strategies={strategy} only for {', '.join(STRATEGY_PATHS)}"
    if path in TF_PRIVACY_PATHS and importlib.util.find_spec("tensorflow_privacy") is None:
        return "tensorflow-privacy is not installed (comparison stack only)"
    return None


def keras_version() -> str:
    """The version of the Keras in use (TF 2.15's ``tf.keras`` has no ``__version__``; its package has)."""
    version = getattr(keras, "__version__", None)
    return version or importlib.metadata.version("keras")


def device_description() -> str:
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        names = [tf.config.experimental.get_device_details(gpu).get("device_name", gpu.name) for gpu in gpus]
        return "GPU: " + ", ".join(names)
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"CPU: {cpu}, {os.cpu_count()} logical cores"


def max_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def split_cpu_for_mirrored(num_devices: int) -> None:
    """Splits the physical CPU into `num_devices` logical devices (before TensorFlow initialises them), so that
    ``MirroredStrategy`` has that many replicas on a machine without a GPU."""
    if tf.config.list_physical_devices("GPU"):
        return
    (cpu,) = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * num_devices)


@functools.cache
def make_strategy(name: str) -> tf.distribute.Strategy:
    """One strategy object per name for the whole run: two MirroredStrategy objects over the same devices number
    their collective ops alike, and interleaved steps of both would mix them up."""
    if name == "default":
        return tf.distribute.get_strategy()
    if tf.config.list_physical_devices("GPU"):
        return tf.distribute.MirroredStrategy()
    return tf.distribute.MirroredStrategy([device.name for device in tf.config.list_logical_devices("CPU")])


class Runner:
    """One path on one model under one strategy: its compiled train function and an endless iterator over one
    (global) batch, split across the replicas."""

    def __init__(self, model_name: str, path: str, batch_size: int, strategy_name: str = "default"):
        self.path = path
        self.strategy_name = strategy_name
        strategy = make_strategy(strategy_name)
        self.num_replicas = strategy.num_replicas_in_sync
        with strategy.scope():
            self.model = build(model_name, path, batch_size)
            if strategy_name != "default":  # Create the slots here, not in the replicas' first step.
                self.model.optimizer.build(self.model.trainable_variables)
        x, y = make_data(model_name, batch_size)
        dataset = tf.data.Dataset.from_tensors((x, y)).repeat()
        if strategy_name != "default":
            dataset = strategy.experimental_distribute_dataset(dataset)
        self.iterator = iter(dataset)
        self.model.make_train_function()  # Keras 3's returns None; both set `model.train_function`.
        self.train_function = self.model.train_function
        self.times: list[float] = []
        self.peak_memory_mib: float | None = None
        self.error: str | None = None

    def run(self, steps: int) -> float:
        start = time.perf_counter()
        for _ in range(steps):
            logs = self.train_function(self.iterator)
        # Wait for the last step (a paths' logs may hold no loss: make_private without training metrics).
        np.asarray(logs["loss"] if logs and "loss" in logs else self.model.optimizer.iterations.numpy())
        return (time.perf_counter() - start) / steps


def steps_per_repetition(path: str) -> int:
    return FLAGS.slow_steps if path in SLOW_PATHS else FLAGS.steps


def measure(model_name: str, paths: list[str], strategies: tuple[str, ...] = ("default",)) -> list[dict]:
    gpu = bool(tf.config.list_physical_devices("GPU"))
    runners = []
    for strategy, path in [(strategy, path) for strategy in strategies for path in paths]:
        label = path if strategies == ("default",) else f"{path} ({strategy})"
        reason = unavailable_reason(path, strategy, model_name)
        if reason is not None:
            print(f"[{model_name}] {label} skipped: {reason}")
            runners.append(dict(path=path, strategy=strategy, error=reason, skipped=True))
            continue
        rss_before = max_rss_mib()
        try:
            runner = Runner(model_name, path, FLAGS.batch_size, strategy)
            runner.run(FLAGS.warmup_steps if path not in SLOW_PATHS else 1)
        except Exception as error:  # pylint: disable=broad-except
            print(f"[{model_name}] {label} failed: {type(error).__name__}: {str(error).splitlines()[0][:200]}")
            runner = None
            failed = dict(path=path, strategy=strategy, error=f"{type(error).__name__}")
        if runner is None:
            runners.append(failed)
            continue
        if not gpu:
            runner.peak_memory_mib = max_rss_mib() - rss_before
        runners.append(runner)
        print(f"[{model_name}] {label} warmed up ({runner.num_replicas} replica(s))")
    for repeat in range(FLAGS.repeats):
        for runner in runners:
            if isinstance(runner, dict):
                continue
            if gpu:
                tf.config.experimental.reset_memory_stats("GPU:0")
            runner.times.append(runner.run(steps_per_repetition(runner.path)))
            if gpu:
                peak = tf.config.experimental.get_memory_info("GPU:0")["peak"] / 2**20
                runner.peak_memory_mib = max(runner.peak_memory_mib or 0.0, peak)
        done = ", ".join(f"{r.path}/{r.strategy_name} {r.times[-1]:.4f}" for r in runners if not isinstance(r, dict))
        print(f"[{model_name}] repetition {repeat + 1}/{FLAGS.repeats} done (s/step: {done})")
    rows = []
    for runner in runners:
        if isinstance(runner, dict):
            note = f"skipped: {runner['error']}" if runner.get("skipped") else f"failed: {runner['error']}"
            rows.append(
                dict(
                    model=model_name,
                    path=runner["path"],
                    strategy=runner["strategy"],
                    replicas=None,
                    seconds_per_step=None,
                    ratio=None,
                    peak_memory_mib=None,
                    note=note,
                    seconds_per_repetition="",
                )
            )
            continue
        baseline_times = next(
            (
                r.times
                for r in runners
                if not isinstance(r, dict) and r.path == "nonprivate" and r.strategy_name == runner.strategy_name
            ),
            None,
        )
        ratio = None
        if baseline_times:
            # Median over repetitions of the ratio within one repetition: steadier than a ratio of medians when
            # the load on the machine drifts between repetitions.
            ratio = statistics.median(t / b for t, b in zip(runner.times, baseline_times))
        rows.append(
            dict(
                model=model_name,
                path=runner.path,
                strategy=runner.strategy_name,
                replicas=runner.num_replicas,
                seconds_per_step=statistics.median(runner.times),
                ratio=ratio,
                peak_memory_mib=runner.peak_memory_mib,
                note=f"{len(runner.times)} x {steps_per_repetition(runner.path)} steps",
                seconds_per_repetition=" ".join(f"{t:.4f}" for t in runner.times),
            )
        )
    return rows


def markdown(rows: list[dict], device: str) -> str:
    memory_kind = "GPU peak MiB" if "GPU" in device else "CPU max-RSS growth at warm-up, MiB"
    # The strategy column only when a strategy other than the default one was timed (earlier tables lack it).
    with_strategy = any(row["strategy"] != "default" for row in rows)
    strategy_header = " strategy (replicas) |" if with_strategy else ""
    lines = [
        f"Device: {device}; Python {platform.python_version()}, TF {tf.__version__}, Keras {keras_version()}; "
        f"batch {FLAGS.batch_size}; median of {FLAGS.repeats} "
        "interleaved repetitions.",
        "",
        f"| model | path |{strategy_header} s/step | x non-private | {memory_kind} | note |",
        "|---|---|" + ("---|" if with_strategy else "") + "---|---|---|---|",
    ]
    for row in rows:
        seconds = "—" if row["seconds_per_step"] is None else f"{row['seconds_per_step']:.4f}"
        ratio = "—" if row["ratio"] is None else f"{row['ratio']:.2f}"
        memory = "—" if row["peak_memory_mib"] is None else f"{row['peak_memory_mib']:.0f}"
        strategy = f" {row['strategy']} ({row['replicas'] or '—'}) |" if with_strategy else ""
        lines.append(f"| {row['model']} | {row['path']} |{strategy} {seconds} | {ratio} | {memory} | {row['note']} |")
    return "\n".join(lines) + "\n"


def record_results(rows: list[dict]) -> dict:
    """The rows as a record's results: ``{model: {path: {seconds_per_step, ratio, ...}}}`` (a strategy other than
    the default one is named after the path: ``dyndp_fast@mirrored``)."""
    results: dict = {}
    for row in rows:
        path = row["path"] if row["strategy"] == "default" else f"{row['path']}@{row['strategy']}"
        results.setdefault(row["model"], {})[path] = {
            key: row[key] for key in ("seconds_per_step", "ratio", "peak_memory_mib", "replicas", "note")
        }
        results[row["model"]][path]["seconds_per_repetition"] = [
            float(t) for t in row["seconds_per_repetition"].split()
        ]
    return results


def main(argv: list[str]) -> None:
    del argv
    # By default the paths this stack can run; a path asked for by name is listed as skipped if it cannot.
    paths = FLAGS.paths or [path for path in ALL_PATHS if unavailable_reason(path) is None]
    unknown = sorted(set(paths) - set(ALL_PATHS))
    if unknown:
        raise ValueError(f"`--paths` must be among {ALL_PATHS}. Received: {unknown}.")
    unknown = sorted(set(FLAGS.models) - set(MODELS))
    if unknown:
        raise ValueError(f"`--models` must be among {sorted(MODELS)}. Received: {unknown}.")
    strategies = tuple(FLAGS.strategies)
    unknown = sorted(set(strategies) - set(STRATEGIES))
    if unknown or not strategies:
        raise ValueError(f"`--strategies` must be among {STRATEGIES}. Received: {list(strategies)}.")
    if "mirrored" in strategies:
        split_cpu_for_mirrored(FLAGS.cpu_replicas)
    device = device_description()
    if "mirrored" in strategies and "CPU" in device:
        device += f"; mirrored: {FLAGS.cpu_replicas} logical CPU devices sharing those cores"
    rows = []
    for model_name in FLAGS.models:
        rows.extend(measure(model_name, paths, strategies))
    table = markdown(rows, device)
    print(table)
    if FLAGS.out_csv:
        with open(FLAGS.out_csv, "w", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    if FLAGS.out_md:
        with open(FLAGS.out_md, "w", encoding="utf-8") as handle:
            handle.write(table)
    if FLAGS.record:
        records.write_record(FLAGS.record, records.command_line(), record_results(rows))


if __name__ == "__main__":
    app.run(main)
