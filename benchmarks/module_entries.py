"""How often each keras_dyndp module is entered while one DP step is traced (issue 53's "each module entered at most
twice along one DP step"), on the backend Keras runs on.

An entry is a call into a function of a keras_dyndp module from code of another module (Keras, TensorFlow, JAX or
another keras_dyndp module), counted with ``sys.setprofile`` while make_private's train step (``_private_train_step``)
is on the stack: the trace of its first call through ``fit``, from the step to the optimizer's update. A generator's
resumption is not an entry; a lambda or callback of the module called back by a library is. The model: three Dense
layers (8 -> 16 -> 16 -> 3) on Poisson batches of p = 16 / 1,000, ``method`` as given.

Usage:
    python benchmarks/module_entries.py --method ghost [--record benchmarks/results/module_entries_tf_ghost.json]
    KERAS_BACKEND=jax python benchmarks/module_entries.py --method vectorized
"""

from __future__ import annotations

import argparse
import collections
import inspect
import sys
import warnings

import numpy as np
import records  # benchmarks/records.py

import keras_dyndp

PARSER = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
PARSER.add_argument("--method", default="ghost", help="make_private's method")
PARSER.add_argument("--record", default=None, help="where to write the run's record (benchmarks/records.py)")
_RESUMABLE = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR


def _module(frame) -> str:
    return frame.f_globals.get("__name__", "")


def _in_step(frame) -> bool:
    while frame is not None:
        if frame.f_code.co_name == "_private_train_step" and _module(frame).startswith("keras_dyndp"):
            return True
        frame = frame.f_back
    return False


def entries(method: str) -> collections.Counter:
    """Entries per keras_dyndp module while the first DP step of a small model is traced (module docstring)."""
    keras = keras_dyndp.tf_backend.keras_compat.keras if keras_dyndp.keras_backend() != "jax" else __import__("keras")
    inputs = keras.Input((8,))
    h = keras.layers.Dense(16, activation="relu")(keras.layers.Dense(16, activation="relu")(inputs))
    model = keras_dyndp.make_private(keras.Model(inputs, keras.layers.Dense(3)(h)), method=method)
    optimizer = keras_dyndp.DynamicDPKerasSGD(
        target_epsilon=3.0, target_delta=1e-5, num_examples=1000, batch_size=16, epochs=1, method="vanilla",
        initial_clip=1.0, learning_rate=0.1,
    )  # fmt: skip
    model.compile(optimizer=optimizer, loss=keras.losses.MeanSquaredError(reduction="none"))
    rng = np.random.default_rng(0)
    data = keras_dyndp.poisson_batches(
        rng.random((1000, 8), np.float32), rng.random((1000, 3), np.float32), sampling_probability=16 / 1000
    )
    counts: collections.Counter = collections.Counter()

    def profile(frame, event, arg):
        del arg  # Unused.
        if event != "call" or not _module(frame).startswith("keras_dyndp"):
            return
        if frame.f_code.co_flags & _RESUMABLE and frame.f_lasti > 0:  # a generator resumed
            return
        caller = frame.f_back
        if caller is not None and _module(caller) == _module(frame):
            return
        if frame.f_code.co_name == "_private_train_step" or _in_step(frame.f_back):
            counts[_module(frame)] += 1

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sys.setprofile(profile)
        try:
            model.fit(data, epochs=1, steps_per_epoch=1, verbose=0)
        finally:
            sys.setprofile(None)
    return counts


def main() -> None:
    args = PARSER.parse_args()
    counts = entries(args.method)
    backend = keras_dyndp.keras_backend()
    print(f"keras_dyndp modules entered along one DP step, {backend}, method={args.method!r}:")
    print("| module | entries |\n|---|---|")
    for module, count in counts.most_common():
        print(f"| {module} | {count} |")
    over = {module: count for module, count in counts.items() if count > 2}
    print(f"\n{len(counts)} modules entered, {len(over)} more than twice, at most {max(counts.values())} times")
    if args.record:
        results = {"backend": backend, "method": args.method, "entries": dict(counts.most_common())}
        records.write_record(args.record, records.command_line(), results)


if __name__ == "__main__":
    main()
