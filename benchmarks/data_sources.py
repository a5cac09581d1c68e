"""Poisson batches from data on disk: the sampler's cost, a batch's read time, examples/s and resident memory.

For each N a file of N x 784 uint8 rows (MNIST-sized, 2,000,000 rows = 1.5 GB) is written under --dir and deleted
after; batches of about 256 rows (p = 256 / N) are drawn by ``keras_dyndp.poisson_batches`` on the backend Keras runs
on (set KERAS_BACKEND=jax for JAX) from:
- ``memmap``: ``np.load(path, mmap_mode='r')`` (read by positioned file reads, `keras_dyndp.sources.file_reader`);
- ``python source``: a random-access source in Python (``__len__``, ``__getitem__`` doing one ``os.pread`` of a row
  and returning ``(x, y)``), with a per-example ``map`` that scales the image to float32 in [0, 1];
- ``python source + __getitems__``: the same with ``__getitems__`` (one call per batch).
The sampler alone (`keras_dyndp.sources.draw`) is timed at each N; "one batch" is a batch drawn and read in the
calling thread (its latency), "in the pipeline" the time per batch the backend's input pipeline delivers (TensorFlow:
parallel calls and prefetch; JAX: 2 reader threads). Resident memory: RSS (``/proc/self/statm``) after 40 batches
minus before building them. The file is in the page cache after it is written (warm reads).

    python benchmarks/data_sources.py --sizes=1000000,2000000 --batches=40
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras_dyndp  # noqa: E402
from keras_dyndp import sources  # noqa: E402

ROW = 784


def rss_mb() -> float:
    with open(f"/proc/{os.getpid()}/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize() / 2**20


class PreadSource:
    """N examples ``(image uint8 [784], label)`` read one by one from the .npy file: a record store in Python."""

    def __init__(self, path: str, num_examples: int, offset: int):
        self.descriptor, self.num_examples, self.offset = os.open(path, os.O_RDONLY), num_examples, offset

    def __len__(self) -> int:
        return self.num_examples

    def __getitem__(self, index: int):
        row = np.frombuffer(os.pread(self.descriptor, ROW, self.offset + index * ROW), np.uint8)
        return row, index % 10


class BatchedPreadSource(PreadSource):
    def __getitems__(self, indices):
        return [self[index] for index in indices]


def write_rows(path: str, num_examples: int) -> int:
    """Writes N x 784 uint8 rows (random bytes, in chunks) as a .npy file; returns the data's byte offset."""
    rows = np.lib.format.open_memmap(path, mode="w+", dtype=np.uint8, shape=(num_examples, ROW))
    rng = np.random.default_rng(0)
    for start in range(0, num_examples, 100_000):
        stop = min(num_examples, start + 100_000)
        rows[start:stop] = rng.integers(0, 256, (stop - start, ROW), np.uint8)
    rows.flush()
    offset = rows.offset
    del rows
    return offset


def batches_of(dataset) -> object:
    if keras_dyndp.keras_backend() == "jax":
        return (dataset[index] for index in range(len(dataset)))
    return iter(dataset)


def time_batches(data: dict, num_batches: int) -> dict:
    """ms per batch of ``poisson_batches(**data)`` (after one warm-up batch; with the backend's prefetching),
    examples/s and RSS growth (MB) over ``num_batches`` batches."""
    before = rss_mb()
    num_examples = len(data["x"])
    dataset = keras_dyndp.poisson_batches(
        **data, sampling_probability=256 / num_examples, steps_per_epoch=num_batches + 1
    )
    iterator = batches_of(dataset)
    next(iterator)
    examples, start = 0, time.perf_counter()
    for _, _, weights in iterator:
        examples += int(np.sum(np.asarray(weights) > 0))
    seconds = time.perf_counter() - start
    return {"ms": 1e3 * seconds / num_batches, "examples_s": examples / seconds, "rss": rss_mb() - before}


def time_one_batch(data: dict, repeats: int = 40) -> float:
    """ms to draw and read one batch in the calling thread (no pipeline, no prefetch): a batch's latency."""
    num_examples = len(data["x"])
    rows = sources.rows(data["x"], data.get("y"), None, data.get("map"), lambda *arrays: num_examples)
    rng = np.random.default_rng(0)
    start = time.perf_counter()
    for _ in range(repeats):
        _, chosen = sources.draw(rng, num_examples, 256 / num_examples, 10**6)
        rows.batch(chosen, 384)
    return 1e3 * (time.perf_counter() - start) / repeats


def time_sampler(num_examples: int, repeats: int = 200) -> float:
    rng, p = np.random.default_rng(0), 256 / num_examples
    start = time.perf_counter()
    for _ in range(repeats):
        sources.draw(rng, num_examples, p, 10**6)
    return 1e6 * (time.perf_counter() - start) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000000,2000000", help="Comma-separated N (rows of 784 bytes).")
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--dir", default="/tmp")
    args = parser.parse_args()
    backend = keras_dyndp.keras_backend()
    print(f"backend {backend}; {os.cpu_count()} CPUs; load {os.getloadavg()[0]:.1f}")
    warm_up = keras_dyndp.poisson_batches(
        np.zeros((100, ROW), np.uint8), np.zeros(100, np.int32), sampling_probability=0.1, map=lambda e: e
    )
    list(batches_of(warm_up))  # the backend's input pipeline started before anything is measured
    print(
        "| backend | N | source | sampler us/step | one batch, ms | ms/batch in the pipeline | examples/s "
        "| RSS growth MB |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for num_examples in (int(size) for size in args.sizes.split(",")):
        path = os.path.join(args.dir, f"keras_dyndp_rows_{num_examples}.npy")
        try:
            offset = write_rows(path, num_examples)
            sampler_us = time_sampler(num_examples)
            for name, data in inputs(path, num_examples, offset).items():
                result = time_batches(data, args.batches)
                print(
                    f"| {backend} | {num_examples:,} | {name} | {sampler_us:.0f} | {time_one_batch(data):.2f} | "
                    f"{result['ms']:.2f} | {result['examples_s']:,.0f} | {result['rss']:.0f} |",
                    flush=True,
                )
        finally:
            if os.path.exists(path):
                os.remove(path)


def inputs(path: str, num_examples: int, offset: int) -> dict:
    """``poisson_batches``' data arguments for the file at ``path``: as a memmap and as two Python sources."""
    scale = lambda element: (element[0].astype(np.float32) / 255, np.int32(element[1]))  # noqa: E731
    return {
        "memmap": {"x": np.load(path, mmap_mode="r"), "y": np.arange(num_examples, dtype=np.int32) % 10},
        "python source": {"x": PreadSource(path, num_examples, offset), "map": scale},
        "python source + __getitems__": {"x": BatchedPreadSource(path, num_examples, offset), "map": scale},
    }


if __name__ == "__main__":
    main()
