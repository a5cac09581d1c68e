"""Opacus's DPDataLoader (Poisson batches, PyTorch) on the memmap of benchmarks/data_sources.py: the comparison.

Run in a PyTorch venv with opacus (not a keras_dyndp dependency), e.g. ``/work/venvs/torch/bin/python``. For each N a
file of N x 784 uint8 rows is written under --dir (deleted after) and mapped with ``np.load(..., mmap_mode='r')``;
``opacus.data_loader.DPDataLoader`` draws Poisson batches with sample rate p = 256 / N (its
``UniformWithReplacementSampler``: N uniforms a step) from a map-style dataset over the memmap:
- ``__getitem__``: one row read and scaled to float32 a call, the batch stacked by the default collate (the usual
  map-style dataset);
- ``__getitems__``: the batch's rows read at once (``memmap[sorted indices]``), as recent torch fetchers allow.
Reported as benchmarks/data_sources.py does: the sampler alone (us/step), ms per batch over --batches batches after
one, examples/s, and RSS growth (MB) over them since before the loader was built. ``--cold`` evicts the file from the
page cache first (``posix_fadvise(DONTNEED)``).

    /work/venvs/torch/bin/python benchmarks/opacus_data_loader.py --sizes=1000000,2000000 --batches=40
"""

from __future__ import annotations

import argparse
import os
import resource
import time

import numpy as np
import torch
from opacus.data_loader import DPDataLoader
from opacus.utils.uniform_sampler import UniformWithReplacementSampler

ROW = 784


def rss_mb() -> float:
    with open(f"/proc/{os.getpid()}/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize() / 2**20


class Rows(torch.utils.data.Dataset):
    """The memmap's rows as ``(float32 [784] in [0, 1], label)``, one per ``__getitem__``."""

    def __init__(self, memmap: np.ndarray):
        self.memmap = memmap

    def __len__(self) -> int:
        return len(self.memmap)

    def __getitem__(self, index: int):
        return torch.from_numpy(self.memmap[index].astype(np.float32) / 255), index % 10


class BatchedRows(Rows):
    """The same, with ``__getitems__``: a batch's rows read in one fancy index of the memmap."""

    def __getitems__(self, indices: list[int]):
        order = np.argsort(indices)
        rows = np.empty((len(indices), ROW), np.float32)
        rows[order] = self.memmap[np.asarray(indices)[order]] / np.float32(255)
        return [(torch.from_numpy(row), index % 10) for row, index in zip(rows, indices)]


def write_rows(path: str, num_examples: int) -> None:
    """N x 784 uint8 random rows as a .npy file (the bytes of benchmarks/data_sources.py's, seed 0)."""
    rows = np.lib.format.open_memmap(path, mode="w+", dtype=np.uint8, shape=(num_examples, ROW))
    rng = np.random.default_rng(0)
    for start in range(0, num_examples, 100_000):
        stop = min(num_examples, start + 100_000)
        rows[start:stop] = rng.integers(0, 256, (stop - start, ROW), np.uint8)
    rows.flush()
    del rows


def drop_from_page_cache(path: str) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(descriptor)


def time_sampler(num_examples: int, repeats: int = 50) -> float:
    """us per step of Opacus's Poisson sampler alone."""
    sampler = UniformWithReplacementSampler(num_samples=num_examples, sample_rate=256 / num_examples, steps=repeats)
    start = time.perf_counter()
    for _ in sampler:
        pass
    return 1e6 * (time.perf_counter() - start) / repeats


def time_loader(dataset: Rows, num_batches: int, workers: int) -> dict:
    before = rss_mb()
    loader = DPDataLoader(dataset, sample_rate=256 / len(dataset), num_workers=workers)
    iterator = iter(loader)
    next(iterator)
    examples, start = 0, time.perf_counter()
    for _ in range(num_batches):
        batch_x, _ = next(iterator)
        examples += len(batch_x)
    seconds = time.perf_counter() - start
    return {"ms": 1e3 * seconds / num_batches, "examples_s": examples / seconds, "rss": rss_mb() - before}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000000,2000000", help="Comma-separated N (rows of 784 bytes).")
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--workers", type=int, default=0, help="DataLoader worker processes.")
    parser.add_argument("--dir", default="/tmp")
    parser.add_argument("--cold", action="store_true", help="Drop the file from the page cache first.")
    args = parser.parse_args()
    torch.set_num_threads(2)
    print(f"torch {torch.__version__}; {os.cpu_count()} CPUs; load {os.getloadavg()[0]:.1f}; workers {args.workers}")
    print("| loader | N | dataset | sampler us/step | ms/batch | examples/s | RSS growth MB |")
    print("|---|---|---|---|---|---|---|")
    for num_examples in (int(size) for size in args.sizes.split(",")):
        path = os.path.join(args.dir, f"keras_dyndp_opacus_rows_{num_examples}.npy")
        try:
            write_rows(path, num_examples)
            sampler_us = time_sampler(num_examples)
            for name, dataset_class in (("__getitem__", Rows), ("__getitems__", BatchedRows)):
                if args.cold:
                    drop_from_page_cache(path)
                result = time_loader(dataset_class(np.load(path, mmap_mode="r")), args.batches, args.workers)
                print(
                    f"| Opacus DPDataLoader | {num_examples:,} | {name} | {sampler_us:.0f} | {result['ms']:.2f} | "
                    f"{result['examples_s']:,.0f} | {result['rss']:.0f} |",
                    flush=True,
                )
        finally:
            if os.path.exists(path):
                os.remove(path)


if __name__ == "__main__":
    main()
