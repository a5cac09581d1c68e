"""The cost of copying what a random-access source returns (`keras_dyndp.sources._owned`) beside a batch's read.

Every array a source returns is copied before the source is called again (a source may refill the buffer it returned).
This times a batch of about --batch_size examples read as ``keras_dyndp.poisson_batches`` reads it
(``sources.source_rows(source, None).read(sorted indices)``: the calls of the source, the checks, the stack into the
batch's arrays), with the copy and with it replaced by the identity (which is wrong for the sources that refill a
buffer: timing only), for each source:
- ``in memory``: ``source[i]`` returns ``(x[i], y[i])`` of arrays in memory (a writeable view of a row);
- ``memmap + decode``: ``source[i]`` reads row i of a uint8 file (``os.preadv`` into a buffer of its own), decodes it to
  float32 in [0, 1] into a decode buffer of its own and returns a read-only view of it (a reader with its own decode
  buffer, the case the copy is for);
- ``zlib file + decode``: the same with each row stored zlib-compressed (as tfds's ``Encoding.ZLIB`` stores a tensor),
  read by ``os.pread`` of its bytes and decompressed before the decode;
and each ``+ __getitems__`` (one call a batch returning its elements). The variants run interleaved, --repeats times
(report medians: the machine may be shared); "copy" is the median of the copy alone (every element of a batch through
``_owned``), its share the copy's time over the no-copy read's time. One process, one thread: numpy only, no backend.

    python benchmarks/source_copy.py [--shapes=28x28,64x64x3] [--repeats=21] [--batch_size=256]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
import zlib

import numpy as np

from keras_dyndp import sources

NUM_EXAMPLES = 4096


class InMemory:
    """``(x[i], y[i])`` of arrays in memory."""

    def __init__(self, x: np.ndarray, y: np.ndarray):
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int):
        return self.x[index], self.y[index]


class MemmapDecode:
    """Row i of a uint8 file read into a buffer of its own, decoded to float32 in [0, 1] into a decode buffer of its
    own, returned as a read-only view of it."""

    def __init__(self, path: str, shape: tuple[int, ...], labels: np.ndarray):
        self.descriptor, self.shape, self.labels = os.open(path, os.O_RDONLY), shape, labels
        self.raw = np.empty(int(np.prod(shape)), np.uint8)
        self.decoded = np.empty(shape, np.float32)

    def __len__(self) -> int:
        return len(self.labels)

    def _decode(self, index: int) -> np.ndarray:
        os.preadv(self.descriptor, [self.raw], index * self.raw.size)
        np.multiply(self.raw.reshape(self.shape), np.float32(1 / 255), out=self.decoded)
        view = self.decoded.view()
        view.flags.writeable = False
        return view

    def __getitem__(self, index: int):
        return self._decode(index), self.labels[index]


class ZlibDecode(MemmapDecode):
    """Row i stored zlib-compressed (at its own offset) in a file, read, decompressed and decoded as `MemmapDecode`."""

    def __init__(self, path: str, shape: tuple[int, ...], labels: np.ndarray, offsets: np.ndarray):
        super().__init__(path, shape, labels)
        self.offsets = offsets

    def _decode(self, index: int) -> np.ndarray:
        start, stop = int(self.offsets[index]), int(self.offsets[index + 1])
        raw = np.frombuffer(zlib.decompress(os.pread(self.descriptor, stop - start, start)), np.uint8)
        np.multiply(raw.reshape(self.shape), np.float32(1 / 255), out=self.decoded)
        view = self.decoded.view()
        view.flags.writeable = False
        return view


def with_getitems(source_class: type) -> type:
    """``source_class`` with ``__getitems__``: one call a batch (each element as ``source[i]`` returns it, so a
    decode buffer's views are copied by the source itself there, as a batched reader writes a batch buffer)."""

    def getitems(self, indices):
        return [(np.array(x), y) for x, y in map(self.__getitem__, indices)]

    return type(f"{source_class.__name__}Batched", (source_class,), {"__getitems__": getitems})


def cpu_model() -> str:
    """The CPU's model name (Linux), else the platform's processor."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            return next(line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "?"


def make_sources(shape: tuple[int, ...], directory: str) -> dict[str, object]:
    """The six sources of ``NUM_EXAMPLES`` examples of ``shape`` (the file under ``directory``)."""
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 256, (NUM_EXAMPLES,) + shape, dtype=np.uint8)
    labels = np.arange(NUM_EXAMPLES, dtype=np.int64)
    path = os.path.join(directory, "x.u8")
    raw.tofile(path)
    in_memory = raw.astype(np.float32) / 255
    # Images compress: smooth rows (a ramp plus noise) rather than uniform noise.
    smooth = (np.arange(raw[0].size) % 256).astype(np.uint8).reshape(shape) + raw % 8
    compressed = [zlib.compress(row.tobytes()) for row in smooth]
    offsets = np.concatenate([[0], np.cumsum([len(record) for record in compressed])])
    zlib_path = os.path.join(directory, "x.zlib")
    with open(zlib_path, "wb") as file:
        file.write(b"".join(compressed))
    return {
        "in memory": InMemory(in_memory, labels),
        "in memory + __getitems__": with_getitems(InMemory)(in_memory, labels),
        "memmap + decode": MemmapDecode(path, shape, labels),
        "memmap + decode + __getitems__": with_getitems(MemmapDecode)(path, shape, labels),
        "zlib file + decode": ZlibDecode(zlib_path, shape, labels, offsets),
        "zlib file + decode + __getitems__": with_getitems(ZlibDecode)(zlib_path, shape, labels, offsets),
    }


def time_read(source: object, indices: np.ndarray, copy: bool) -> float:
    """Seconds to read the batch ``indices`` of ``source`` (with the copy, or with the identity in its place)."""
    owned = sources._owned  # pylint: disable=protected-access
    if not copy:
        sources._owned = lambda element: element  # pylint: disable=protected-access
    try:
        rows = sources.source_rows(source, None)
        start = time.perf_counter()
        rows.read(indices)
        return time.perf_counter() - start
    finally:
        sources._owned = owned  # pylint: disable=protected-access


def time_copy(source: object, indices: np.ndarray) -> float:
    """Seconds of the copy alone: every element of the batch through `_owned`."""
    elements = [source[int(index)] for index in indices]
    start = time.perf_counter()
    for element in elements:
        sources._owned(element)  # pylint: disable=protected-access
    return time.perf_counter() - start


def measure(shape: tuple[int, ...], repeats: int, batch_size: int) -> None:
    """Prints each source's medians for examples of ``shape``."""
    with tempfile.TemporaryDirectory() as directory:
        made = make_sources(shape, directory)
        rng = np.random.default_rng(1)
        times: dict[tuple[str, str], list[float]] = {}
        for _ in range(repeats):
            indices = np.sort(rng.choice(NUM_EXAMPLES, batch_size, replace=False))
            for name, source in made.items():
                times.setdefault((name, "copy"), []).append(time_read(source, indices, True))
                times.setdefault((name, "none"), []).append(time_read(source, indices, False))
                times.setdefault((name, "alone"), []).append(time_copy(source, indices))
        size = np.dtype(np.float32).itemsize * int(np.prod(shape))
        print(f"\nexamples of shape {shape} float32 ({size} bytes), batches of {batch_size}, {repeats} repeats")
        print(f"{'source':34s} {'read, copy':>11s} {'read, none':>11s} {'difference':>11s} {'copy alone':>11s}")
        for name in made:
            with_copy, without, alone = (statistics.median(times[name, kind]) for kind in ("copy", "none", "alone"))
            print(
                f"{name:34s} {1e3 * with_copy:9.3f}ms {1e3 * without:9.3f}ms "
                f"{100 * (with_copy - without) / without:+10.1f}% {1e3 * alone:7.3f}ms ({100 * alone / without:.1f}%)"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--shapes", default="28x28,64x64x3", help="example shapes, comma-separated (28x28,...)")
    parser.add_argument("--repeats", type=int, default=21, help="interleaved repetitions (medians reported)")
    parser.add_argument("--batch_size", type=int, default=256, help="examples a batch")
    args = parser.parse_args()
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores; load {os.getloadavg()[0]:.1f}; numpy {np.__version__}")
    for shape in args.shapes.split(","):
        measure(tuple(int(size) for size in shape.split("x")), args.repeats, args.batch_size)


if __name__ == "__main__":
    main()
