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
