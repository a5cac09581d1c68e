"""Poisson batches from data on disk: the sampler's cost, a batch's read time, examples/s and resident memory.

For each N a file of N x 784 uint8 rows (MNIST-sized, 2,000,000 rows = 1.5 GB) is written under --dir and deleted
after; batches of about 256 rows (p = 256 / N) are drawn by ``keras_dyndp.poisson_batches`` on the backend Keras runs
on (set KERAS_BACKEND=jax for JAX) from:
- ``memmap``: ``np.load(path, mmap_mode='r')`` (read by positioned file reads, `keras_dyndp.data.readers.file_reader`);
- ``python source``: a random-access source in Python (``__len__``, ``__getitem__`` doing one ``os.pread`` of a row
  and returning ``(x, y)``), with a per-example ``map`` that scales the image to float32 in [0, 1];
- ``python source + __getitems__``: the same with ``__getitems__`` (one call per batch).
Both Python sources read with ``os.pread`` (positional, no shared file offset), so they are declared safe for 8
threads (``source_threads=8``) and read as tfds's sources are; ``python source, undeclared`` is the first without the
declaration, called by one thread at a time (`keras_dyndp.data.readers.source_guard`), the default for a source
``poisson_batches`` does not know.
The sampler alone (`keras_dyndp.data.sources.draw`) is timed at each N; "one batch" is a batch drawn and read in the
calling thread (its latency), "in the pipeline" the time per batch the backend's input pipeline delivers (TensorFlow:
parallel calls and prefetch; JAX: 2 reader threads). Resident memory: RSS (``/proc/self/statm``) after 40 batches
minus before building them; "CPU ms/batch": the process's CPU time (every thread) per batch delivered, less sensitive
to other jobs on the machine than the wall time. The file is in the page cache after it is written (warm reads);
``--cold`` asks the kernel to drop the file's pages (``posix_fadvise(DONTNEED)``) before each measurement, so reads go
to the disk.

With ``--baselines`` the same rows are also served by (on JAX, with KERAS_BACKEND=jax, all but the plain
``tf.data`` pipeline; the tfds files, which take TensorFlow to build, from ``--tfds_dir`` built by a TensorFlow run):
- ``plain tf.data``: ``tf.data.Dataset.range(N).shuffle(N).batch(256)`` mapped by ``tf.numpy_function`` reading
  ``memmap[sorted indices]`` (shuffle-and-slice batches of 256, not Poisson sampling; parallel calls, prefetch);
- ``tfds.data_source``: ArrayRecord files of the first --tfds_size rows written by
  ``tfds.dataset_builders.store_as_tfds_dataset`` (under --dir, deleted after; the build, some 1,000-6,000
  examples/s in Python here, is timed apart; ``--tfds_dir`` keeps the files there and reuses them), read by
  ``poisson_batches`` with a ``map`` to float32, and with one keeping uint8; the image a ``tfds.features.Tensor``
  stored as ``--tfds_encoding`` says (tfds's ``Encoding``: ``none``, its default, 784 int64 varints a record;
  ``bytes``, one 784-byte value; ``zlib``, compressed bytes; several, comma-separated, each its own files);
- ``ArrayRecordDataSource``: all N rows as raw 784-byte records in an ArrayRecord file (written by array_record's
  ``ArrayRecordWriter``, fast), read through ``array_record_data_source.ArrayRecordDataSource`` (the reader under
  ``tfds.data_source``, without tfds's decoding) by ``poisson_batches`` with a ``map``.
With ``--before`` the Python sources (and the tfds one) are also read as before the reads overlapped (`reading`):
one call a batch in the calling thread, tfds parsing each record in Python, and the tfds one as before its own
ArrayRecord readers (ArrayRecord's ``__getitems__``, tfds's decode of every example); ``--repeats`` measures every
source that often, interleaved (report medians: the machine is shared). ``--cnn_steps`` also times that many DP
steps of the paper CNN (benchmarks/step_time.py's ``dyndp_fast``, batch 256) in every repeat and prints each tfds
variant's examples/s over the CNN's measured in the same repeat (the input pipeline against the training it feeds),
and the CNN step's CPU time an example (every thread) over the pipeline's: less sensitive to the other jobs.
Opacus's DPDataLoader on the same memmap is benchmarks/opacus_data_loader.py (PyTorch, a venv of its own).

    python benchmarks/data_sources.py --sizes=1000000,2000000 --batches=40
    python benchmarks/data_sources.py --sizes=1000000 --baselines [--cold]
    python benchmarks/data_sources.py --sizes=1000000 --baselines --before --repeats=3 --tfds_size=100000 [--cold]
    python benchmarks/data_sources.py --sizes=1000000 --batches=100 --baselines --skip_ours --before --repeats=3 \
        --tfds_size=1000000 --tfds_dir=/tmp/keras_dyndp_tfds_kept
    python benchmarks/data_sources.py --sizes=1000000 --batches=100 --baselines --skip_ours --repeats=5 \
        --tfds_size=1000000 --tfds_dir=/tmp/keras_dyndp_tfds_kept --tfds_encoding=none,bytes,zlib --cnn_steps=40
    KERAS_BACKEND=jax python benchmarks/data_sources.py ... (the same flags; the JAX CNN step's examples/s)
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import shutil
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras_dyndp  # noqa: E402
from keras_dyndp.data import readers  # noqa: E402
from keras_dyndp.data import sources  # noqa: E402
from keras_dyndp.data import tfds_reader  # noqa: E402

ROW = 784


@contextlib.contextmanager
def reading(previous: bool | str):
    """With ``previous``, sources read as before the parallel reads: one call per batch in the calling thread
    (`keras_dyndp.data.readers._parts` one part) and tfds's own per-example parsing (no `tfds_reader.tfds_fetcher`);
    with ``previous="batched"`` a tfds source read as before its own ArrayRecord readers: the records by one
    ``__getitems__`` of ArrayRecord's source (its thread pools), then ``decode_example_np`` per example."""
    if not previous:
        yield
        return
    saved = readers._parts, tfds_reader.tfds_fetcher, tfds_reader._ArrayRecordFiles.of, tfds_reader._tfds_decoder
    if previous == "batched":
        tfds_reader._ArrayRecordFiles.of = classmethod(lambda cls, source: None)
        tfds_reader._tfds_decoder = decoding_every_example
    else:
        readers._parts = lambda num_rows, threads=1: [np.arange(num_rows)]
        tfds_reader.tfds_fetcher = lambda source, guard: None
    try:
        yield
    finally:
        readers._parts, tfds_reader.tfds_fetcher, tfds_reader._ArrayRecordFiles.of, tfds_reader._tfds_decoder = saved


def decoding_every_example(features):
    """`keras_dyndp.data.tfds_reader._tfds_decoder` as before: tfds's ``decode_example_np`` on every example."""
    from tensorflow_datasets.core import utils  # pylint: disable=import-outside-toplevel

    info = features.get_serialized_info()
    flat_info = utils.flatten_nest_dict(info)

    def decode(parsed: dict) -> list:
        columns = {}
        for key, column in parsed.items():
            column = column.astype(flat_info[key].np_dtype)
            columns[key] = column.tolist() if column.ndim == 1 else column
        examples = ({key: column[i] for key, column in columns.items()} for i in range(len(column)))
        return [features.decode_example_np(utils.pack_as_nest_dict(example, info)) for example in examples]

    return decode


def cpu_model() -> str:
    with open("/proc/cpuinfo") as cpuinfo:
        return next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), "?")


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
    examples/s, RSS growth (MB) and the process's CPU time per batch (ms, every thread: less sensitive to the other
    jobs on the machine than the wall time) over ``num_batches`` batches."""
    before = rss_mb()
    data = dict(data)
    previous, num_examples = data.pop("previous", False), len(data["x"])
    with reading(previous):
        dataset = keras_dyndp.poisson_batches(
            **data, sampling_probability=256 / num_examples, steps_per_epoch=num_batches + 1
        )
        iterator = batches_of(dataset)
        next(iterator)
        examples, start, cpu_start = 0, time.perf_counter(), time.process_time()
        for _, _, weights in iterator:
            examples += int(np.sum(np.asarray(weights) > 0))
        seconds, cpu_ms = time.perf_counter() - start, 1e3 * (time.process_time() - cpu_start) / num_batches
    return {
        "ms": 1e3 * seconds / num_batches,
        "examples_s": examples / seconds,
        "rss": rss_mb() - before,
        "cpu": cpu_ms,
    }


def time_one_batch(data: dict, repeats: int = 40) -> float:
    """ms to draw and read one batch in the calling thread (no pipeline, no prefetch): a batch's latency."""
    num_examples = len(data["x"])
    with reading(data.get("previous", False)):
        check = lambda *arrays: num_examples  # noqa: E731
        rows = sources.rows(data["x"], data.get("y"), None, data.get("map"), check, data.get("source_threads"))
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


def drop_from_page_cache(path: str) -> None:
    """Asks the kernel to evict ``path``'s pages (cold reads from then on; best effort)."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
        os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(descriptor)


def plain_tf_data(memmap: np.ndarray, labels: np.ndarray, num_batches: int):
    """Shuffle-and-slice batches of 256 rows read from the memmap in a ``tf.data`` pipeline (the usual recipe)."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    def read(indices: np.ndarray):
        indices = np.sort(indices)
        return memmap[indices].astype(np.float32) / 255, labels[indices], np.ones(len(indices), np.float32)

    def make_batch(indices):
        x, y, w = tf.numpy_function(read, [indices], [tf.float32, tf.int32, tf.float32], stateful=False)
        return tf.ensure_shape(x, [256, ROW]), tf.ensure_shape(y, [256]), tf.ensure_shape(w, [256])

    indices = tf.data.Dataset.range(len(memmap)).shuffle(len(memmap), seed=0).batch(256, drop_remainder=True)
    return indices.take(num_batches + 1).map(make_batch, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)


def tfds_source(memmap: np.ndarray, labels: np.ndarray, data_dir: str, reuse: bool = False, encoding: str = "none"):
    """``tfds.data_source`` of the rows, written as ArrayRecord files under ``data_dir`` (with ``reuse``, those
    already there when there are: the same rows, written by an earlier run), the image a ``tfds.features.Tensor``
    of tfds's ``encoding`` ("none": 784 int64s in the record, "bytes": one bytes value, "zlib": zlib-compressed
    bytes); (source, build seconds)."""
    import importlib.resources  # pylint: disable=import-outside-toplevel

    sys.modules.setdefault("importlib_resources", importlib.resources)  # tfds 4.9 imports the backport
    import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel

    name = "rows" if encoding == "none" else f"rows_{encoding}"
    if reuse and os.path.isdir(os.path.join(data_dir, name)):
        return tfds.data_source(name, split="train", data_dir=data_dir, download=False), 0.0
    if keras_dyndp.keras_backend() == "jax":
        sys.exit(f"Building tfds files takes TensorFlow: build {name} with the TensorFlow stack and --tfds_dir first.")
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    def chunks():
        for start in range(0, len(memmap), 10_000):
            yield {"image": np.asarray(memmap[start : start + 10_000]), "label": labels[start : start + 10_000]}

    signature = {"image": tf.TensorSpec([None, ROW], tf.uint8), "label": tf.TensorSpec([None], tf.int32)}
    rows = tf.data.Dataset.from_generator(chunks, output_signature=signature).unbatch()
    features = tfds.features.FeaturesDict(
        {
            "image": tfds.features.Tensor(shape=(ROW,), dtype=np.uint8, encoding=tfds.features.Encoding(encoding)),
            "label": tfds.features.Scalar(dtype=np.int32),
        }
    )
    start = time.perf_counter()
    tfds.dataset_builders.store_as_tfds_dataset(
        name=name,
        version="1.0.0",
        data_dir=data_dir,
        split_datasets={"train": rows},
        features=features,
        file_format="array_record",
        disable_shuffling=True,
    )
    build_s = time.perf_counter() - start
    return tfds.data_source(name, split="train", data_dir=data_dir, download=False), build_s


def array_record_source(memmap: np.ndarray, path: str):
    """The rows as raw records of one ArrayRecord file at ``path``, read by ``ArrayRecordDataSource``."""
    from array_record.python import array_record_data_source  # pylint: disable=import-outside-toplevel
    from array_record.python import array_record_module  # pylint: disable=import-outside-toplevel

    writer = array_record_module.ArrayRecordWriter(path, "group_size:1")
    for start in range(0, len(memmap), 10_000):
        for record in np.asarray(memmap[start : start + 10_000]):
            writer.write(record.tobytes())
    writer.close()
    return array_record_data_source.ArrayRecordDataSource([path])


def baselines(
    path: str, num_examples: int, num_batches: int, cold: bool, data_dir: str, args: argparse.Namespace
) -> None:
    """The plain ``tf.data`` pipeline and ``poisson_batches`` of a ``tfds.data_source`` on the same rows (with
    ``args.before`` also read as before; each tfds variant ``args.repeats`` times, interleaved)."""
    tfds_size, before, repeats = args.tfds_size, args.before, args.repeats
    memmap, labels = np.load(path, mmap_mode="r"), np.arange(num_examples, dtype=np.int32) % 10
    if cold:
        drop_from_page_cache(path)
    if keras_dyndp.keras_backend() != "jax":  # the JAX stack has no TensorFlow
        rss_before, iterator = rss_mb(), iter(plain_tf_data(memmap, labels, num_batches))
        next(iterator)
        start = time.perf_counter()
        examples = sum(len(np.asarray(weights)) for _, _, weights in iterator)
        seconds = time.perf_counter() - start
        row("plain tf.data", num_examples, 1e3 * seconds / num_batches, examples / seconds, rss_mb() - rss_before)
    os.makedirs(data_dir, exist_ok=True)
    records = array_record_source(memmap, os.path.join(data_dir, "rows.array_record"))
    decode = lambda record: (np.frombuffer(record, np.uint8).astype(np.float32) / 255, np.int32(0))  # noqa: E731
    measure("ArrayRecordDataSource", {"x": records, "map": decode}, num_batches, cold, data_dir)
    size = min(num_examples, tfds_size)
    tfds_dir = args.tfds_dir or data_dir
    to_float = lambda element: (element["image"].astype(np.float32) / 255, element["label"])  # noqa: E731
    keep_uint8 = lambda element: (element["image"], element["label"])  # noqa: E731
    variants = {}
    for encoding in args.tfds_encoding.split(","):
        source, build_s = tfds_source(memmap[:size], labels[:size], tfds_dir, bool(args.tfds_dir), encoding)
        print(f"(tfds ArrayRecord files of N={size:,}, encoding {encoding!r}, built in {build_s:.0f} s)", flush=True)
        name = "tfds.data_source" if encoding == "none" else f"tfds.data_source, {encoding}"
        variants[name] = {"x": source, "map": to_float}
        variants[f"{name}, map keeping uint8"] = {"x": source, "map": keep_uint8}
        if before and encoding == "none":
            variants[f"{name}, ArrayRecord's __getitems__ + tfds decode"] = {
                "x": source,
                "map": to_float,
                "previous": "batched",
            }
            variants[f"{name}, read as before"] = {"x": source, "map": to_float, "previous": True}
    cnn = cnn_examples_per_second(args.cnn_steps) if args.cnn_steps else None
    ratios: dict = {}
    for _ in range(repeats):
        cnn_rate, cnn_cpu = cnn() if cnn else (None, None)
        if cnn_rate:
            row("paper CNN, DP step (dyndp_fast, batch 256)", size, 256e3 / cnn_rate, cnn_rate, 0, cnn_cpu)
        for name, data in variants.items():
            result = measure(name, data, num_batches, cold, data_dir)
            if cnn_rate:
                cpu_ratio = (cnn_cpu / 256) / (result["cpu"] / (result["examples_s"] * result["ms"] / 1e3))
                ratios.setdefault(name, []).append((result["examples_s"] / cnn_rate, cpu_ratio))
    if cnn:
        print(
            "\n| source | examples/s over the CNN DP step's (median; each repeat) | the CNN step's CPU time an "
            "example over the pipeline's (median; each repeat) |"
        )
        print("|---|---|---|")
        for name, values in ratios.items():
            columns = [[value[i] for value in values] for i in (0, 1)]
            print(
                f"| {name} | "
                + " | ".join(f"{statistics.median(c):.2f}x ({', '.join(f'{v:.2f}' for v in c)})" for c in columns)
                + " |"
            )


def cnn_examples_per_second(steps: int):
    """``() -> (examples/s, CPU ms a step)`` of ``steps`` DP training steps of the paper CNN (benchmarks/step_time.py's
    ``dyndp_fast`` path: ``make_private``, batch 256, an in-memory batch), so that each input pipeline is compared with
    the step it feeds in the same repeat, under the same load."""
    if keras_dyndp.keras_backend() == "jax":
        import jax_step_time  # pylint: disable=import-outside-toplevel  # benchmarks/jax_step_time.py
        import models  # pylint: disable=import-outside-toplevel  # benchmarks/models.py

        runner = jax_step_time._Stepper(jax_step_time.build("cnn", "dyndp_fast", 256), *models.make_data("cnn", 256))
    else:
        import step_time  # pylint: disable=import-outside-toplevel  # benchmarks/step_time.py

        runner = step_time.Runner("cnn", "dyndp_fast", 256)
    runner.run(5)  # traced and warm

    def measure_steps() -> tuple[float, float]:
        cpu_start = time.process_time()
        seconds = runner.run(steps)
        return 256 / seconds, 1e3 * (time.process_time() - cpu_start) / steps

    return measure_steps


def measure(name: str, data: dict, num_batches: int, cold: bool, data_dir: str) -> dict:
    """One table row of ``poisson_batches`` from the source ``data["x"]`` (files under ``data_dir``)."""
    if cold:
        for folder, _, names in os.walk(data_dir):
            for file_name in names:
                drop_from_page_cache(os.path.join(folder, file_name))
    result = time_batches(data, num_batches)
    print(
        f"| {keras_dyndp.keras_backend()} | {len(data['x']):,} | {name} | - | {time_one_batch(data):.2f} | "
        f"{result['ms']:.2f} | {result['examples_s']:,.0f} | {result['rss']:.0f} | {result['cpu']:.2f} |",
        flush=True,
    )
    return result


def row(name: str, num_examples: int, ms: float, examples_s: float, rss: float, cpu: float | None = None) -> None:
    cpu_ms = "-" if cpu is None else f"{cpu:.2f}"
    print(
        f"| {keras_dyndp.keras_backend()} | {num_examples:,} | {name} | - | - | {ms:.2f} | {examples_s:,.0f} | "
        f"{rss:.0f} | {cpu_ms} |",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000000,2000000", help="Comma-separated N (rows of 784 bytes).")
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--dir", default="/tmp")
    parser.add_argument("--baselines", action="store_true", help="Also plain tf.data and tfds.data_source.")
    parser.add_argument("--cold", action="store_true", help="Drop the files from the page cache first.")
    parser.add_argument("--skip_ours", action="store_true", help="Only the baselines.")
    parser.add_argument("--tfds_size", type=int, default=100_000, help="Rows written through tfds (slow to build).")
    parser.add_argument(
        "--tfds_dir", default="", help="Keep the tfds files here and reuse them when there (rows of the same N)."
    )
    parser.add_argument("--before", action="store_true", help="Also the sources read as before the parallel reads.")
    parser.add_argument("--repeats", type=int, default=1, help="Measure every source this often (interleaved).")
    parser.add_argument(
        "--tfds_encoding",
        default="none",
        help="Comma-separated encodings of the tfds image (tfds.features.Encoding): none (tfds's default: 784 int64 "
        "varints a record), bytes (one 784-byte value), zlib (compressed bytes).",
    )
    parser.add_argument(
        "--cnn_steps",
        type=int,
        default=0,
        help="With --baselines, also time this many DP steps of the paper CNN (batch 256) in every repeat and print "
        "each tfds variant's examples/s over the CNN's, measured in the same repeat.",
    )
    args = parser.parse_args()
    backend = keras_dyndp.keras_backend()
    onednn = os.environ.get("TF_ENABLE_ONEDNN_OPTS", "unset (TensorFlow's default: on)")
    print(f"backend {backend}; {os.cpu_count()} CPUs ({cpu_model()}); load {os.getloadavg()[0]:.1f}; oneDNN {onednn}")
    warm_up = keras_dyndp.poisson_batches(
        np.zeros((100, ROW), np.uint8), np.zeros(100, np.int32), sampling_probability=0.1, map=lambda e: e
    )
    list(batches_of(warm_up))  # the backend's input pipeline started before anything is measured
    print(
        "| backend | N | source | sampler us/step | one batch, ms | ms/batch in the pipeline | examples/s "
        "| RSS growth MB | CPU ms/batch |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for num_examples in (int(size) for size in args.sizes.split(",")):
        path = os.path.join(args.dir, f"keras_dyndp_rows_{num_examples}.npy")
        data_dir = os.path.join(args.dir, f"keras_dyndp_tfds_{num_examples}")
        try:
            offset = write_rows(path, num_examples)
            sampler_us = time_sampler(num_examples)
            ours = {} if args.skip_ours else inputs(path, num_examples, offset, args.before)
            for name, data in [item for _ in range(args.repeats) for item in ours.items()]:
                if args.cold:
                    drop_from_page_cache(path)
                result = time_batches(data, args.batches)
                print(
                    f"| {backend} | {num_examples:,} | {name} | {sampler_us:.0f} | {time_one_batch(data):.2f} | "
                    f"{result['ms']:.2f} | {result['examples_s']:,.0f} | {result['rss']:.0f} | {result['cpu']:.2f} |",
                    flush=True,
                )
            if args.baselines:
                baselines(path, num_examples, args.batches, args.cold, data_dir, args)
        finally:
            if os.path.exists(path):
                os.remove(path)
            shutil.rmtree(data_dir, ignore_errors=True)


def inputs(path: str, num_examples: int, offset: int, before: bool) -> dict:
    """``poisson_batches``' data arguments for the file at ``path``: as a memmap and as two Python sources (with
    ``before``, also the Python sources read as before: one call per batch, in one thread)."""
    scale = lambda element: (element[0].astype(np.float32) / 255, np.int32(element[1]))  # noqa: E731
    safe = {"map": scale, "source_threads": 8}  # os.pread: positional reads, safe from any number of threads
    data = {
        "memmap": {"x": np.load(path, mmap_mode="r"), "y": np.arange(num_examples, dtype=np.int32) % 10},
        "python source": {"x": PreadSource(path, num_examples, offset), **safe},
        "python source, undeclared": {"x": PreadSource(path, num_examples, offset), "map": scale},
        "python source + __getitems__": {"x": BatchedPreadSource(path, num_examples, offset), **safe},
    }
    if before:
        data["python source, read as before"] = {**data["python source"], "previous": True}
        data["python source + __getitems__, read as before"] = {
            **data["python source + __getitems__"],
            "previous": True,
        }
    return data


if __name__ == "__main__":
    main()
