"""Step time of a small sequence model with AdditiveAttention (a trained ``scale``): the DP step before and after
its ghost rule (`keras_dyndp.rules.dense_attention`), interleaved in one process, on Keras 3's TensorFlow or JAX
backend.

The model: token ids [B, L]; Embedding(10000, d); query Dense(d, tanh), value Dense(d);
AdditiveAttention()([query, value]); Dense(4d, relu), Dense(d); GlobalAveragePooling1D; Dense(10). Paths: on
TensorFlow ``before`` is ``make_private(model, 'vectorized')``, the path 'auto' took while no rule covered the
scale, and ``after`` is ``make_private(model)`` ('auto': the ghost path); on JAX ``before`` is compiled while the
rule is taken out of the registry (the other layers tapped, the scale by vmap), ``after`` with it (every layer
tapped). Trained through Keras's own train function on one repeated batch (TensorFlow, oneDNN on) or the train step
compiled as ``fit`` compiles it (JAX, ``jax_step_time``'s stepper); median ms per step and the median
within-repetition ratio to ``before`` (`interleaved.step_table`).

Usage:
    python benchmarks/attention_step_time.py --backend tensorflow --steps 10 --repeats 9
    python benchmarks/attention_step_time.py --backend jax --batch_size 64 --length 64 --width 64 --steps 5
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings

PARSER = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
PARSER.add_argument("--backend", choices=["tensorflow", "jax"], default="tensorflow")
PARSER.add_argument("--batch_size", type=int, default=32)
PARSER.add_argument("--length", type=int, default=32, help="positions per example (L)")
PARSER.add_argument("--width", type=int, default=32, help="features (d)")
PARSER.add_argument("--steps", type=int, default=10, help="timed steps per path and repetition")
PARSER.add_argument("--warmup_steps", type=int, default=3)
PARSER.add_argument("--repeats", type=int, default=7)
ARGS = PARSER.parse_args()
os.environ["KERAS_BACKEND"] = ARGS.backend
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

import interleaved  # noqa: E402  (benchmarks/interleaved.py)
import keras  # noqa: E402
import models  # noqa: E402  (benchmarks/models.py)
import numpy as np  # noqa: E402

import keras_dyndp  # noqa: E402
from keras_dyndp.core.batch_sizes import SamplingWarning  # noqa: E402

VOCABULARY = 10_000


def build(method: str) -> keras.Model:
    keras.utils.set_random_seed(0)
    layers = keras.layers
    inputs = keras.Input((ARGS.length,), dtype="int32")
    embedded = layers.Embedding(VOCABULARY, ARGS.width)(inputs)
    query = layers.Dense(ARGS.width, activation="tanh")(embedded)
    attended = layers.AdditiveAttention()([query, layers.Dense(ARGS.width)(embedded)])
    hidden = layers.Dense(ARGS.width)(layers.Dense(4 * ARGS.width, activation="relu")(attended))
    model = keras.Model(inputs, layers.Dense(10)(layers.GlobalAveragePooling1D()(hidden)))
    return models.compile_private(keras, keras_dyndp.make_private(model, method), ARGS.batch_size, 25_000)


def tensorflow_runs(x: np.ndarray, y: np.ndarray) -> dict:

    from keras_dyndp.tf_backend import per_example  # pylint: disable=import-outside-toplevel

    built = {"before": build("vectorized"), "after": build("auto")}
    print(f"after: ghost path {per_example.ghost_supported(built['after'], built['after'].trainable_variables)}")
    return {path: interleaved.keras_train_function_run(model, x, y) for path, model in built.items()}


def jax_runs(x: np.ndarray, y: np.ndarray) -> dict:
    import jax_step_time  # pylint: disable=import-outside-toplevel  (benchmarks/jax_step_time.py)

    from keras_dyndp.rules import registry  # pylint: disable=import-outside-toplevel

    rule = registry.registered().pop(keras.layers.AdditiveAttention)
    try:
        before = jax_step_time._Stepper(build("auto"), x, y)  # pylint: disable=protected-access
    finally:
        registry.registered()[keras.layers.AdditiveAttention] = rule
    after = jax_step_time._Stepper(build("auto"), x, y)  # pylint: disable=protected-access
    return {"before": before.run, "after": after.run}


def main() -> None:
    rng = np.random.default_rng(0)
    x = rng.integers(0, VOCABULARY, (ARGS.batch_size, ARGS.length)).astype("int32")
    y = rng.integers(0, 10, ARGS.batch_size).astype("int32")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SamplingWarning)  # one fixed batch, not Poisson batches: expected here
        runs = (tensorflow_runs if ARGS.backend == "tensorflow" else jax_runs)(x, y)
        table = interleaved.step_table(runs, ARGS.steps, ARGS.repeats, ARGS.warmup_steps, ARGS.backend)
    versions = f"Python {sys.version.split()[0]}, Keras {keras.__version__} on {ARGS.backend}"
    print(f"\n{os.cpu_count()} logical cores; {versions}")
    print(f"B {ARGS.batch_size}, L {ARGS.length}, d {ARGS.width}")
    if ARGS.backend == "tensorflow":
        print(f"oneDNN: TF_ENABLE_ONEDNN_OPTS={os.environ.get('TF_ENABLE_ONEDNN_OPTS')}")
    print("| path | ms / step | ratio to before |\n|---|---|---|")
    for path, (milliseconds, ratio) in table.items():
        print(f"| {path} | {milliseconds:.1f} | {ratio:.2f}x |")


if __name__ == "__main__":
    main()
