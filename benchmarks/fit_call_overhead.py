"""What `make_private` adds to each ``fit`` call, apart from its steps: a user calling ``fit`` once per epoch on small
data pays it every epoch (issue 56's goal: at most 5 ms).

The same model and the same `keras_dyndp.poisson_batches` data (so the pipeline's cost cancels), non-private
(SGD) and made private (the default method), on the backend Keras runs on. A call's cost is ``a + s k`` for k steps;
each variant runs ``fit`` with 1 and with 3 steps, interleaved, and a = (3 t_1 - t_3) / 2 is reported (medians over
the repetitions), beside s, the time of one step.

    python benchmarks/fit_call_overhead.py --repeats 15 [--seed 3] [--record benchmarks/results/x.json]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import records  # benchmarks/records.py (this script's directory is on sys.path)

import keras_dyndp
from keras_dyndp.schedules import DPSchedule

NUM_EXAMPLES, BATCH_SIZE = 2048, 64


def _model(private: bool):
    import keras  # noqa: PLC0415  (after keras_dyndp: its backend choice)

    model = keras.Sequential(
        [keras.Input((28, 28, 1)), keras.layers.Conv2D(8, 3, activation="relu"), keras.layers.Flatten()]
        + [keras.layers.Dense(10)]
    )
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    if not private:  # Keras's own reduction: JAX's trainer takes only a scalar loss
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss=keras.losses.SparseCategoricalCrossentropy(True))
        return model
    p = BATCH_SIZE / NUM_EXAMPLES
    schedule = DPSchedule(np.ones(100_000), np.ones(100_000), p)
    optimizer = keras_dyndp.DynamicDPKerasSGD(schedule=schedule, expected_batch_size=BATCH_SIZE, learning_rate=0.1)
    model.compile(optimizer=optimizer, loss=loss)
    return keras_dyndp.make_private(model)


def _fit_seconds(model, data, steps: int) -> float:
    start = time.perf_counter()
    model.fit(data, epochs=1, steps_per_epoch=steps, verbose=0)
    return time.perf_counter() - start


def measure(repeats: int, seed: int | None) -> dict[str, tuple[float, float]]:
    """``{variant: (ms a call, ms a step)}``, medians over ``repeats`` interleaved repetitions."""
    rng = np.random.default_rng(0)
    x = rng.random((NUM_EXAMPLES, 28, 28, 1), dtype=np.float32)
    y = rng.integers(0, 10, NUM_EXAMPLES)
    data = keras_dyndp.poisson_batches(x, y, sampling_probability=BATCH_SIZE / NUM_EXAMPLES, seed=seed)
    models = {"non-private": _model(False), "make_private": _model(True)}
    for model in models.values():
        _fit_seconds(model, data, 3)  # traced
    calls, steps = ({name: [] for name in models} for _ in range(2))
    for _ in range(repeats):
        for name, model in models.items():
            one, three = _fit_seconds(model, data, 1), _fit_seconds(model, data, 3)
            calls[name].append((3 * one - three) / 2)
            steps[name].append((three - one) / 2)
    return {name: (1e3 * statistics.median(calls[name]), 1e3 * statistics.median(steps[name])) for name in models}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15, help="interleaved repetitions (>= 1)")
    parser.add_argument("--seed", type=int, default=None, help="poisson_batches' seed (None: OS entropy, the default)")
    parser.add_argument("--record", default=None, help="where to write the run's record (benchmarks/records.py)")
    args = parser.parse_args()
    results = measure(args.repeats, args.seed)
    print(f"backend {keras_dyndp.keras_backend()}, {args.repeats} repetitions, seed {args.seed}")
    print("| variant | a fit call (ms) | a step (ms) |\n|---|---|---|")
    for name, (call, step) in results.items():
        print(f"| {name} | {call:.1f} | {step:.1f} |")
    extra = results["make_private"][0] - results["non-private"][0]
    print(f"make_private adds {extra:.1f} ms a fit call")
    if args.record:
        measured = {name: {"ms_per_call": call, "ms_per_step": step} for name, (call, step) in results.items()}
        records.write_record(
            args.record,
            records.command_line(),
            {"backend": keras_dyndp.keras_backend(), "seed": args.seed, **measured, "added_ms_per_call": extra},
        )


if __name__ == "__main__":
    main()
