"""Interleaved timing for the micro-benchmarks: each repetition runs every variant in turn, so that load drifting on
a shared machine hits all variants alike; the median over repetitions is reported."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any


def median_milliseconds(
    functions: dict[str, Callable[[], Any]],
    calls: int,
    repeats: int,
    wait: Callable[[Any], Any] = lambda result: result,
) -> dict[str, float]:
    """Median ms per call of each function over ``repeats`` interleaved repetitions of ``calls`` calls each.

    Each function is called once first, untimed (tracing, compiling). ``wait`` is applied to the last result of a
    repetition before the clock stops (e.g. to fetch an asynchronously computed value)."""
    for function in functions.values():
        wait(function())
    milliseconds = {name: [] for name in functions}
    for _ in range(repeats):
        for name, function in functions.items():
            start = time.perf_counter()
            for _ in range(calls):
                result = function()
            wait(result)
            milliseconds[name].append((time.perf_counter() - start) / calls * 1e3)
    return {name: statistics.median(times) for name, times in milliseconds.items()}


def step_table(
    runs: dict[str, Callable[[int], float]], steps: int, repeats: int, warmup: int, label: str
) -> dict[str, tuple[float, float]]:
    """Median ms per step and median ratio to the first run of each run, over ``repeats`` interleaved repetitions.

    ``runs`` maps a path to a function that takes ``steps`` steps and returns the seconds per step; each is first
    called with ``warmup`` (untimed). The ratio is taken within each repetition, so that load drifting between
    repetitions cancels; each repetition's times are printed, prefixed by ``label``."""
    for run in runs.values():
        run(warmup)
    seconds = {path: [] for path in runs}
    for repetition in range(repeats):
        for path, run in runs.items():
            seconds[path].append(run(steps))
        print(f"{label} repetition {repetition}: " + ", ".join(f"{p} {s[-1] * 1e3:.2f} ms" for p, s in seconds.items()))
    baseline = seconds[next(iter(runs))]
    return {
        path: (1e3 * statistics.median(times), statistics.median(t / b for t, b in zip(times, baseline)))
        for path, times in seconds.items()
    }


def report(table: str, out_md: str | None) -> None:
    """Prints a benchmark's markdown table and, with ``out_md``, writes it there."""
    print(table)
    if out_md:
        with open(out_md, "w", encoding="utf-8") as handle:
            handle.write(table)


def keras_train_function_run(model: Any, x: Any, y: Any) -> Callable[[int], float]:
    """``steps -> seconds per step`` of a compiled TensorFlow Keras model's own train function on the batch (x, y),
    repeated; the clock stops once the last step's logs are fetched."""
    import numpy as np  # pylint: disable=import-outside-toplevel
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


def jax_train_step_run(model: Any, x: Any, y: Any) -> Callable[[int], float]:
    """``steps -> seconds per step`` of a compiled JAX Keras model's train step, compiled as ``fit`` compiles it
    (``jax_step_time``'s stepper), on the batch (x, y); prints XLA's temporary buffers of the compiled step."""
    import jax_step_time  # pylint: disable=import-outside-toplevel  (benchmarks/jax_step_time.py)

    stepper = jax_step_time._Stepper(model, x, y)  # pylint: disable=protected-access
    memory = stepper._function.memory_analysis()  # pylint: disable=protected-access
    if memory is not None:
        print(
            f"{model.optimizer.__class__.__name__}: XLA temporary buffers {memory.temp_size_in_bytes / 2**20:.1f} MiB"
        )
    return stepper.run
