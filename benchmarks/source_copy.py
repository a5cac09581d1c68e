"""The cost of a batch owning what a random-access source returns (`keras_dyndp.data.readers.BatchRows`) beside its
read.

What a source returns is owned by the batch before the source is called again (a source may refill the buffer it
returned): each element is written into the batch's arrays as it is read (the copy that stacking the batch makes
anyway). This times a batch of about --batch_size examples read as ``keras_dyndp.poisson_batches`` reads it
(``sources.source_rows(source, None).read(sorted indices)``: the calls of the source, the checks, the batch's arrays),
owned and with `Unowned` in place of `readers.BatchRows` (the elements kept as returned and stacked at the end, as
before the copy: wrong for the sources that refill a buffer, timing only), for each source:
- ``in memory``: ``source[i]`` returns ``(x[i], y[i])`` of arrays in memory (a writeable view of a row);
- ``memmap + decode``: ``source[i]`` reads row i of a uint8 file (``os.preadv`` into a buffer of its own), decodes it to
  float32 in [0, 1] into a decode buffer of its own and returns a read-only view of it (a reader with its own decode
  buffer, the case the ownership is for);
- ``zlib file + decode``: the same with each row stored zlib-compressed (as tfds's ``Encoding.ZLIB`` stores a tensor),
  read by ``os.pread`` of its bytes and decompressed before the decode;
and each ``+ __getitems__`` (one call a batch returning its elements). The variants run interleaved, --repeats times
(report medians: the machine may be shared); "difference" is the owned read's time over the unowned one's, minus 1.
numpy only, no backend.

    python benchmarks/source_copy.py [--shapes=28x28,64x64x3] [--repeats=21] [--batch_size=256] [--record=PATH]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import zlib

import numpy as np
import records  # benchmarks/records.py (this script's directory is on sys.path)

from keras_dyndp.data import readers
from keras_dyndp.data import sources

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


class Unowned:
    """`readers.BatchRows` without the ownership: each element kept as the source returned it and the batch stacked
    at the end (`readers.examples`), as the reads were before what a source returns was copied (wrong for a source
    that refills a buffer: timing only)."""

    def __init__(self, num_rows: int, first: object):
        self.elements = [first] + [None] * (num_rows - 1)

    def write(self, row: int, element: object) -> None:
        self.elements[row] = element

    def fill(self, elements: list) -> None:
        self.elements = list(elements)

    def examples(self, map_fn):
        return readers.examples(self.elements, map_fn)


def time_read(source: object, indices: np.ndarray, owned: bool) -> float:
    """Seconds to read the batch ``indices`` of ``source`` (with the batch owning its rows, or with `Unowned`)."""
    batch_rows = readers.BatchRows
    if not owned:
        readers.BatchRows = Unowned
    try:
        rows = sources.source_rows(source, None)
        start = time.perf_counter()
        rows.read(indices)
        return time.perf_counter() - start
    finally:
        readers.BatchRows = batch_rows


def measure(shape: tuple[int, ...], repeats: int, batch_size: int) -> dict:
    """Prints and returns each source's medians for examples of ``shape``: ``{source: {owned_ms, unowned_ms,
    difference_percent}}``."""
    with tempfile.TemporaryDirectory() as directory:
        made = make_sources(shape, directory)
        rng = np.random.default_rng(1)
        times: dict[tuple[str, str], list[float]] = {}
        for repeat in range(repeats):
            indices = np.sort(rng.choice(NUM_EXAMPLES, batch_size, replace=False))
            # Which variant reads first alternates: the second reads the same examples from warmer caches.
            order = (True, False) if repeat % 2 == 0 else (False, True)
            for name, source in made.items():
                for owned in order:
                    times.setdefault((name, "owned" if owned else "unowned"), []).append(
                        time_read(source, indices, owned)
                    )
        size = np.dtype(np.float32).itemsize * int(np.prod(shape))
        print(f"\nexamples of shape {shape} float32 ({size} bytes), batches of {batch_size}, {repeats} repeats")
        print(f"{'source':34s} {'owned':>11s} {'unowned':>11s} {'difference':>11s}")
        found = {}
        for name in made:
            owned, unowned = (statistics.median(times[name, kind]) for kind in ("owned", "unowned"))
            print(f"{name:34s} {1e3 * owned:9.3f}ms {1e3 * unowned:9.3f}ms {100 * (owned - unowned) / unowned:+10.1f}%")
            found[name] = {
                "owned_ms": 1e3 * owned,
                "unowned_ms": 1e3 * unowned,
                "difference_percent": 100 * (owned - unowned) / unowned,
            }
        return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--shapes", default="28x28,64x64x3", help="example shapes, comma-separated (28x28,...)")
    parser.add_argument("--repeats", type=int, default=21, help="interleaved repetitions (medians reported)")
    parser.add_argument("--batch_size", type=int, default=256, help="examples a batch")
    parser.add_argument("--record", default=None, help="where to write the run's record (benchmarks/records.py)")
    args = parser.parse_args()
    print(f"CPU: {records.cpu_model()}, {os.cpu_count()} cores; load {os.getloadavg()[0]:.1f}; numpy {np.__version__}")
    results = {
        shape: measure(tuple(int(size) for size in shape.split("x")), args.repeats, args.batch_size)
        for shape in args.shapes.split(",")
    }
    if args.record:
        results["load"] = os.getloadavg()[0]
        records.write_record(args.record, records.command_line(), results)


if __name__ == "__main__":
    main()
