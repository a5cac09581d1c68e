"""Records of measured runs: ``benchmarks/results/<name>.json``, one per run behind a table of the docs.

A record holds what a reader needs to trust and repeat a number: ``command`` (the exact command line), ``date`` (UTC,
``YYYY-MM-DD``), ``machine`` (CPU model, cores, oneDNN setting, GPU, Python and package versions; filled here, not by
the caller) and ``results`` (the measured values, structured as the script measures them). How a doc quotes the
record is its ``rows`` (a table's rows) and ``quoted`` (values in a sentence), read by ``benchmarks/doc_numbers.py``;
their values name paths into ``results`` (``"results.cnn.dyndp_fast.ratio"``), so rewriting a record that exists
(which keeps its ``rows`` and ``quoted``) and then ``python benchmarks/doc_numbers.py --write`` puts a re-measured
run's numbers into the docs.

    python benchmarks/step_time.py --models cnn --paths nonprivate,dyndp_fast --record benchmarks/results/x.json
"""

from __future__ import annotations

import datetime
import importlib.metadata
import importlib.util
import json
import os
import pathlib
import platform
import shlex
import sys

PACKAGES = ("tensorflow", "keras", "tf-keras", "jax", "jaxlib", "dp-accounting", "numpy", "tensorflow-privacy")


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else the platform's processor, else ``"not recorded"``."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            return next(line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "not recorded"


def cpu_flags() -> list[str]:
    """The CPU features that change TensorFlow's default (AVX-512 VNNI turns oneDNN on), as /proc/cpuinfo lists them."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            flags = next((line.split(":", 1)[1].split() for line in cpuinfo if line.startswith("flags")), [])
    except OSError:
        return []
    return sorted(flag for flag in flags if flag in {"avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile"})


def onednn() -> str:
    """TensorFlow's oneDNN setting: ``TF_ENABLE_ONEDNN_OPTS`` when set, else TensorFlow's default on this CPU, or
    ``"n/a"`` where TensorFlow is not installed (the JAX stack)."""
    if importlib.util.find_spec("tensorflow") is None:
        return "n/a"
    setting = os.environ.get("TF_ENABLE_ONEDNN_OPTS")
    if setting is not None:
        return f"{'on' if setting == '1' else 'off'} (TF_ENABLE_ONEDNN_OPTS={setting})"
    return f"{'on' if 'avx512_vnni' in cpu_flags() else 'off'} (TensorFlow's default on this CPU)"


def gpu() -> str:
    """The GPUs ``nvidia-smi`` would show, read from /proc/driver/nvidia (no process started), else ``"none"``."""
    gpus = pathlib.Path("/proc/driver/nvidia/gpus")
    names = []
    for information in sorted(gpus.glob("*/information")) if gpus.is_dir() else []:
        line = next((x for x in information.read_text().splitlines() if x.startswith("Model:")), "Model: GPU")
        names.append(line.split(":", 1)[1].strip())
    return ", ".join(names) or "none"


def versions() -> dict[str, str]:
    """Python's and the installed packages' versions (those of PACKAGES that are installed)."""
    found = {"python": platform.python_version()}
    for package in PACKAGES:
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def machine() -> dict:
    """The facts of this machine a record keeps."""
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "cpu_flags": cpu_flags(),
        "onednn": onednn(),
        "gpu": gpu(),
        "versions": versions(),
    }


def command_line(argv: list[str] | None = None) -> str:
    """The command that ran this process, as a shell would take it (``python <script> <args>``), with the
    ``TF_ENABLE_ONEDNN_OPTS`` setting in effect in front where it is set (by the caller or the script itself)."""
    argv = list(sys.argv if argv is None else argv)
    if argv and os.path.isabs(argv[0]) and not os.path.relpath(argv[0]).startswith(".."):
        argv[0] = os.path.relpath(argv[0])  # as typed from the repository root (runpy hands on an absolute path)
    setting = os.environ.get("TF_ENABLE_ONEDNN_OPTS")
    prefix = f"TF_ENABLE_ONEDNN_OPTS={setting} " if setting is not None else ""
    return prefix + shlex.join(["python", *argv])


def write_record(path: str | os.PathLike, command: str, results: dict) -> dict:
    """Writes the record of one measured run to ``path`` (JSON) and returns it.

    Args:
        path: where, conventionally ``benchmarks/results/<name>.json``; one there keeps its ``rows`` and ``quoted``.
        command: the exact command line of the run (``command_line()`` gives this process's).
        results: the measured values, structured (JSON types: numbers, strings, lists, dicts).
    """
    path = pathlib.Path(path)
    record = {
        "command": command,
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d"),
        "machine": machine(),
        "results": results,
    }
    if path.exists():
        previous = json.loads(path.read_text(encoding="utf-8"))
        record.update({key: previous[key] for key in ("rows", "quoted") if key in previous})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"record written: {path}")
    return record
