"""Step time of KerasHub backbones fine-tuned privately: keras_dyndp's default DP step (``make_private(model)``, method
'auto') against non-private SGD on the same model, on Keras 3's TensorFlow or JAX backend, interleaved in one process.

Each family's backbone is built tiny from its constructor (random weights, nothing downloaded: ``--layers`` blocks of
width ``--hidden``, feed-forward 2x, 4 query heads (2 key/value heads where the family groups them), ``--vocabulary``
tokens, ``--length`` tokens per example), with a Dense(2) head on the first position's features, as in
tests/test_keras_hub.py. ``--lora RANK`` fine-tunes by LoRA (``backbone.enable_lora(RANK)``: the backbone's kernels
frozen, its adapters and the head trained). On TensorFlow each path trains through Keras's own ``model.train_function``
on one repeated batch (oneDNN on: ``TF_ENABLE_ONEDNN_OPTS=1`` unless set); on JAX through its train step compiled as
``fit`` compiles it (``jax_step_time``'s stepper). Warm-up steps are excluded; each repetition runs both paths of a
family in turn (`interleaved.step_table`): median ms per step and the median of the within-repetition ratios. Each
family's line also says which clipping the DP step takes (on TensorFlow: the ghost path or per-example gradients; on
JAX: how many trained layers its ghost rules clip). ``--task causal_lm`` times each family's ``*CausalLM`` instead
(families with one: GPT-2, Gemma, Llama 3, Mistral, Qwen 3): next-token targets [B, L], KerasHub's padding-mask
convention (no padding here), the per-token loss summed per example as make_private does.

KerasHub is the ``[hub]`` extra (it needs tensorflow-text, so TensorFlow; on JAX install it with ``--no-deps`` plus
``regex``, ``tokenizers`` and ``kagglehub``).

Usage:
    python benchmarks/hub_step_time.py --backend tensorflow --record benchmarks/results/hub_step_time_tf.json
    python benchmarks/hub_step_time.py --backend jax --lora 4 --record benchmarks/results/hub_step_time_jax_lora.json
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings

FAMILIES = ("bert", "distil_bert", "roberta", "gpt2", "gemma", "llama3", "mistral", "qwen3")
PARSER = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
PARSER.add_argument("--backend", choices=["tensorflow", "jax"], default="tensorflow")
PARSER.add_argument("--families", default=",".join(FAMILIES), help=f"comma-separated subset of {FAMILIES}")
PARSER.add_argument("--batch_size", type=int, default=16)
PARSER.add_argument("--length", type=int, default=32, help="tokens per example (L)")
PARSER.add_argument("--hidden", type=int, default=32, help="the backbone's width")
PARSER.add_argument("--layers", type=int, default=2, help="the backbone's blocks")
PARSER.add_argument("--vocabulary", type=int, default=1000)
PARSER.add_argument("--dropout", type=float, default=None, help="the backbone's dropout (default: the family's)")
PARSER.add_argument("--task", choices=["classifier", "causal_lm"], default="classifier")
PARSER.add_argument("--lora", type=int, default=0, help="LoRA rank (0: full fine-tuning)")
PARSER.add_argument("--steps", type=int, default=10, help="timed steps per path and repetition")
PARSER.add_argument("--warmup_steps", type=int, default=3)
PARSER.add_argument("--repeats", type=int, default=5)
PARSER.add_argument("--record", default=None, help="where to write the run's record (benchmarks/records.py)")
ARGS = PARSER.parse_args()
os.environ["KERAS_BACKEND"] = ARGS.backend
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

import interleaved  # noqa: E402  (benchmarks/interleaved.py)
import keras  # noqa: E402
import keras_hub  # noqa: E402
import models  # noqa: E402  (benchmarks/models.py)
import numpy as np  # noqa: E402
import records  # noqa: E402  (benchmarks/records.py)

import keras_dyndp  # noqa: E402
from keras_dyndp import SamplingWarning  # noqa: E402


def backbone(family: str) -> keras.Model:
    """``family``'s backbone built from its constructor at the benchmark's size (module docstring)."""
    size = dict(
        vocabulary_size=ARGS.vocabulary,
        num_layers=ARGS.layers,
        hidden_dim=ARGS.hidden,
        intermediate_dim=2 * ARGS.hidden,
        **({} if ARGS.dropout is None else {"dropout": ARGS.dropout}),
    )
    positions = dict(num_heads=4, max_sequence_length=ARGS.length, **size)
    grouped = dict(num_query_heads=4, num_key_value_heads=2, **size)
    hub = keras_hub.models
    return {
        "bert": lambda: hub.BertBackbone(**positions),
        "distil_bert": lambda: hub.DistilBertBackbone(**positions),
        "roberta": lambda: hub.RobertaBackbone(**positions),
        "gpt2": lambda: hub.GPT2Backbone(**positions),
        "gemma": lambda: hub.GemmaBackbone(head_dim=ARGS.hidden // 4, **grouped),
        "llama3": lambda: hub.Llama3Backbone(**grouped),
        "mistral": lambda: hub.MistralBackbone(**grouped),
        "qwen3": lambda: hub.Qwen3Backbone(head_dim=ARGS.hidden // 4, **grouped),
    }[family]()


CAUSAL_LMS = {
    "gpt2": "GPT2CausalLM",
    "gemma": "GemmaCausalLM",
    "llama3": "Llama3CausalLM",
    "mistral": "MistralCausalLM",
    "qwen3": "Qwen3CausalLM",
}


def batch(network: keras.Model) -> tuple[dict, np.ndarray]:
    """One batch of random token ids (no padding), with the inputs ``network`` takes, and its targets: binary labels
    (a classifier) or the next tokens (``--task causal_lm``)."""
    rng = np.random.default_rng(0)
    causal = ARGS.task == "causal_lm"
    ids = rng.integers(1, ARGS.vocabulary, (ARGS.batch_size, ARGS.length + causal)).astype("int32")
    tokens = ids[:, :-1] if causal else ids
    everything = {"token_ids": tokens, "padding_mask": np.ones_like(tokens), "segment_ids": np.zeros_like(tokens)}
    x = {name: everything[name] for name in network.input if name in everything}
    return x, ids[:, 1:] if causal else rng.integers(0, 2, ARGS.batch_size).astype("int32")


def build(family: str, path: str) -> keras.Model:
    """The backbone with a Dense(2) head on the first position (or its CausalLM), LoRA per ``--lora``, compiled for
    ``path``."""
    keras.utils.set_random_seed(0)
    network = backbone(family)
    if ARGS.lora:
        network.enable_lora(ARGS.lora)
    if ARGS.task == "causal_lm":
        model = getattr(keras_hub.models, CAUSAL_LMS[family])(backbone=network, preprocessor=None)
    else:
        inputs = {name: keras.Input((ARGS.length,), dtype="int32", name=name) for name in batch(network)[0]}
        features = network(inputs)
        features = features["sequence_output"] if isinstance(features, dict) else features
        model = keras.Model(inputs, keras.layers.Dense(2)(features[:, 0]))
    if path == "nonprivate":
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss=loss)
        return model
    return models.compile_private(keras, keras_dyndp.make_private(model), ARGS.batch_size, 25_000)


def measure(family: str) -> dict:
    """The family's interleaved table: ``{path: (ms per step, ratio to nonprivate)}``, and how the DP step clips."""
    step = interleaved.keras_train_function_run if ARGS.backend == "tensorflow" else interleaved.jax_train_step_run
    built = {path: build(family, path) for path in ("nonprivate", "dyndp_auto")}
    x, y = batch(built["nonprivate"])
    clipping = models.ghost_coverage(built["dyndp_auto"], x)
    print(f"{family}: {clipping}")
    runs = {path: step(model, x, y) for path, model in built.items()}
    table = interleaved.step_table(runs, ARGS.steps, ARGS.repeats, ARGS.warmup_steps, family)
    return {"clipping": clipping, **{path: {"ms_per_step": ms, "ratio": ratio} for path, (ms, ratio) in table.items()}}


def main() -> None:
    results = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SamplingWarning)  # one fixed batch, not Poisson batches: expected here
        families = ARGS.families.split(",")
    if ARGS.task == "causal_lm":
        families = [family for family in families if family in CAUSAL_LMS]
    for family in families:
        results[family] = measure(family)
    versions = f"Python {sys.version.split()[0]}, Keras {keras.__version__} on {ARGS.backend}"
    versions += f", KerasHub {keras_hub.__version__}"
    fine_tuning = f"LoRA rank {ARGS.lora}" if ARGS.lora else "full fine-tuning"
    fine_tuning += ", causal LMs" if ARGS.task == "causal_lm" else ", a Dense(2) head"
    shape = f"B {ARGS.batch_size}, L {ARGS.length}, {ARGS.layers} blocks of width {ARGS.hidden}"
    print(f"\n{records.cpu_model()}; oneDNN {records.onednn()}; {versions}; {shape}; {fine_tuning}")
    print("| backbone | non-private ms / step | DP ms / step | DP / non-private | clipping |\n|---|---|---|---|---|")
    for family, row in results.items():
        nonprivate, private = row["nonprivate"], row["dyndp_auto"]
        print(
            f"| {family} | {nonprivate['ms_per_step']:.1f} | {private['ms_per_step']:.1f} | {private['ratio']:.2f}x "
            f"| {row['clipping']} |"
        )
    if ARGS.record:
        records.write_record(ARGS.record, records.command_line(), results)


if __name__ == "__main__":
    main()
