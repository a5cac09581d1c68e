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

``--model tutorial`` times keras.io's subclassed transformer (`tutorial`) instead. With ``--lora RANK`` both paths
fine-tune the same model by LoRA (Keras 3's ``enable_lora(RANK)`` on every Dense,
EinsumDense and Embedding: their kernels frozen, the adapters and the biases trained; LayerNormalization frozen): the
DP step through the LoRA ghost rules. ``--paths`` runs a subset (one path alone: its own peak memory). The process's
peak resident memory (``getrusage`` maxrss) is printed at the end; on JAX also each compiled step's temporary
buffers (XLA's ``memory_analysis``).

Usage:
    python benchmarks/transformer_step_time.py --backend tensorflow --batch_size 32 --steps 10 --repeats 7
    python benchmarks/transformer_step_time.py --backend jax --batch_size 32 --steps 10 --repeats 7
    python benchmarks/transformer_step_time.py --backend jax --lora 8 --steps 10 --repeats 7
    python benchmarks/transformer_step_time.py --model tutorial --length 256 --steps 5 --repeats 7
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import sys
import warnings

PARSER = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
PARSER.add_argument("--backend", choices=["tensorflow", "jax"], default="tensorflow")
PARSER.add_argument("--batch_size", type=int, default=32)
PARSER.add_argument("--length", type=int, default=64, help="tokens per example (L)")
PARSER.add_argument("--width", type=int, default=64, help="model width (d)")
PARSER.add_argument("--steps", type=int, default=10, help="timed steps per path and repetition")
PARSER.add_argument("--warmup_steps", type=int, default=3)
PARSER.add_argument("--repeats", type=int, default=7)
PARSER.add_argument(
    "--model",
    choices=["functional", "tutorial"],
    default="functional",
    help="functional: Keras layers wired in a functional model; tutorial: keras.io's subclassed layers",
)
PARSER.add_argument("--lora", type=int, default=0, help="LoRA rank (0: no LoRA, every weight trains)")
PARSER.add_argument("--paths", default="nonprivate,dyndp_auto", help="comma-separated subset, timed in this order")
PARSER.add_argument("--record", default=None, help="where to write the run's record (benchmarks/records.py)")
ARGS = PARSER.parse_args()
os.environ["KERAS_BACKEND"] = ARGS.backend
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

import interleaved  # noqa: E402  (benchmarks/interleaved.py)
import keras  # noqa: E402
import models  # noqa: E402  (benchmarks/models.py)
import numpy as np  # noqa: E402
import records  # noqa: E402  (benchmarks/records.py)

import keras_dyndp  # noqa: E402
from keras_dyndp import SamplingWarning  # noqa: E402

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


def tutorial(length: int, width: int) -> keras.Model:
    """keras.io's "Text classification with Transformer" model (its subclassed ``TokenAndPositionEmbedding`` and
    ``TransformerBlock``, 2 heads of ``width``, feed-forward ``width``, dropout 0.1; average pooling, Dropout,
    Dense(20, relu), Dropout, Dense(2)), its two layers registered with one line each (docs/usage.md)."""
    layers = keras.layers
    arange = keras.ops.arange if hasattr(keras, "ops") else __import__("tensorflow").range  # Keras 2: no keras.ops

    class TransformerBlock(layers.Layer):
        def __init__(self, embed_dim, num_heads, ff_dim, rate=0.1):
            super().__init__()
            self.att = layers.MultiHeadAttention(num_heads=num_heads, key_dim=embed_dim)
            self.ffn = keras.Sequential([layers.Dense(ff_dim, activation="relu"), layers.Dense(embed_dim)])
            self.layernorm1 = layers.LayerNormalization(epsilon=1e-6)
            self.layernorm2 = layers.LayerNormalization(epsilon=1e-6)
            self.dropout1 = layers.Dropout(rate)
            self.dropout2 = layers.Dropout(rate)

        def call(self, inputs):
            out1 = self.layernorm1(inputs + self.dropout1(self.att(inputs, inputs)))
            return self.layernorm2(out1 + self.dropout2(self.ffn(out1)))

    class TokenAndPositionEmbedding(layers.Layer):
        def __init__(self, maxlen, vocab_size, embed_dim):
            super().__init__()
            self.token_emb = layers.Embedding(input_dim=vocab_size, output_dim=embed_dim)
            self.pos_emb = layers.Embedding(input_dim=maxlen, output_dim=embed_dim)

        def call(self, x):
            return self.token_emb(x) + self.pos_emb(arange(x.shape[-1]))

    keras_dyndp.register_layer_rule(TransformerBlock, per_example=True)
    rule = keras_dyndp.layer_rules.token_and_position_embedding()
    keras_dyndp.register_layer_rule(TokenAndPositionEmbedding, **rule)
    inputs = keras.Input((length,), dtype="int32")
    h = TransformerBlock(width, 2, width)(TokenAndPositionEmbedding(length, VOCABULARY, width)(inputs))
    h = layers.Dropout(0.1)(
        layers.Dense(20, activation="relu")(layers.Dropout(0.1)(layers.GlobalAveragePooling1D()(h)))
    )
    return keras.Model(inputs, layers.Dense(2)(h))


def with_lora(model: keras.Model, rank: int) -> keras.Model:
    """LoRA of ``rank`` on every Dense, EinsumDense and Embedding (MultiHeadAttention's projections included);
    LayerNormalization frozen."""
    for layer in model._flatten_layers():  # pylint: disable=protected-access
        if type(layer) in (keras.layers.Dense, keras.layers.EinsumDense, keras.layers.Embedding):
            layer.enable_lora(rank)
        elif isinstance(layer, keras.layers.LayerNormalization):
            layer.trainable = False
    return model


def build(path: str) -> keras.Model:
    keras.utils.set_random_seed(0)
    model = (transformer if ARGS.model == "functional" else tutorial)(ARGS.length, ARGS.width)
    if ARGS.lora:
        model = with_lora(model, ARGS.lora)
    if path == "nonprivate":
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss=loss)
        return model
    return models.compile_private(keras, keras_dyndp.make_private(model), ARGS.batch_size, 25_000)


def device_description() -> str:
    cpu = platform.processor() or platform.machine()
    with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
        cpu = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), cpu)
    return f"CPU: {cpu}, {os.cpu_count()} logical cores"


def main() -> None:
    rng = np.random.default_rng(0)
    x = rng.integers(0, VOCABULARY, (ARGS.batch_size, ARGS.length)).astype("int32")
    y = rng.integers(0, 2, ARGS.batch_size).astype("int32")
    step = interleaved.keras_train_function_run if ARGS.backend == "tensorflow" else interleaved.jax_train_step_run
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SamplingWarning)  # one fixed batch, not Poisson batches: expected here
        built = {path: build(path) for path in ARGS.paths.split(",")}
        if "dyndp_auto" in built:
            print(models.ghost_coverage(built["dyndp_auto"], x))
        runs = {path: step(model, x, y) for path, model in built.items()}
        table = interleaved.step_table(runs, ARGS.steps, ARGS.repeats, ARGS.warmup_steps, ARGS.backend)
    versions = f"Python {sys.version.split()[0]}, Keras {keras.__version__} on {ARGS.backend}"
    lora = f", LoRA rank {ARGS.lora}" if ARGS.lora else ""
    shape = f"B {ARGS.batch_size}, L {ARGS.length}, d {ARGS.width}"
    print(f"\n{device_description()}; {versions}; {ARGS.model} model, {shape}{lora}")
    if ARGS.backend == "tensorflow":
        print(f"oneDNN: TF_ENABLE_ONEDNN_OPTS={os.environ.get('TF_ENABLE_ONEDNN_OPTS')}")
    print("| path | ms / step | ratio to the first path |\n|---|---|---|")
    for path, (milliseconds, ratio) in table.items():
        print(f"| {path} | {milliseconds:.1f} | {ratio:.2f}x |")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    print(f"peak resident memory of the process: {peak:.0f} MiB")
    if ARGS.record:
        results = {path: {"ms_per_step": ms, "ratio": ratio} for path, (ms, ratio) in table.items()}
        records.write_record(ARGS.record, records.command_line(), {**results, "peak_rss_mib": peak})


if __name__ == "__main__":
    main()
