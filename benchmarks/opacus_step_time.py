"""Opacus's DP-SGD step against PyTorch's non-private step on benchmarks/models.py's models, interleaved in one run.

The comparison the GPU goals name ("faster than Opacus on the same model and batch"): the same paper CNN
and WideResNet-16-4 (GroupNorm 16, CIFAR-10 shapes) as ``jax_step_time.py``, written in PyTorch layer for layer
(`cnn`, `wide_resnet`), trained on one fixed synthetic batch of the same shapes. Paths:

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
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import time
import warnings

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
flags.DEFINE_list("models", ["cnn", "wrn"], "Models among cnn, wrn.")
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


def batch(model_name: str, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """models.make_data's batch, channels first."""
    x, y = models.make_data(model_name, FLAGS.batch_size)
    x = torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2)))
    return x.to(device), torch.from_numpy(y).long().to(device)


class _Stepper:
    """One path: its own copy of the model (same initial weights), optimizer and loss, stepped on one fixed batch."""

    def __init__(self, model_name: str, path: str, x: torch.Tensor, y: torch.Tensor):
        torch.manual_seed(0)
        model = (cnn() if model_name == "cnn" else wide_resnet()).to(x.device)
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
    steppers = {path: _Stepper(model_name, path, x, y) for path in paths}
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
    unknown = sorted(set(FLAGS.models) - {"cnn", "wrn"})
    if unknown:
        raise app.UsageError(f"`--models` must be among ['cnn', 'wrn']. Received: {unknown}.")
    warnings.filterwarnings("ignore", module="opacus")  # its ghost mode's note on PyTorch's backward hooks
    torch.backends.cuda.matmul.allow_tf32 = FLAGS.tf32
    torch.backends.cudnn.allow_tf32 = FLAGS.tf32
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    rows = [row for name in FLAGS.models for row in measure(name, device)]
    interleaved.report(markdown(rows, device), FLAGS.out_md)


if __name__ == "__main__":
    app.run(main)
