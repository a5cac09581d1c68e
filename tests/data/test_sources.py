"""sources: `keras_dyndp.poisson_batches` from data read on demand (a memmap on disk, a Python random-access source with
and without ``__getitems__``, a per-example ``map``) on the backend Keras runs on: Poisson batches of the same law,
padding, refusals and size as from arrays, O(k) draws at N = 10^7, and resident memory that does not follow N."""

import collections
import concurrent.futures
import contextlib
import importlib.resources
import os
import pathlib
import resource
import subprocess
import sys
import threading
import time
import warnings
import zlib

import numpy as np
import pytest

import keras_dyndp
import keras_dyndp.backend
from keras_dyndp.data import readers
from keras_dyndp.data import sources
from keras_dyndp.data import tfds_reader

N, P = 200, 0.1
JAX = keras_dyndp.keras_backend() == "jax"


def _batches(batches) -> list:
    """The batches of one epoch as numpy ``(x, y, sample_weight)``, on either backend."""
    if JAX:
        return [batches[index] for index in range(len(batches))]
    return [tuple(None if part is None else np.asarray(part) for part in batch) for batch in batches]


def _sampling(batches):
    if JAX:
        return batches.sampling
    from keras_dyndp.tf_backend import data  # pylint: disable=import-outside-toplevel

    return data.poisson_sampling(batches)


def _memmap(tmp_path, num_examples=N, features=3):
    """Row i holds i + 1 in every feature (uint8 wraps, so y identifies rows), written to disk and mapped back."""
    path = str(tmp_path / "x.npy")
    x = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(num_examples, features))
    x[:] = np.arange(1, num_examples + 1, dtype=np.float32)[:, None]
    x.flush()
    del x
    return np.load(path, mmap_mode="r"), np.arange(1, num_examples + 1)


class Source:
    """A random-access source of ``num_examples`` dict elements, counting its reads."""

    def __init__(self, num_examples=N):
        self.num_examples, self.reads = num_examples, 0

    def __len__(self):
        return self.num_examples

    def __getitem__(self, index):
        self.reads += 1
        return {"image": np.full(3, index + 1, np.uint8), "label": index + 1}


class BatchedSource(Source):
    """The same, with ``__getitems__`` (one call per batch)."""

    def __init__(self, num_examples=N):
        super().__init__(num_examples)
        self.calls = []

    def __getitems__(self, indices):
        self.calls.append(list(indices))
        return [{"image": np.full(3, i + 1, np.uint8), "label": i + 1} for i in indices]


def _decode(element):
    return element["image"].astype(np.float32), element["label"]


def _check_batches(batches, num_steps, weights_in=None):
    """Every batch padded to the cap with zero rows of weight 0, rows whole, no example twice; the sizes and
    each example's inclusion count follow Binomial(N, p) and Binomial(steps, p) (5 standard errors, variance 30%)."""
    cap = _sampling(batches).max_batch_size
    counts, sizes = np.zeros(N), []
    for batch_x, batch_y, weights in _batches(batches):
        assert batch_x.shape == (cap, 3) and weights.shape == (cap,)
        real = weights > 0
        assert np.all(batch_x[~real] == 0) and np.all(batch_y[~real] == 0)
        np.testing.assert_array_equal(batch_x[real, 0], batch_y[real])
        assert len(set(batch_y[real])) == real.sum()
        if weights_in is not None:
            np.testing.assert_allclose(weights[real], weights_in[batch_y[real] - 1])
        counts[batch_y[real] - 1] += 1
        sizes.append(real.sum())
    sizes, variance = np.array(sizes), N * P * (1 - P)
    assert abs(sizes.mean() - N * P) < 5 * np.sqrt(variance / num_steps) and 0.7 < sizes.var() / variance < 1.3
    assert np.all(np.abs(counts - num_steps * P) < 5 * np.sqrt(num_steps * P * (1 - P)))
    assert 0.7 < counts.var() / (num_steps * P * (1 - P)) < 1.3


def test_memmap_batches_are_poisson_samples_padded_with_zero_weight_rows(tmp_path):
    x, y = _memmap(tmp_path)
    weights_in = np.linspace(0.5, 2.0, N).astype(np.float32)
    batches = keras_dyndp.poisson_batches(x, y, weights_in, sampling_probability=P, steps_per_epoch=400, seed=0)
    assert _sampling(batches) == keras_dyndp.data.sampling.PoissonSampling(
        N, P, keras_dyndp.core.batch_sizes.default_max_batch_size(N, P)
    )
    _check_batches(batches, 400, weights_in)


@pytest.mark.parametrize("source_class", [Source, BatchedSource])
def test_random_access_sources_with_a_map_give_the_same_batches(source_class):
    source = source_class()
    batches = keras_dyndp.poisson_batches(source, sampling_probability=P, steps_per_epoch=400, seed=0, map=_decode)
    _check_batches(batches, 400)
    if source_class is BatchedSource:  # one read per batch, in increasing index order
        assert len(source.calls) == 400 + 1 and all(call == sorted(call) for call in source.calls)
    else:
        assert 400 * N * P * 0.8 < source.reads < 400 * N * P * 1.2


def test_a_seed_repeats_the_sample_and_a_source_reads_the_memmaps_indices(tmp_path):
    x, y = _memmap(tmp_path)

    def labels(data, **kwargs):
        made = keras_dyndp.poisson_batches(data, sampling_probability=P, steps_per_epoch=5, seed=3, **kwargs)
        return [sorted(batch_y[weights > 0]) for _, batch_y, weights in _batches(made)]

    from_memmap = [sorted(batch_y[w > 0]) for _, batch_y, w in _batches(_memmap_batches(x, y, seed=3))]
    assert from_memmap == labels(Source(), map=_decode) == labels(BatchedSource(), map=_decode)
    assert from_memmap != [sorted(b[w > 0]) for _, b, w in _batches(_memmap_batches(x, y, seed=4))]


def test_a_second_epoch_and_a_resumed_run_replay_no_batch(tmp_path):
    """Resuming (docs/usage.md): a step's sample is a function of (seed, step), fresh at every epoch; a resumed run
    builds its batches with a fresh seed (OS entropy, or research/batches.py's ``derived_seed(seed, start_step,
    stream)``), draws none of the first run's batches, and the same derived seed repeats its own."""
    x, y = _memmap(tmp_path)
    derived = int(np.random.SeedSequence([3, 10, 0]).generate_state(1)[0])  # derived_seed(3, 10, BATCH_STREAM)

    def samples(data, arguments, seed, epochs=1):
        made = keras_dyndp.poisson_batches(data, sampling_probability=P, steps_per_epoch=5, seed=seed, **arguments)
        return [tuple(sorted(b[w > 0])) for _ in range(epochs) for _, b, w in _batches(made)]

    for data, arguments in ((x, {"y": y}), (Source(), {"map": _decode}), (BatchedSource(), {"map": _decode})):
        first = samples(data, arguments, 3, epochs=2)
        assert len(set(first)) == 10  # the second epoch's 5 batches are fresh ones
        resumed = samples(data, arguments, derived)
        assert not set(resumed) & set(first) and resumed == samples(data, arguments, derived)
        assert not set(samples(data, arguments, None)) & set(first)


def _memmap_batches(x, y, **kwargs):
    return keras_dyndp.poisson_batches(x, y, sampling_probability=P, steps_per_epoch=5, **kwargs)


def test_map_applies_to_each_example_of_arrays_and_a_tuple_source_needs_none(tmp_path):
    x, y = _memmap(tmp_path)
    doubled = keras_dyndp.poisson_batches(
        x, y, sampling_probability=P, steps_per_epoch=3, seed=0, map=lambda e: (2 * e[0], e[1])
    )
    for batch_x, batch_y, weights in _batches(doubled):
        np.testing.assert_array_equal(batch_x[weights > 0, 0], 2 * batch_y[weights > 0])
    pairs = [(np.full(3, i + 1, np.float32), i + 1, 0.5) for i in range(N)]  # a list is arrays, not a source
    (batch_x, batch_y, weights), *_ = _batches(
        keras_dyndp.poisson_batches(_Indexable(pairs), sampling_probability=P, seed=0)
    )
    assert set(np.unique(weights)) <= {0.0, 0.5} and np.all(batch_x[weights > 0, 0] == batch_y[weights > 0])


class _Indexable:
    def __init__(self, items):
        self.items = items

    def __len__(self):
        return len(self.items)

    def __getitem__(self, index):
        return self.items[index]


def _scaled_parts(x_i, y_i, weight=None):
    """A map of the parts of a tuple element, as tf.data.Dataset.map takes one."""
    return (2 * np.asarray(x_i, np.float32), y_i) + (() if weight is None else (weight,))


def test_map_takes_a_tuple_elements_parts_as_tf_data_does_or_the_element_whole(tmp_path):
    x, y = _memmap(tmp_path)
    triples = _Indexable([(np.full(3, i + 1, np.float32), i + 1, 0.5) for i in range(N)])
    for data, function in [
        ((x, y), _scaled_parts),  # arrays' (x_i, y_i): map(x_i, y_i) (was a TypeError inside sources)
        ((x, y), lambda pair: (2 * pair[0], pair[1])),  # a function of one argument takes the pair whole
        ((triples,), _scaled_parts),
        ((triples,), lambda *parts: (2 * parts[0], *parts[1:])),
        ((triples,), lambda element: (2 * element[0], *element[1:])),
    ]:
        batches = keras_dyndp.poisson_batches(*data, sampling_probability=P, steps_per_epoch=3, seed=0, map=function)
        for batch_x, batch_y, weights in _batches(batches):
            np.testing.assert_array_equal(batch_x[weights > 0, 0], 2 * batch_y[weights > 0])
    with pytest.raises(ValueError, match=r"`map` takes 2 positional arguments, the parts of a tuple .* is a dict"):
        keras_dyndp.poisson_batches(Source(), sampling_probability=P, map=lambda image, label: (image, label))
    with pytest.raises(ValueError, match="an element here is a tuple of 3: write map"):
        keras_dyndp.poisson_batches(triples, sampling_probability=P, map=lambda x_i, y_i: (x_i, y_i))
    with pytest.raises(ValueError, match="`map` must take the example"):
        keras_dyndp.poisson_batches(triples, sampling_probability=P, map=lambda: None)


def test_padding_to_a_multiple_and_overflow_as_from_arrays(tmp_path, capfd, caplog):
    x, y = _memmap(tmp_path)
    padded = keras_dyndp.poisson_batches(x, y, sampling_probability=P, pad_to_multiple=8, steps_per_epoch=50, seed=1)
    cap = _sampling(padded).max_batch_size
    for batch_x, _, weights in _batches(padded):
        real = int((weights > 0).sum())
        assert len(batch_x) == len(weights) == min(cap, max(8, -(-real // 8) * 8))
        assert np.all(weights[:real] == 1) and np.all(weights[real:] == 0)
    truncated = keras_dyndp.poisson_batches(x, y, sampling_probability=0.5, max_batch_size=10, seed=0)
    assert [int((w > 0).sum()) for _, _, w in _batches(truncated)] == [10, 10]
    assert "truncated to max_batch_size=10" in capfd.readouterr().err + caplog.text
    raising = keras_dyndp.poisson_batches(
        Source(), map=_decode, sampling_probability=0.5, max_batch_size=10, overflow="raise"
    )
    with pytest.raises(Exception, match="larger than max_batch_size=10"):
        _batches(raising)


def test_refusals(tmp_path):
    x, y = _memmap(tmp_path)
    with pytest.raises(ValueError, match="`x` must have num_examples=7 rows. Received: 200"):
        keras_dyndp.poisson_batches(Source(), map=_decode, sampling_probability=P, num_examples=7)
    with pytest.raises(ValueError, match="`x` must have num_examples=7 rows. Received: 200"):
        keras_dyndp.poisson_batches(x, y, sampling_probability=P, num_examples=7)
    with pytest.raises(ValueError, match="same number of rows"):
        keras_dyndp.poisson_batches(x, y[:5], sampling_probability=P)
    with pytest.raises(ValueError, match="leave `y` and `sample_weight` None"):
        keras_dyndp.poisson_batches(Source(), y, sampling_probability=P)
    with pytest.raises(ValueError, match=r"must be tuples \(x, y\) or \(x, y, sample_weight\); pass a per-example"):
        keras_dyndp.poisson_batches(Source(), sampling_probability=P)
    with pytest.raises(ValueError, match="N >= 1"):
        keras_dyndp.poisson_batches(Source(0), sampling_probability=P)
    if hasattr(keras_dyndp.backend.keras_module().utils, "PyDataset"):  # Keras 3: its items are batches
        with pytest.raises(ValueError, match="whose items are batches: poisson_batches samples examples"):
            keras_dyndp.poisson_batches(_batches_class()(), sampling_probability=P)
    with pytest.raises(ValueError, match="`map` must be a function"):
        keras_dyndp.poisson_batches(Source(), sampling_probability=P, map=3)
    with pytest.raises(ValueError, match=r"`sampling_probability` must be in \(0, 1\]"):
        keras_dyndp.poisson_batches(Source(), sampling_probability=0.0, map=_decode)
    for threads in (0, -1, 1.5, True, "2"):
        with pytest.raises(
            ValueError, match=r"`source_threads` must be None \(the package decides\) or an integer >= 1"
        ):
            keras_dyndp.poisson_batches(Source(), sampling_probability=P, map=_decode, source_threads=threads)
    with pytest.raises(ValueError, match="`source_threads` is for a random-access source"):
        keras_dyndp.poisson_batches(x, y, sampling_probability=P, source_threads=2)


def _batches_class():
    """A keras PyDataset of two batches."""
    keras = keras_dyndp.backend.keras_module()
    methods = {"__len__": lambda self: 2, "__getitem__": lambda self, i: (np.ones((4, 3)), np.ones(4))}
    return type("Batches", (keras.utils.PyDataset,), methods)


def test_what_is_read_on_demand():
    memory = np.zeros((4, 2))
    assert not sources.is_lazy_array(memory) and not sources.is_random_access(memory)
    assert sources.is_random_access(Source()) and not sources.is_random_access([memory])
    assert sources.rows(memory, memory[:, 0], None, None, lambda *a: 4) is None  # arrays stay on today's path


def test_the_draw_is_poisson_at_ten_million_examples_in_o_of_k():
    num_examples, p, steps = 10**7, 256 / 10**7, 2000
    rng = np.random.default_rng(0)
    draws = [sources.draw(rng, num_examples, p, 10**6) for _ in range(steps)]
    sizes = np.array([k for k, _ in draws])
    assert all(len(chosen) == k == len(np.unique(chosen)) for k, chosen in draws)
    mean, variance = num_examples * p, num_examples * p * (1 - p)
    assert abs(sizes.mean() - mean) < 5 * np.sqrt(variance / steps) and 0.85 < sizes.var() / variance < 1.15
    # Inclusion ~ p for every example: the counts of 1000 bins of 10^4 examples are Binomial-like.
    chosen = np.concatenate([c for _, c in draws])
    bins = np.bincount(chosen // 10**4, minlength=1000)
    expected = steps * p * 10**4
    assert np.all(np.abs(bins - expected) < 6 * np.sqrt(expected)) and 0.8 < bins.var() / expected < 1.2
    # Independence across steps: consecutive batches share about k^2 / N examples (6.6e-3 each).
    shared = [len(np.intersect1d(a, b)) for (_, a), (_, b) in zip(draws, draws[1:])]
    assert np.mean(shared) < 0.05
    overflow, kept = sources.draw(np.random.default_rng(1), 1000, 0.5, 10)
    assert overflow > 10 and len(kept) == 10


def test_resident_memory_does_not_grow_with_the_memmap(tmp_path):
    num_examples, features = 100_000, 2048  # 205 MB on disk
    path = str(tmp_path / "big.npy")
    x = np.lib.format.open_memmap(path, mode="w+", dtype=np.uint8, shape=(num_examples, features))
    x[::1000] = 1  # a sparse file: little written, the rest zeros
    x.flush()
    del x
    x, y = np.load(path, mmap_mode="r"), np.zeros(num_examples, np.int32)
    _batches(keras_dyndp.poisson_batches(x[:1000], y[:1000], sampling_probability=0.1, seed=0))  # warms up
    before = _rss_bytes()
    batches = keras_dyndp.poisson_batches(x, y, sampling_probability=256 / num_examples, steps_per_epoch=20, seed=0)
    assert len(_batches(batches)) == 20
    assert _rss_bytes() - before < 50e6  # the file is 205 MB; 20 batches read about 10 MB of it


def _rss_bytes() -> float:
    with open(f"/proc/{os.getpid()}/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize()


@pytest.mark.parametrize("data", ["memmap", "source"])
def test_fit_trains_on_data_read_on_demand_at_the_schedules_rate(tmp_path, data):
    keras = keras_dyndp.backend.keras_module()
    x, y = _memmap(tmp_path)
    model = keras_dyndp.make_private(keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]))
    optimizer = keras_dyndp.DynamicDPKerasSGD(
        schedule=keras_dyndp.DPSchedule(np.ones(10), np.ones(10), P), expected_batch_size=N * P, learning_rate=0.01
    )
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    model.compile(optimizer=optimizer, loss=loss)
    binary = lambda element: (element["image"].astype(np.float32) / 255, np.int32(element["label"] % 2))  # noqa: E731
    arguments = dict(sampling_probability=P, steps_per_epoch=3, seed=0)
    if data == "memmap":
        batches = keras_dyndp.poisson_batches(x, (y % 2).astype(np.int32), **arguments)
    else:
        batches = keras_dyndp.poisson_batches(BatchedSource(), map=binary, **arguments)
    with warnings.catch_warnings():
        warnings.simplefilter("error", keras_dyndp.SamplingWarning)
        model.fit(batches, verbose=0)
    assert int(np.asarray(optimizer.dp_step)) == 3
    other_rate = keras_dyndp.poisson_batches(BatchedSource(), map=binary, sampling_probability=0.2, steps_per_epoch=1)
    with pytest.raises(ValueError, match=r"sampled at p=0.2, but the optimizer's schedule is accounted at p=0.1"):
        model.fit(other_rate, verbose=0)


class LazyArray:
    """An h5py / zarr-like array-like: ``shape``, ``dtype`` and a ``__getitem__`` of increasing integer arrays,
    counting the rows it reads."""

    def __init__(self, values):
        self.values, self.rows_read = values, 0
        self.shape, self.dtype = values.shape, values.dtype

    def __len__(self):
        return len(self.values)

    def __getitem__(self, indices):
        indices = np.asarray(indices)
        assert indices.ndim == 1 and np.all(np.diff(indices) > 0)  # what h5py requires
        self.rows_read += len(indices)
        return self.values[indices]


def test_an_array_like_is_read_only_at_the_sampled_rows():
    num_examples = 10_000
    values = np.arange(1, num_examples + 1, dtype=np.float32)[:, None] * np.ones(3, np.float32)
    x = LazyArray(values)
    batches = keras_dyndp.poisson_batches(x, np.arange(1, num_examples + 1), sampling_probability=0.01, seed=0)
    real_rows = 0
    for _ in range(2):  # every epoch resamples
        for batch_x, batch_y, weights in _batches(batches):
            real = weights > 0
            np.testing.assert_array_equal(batch_x[real], values[batch_y[real] - 1])
            real_rows += int(real.sum())
    assert x.rows_read == real_rows + 1  # the sampled rows and one example read for the shapes: not all N


def test_an_h5py_dataset_is_read_by_index(tmp_path):
    h5py = pytest.importorskip("h5py")
    with h5py.File(tmp_path / "data.h5", "w") as file:
        file["x"] = np.arange(1, N + 1, dtype=np.float32)[:, None] * np.ones(3, np.float32)
        file["y"] = np.arange(1, N + 1)
    with h5py.File(tmp_path / "data.h5", "r") as file:
        batches = keras_dyndp.poisson_batches(file["x"], file["y"], sampling_probability=P, steps_per_epoch=400, seed=0)
        _check_batches(batches, 400)


def _tfds_source(data_dir, encoding="none"):
    """A ``tfds.data_source`` (ArrayRecord files, built here) of N examples {"image": [i + 1] * 3, "label": i + 1}, the
    image stored with tfds's ``encoding`` ("none": 3 floats, "bytes": their bytes, "zlib": compressed)."""
    tfds = pytest.importorskip("tensorflow_datasets")
    pytest.importorskip("array_record")
    tf = pytest.importorskip("tensorflow")
    # tensorflow_datasets 4.9 imports the importlib_resources backport, which the stdlib module replaces.
    sys.modules.setdefault("importlib_resources", importlib.resources)
    examples = tf.data.Dataset.range(1, N + 1).map(
        lambda i: {"image": tf.fill([3], tf.cast(i, tf.float32)), "label": i}
    )
    features = tfds.features.FeaturesDict(
        {
            "image": tfds.features.Tensor(shape=(3,), dtype=np.float32, encoding=encoding),
            "label": tfds.features.Scalar(dtype=np.int64),
        }
    )
    tfds.dataset_builders.store_as_tfds_dataset(
        name="rows",
        version="1.0.0",
        data_dir=str(data_dir),
        split_datasets={"train": examples},
        features=features,
        file_format="array_record",
        disable_shuffling=False,
    )
    return tfds.data_source("rows", split="train", data_dir=str(data_dir), download=False)


# tfds 4.9's ArrayRecord files of `_tfds_source` (its N examples, encodings "none" and "bytes"), kept so that every
# stack reads them, JAX's without TensorFlow too (building them takes tf.data).
_TFDS_FILES = pathlib.Path(__file__).parent / "tfds"


@pytest.mark.parametrize("encoding", ["none", "bytes"])
def test_tfds_files_are_read_as_tfds_reads_them_on_every_backend(encoding):
    tfds = pytest.importorskip("tensorflow_datasets")
    pytest.importorskip("array_record")
    sys.modules.setdefault("importlib_resources", importlib.resources)
    data_dir = str(_TFDS_FILES / encoding)
    source = tfds.data_source("rows", split="train", data_dir=data_dir, download=False)
    assert len(source) == N and source[0]["image"].dtype == np.float32
    batches = keras_dyndp.poisson_batches(
        source, sampling_probability=P, steps_per_epoch=400, seed=0, map=lambda e: (e["image"], e["label"])
    )
    _check_batches(batches, 400)
    # Read and parsed a batch at a time (by TensorFlow where it is imported, else by protobuf), decoded by column.
    fetch = tfds_reader.tfds_fetcher(source, contextlib.nullcontext())
    everything = list(range(N))
    assert fetch is not None and all(map(tfds_reader._same_nest, fetch(everything), source.__getitems__(everything)))


@pytest.mark.parametrize("encoding", ["none", "bytes"])
def test_without_tensorflow_tfds_records_are_parsed_by_protobuf_into_the_columns_tensorflow_parses(encoding):
    tfds = pytest.importorskip("tensorflow_datasets")
    pytest.importorskip("array_record")
    sys.modules.setdefault("importlib_resources", importlib.resources)
    source = tfds.data_source("rows", split="train", data_dir=str(_TFDS_FILES / encoding), download=False)
    features, everything = source.dataset_info.features, list(range(N))
    columns = tfds_reader._protobuf_parser(features)(source.data_source.__getitems__(everything))
    labels = [source[i]["label"] for i in everything]
    assert columns["label"].dtype == np.int64 and columns["label"].tolist() == labels
    if encoding == "none":
        assert columns["image"].dtype == np.float32 and columns["image"].shape == (N, 3)
        np.testing.assert_array_equal(columns["image"], [source[i]["image"] for i in everything])
    else:  # one bytes value an example, decoded by `_column_decoder`
        assert columns["image"].dtype == object and columns["image"].shape == (N,)
        assert [np.frombuffer(value, np.float32).tolist() for value in columns["image"]] == [
            [label] * 3 for label in labels
        ]
    if "tensorflow" in sys.modules:  # the same columns as TensorFlow's parse, cast to the dtypes tfds stores
        parsed = tfds_reader._tensorflow_parser(features, sys.modules["tensorflow"])(
            source.data_source.__getitems__(everything)
        )
        assert parsed.keys() == columns.keys()
        for key, column in columns.items():
            np.testing.assert_array_equal(parsed[key].astype(column.dtype), column)


def test_protobuf_parsing_refuses_records_that_are_not_what_the_features_say():
    tfds = pytest.importorskip("tensorflow_datasets")
    pytest.importorskip("array_record")
    sys.modules.setdefault("importlib_resources", importlib.resources)
    from tensorflow_datasets.proto import tf_example_pb2

    source = tfds.data_source("rows", split="train", data_dir=str(_TFDS_FILES / "none"), download=False)
    parse = tfds_reader._protobuf_parser(source.dataset_info.features)

    def record(image=None, label=None, image_kind="float_list"):
        example = tf_example_pb2.Example()
        if image is not None:
            getattr(example.features.feature["image"], image_kind).value.extend(image)
        if label is not None:
            example.features.feature["label"].int64_list.value.append(label)
        return example.SerializeToString()

    assert parse([record([1.0, 2.0, 3.0], 7)])["label"].tolist() == [7]
    too_short = r"'image' of shape \(3,\) holds 3 values an example in its records; records of this batch hold \[2, 3\]"
    with pytest.raises(ValueError, match=too_short):  # one record short: joined, rows would shift
        parse([record([1.0, 2.0, 3.0], 7), record([1.0, 2.0], 8)])
    with pytest.raises(ValueError, match=r"'label' of shape \(\) .* hold \[0\] in a int64_list"):  # missing
        parse([record([1.0, 2.0, 3.0])])
    with pytest.raises(ValueError, match=r"'image' .* hold \[0\] in a float_list"):  # stored as another kind
        parse([record([1, 2, 3], 7, image_kind="int64_list")])
    variable = tfds.features.FeaturesDict({"image": tfds.features.Tensor(shape=(None,), dtype=np.float32)})
    assert tfds_reader._protobuf_parser(variable) is None  # of no fixed shape: tfds reads them


def test_a_tfds_data_source_with_a_map(tmp_path):
    source = _tfds_source(tmp_path)
    assert len(source) == N and hasattr(source, "__getitems__")
    batches = keras_dyndp.poisson_batches(
        source, sampling_probability=P, steps_per_epoch=400, seed=0, map=lambda e: (e["image"], e["label"])
    )
    _check_batches(batches, 400)


@pytest.mark.parametrize("encoding", ["none", "bytes", "zlib"])
def test_a_tfds_data_source_is_parsed_a_batch_at_a_time_into_the_elements_tfds_returns(tmp_path, encoding):
    source = _tfds_source(tmp_path, encoding)
    assert readers.known_thread_safe(source) and readers.known_thread_safe(source.data_source)  # read in parallel
    fetch = tfds_reader.tfds_fetcher(source, contextlib.nullcontext())
    assert fetch is not None  # records of fixed-length features, no decoders, TensorFlow imported
    features = source.dataset_info.features
    serialized = sys.modules["tensorflow_datasets"].core.utils.flatten_nest_dict(features.get_serialized_info())
    assert all(tfds_reader._column_decoder(features[key], serialized[key]) for key in features)  # decoded by column
    positions = [0, 3, 17, 18, 150, N - 1]
    elements = fetch(positions)
    assert all(map(tfds_reader._same_nest, elements, source.__getitems__(positions)))
    assert isinstance(elements[1]["label"], int) and elements[1]["image"].dtype == np.float32
    assert elements[1]["image"].flags.writeable == source[3]["image"].flags.writeable  # bytes: read-only, as tfds's
    batches = keras_dyndp.poisson_batches(
        source, sampling_probability=P, steps_per_epoch=400, seed=0, map=lambda e: (e["image"], e["label"])
    )
    _check_batches(batches, 400)
    source.decoders = {"image": object()}  # decoders (a tfds setting): tfds decodes
    assert tfds_reader.tfds_fetcher(source, contextlib.nullcontext()) is None


def test_tfds_features_decoded_by_column_are_fixed_shape_tensors_stored_as_themselves_or_as_bytes():
    tfds = pytest.importorskip("tensorflow_datasets")
    features = tfds.features

    def decoder(feature):
        return tfds_reader._column_decoder(feature, feature.get_serialized_info())

    assert decoder(features.Tensor(shape=(2, 3), dtype=np.int32)) and decoder(features.ClassLabel(num_classes=3))
    assert decoder(features.Tensor(shape=(4,), dtype=np.uint64, encoding="zlib"))
    column = np.array([np.arange(4, dtype=np.uint64).tobytes(), np.arange(4, 8, dtype=np.uint64).tobytes()], object)
    np.testing.assert_array_equal(
        decoder(features.Tensor(shape=(2, 2), dtype=np.uint64, encoding="bytes"))(column),
        [[[0, 1], [2, 3]], [[4, 5], [6, 7]]],
    )
    # One record a byte long and the next a byte short: joined, they would fill the two rows with shifted bytes.
    uneven = np.array([bytes(range(5)), bytes(range(5, 8))], object)
    for encoding, column in (("bytes", uneven), ("zlib", np.array([zlib.compress(v) for v in uneven], object))):
        with pytest.raises(ValueError, match=r"holds 4 bytes an example; records of this batch hold \[3, 5\]"):
            decoder(features.Tensor(shape=(4,), dtype=np.uint8, encoding=encoding))(column)
    # Of no fixed shape, a bytes scalar, not a Tensor: tfds decodes them one by one.
    assert not decoder(features.Tensor(shape=(None,), dtype=np.float32))
    assert not decoder(features.Tensor(shape=(), dtype=np.float32, encoding="bytes"))
    assert not decoder(features.Image(shape=(4, 4, 1))) and not decoder(features.Text())
    # Stored under other keys.
    assert not tfds_reader._column_decoder(features.Tensor(shape=(2,), dtype=np.float32), None)


def test_a_tfds_data_source_s_array_record_files_are_read_by_key_from_every_thread_as_its_records():
    tfds = pytest.importorskip("tensorflow_datasets")
    pytest.importorskip("array_record")
    sys.modules.setdefault("importlib_resources", importlib.resources)
    data_dir = str(_TFDS_FILES / "none")
    source = tfds.data_source("rows", split="train", data_dir=data_dir, download=False)
    part = tfds.data_source("rows", split="train[7:150]", data_dir=data_dir, download=False)  # skips records
    for data in (source, part):
        files = tfds_reader._ArrayRecordFiles.of(data)
        assert files is not None  # ArrayRecord files, read with readers of our own
        everything = list(range(len(data)))
        assert files(everything) == list(data.data_source.__getitems__(everything))
        expected = [list(data.data_source.__getitems__(everything[start::4])) for start in range(4)]
        with concurrent.futures.ThreadPoolExecutor(4) as pool:  # a set of readers per thread: no seek interleaves
            reads = list(pool.map(files, [everything[start::4] for start in range(4)] * 8))
        assert reads == expected * 8
    # Records split over several files (as tfds shards them): each key read from its file at its offset.
    instruction = source.dataset_info.splits["train"].file_instructions[0]
    shards = [instruction.replace(skip=skip, take=take) for skip, take in ((0, 120), (120, N - 120))]
    everything = list(range(N))
    shuffled = np.random.default_rng(0).permutation(N).tolist()
    files = tfds_reader._ArrayRecordFiles(shards, tfds_reader._ArrayRecordFiles.of(source).reader_class)
    assert files(everything) == list(source.data_source.__getitems__(everything))
    assert files(shuffled) == list(source.data_source.__getitems__(shuffled))
    assert tfds_reader._ArrayRecordFiles.of(type("Other", (), {})()) is None  # anything else: the source's own reads


def test_a_batch_of_64_or_more_is_read_in_chunks_by_several_threads_unless_the_source_reads_batches():
    reads, lock = [], threading.Lock()

    class Recording(Source):
        def __getitem__(self, index):
            with lock:
                reads.append((threading.get_ident(), index))
            return super().__getitem__(index)

    positions = sorted(np.random.default_rng(0).choice(N, 150, replace=False).tolist())
    elements = readers.chunked_fetcher(Recording(), 8, contextlib.nullcontext())(positions).elements()
    assert [element["label"] for element in elements] == [position + 1 for position in positions]
    assert sorted(index for _, index in reads) == positions
    assert reads[0] == (threading.get_ident(), positions[0])  # the first, on the calling thread, gives the columns
    del reads[0]
    threads = {thread for thread, _ in reads}
    assert threading.get_ident() not in threads
    for thread in threads:  # each thread reads in increasing order (its chunks, taken in order)
        indices = [index for reader, index in reads if reader == thread]
        assert indices == sorted(indices)
    reads.clear()
    readers.chunked_fetcher(Recording(), 8, contextlib.nullcontext())(positions[:63])
    assert {thread for thread, _ in reads} == {threading.get_ident()}  # fewer than 64: no threads
    source = BatchedSource()
    readers.chunked_fetcher(source, 8, contextlib.nullcontext())(positions)
    assert source.calls == [positions]  # __getitems__: one call a batch


def test_draws_are_numbered_so_none_repeats_and_a_seed_repeats_them():
    first, again = sources.DrawCounter(5), sources.DrawCounter(5)
    values = [first.next_generator().integers(2**62) for _ in range(3)]
    assert values == [again.next_generator().integers(2**62) for _ in range(3)]
    assert len(set(values)) == 3 and first.draws == 3  # the state: (seed, draws)
    assert sources.DrawCounter(6).next_generator().integers(2**62) != values[0]


@pytest.mark.skipif(not JAX, reason="JAX's processes")
def test_each_jax_process_reads_only_its_share_of_the_global_sample(monkeypatch):
    import jax  # pylint: disable=import-outside-toplevel

    from keras_dyndp.jax_backend import distribution  # pylint: disable=import-outside-toplevel

    monkeypatch.setattr(jax, "process_count", lambda: 2)
    monkeypatch.setattr(jax, "device_count", lambda: 2)
    monkeypatch.setattr(distribution, "check_same_data", lambda arrays: None)  # a collective: tests/jax_backend
    shares = []
    for index in range(2):  # Process `index` of 2, from the same seed.
        monkeypatch.setattr(jax, "process_index", lambda index=index: index)
        source = BatchedSource()
        batches = keras_dyndp.poisson_batches(source, map=_decode, sampling_probability=P, steps_per_epoch=5, seed=3)
        assert batches.workers == 1
        source.calls.clear()  # The first example and the rows compared across processes.
        for step in range(5):
            batch = batches[step]  # An empty share reads nothing.
            shares.append((index, step, batch, source.calls.pop() if source.calls else []))
    cap = batches.max_batch_size
    for step in range(5):
        (_, _, first, first_reads), (_, _, second, second_reads) = (s for s in shares if s[1] == step)
        _, chosen = sources.draw(np.random.default_rng([3, step]), N, P, cap)
        assert len(first[0]) == len(second[0]) == cap // 2
        assert not set(first_reads) & set(second_reads)
        assert sorted(first_reads + second_reads) == sorted(chosen)  # the global sample, each row read once
        assert first_reads == sorted(chosen[: cap // 2])  # process 0's share, read in increasing order
        for (_, y, weights), reads in ((first, first_reads), (second, second_reads)):
            np.testing.assert_array_equal(y[weights > 0], np.asarray(reads) + 1)
    batches.workers = 2
    with pytest.raises(ValueError, match="with workers=2 the processes could number their draws differently"):
        batches[0]


@pytest.mark.skipif(JAX, reason="TensorFlow's workers")
def test_a_tensorflow_worker_reads_only_its_share_of_the_global_sample(monkeypatch):
    from keras_dyndp.tf_backend import distribution  # pylint: disable=import-outside-toplevel

    np.testing.assert_array_equal(distribution.worker_share(8, (1, 2), 4), [2, 3, 6, 7])  # parts 1 and 3 of 4
    np.testing.assert_array_equal(distribution.worker_share(6, (0, 1), 2), np.arange(6))
    monkeypatch.setattr(distribution, "input_pipeline", lambda: (0, 2))  # worker 0 of 2 (tests/multi_worker_job.py)
    monkeypatch.setattr(distribution, "num_replicas", lambda: 2)
    source = BatchedSource()
    batches = keras_dyndp.poisson_batches(source, map=_decode, sampling_probability=P, steps_per_epoch=5, seed=3)
    source.calls.clear()  # The first example, read to learn the shapes.
    fed = []
    for _, y, weights in _batches(batches):
        real = weights > 0
        assert not real[len(weights) // 2 :].any()  # worker 1's half: zeros of weight 0, not read
        fed += list(y[real] - 1)
    assert fed and sorted(sum(source.calls, [])) == sorted(fed)  # read once each, only where fed


@pytest.mark.skipif(JAX, reason="TensorFlow's replicas")
def test_rows_are_a_multiple_of_the_replicas_and_a_dataset_takes_no_map(tmp_path):
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    x, y = _memmap(tmp_path)
    devices = [device.name for device in tf.config.list_logical_devices("CPU")][:2]
    with tf.distribute.MirroredStrategy(devices, cross_device_ops=tf.distribute.ReductionToOneDevice()).scope():
        batches = keras_dyndp.poisson_batches(
            x, y, sampling_probability=P, steps_per_epoch=20, seed=0, pad_to_multiple=3
        )
    assert _sampling(batches).pad_to_multiple == 6 and _sampling(batches).max_batch_size % 2 == 0
    assert all(len(w) % 6 == 0 for _, _, w in _batches(batches))
    with pytest.raises(ValueError, match="map a tf.data.Dataset `x` with its own .map"):
        keras_dyndp.poisson_batches(tf.data.Dataset.from_tensor_slices((y, y)), sampling_probability=P, map=_decode)


ROW_BYTES = 16


class SeekReadSource:
    """A source that is not thread-safe, as users write them: one file object, seek then read (a yield between
    provokes the race). Row i holds i (int32, 4 times); the label is the index asked for, so a row read by a
    concurrent seek holds another example's bytes under this example's label."""

    def __init__(self, path):
        self.file, self.num_examples = open(path, "rb"), os.path.getsize(path) // ROW_BYTES

    def __len__(self):
        return self.num_examples

    def __getitem__(self, index):
        self.file.seek(index * ROW_BYTES)
        os.sched_yield()
        row = self.file.read(ROW_BYTES)
        return np.frombuffer(row, np.int32).copy(), np.int32(index)


def _seek_read_source(tmp_path, num_examples=400):
    path = tmp_path / "rows.bin"
    path.write_bytes(np.repeat(np.arange(num_examples, dtype=np.int32), ROW_BYTES // 4).tobytes())
    return SeekReadSource(str(path))


def test_a_source_not_known_thread_safe_is_read_one_call_at_a_time_so_rows_hold_their_examples(tmp_path):
    source = _seek_read_source(tmp_path)
    batches = keras_dyndp.poisson_batches(source, sampling_probability=0.4, steps_per_epoch=12, seed=0)
    for x, y, weights in _batches(batches):  # ~160 examples a batch: 8 threads a batch, and batches in parallel
        kept = np.asarray(weights) > 0
        x, y = np.asarray(x)[kept], np.asarray(y)[kept]
        assert (x == y[:, None]).all()  # row i holds example i's bytes
        assert len(np.unique(x[:, 0])) == len(x)  # no example twice


class ConcurrencyCounter:
    """A source that records how many of its calls ran at once at most."""

    def __init__(self):
        self.active = self.most = 0
        self.lock = threading.Lock()

    def __len__(self):
        return N

    def __getitem__(self, index):
        with self.lock:
            self.active += 1
            self.most = max(self.most, self.active)
        time.sleep(0.0005)
        with self.lock:
            self.active -= 1
        return np.float32(index), np.int32(index)


@pytest.mark.parametrize("threads, most", [(None, 1), (1, 1), (2, 2), (8, 8)])
def test_calls_of_a_source_hold_its_lock_or_at_most_the_declared_threads_across_batches(threads, most):
    source = ConcurrencyCounter()
    rows = sources.source_rows(source, None, threads)
    indices = np.arange(150)  # 4 chunks a batch, 3 batches at once
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        for x, _, _ in pool.map(lambda _: rows.read(indices), range(3)):
            assert (x == indices).all()
    assert source.most <= most and (most == 1 or source.most > 1)


def test_known_thread_safe_sources_are_tfds_and_array_record_ones():
    assert not readers.known_thread_safe(Source()) and not readers.known_thread_safe(ConcurrencyCounter())
    for module in ("grain._src.python.data_sources", "array_record.python.array_record_data_source"):
        assert readers.known_thread_safe(type("ArrayRecordDataSource", (), {"__module__": module})())
    assert readers.known_thread_safe(type("DataSource", (), {"__module__": "tensorflow_datasets.core"})())
    assert not readers.known_thread_safe(type("ArrayRecordDataSource", (), {"__module__": "mine"})())


def test_a_big_endian_memmap_is_read_as_its_values(tmp_path):
    path = str(tmp_path / "big_endian.npy")
    np.save(path, np.arange(N * 3, dtype=">f4").reshape(N, 3))  # TensorFlow's pipeline read its bytes as native
    batches = keras_dyndp.poisson_batches(np.load(path, mmap_mode="r"), np.arange(N), sampling_probability=P, seed=0)
    for x, y, weights in _batches(batches)[:3]:
        kept = np.asarray(weights) > 0
        np.testing.assert_array_equal(np.asarray(x)[kept], 3 * np.asarray(y)[kept][:, None] + np.arange(3))


class ListSource(_Indexable):
    """A random-access source of the given elements, with ``__getitems__`` returning only the first's."""

    def __getitems__(self, indices):
        return [self.items[indices[0]]]


def test_a_short_read_and_elements_of_other_nests_are_refused_not_broadcast_or_cut():
    short = sources.Rows(N, lambda indices: (np.arange(1), np.arange(1), np.ones(1, np.float32)))
    with pytest.raises(ValueError, match=r"Reading 5 examples of `x` gave \[1\] rows: .* one element per index"):
        short.read(np.arange(5))  # padded, the one row read would have filled all 5
    elements = [(np.float32(i), i) for i in range(N)]
    with pytest.raises(ValueError, match="one element per index"):
        sources.source_rows(ListSource(elements), None).read(np.arange(5))
    lists = [([np.float32(i)] * (1 + i % 2), i) for i in range(N)]  # zip kept only each list's first item
    with pytest.raises(ValueError, match=r"same shapes: Nests of different structures: \[\['\*'\], \['\*', '\*'\]"):
        sources.source_rows(lists, None).read(np.arange(2))
    dicts = [({"a" if i else "b": np.float32(i)}, i) for i in range(N)]
    with pytest.raises(ValueError, match="Nests of different structures"):
        sources.source_rows(dicts, None).read(np.arange(2))


def test_a_weight_of_none_is_one_and_text_labels_are_numpy_strings():
    elements = [(np.float32(i), str(i).encode(), None) for i in range(N)]
    x, y, weights = sources.source_rows(elements, None).read(np.arange(3))
    np.testing.assert_array_equal(weights, np.ones(3))  # np.float32(None) is nan
    assert y.dtype == np.dtype("S1") and y.tolist() == [b"0", b"1", b"2"]
    objects = [(np.float32(i), np.asarray(str(i).encode(), object)) for i in range(N)]  # TF string tensors in numpy
    batch_x, batch_y, _ = sources.source_rows(objects, None).batch(np.array([7, 3]), 4)
    assert batch_y.tolist() == [b"3", b"7", b"", b""]  # padding an object array gave int 0, which TF refuses


def test_examples_of_other_shapes_or_dtypes_than_example_0_are_refused_naming_both():
    shapes = [(np.zeros(1 if i == 0 else 3, np.float32), i) for i in range(N)]  # a batch without example 0 stacks
    with pytest.raises(ValueError, match=r"shapes and dtypes of example 0: it has shape \(1,\) and dtype float32, "):
        sources.source_rows(shapes, None).read(np.arange(1, 5))
    labels = [(np.float32(i), 0 if i == 0 else 0.5) for i in range(N)]
    with pytest.raises(ValueError, match=r"dtype int64, others \(\) and float64. Pad, crop or cast them in `map`"):
        sources.source_rows(labels, None).read(np.arange(1, 5))
    text = [(np.float32(i), "x" * (1 + i % 4)) for i in range(N)]  # text of any length
    assert sources.source_rows(text, None).read(np.arange(1, 5))[1].tolist() == ["xx", "xxx", "xxxx", "x"]


def test_a_source_whose_getitems_returns_no_element_is_refused_when_poisson_batches_reads_example_0():
    with pytest.raises(ValueError, match=r"Reading 1 examples of `x` gave \[0\] rows"):  # was an IndexError
        keras_dyndp.poisson_batches(
            type("Empty", (ListSource,), {"__getitems__": lambda self, i: []})([(1, 2)]), sampling_probability=P
        )


class LabelIndexed:
    """A pandas-like column (its module is pandas'): in memory, shuffled, ``column[keys]`` indexing by label."""

    __module__ = "pandas.core.series"

    def __init__(self, values, labels):
        self.values, self.labels, self.shape = values, list(labels), values.shape

    def __len__(self):
        return len(self.values)

    def __array__(self, dtype=None, copy=None):
        return self.values

    def __getitem__(self, keys):
        return self.values[[self.labels.index(key) for key in np.atleast_1d(keys)]]


def test_in_memory_tensors_and_label_indexed_columns_with_a_map_are_read_by_position():
    if JAX:
        tensor = sys.modules["jax"].numpy.arange(N, dtype=np.float32)
    else:
        tensor = sys.modules["tensorflow"].range(N, dtype="float32")  # took no index array
    order = np.random.default_rng(0).permutation(N)
    shuffled = LabelIndexed(np.arange(N, dtype=np.float32)[order], order[::-1])  # read by label: another's x
    for x in (tensor, shuffled):
        batches = keras_dyndp.poisson_batches(x, np.asarray(x), sampling_probability=P, seed=0, map=lambda e: e)
        for batch_x, batch_y, weights in _batches(batches)[:3]:
            kept = np.asarray(weights) > 0
            np.testing.assert_array_equal(np.asarray(batch_x)[kept], np.asarray(batch_y)[kept])


def test_a_scipy_sparse_matrix_is_read_as_its_dense_rows():
    sparse = pytest.importorskip("scipy.sparse")
    x = sparse.csr_matrix(np.eye(N, dtype=np.float32))  # its rows: a sparse matrix, np.asarray of it a 0-d array
    for batch_x, batch_y, weights in _batches(keras_dyndp.poisson_batches(x, np.arange(N), sampling_probability=P)):
        kept = np.asarray(weights) > 0
        np.testing.assert_array_equal(np.asarray(batch_x)[kept], np.eye(N)[np.asarray(batch_y)[kept]])
    with pytest.raises(ValueError, match=r"Reading 1 examples of `x` gave \[1, None\] rows"):
        sources.Rows(N, lambda indices: (np.float32(1), None, np.ones(1, np.float32)))


def test_a_map_of_arrays_returning_a_weight_is_refused_not_ignored(tmp_path):
    x, y = _memmap(tmp_path)
    with pytest.raises(ValueError, match=r"a weight it returned would be ignored: pass per-example weights as `samp"):
        keras_dyndp.poisson_batches(x, y, sampling_probability=P, map=lambda e: (e[0], e[1], np.float32(0.25)))


Point = collections.namedtuple("Point", "a b")


def test_namedtuples_of_memmaps_and_in_source_elements_keep_their_fields(tmp_path):
    x, y = _memmap(tmp_path)
    elements = [(Point(np.float32(i), np.full(2, i)), i) for i in range(N)]
    batch_x, batch_y, _ = sources.source_rows(elements, None).batch(np.array([7, 3]), 4)
    assert (
        isinstance(batch_x, Point) and batch_x.a.tolist() == [3, 7, 0, 0] and batch_x.b[:, 1].tolist() == [3, 7, 0, 0]
    )
    batch_x, batch_y, _ = sources.array_rows(Point(x, x), y, None, None, N).batch(np.array([7, 3]), 2)
    assert isinstance(batch_x, Point) and batch_x.b[:, 0].tolist() == batch_y.tolist() == [4, 8]  # was a TypeError
    with pytest.raises(ValueError, match=r"Nests of different structures: \[\('\*', '\*'\), \['\*'\]\]"):
        readers.map_nest(np.add, Point(1, 2), [1])


class ReusedBuffer:
    """A source that fills one buffer of its own and returns it for every example."""

    def __init__(self):
        self.buffer = np.zeros(3, np.float32)

    def __len__(self):
        return N

    def __getitem__(self, index):
        self.buffer[:] = index
        return self.buffer, index


def test_a_source_returning_a_buffer_it_reuses_gives_each_row_its_own_example():
    batches = keras_dyndp.poisson_batches(ReusedBuffer(), sampling_probability=0.3, seed=0, steps_per_epoch=3)
    for x, y, weights in _batches(batches):
        kept = np.asarray(weights) > 0
        np.testing.assert_array_equal(np.asarray(x)[kept][:, 0], np.asarray(y)[kept])  # was the last read in every row


class ReadOnlyViews:
    """A source with a decode buffer of its own, refilled at each read (``__getitem__``: one example's;
    ``__getitems__``: the batch's), returning read-only views of it, as a reader that decodes into one buffer does."""

    def __init__(self, batched):
        self.buffer = np.zeros((N, 3), np.float32)
        if batched:
            self.__getitems__ = self._getitems

    def __len__(self):
        return N

    def _view(self, row):
        view = self.buffer[row].view()
        view.flags.writeable = False
        return view

    def __getitem__(self, index):
        self.buffer[0] = index
        return self._view(0), index

    def _getitems(self, indices):
        self.buffer[: len(indices)] = np.asarray(indices)[:, None]
        return [(self._view(row), index) for row, index in enumerate(indices)]


def _decoded_slowly(element):
    time.sleep(0.002)  # a map that decodes (releasing the GIL) while another batch reads the source
    return element


def _read_concurrently(batches, num_batches):
    """``num_batches`` batches of ``batches``, several read at once: TensorFlow's pipeline makes them in parallel calls;
    JAX's batches are read by a pool of threads, as its reader threads do."""
    if not JAX:
        return _batches(batches)[:num_batches]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        return list(pool.map(batches.__getitem__, range(num_batches)))


@pytest.mark.parametrize("map_fn", [None, _decoded_slowly], ids=["no map", "map"])
@pytest.mark.parametrize("batched", [False, True], ids=["getitem", "getitems"])
def test_a_source_returning_read_only_views_of_a_buffer_it_refills_gives_each_row_its_own_example(batched, map_fn):
    batches = keras_dyndp.poisson_batches(
        ReadOnlyViews(batched), sampling_probability=0.1, seed=0, steps_per_epoch=8, map=map_fn
    )
    for x, y, weights in _read_concurrently(batches, 8):
        kept = np.asarray(weights) > 0
        # Was the last example read in every row (__getitem__), or another batch's examples (__getitems__).
        np.testing.assert_array_equal(np.asarray(x)[kept], np.repeat(np.asarray(y)[kept][:, None], 3, axis=1))


Point = collections.namedtuple("Point", "a b")

# Batches of elements as sources return them; each is read as a batch of written rows and as a list stacked by
# `_examples` (the per-element path), which must agree (values, dtypes, structure) or both refuse.
_ELEMENT_BATCHES = {
    "arrays": [(np.full((2, 3), i, np.float32), np.int64(i)) for i in range(5)],
    "nests and weights": [
        ({"image": np.full(4, i, np.uint8), "ids": [np.int32(i), np.arange(2) + i]}, (i, "t" * (i + 1)), 0.5 * i)
        for i in range(4)
    ],
    "weights None or 1-element arrays": [(np.float32(i), i, None if i % 2 else np.ones(1)) for i in range(4)],
    "promoted: int then float": [(np.arange(2) + i, i) for i in range(3)] + [(np.arange(2.0), 3.5)],
    "other shape": [(np.zeros(3), 0), (np.zeros(4), 1)],
    "other structure": [({"a": np.zeros(2)}, 0), ({"b": np.zeros(2)}, 1)],
    "namedtuple": [(Point(np.zeros(2) + i, i), i) for i in range(3)],
    "bytes and object arrays": [(np.array([b"ab", b"c" * i], object), b"y") for i in range(3)],
    "structured rows": [(np.zeros(2, [("u", "i4"), ("v", "f4")])[0], i) for i in range(3)],
    "not a tuple": [[np.zeros(2), 0], [np.zeros(2), 1]],
}


@pytest.mark.parametrize("at_once", [False, True], ids=["row by row", "__getitems__"])
@pytest.mark.parametrize("name", _ELEMENT_BATCHES)
def test_a_batch_written_row_by_row_is_what_stacking_its_elements_gives(name, at_once):
    elements = _ELEMENT_BATCHES[name]

    def stacked(read):
        try:
            return read()
        except ValueError as error:
            return str(error)

    batch = readers.BatchRows(len(elements), elements[0])  # pylint: disable=protected-access
    if at_once:  # one source call's elements, each column stacked at once
        batch.fill(elements)
    else:
        for row, element in enumerate(elements[1:], 1):
            batch.write(row, element)
    written = stacked(lambda: batch.examples(None))
    # Elements of one structure, shapes and dtypes are written into the batch's columns, none kept whole.
    assert not batch.whole or name not in ("arrays", "nests and weights", "bytes and object arrays", "structured rows")
    expected = stacked(lambda: readers.examples(elements, None))  # pylint: disable=protected-access
    assert type(written) is type(expected)
    if isinstance(expected, str):
        assert written == expected
        return
    flat = lambda nest: readers.map_nest(lambda leaf: (leaf.dtype, leaf.shape, leaf.tolist()), nest)  # noqa: E731
    assert flat(written) == flat(expected) and type(written[0]) is type(expected[0])


def test_every_array_a_source_returns_is_copied_immutable_leaves_kept_and_an_uncopyable_leaf_refused():
    shared, owned_buffer, text = np.arange(3.0), np.arange(3.0), "a"
    owned_buffer.flags.writeable = False  # owns its data, read-only: still the buffer a next read may refill
    view = shared[:2]
    view.flags.writeable = False
    element = ({"view": view, "owned": owned_buffer, "list": [np.float32(1)]}, text, 1, None)
    copied = readers._owned(element)  # pylint: disable=protected-access
    assert not np.shares_memory(copied[0]["view"], shared) and not np.shares_memory(copied[0]["owned"], owned_buffer)
    assert copied[0]["list"] == [1] and copied[0]["list"] is not element[0]["list"] and copied[1:] == (text, 1, None)
    with pytest.raises(ValueError, match="returned a memoryview, which cannot be copied before the next read"):
        readers._owned((memoryview(b"ab"), 0))  # pylint: disable=protected-access


class SeekReadArray(SeekReadSource):
    """The same file as an array-like (``shape``, ``x[indices]``), of no package known to read from several threads."""

    def __init__(self, path):
        super().__init__(path)
        self.shape, self.dtype = (self.num_examples, ROW_BYTES // 4), np.dtype(np.int32)

    def __getitem__(self, indices):
        return np.stack([super(SeekReadArray, self).__getitem__(int(index))[0] for index in indices])


def test_an_array_like_of_an_unknown_package_is_read_one_call_at_a_time_so_rows_hold_their_examples(tmp_path):
    array = SeekReadArray(_seek_read_source(tmp_path).file.name)
    rows = sources.array_rows(array, np.arange(len(array)), None, None, len(array))
    indices = np.arange(0, len(array), 2)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:  # as TensorFlow's parallel calls and JAX's readers
        for x, y, _ in pool.map(lambda _: rows.read(indices), range(8)):
            assert (x == y[:, None]).all()


def test_the_optimizer_imports_no_tfds_reading_until_a_source_is_read():
    """The tfds, ArrayRecord and protobuf readers load with the first random-access source, not with the optimizer."""
    backend = keras_dyndp.backend.keras_backend()
    module = "keras_dyndp.tf_backend.optimizer" if backend == "tensorflow" else "keras_dyndp.jax_backend.optimizer"
    script = (
        f"import sys, numpy as np, {module}, keras_dyndp.data.sources as sources\n"
        "print('keras_dyndp.data.tfds_reader' in sys.modules)\n"
        "sources.source_rows([(np.zeros(2), 0)] * 3, None).read(np.arange(2))\n"
        "print('keras_dyndp.data.tfds_reader' in sys.modules)\n"
    )
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["False", "True"]
