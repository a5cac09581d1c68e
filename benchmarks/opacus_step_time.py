"""Opacus's DP-SGD step against PyTorch's non-private step on benchmarks/models.py's models, interleaved in one run.

The comparison the GPU goals name ("faster than Opacus on the same model and batch"): the same paper CNN,
WideResNet-16-4 (GroupNorm 16, CIFAR-10 shapes), text transformer and ViT as ``jax_step_time.py``, written in PyTorch
layer for layer (`cnn`, `wide_resnet`, `transformer`, `vit`), trained on one fixed synthetic batch of the same shapes.
The attention is written out with ``nn.Linear`` projections (`_Attention`), the layers Opacus computes per-example
gradients of in both modes (its ``DPMultiheadAttention`` is the same computation); the learned positions are an
``nn.Embedding`` over the position ids, added to a bias-free ``nn.Linear`` (Keras's EinsumDense with a bias over
positions and features: the same function and parameter count). Paths:

* ``nonprivate``: ``torch.optim.SGD``, mean cross-entropy, eager PyTorch.
* ``opacus_hooks``: ``opacus.PrivacyEngine().make_private(...)``, ``grad_sample_mode="hooks"`` (per-example gradients
  by its layer hooks, the default), clipping norm 1, noise multiplier 1.
* ``opacus_ghost``: the same with ``grad_sample_mode="ghost"`` (its fast gradient clipping: per-example norms without
  per-example gradients where its layers allow, then a second backward pass).

Opacus is not a dependency of keras_dyndp: install ``torch`` and ``opacus`` to run this (the device machine has
PyTorch; ``gpu_jax.sh`` carries Opacus's wheel). Warm-up steps are excluded; each repetition runs every path for
``--steps`` steps in the same order and synchronises the device before reading the clock; the table reports the
median over repetitions of the mean step time and of the ratio to ``nonprivate`` within one repetition. On a CUDA
device the table also gives each path's peak memory (``torch.cuda.max_memory_allocated`` over two steps of that path
alone, the others' tensors freed). float32 matmuls may use TF32 (``--tf32``, on by default), as JAX's default GPU
precision does, so that both frameworks compute at the same precision.

Usage:
    python benchmarks/opacus_step_time.py --models cnn,wrn --batch_size 256 --steps 20 --repeats 5
    python benchmarks/opacus_step_time.py --models transformer,vit --batch_size 32 --steps 10 --repeats 5
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import time
import warnings
from collections.abc import Callable

import interleaved  # benchmarks/interleaved.py
import models  # benchmarks/models.py: the same synthetic batches as the JAX and TensorFlow benchmarks
import numpy as np
import torch
from absl import app
from absl import flags
from torch import nn

FLAGS = flags.FLAGS
flags.DEFINE_integer("batch_size", 256, "Examples per step.")
flags.DEFINE_integer("steps", 20, "Timed steps per repetition.")
flags.DEFINE_integer("warmup_steps", 3, "Untimed steps per path before the first repetition.")
flags.DEFINE_integer("repeats", 5, "Interleaved repetitions; the median is reported.")
MODELS = ("cnn", "wrn", "transformer", "vit")
flags.DEFINE_list("models", ["cnn", "wrn"], f"Models among {', '.join(MODELS)}.")
PATHS = ("nonprivate", "opacus_hooks", "opacus_ghost")
flags.DEFINE_list("paths", list(PATHS), f"Paths among {PATHS}; nonprivate is always run (the ratios' denominator).")
flags.DEFINE_bool("tf32", True, "Let float32 matmuls and convolutions use TF32 on the GPU (JAX's default precision).")
flags.DEFINE_string("out_md", None, "Where to write the markdown table.")
LEARNING_RATE = 0.05


def cnn() -> nn.Module:
    """models.cnn_layers in PyTorch: TensorFlow's 'same' padding of the 8x8 stride-2 convolution on 28x28 is 3."""
    return nn.Sequential(
        nn.Conv2d(1, 16, 8, stride=2, padding=3),
        nn.ReLU(),
        nn.MaxPool2d(2, 1),
        nn.Conv2d(16, 32, 4, stride=2),
        nn.ReLU(),
        nn.MaxPool2d(2, 1),
        nn.Flatten(),
        nn.Linear(32 * 4 * 4, 32),
        nn.ReLU(),
        nn.Linear(32, 10),
    )


class _Block(nn.Module):
    """One block of models.wide_resnet: GroupNorm-ReLU-conv twice, a 1x1 convolution on the shortcut when it is the
    stage's first block."""

    def __init__(self, channels_in: int, filters: int, strides: int, groups: int, first: bool):
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, channels_in)
        self.conv1 = nn.Conv2d(channels_in, filters, 3, stride=strides, padding=1)
        self.norm2 = nn.GroupNorm(groups, filters)
        self.conv2 = nn.Conv2d(filters, filters, 3, padding=1)
        self.shortcut = nn.Conv2d(channels_in, filters, 1, stride=strides) if first else None

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        shortcut = h
        h = torch.relu(self.norm1(h))
        if self.shortcut is not None:
            shortcut = self.shortcut(h)
        h = self.conv2(torch.relu(self.norm2(self.conv1(h))))
        return h + shortcut


def wide_resnet(depth: int = 16, width: int = 4, groups: int = 16) -> nn.Module:
    """models.wide_resnet in PyTorch (NCHW): the same layers, shapes and parameter count."""
    layers: list[nn.Module] = [nn.Conv2d(3, 16, 3, padding=1)]
    channels = 16
    for stage, filters in enumerate((16 * width, 32 * width, 64 * width)):
        for block in range((depth - 4) // 6):
            strides = 2 if stage > 0 and block == 0 else 1
            layers.append(_Block(channels, filters, strides, groups, first=block == 0))
            channels = filters
    layers += [nn.GroupNorm(groups, channels), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten()]
    layers.append(nn.Linear(channels, 10))
    return nn.Sequential(*layers)


class _Attention(nn.Module):
    """Keras's MultiHeadAttention(heads, width // heads) over one sequence: query, key, value and output projections
    with biases, softmax of the scaled dot products over the key positions."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.query, self.key, self.value, self.output = (nn.Linear(width, width) for _ in range(4))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        batch_size, length, width = h.shape

        def split(projection: nn.Linear) -> torch.Tensor:
            return projection(h).view(batch_size, length, self.heads, width // self.heads).transpose(1, 2)

        query, key, value = split(self.query), split(self.key), split(self.value)
        scores = torch.softmax(query @ key.transpose(-1, -2) / (width // self.heads) ** 0.5, dim=-1)
        return self.output((scores @ value).transpose(1, 2).reshape(batch_size, length, width))


class _TransformerBlock(nn.Module):
    """models.transformer_block: post-norm attention and a ReLU feed-forward of width 2d."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.attention = _Attention(width, heads)
        self.norm1, self.norm2 = nn.LayerNorm(width, eps=1e-3), nn.LayerNorm(width, eps=1e-3)  # Keras's epsilon
        self.feed_forward = nn.Sequential(nn.Linear(width, 2 * width), nn.ReLU(), nn.Linear(2 * width, width))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        h = self.norm1(h + self.attention(h))
        return self.norm2(h + self.feed_forward(h))


class _Transformer(nn.Module):
    """models.transformer (token ids) or models.vit (images, channels last, cut into 4x4 patches): an input
    embedding, learned positions (an Embedding over position ids, added), two blocks, average pooling, a Dense."""

    def __init__(self, image: bool, width: int = models.TRANSFORMER_WIDTH, heads: int = models.TRANSFORMER_HEADS):
        super().__init__()
        self.image = image
        patch = models.PATCH_SIZE
        self.length = (models.IMAGE_SIZE // patch) ** 2 if image else models.TRANSFORMER_LENGTH
        self.tokens = None if image else nn.Embedding(models.TEXT_VOCAB, width)
        self.project = nn.Linear(patch * patch * 3 if image else width, width, bias=False)
        self.positions = nn.Embedding(self.length, width)
        self.blocks = nn.Sequential(*(_TransformerBlock(width, heads) for _ in range(2)))
        self.head = nn.Linear(width, 10 if image else 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.image:  # [B, 32, 32, 3] -> [B, 64, 48], patches in row order, each (row, column, channel)
            side, patch = models.IMAGE_SIZE // models.PATCH_SIZE, models.PATCH_SIZE
            h = x.reshape(len(x), side, patch, side, patch, 3).permute(0, 1, 3, 2, 4, 5).reshape(len(x), -1, 48)
        else:
            h = self.tokens(x)
        ids = torch.arange(self.length, device=x.device).repeat(len(x), 1)  # contiguous: Opacus views it
        h = self.project(h) + self.positions(ids)
        return self.head(self.blocks(h).mean(dim=1))


def build(model_name: str) -> nn.Module:
    """Model ``model_name`` (among `MODELS`), freshly initialised."""
    if model_name in ("transformer", "vit"):
        return _Transformer(image=model_name == "vit")
    return cnn() if model_name == "cnn" else wide_resnet()


def batch(model_name: str, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """models.make_data's batch, channels first for the convolutional models (the ViT cuts channels-last images)."""
    x, y = models.make_data(model_name, FLAGS.batch_size)
    if model_name == "transformer":
        x = torch.from_numpy(x.astype(np.int64))
    else:
        x = torch.from_numpy(np.ascontiguousarray(x if model_name == "vit" else x.transpose(0, 3, 1, 2)))
    return x.to(device), torch.from_numpy(y).long().to(device)


class _Stepper:
    """One path: its own copy of the model (same initial weights), optimizer and loss, stepped on one fixed batch."""

    def __init__(self, build_model: Callable[[], nn.Module], path: str, x: torch.Tensor, y: torch.Tensor):
        torch.manual_seed(0)
        model = build_model().to(x.device)
        optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
        criterion = nn.CrossEntropyLoss()
        if path != "nonprivate":
            from opacus import PrivacyEngine  # pylint: disable=import-outside-toplevel  (optional)

            loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=len(x))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # its notes on secure_mode and the accountant's defaults
                private = PrivacyEngine().make_private(
                    module=model,
                    optimizer=optimizer,
                    data_loader=loader,
                    criterion=criterion,
                    noise_multiplier=1.0,
                    max_grad_norm=1.0,
                    poisson_sampling=False,
                    grad_sample_mode=path.removeprefix("opacus_"),
                )
            model, optimizer = private[0], private[1]
            if path == "opacus_ghost":
                criterion = private[2]  # its loss wrapper runs the second backward pass
        self._model, self._optimizer, self._criterion = model, optimizer, criterion
        self._x, self._y = x, y

    def run(self, steps: int) -> float:
        """Seconds per step over ``steps`` steps."""
        _synchronize(self._x.device)
        start = time.perf_counter()
        for _ in range(steps):
            self._optimizer.zero_grad(set_to_none=True)
            self._criterion(self._model(self._x), self._y).backward()
            self._optimizer.step()
        _synchronize(self._x.device)
        return (time.perf_counter() - start) / steps

    def release(self) -> None:
        """Frees what the last step left beside the weights (gradients, Opacus's per-example gradients)."""
        self._optimizer.zero_grad(set_to_none=True)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _peak_mib(stepper: _Stepper, steppers: dict[str, _Stepper], device: torch.device) -> float:
    """Peak memory allocated over two steps of one path, every path's leftovers freed first (CUDA only)."""
    if device.type != "cuda":
        return float("nan")
    for other in steppers.values():
        other.release()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    stepper.run(2)
    peak = torch.cuda.max_memory_allocated(device) / 2**20
    stepper.release()
    return peak


def measure(model_name: str, device: torch.device) -> list[dict]:
    x, y = batch(model_name, device)
    paths = ["nonprivate", *(path for path in FLAGS.paths if path != "nonprivate")]
    steppers = {path: _Stepper(lambda: build(model_name), path, x, y) for path in paths}
    runs = {path: stepper.run for path, stepper in steppers.items()}
    times = interleaved.step_table(runs, FLAGS.steps, FLAGS.repeats, FLAGS.warmup_steps, model_name)
    peaks = {path: _peak_mib(stepper, steppers, device) for path, stepper in steppers.items()}
    return [
        {
            "model": model_name,
            "path": path,
            "ms_per_step": times[path][0],
            "ratio": times[path][1],
            "peak_mib": peaks[path],
            "peak_ratio": peaks[path] / peaks["nonprivate"],
        }
        for path in paths
    ]


def device_description(device: torch.device) -> str:
    cores = os.cpu_count()
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} (cuda; {cores} CPU cores)"
    return f"cpu ({cores} CPU cores, {platform.processor() or platform.machine()}; {torch.get_num_threads()} threads)"


def markdown(rows: list[dict], device: torch.device) -> str:
    lines = [
        f"PyTorch {torch.__version__}, Opacus {_version('opacus')}; {device_description(device)}; batch "
        f"{FLAGS.batch_size}, {FLAGS.steps} steps x {FLAGS.repeats} interleaved repetitions, medians; TF32 "
        f"{'on' if FLAGS.tf32 else 'off'}.",
        "",
        "| model | path | ms / step | x non-private | peak MiB (x) |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['model']} | {r['path']} | {r['ms_per_step']:.2f} | {r['ratio']:.2f} | "
        + ("n/a (CPU) |" if np.isnan(r["peak_mib"]) else f"{r['peak_mib']:,.0f} ({r['peak_ratio']:.2f}x) |")
        for r in rows
    ]
    return "\n".join(lines) + "\n"


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def main(argv: list[str]) -> None:
    del argv  # Unused.
    unknown_paths = sorted(set(FLAGS.paths) - set(PATHS))
    if unknown_paths:
        raise app.UsageError(f"`--paths` must be among {PATHS}. Received: {unknown_paths}.")
    unknown = sorted(set(FLAGS.models) - set(MODELS))
    if unknown:
        raise app.UsageError(f"`--models` must be among {list(MODELS)}. Received: {unknown}.")
    warnings.filterwarnings("ignore", module="opacus")  # its ghost mode's note on PyTorch's backward hooks
    torch.backends.cuda.matmul.allow_tf32 = FLAGS.tf32
    torch.backends.cudnn.allow_tf32 = FLAGS.tf32
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    rows = [row for name in FLAGS.models for row in measure(name, device)]
    interleaved.report(markdown(rows, device), FLAGS.out_md)


if __name__ == "__main__":
    app.run(main)
