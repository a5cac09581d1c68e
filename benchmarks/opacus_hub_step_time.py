"""Opacus's DP-SGD step against PyTorch's non-private step on the Hugging Face counterparts of the KerasHub backbones
``hub_step_time.py`` times, at the same size, interleaved in one run: issue 54's comparison with Opacus.

Opacus fine-tunes these families through Hugging Face ``transformers`` (its text-classification tutorial fine-tunes
BERT so). Each backbone is built from its ``transformers`` configuration with random weights (nothing downloaded):
``--layers`` blocks of width ``--hidden``, feed-forward 2x, 4 query heads (2 key/value heads where the family groups
them, head size width / 4), ``--vocabulary`` tokens, ``--length`` tokens per example, no pooler; a Linear(width, 2) head
on the first position's features, as in ``hub_step_time.py``. Position (and segment) ids are passed as [B, L] tensors,
since Opacus's per-example gradients need the batch axis on every layer's input. Paths (``opacus_step_time``'s
stepper): ``nonprivate`` (SGD, mean cross-entropy), ``opacus_hooks`` (per-example gradients by its hooks; a layer it
has no grad sampler for, such as the RMS norms, by ``torch.func``) and ``opacus_ghost`` (its fast gradient clipping).
A path Opacus refuses for a family is reported with its error. Medians of the interleaved repetitions; the ratio is
taken within each repetition.

Usage:
    python benchmarks/opacus_hub_step_time.py --record benchmarks/results/opacus_hub_step_time.json
"""

from __future__ import annotations

import argparse
import sys
import warnings

import interleaved  # benchmarks/interleaved.py
import opacus_step_time  # benchmarks/opacus_step_time.py: its stepper and device description
import records  # benchmarks/records.py
import torch
import transformers
from torch import nn

FAMILIES = ("bert", "distil_bert", "roberta", "gpt2", "gemma", "llama3", "mistral", "qwen3")
PATHS = ("nonprivate", "opacus_hooks", "opacus_ghost")
PARSER = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
PARSER.add_argument("--families", default=",".join(FAMILIES), help=f"comma-separated subset of {FAMILIES}")
PARSER.add_argument("--batch_size", type=int, default=16)
PARSER.add_argument("--length", type=int, default=32, help="tokens per example (L)")
PARSER.add_argument("--hidden", type=int, default=32, help="the backbone's width")
PARSER.add_argument("--layers", type=int, default=2, help="the backbone's blocks")
PARSER.add_argument("--vocabulary", type=int, default=1000)
PARSER.add_argument("--steps", type=int, default=10, help="timed steps per path and repetition")
PARSER.add_argument("--warmup_steps", type=int, default=3)
PARSER.add_argument("--repeats", type=int, default=5)
PARSER.add_argument("--record", default=None, help="where to write the run's record (benchmarks/records.py)")


def configuration(family: str, args: argparse.Namespace) -> transformers.PretrainedConfig:
    """``family``'s ``transformers`` configuration at the benchmark's size (module docstring)."""
    width, length = args.hidden, args.length
    encoder = dict(
        vocab_size=args.vocabulary,
        hidden_size=width,
        num_hidden_layers=args.layers,
        num_attention_heads=4,
        intermediate_size=2 * width,
    )
    grouped = dict(encoder, num_key_value_heads=2, head_dim=width // 4, max_position_embeddings=length)
    return {
        "bert": lambda: transformers.BertConfig(max_position_embeddings=length, **encoder),
        "roberta": lambda: transformers.RobertaConfig(max_position_embeddings=length + 2, **encoder),
        "distil_bert": lambda: transformers.DistilBertConfig(
            vocab_size=args.vocabulary,
            dim=width,
            n_layers=args.layers,
            n_heads=4,
            hidden_dim=2 * width,
            max_position_embeddings=length,
        ),  # fmt: skip
        "gpt2": lambda: transformers.GPT2Config(
            vocab_size=args.vocabulary,
            n_embd=width,
            n_layer=args.layers,
            n_head=4,
            n_inner=2 * width,
            n_positions=length,
            bos_token_id=0,
            eos_token_id=0,
        ),  # fmt: skip
        "gemma": lambda: transformers.GemmaConfig(**grouped),
        "llama3": lambda: transformers.LlamaConfig(**grouped),
        "mistral": lambda: transformers.MistralConfig(**grouped),
        "qwen3": lambda: transformers.Qwen3Config(**grouped),
    }[family]()


class Classifier(nn.Module):
    """A ``transformers`` backbone with a Linear(width, 2) head on the first position's features."""

    def __init__(self, family: str, args: argparse.Namespace):
        super().__init__()
        config = configuration(family, args)
        pooler = {"add_pooling_layer": False} if family in ("bert", "roberta") else {}
        self.backbone = transformers.AutoModel.from_config(config, **pooler)
        self.family = family
        self.head = nn.Linear(args.hidden, 2)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        extra = {}
        if self.family != "distil_bert":  # DistilBERT takes no position ids: it adds rows 0..L-1 itself
            offset = 2 if self.family == "roberta" else 0  # RoBERTa's positions start after its padding index
            positions = torch.arange(offset, offset + ids.shape[1], device=ids.device)
            extra["position_ids"] = positions.repeat(len(ids), 1)  # contiguous [B, L]: Opacus views it
        if self.family in ("bert", "roberta"):
            extra["token_type_ids"] = torch.zeros_like(ids)
        features = self.backbone(input_ids=ids, **extra).last_hidden_state
        return self.head(features[:, 0])


def measure(family: str, args: argparse.Namespace) -> dict:
    """The family's interleaved table: ``{path: {ms_per_step, ratio} or {error}}``."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randint(1, args.vocabulary, (args.batch_size, args.length), generator=generator)
    y = torch.randint(0, 2, (args.batch_size,), generator=generator)
    runs, results = {}, {}
    for path in PATHS:
        try:
            stepper = opacus_step_time._Stepper(lambda: Classifier(family, args), path, x, y)
            stepper.run(1)
        except Exception as error:  # noqa: BLE001  (a refusal by Opacus is a result here)
            results[path] = {"error": f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"}
            print(f"{family} {path}: {results[path]['error']}")
            continue
        runs[path] = stepper.run
    table = interleaved.step_table(runs, args.steps, args.repeats, args.warmup_steps, family)
    results.update({path: {"ms_per_step": ms, "ratio": ratio} for path, (ms, ratio) in table.items()})
    return results


def _cell(result: dict) -> str:
    return f"{result['ms_per_step']:.1f} ms, {result['ratio']:.2f}x" if "ratio" in result else "fails (record)"


def main() -> None:
    args = PARSER.parse_args()
    warnings.filterwarnings("ignore")  # Opacus's notes on secure_mode, its accountant and PyTorch's hooks
    results = {family: measure(family, args) for family in args.families.split(",")}
    device = opacus_step_time.device_description(torch.device("cpu"))
    print(
        f"\n{records.cpu_model()}; {device}; Python {sys.version.split()[0]}, PyTorch {torch.__version__}, Opacus "
        f"{opacus_step_time._version('opacus')}, transformers {transformers.__version__}; B {args.batch_size}, "
        f"L {args.length}, {args.layers} blocks of width {args.hidden}; full fine-tuning"
    )
    print("| backbone | non-private | Opacus hooks | Opacus ghost |\n|---|---|---|---|")
    for family, row in results.items():
        print(f"| {family} | " + " | ".join(_cell(row[path]) for path in PATHS) + " |")
    if args.record:
        versions = {package: opacus_step_time._version(package) for package in ("torch", "opacus", "transformers")}
        records.write_record(args.record, records.command_line(), {"versions": versions, **results})


if __name__ == "__main__":
    main()
