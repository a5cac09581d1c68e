"""Records of a ``tfds.data_source`` read a batch at a time for `keras_dyndp.data.sources`: its ArrayRecord files
read by readers of our own (`_ArrayRecordFiles`), ``tf.train.Example`` records parsed for the whole batch (by
TensorFlow where it is imported, else by protobuf), then decoded as tfds decodes them (`tfds_fetcher`).
tensorflow_datasets, array_record and protobuf are imported only when such a source is read."""

from __future__ import annotations

import math
import os
import sys
import threading
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np


def tfds_fetcher(source: Any, guard: Any) -> Callable[[list[int]], list] | None:
    """For a ``tfds.data_source`` of ``tf.train.Example`` records of fixed-length features (no ``decoders``):
    ``positions -> elements`` as the source returns them (new at every call: not copied), the records read raw
    (`_ArrayRecordFiles`, else one ``__getitems__`` under ``guard``), parsed for the batch (`_example_parser`) and
    decoded as tfds does (`_tfds_decoder`). None otherwise, or if example 0 so read differs from ``source[0]``."""
    method = getattr(getattr(source, "deserialize_method", None), "name", None)
    if type(source).__module__.split(".")[0] != "tensorflow_datasets" or method != "DESERIALIZE_AND_DECODE":
        return None
    try:
        features, records = source.dataset_info.features, source.data_source
        parse = None if source.decoders is not None else _example_parser(features)
        if parse is None:
            return None
        decode = _tfds_decoder(features)
    except (AttributeError, TypeError, ImportError):
        return None
    read_records = _ArrayRecordFiles.of(source) or records.__getitems__

    def fetch(positions: list[int]) -> list:
        with guard:
            records_read = read_records(positions)
        return decode(parse(records_read))

    try:
        same = _same_nest(fetch([0])[0], source[0])
    except Exception:  # pylint: disable=broad-except  # Anything this reading does not handle: tfds's own reading.
        return None
    return fetch if same else None


def _example_parser(features: Any) -> Callable[[list], dict[str, np.ndarray]] | None:
    """``records -> {flat feature key: [k] + shape column}`` for tfds's ``tf.train.Example`` records whose features
    all have a fixed shape and no default (None otherwise; tfds reads them): `_tensorflow_parser` where TensorFlow is
    imported, else `_protobuf_parser`. Each column is then cast to the dtype tfds stores (`_tfds_decoder`)."""
    tf = sys.modules.get("tensorflow")
    return _protobuf_parser(features) if tf is None else _tensorflow_parser(features, tf)


def _tensorflow_parser(features: Any, tf: Any) -> Callable[[list], dict[str, np.ndarray]] | None:
    """`_example_parser` by ``tf.io.parse_example`` (C++, off the GIL, all the records in one call; integers as
    int64, floats as float32, bytes as objects)."""
    spec = features.tf_example_spec
    if not all(isinstance(feature, tf.io.FixedLenFeature) for feature in spec.values()):
        return None

    def parse(records: list) -> dict[str, np.ndarray]:
        with tf.device("/CPU:0"):
            parsed = tf.io.parse_example(tf.constant(records, tf.string), spec)
        return {key: column.numpy() for key, column in parsed.items()}

    return parse


def _protobuf_parser(features: Any) -> Callable[[list], dict[str, np.ndarray]] | None:
    """`_example_parser` without TensorFlow: protobuf's parse of each record, then one numpy array a column in the
    dtype tfds stores (`_proto_column`; docs/performance.md)."""
    from tensorflow_datasets.core import utils  # pylint: disable=import-outside-toplevel
    from tensorflow_datasets.proto import tf_example_pb2  # pylint: disable=import-outside-toplevel

    infos = utils.flatten_nest_dict(features.get_serialized_info())
    if any(None in info.shape or info.default_value is not None for info in infos.values()):
        return None

    def parse(records: list) -> dict[str, np.ndarray]:
        examples = [tf_example_pb2.Example.FromString(record).features.feature for record in records]
        return {key: _proto_column(key, info, examples) for key, info in infos.items()}

    return parse


def _proto_column(key: str, info: Any, examples: list) -> np.ndarray:
    """The values of feature ``key`` (tfds's serialized ``TensorInfo`` ``info``: shape, dtype) of parsed examples'
    feature maps, as one array of [len(examples)] + shape, cast as tfds's numpy parser casts each. A record holding
    another number of values (none, if another kind of list) is refused, as tfds's reshape and parse_example do."""
    dtype, shape = np.dtype(info.np_dtype), tuple(info.shape)
    kind = "bytes_list" if dtype.kind in "OSU" else "float_list" if dtype.kind == "f" else "int64_list"
    values = [getattr(example[key], kind).value for example in examples]
    sizes = set(map(len, values))
    if sizes != {math.prod(shape)}:
        raise ValueError(
            f"A tfds feature {key!r} of shape {shape} holds {math.prod(shape)} values an example in its records; "
            f"records of this batch hold {sorted(sizes)} in a {kind}: the data source's files are not what its "
            "features say."
        )
    return np.array(values, object if kind == "bytes_list" else dtype).reshape((len(values),) + shape)


def _tfds_decoder(features: Any) -> Callable[[dict], list]:
    """``parsed columns -> elements`` as tfds decodes them: column by column for the whole batch where every feature
    is a flat `Tensor` of fixed shape that `_column_decoder` decodes; else each column in its stored dtype, then
    tfds's ``decode_example_np`` per example (`tfds_fetcher` checks example 0 against tfds's own)."""
    from tensorflow_datasets.core import utils  # pylint: disable=import-outside-toplevel

    info = features.get_serialized_info()
    flat_info = utils.flatten_nest_dict(info)
    by_column = {key: _column_decoder(feature, flat_info.get(key)) for key, feature in features.items()}
    if flat_info.keys() != features.keys() or None in by_column.values():
        by_column = None

    def decode(parsed: dict) -> list:
        keys = list(parsed)
        if by_column is not None:
            return [dict(zip(keys, row)) for row in zip(*(by_column[key](parsed[key]) for key in keys))]
        columns = [parsed[key].astype(flat_info[key].np_dtype) for key in keys]
        columns = [column.tolist() if column.ndim == 1 else column for column in columns]
        examples = (dict(zip(keys, row)) for row in zip(*columns))
        return [features.decode_example_np(utils.pack_as_nest_dict(example, info)) for example in examples]

    return decode


def _column_decoder(feature: Any, serialized: Any) -> Callable[[np.ndarray], Any] | None:
    """``parsed column -> its rows decoded as tfds's Tensor.decode_example_np decodes each`` for a `Tensor` feature
    of fixed shape stored as values or bytes (``BYTES`` or ``ZLIB``: one joined buffer, each row a read-only view, a
    value of another size refused, as it would shift bytes into another row); None for any other feature."""
    from tensorflow_datasets.core.features import tensor_feature  # pylint: disable=import-outside-toplevel

    tensor = type(feature).decode_example_np is tensor_feature.Tensor.decode_example_np
    if not tensor or serialized is None or None in feature.shape:
        return None
    dtype, shape, encoding = np.dtype(feature.np_dtype), tuple(feature.shape), getattr(feature, "_encoding", None)
    if encoding == tensor_feature.Encoding.NONE:
        if np.dtype(serialized.np_dtype) != dtype or tuple(serialized.shape) != shape:
            return None
        return lambda column: column.astype(dtype).tolist() if column.ndim == 1 else column.astype(dtype)
    if encoding not in (tensor_feature.Encoding.BYTES, tensor_feature.Encoding.ZLIB) or not shape:
        return None
    compressed, size = encoding == tensor_feature.Encoding.ZLIB, dtype.itemsize * math.prod(shape)

    def from_bytes(column: np.ndarray) -> np.ndarray:
        values = [zlib.decompress(value) for value in column.tolist()] if compressed else column.tolist()
        sizes = set(map(len, values))
        if sizes != {size}:
            raise ValueError(
                f"A tfds Tensor feature of shape {shape} and dtype {dtype.name} stored as bytes holds {size} bytes an "
                f"example; records of this batch hold {sorted(sizes)}: the data source's files are not what its "
                "features say."
            )
        return np.frombuffer(b"".join(values), dtype).reshape((len(values),) + shape)

    return from_bytes


class _ArrayRecordFiles:
    """A ``tfds.data_source``'s ArrayRecord records by key, read with array_record's ``ArrayRecordReader`` in random
    access (``read(offset, offset + 1)`` in the calling thread, GIL released, a file buffer of twice a record's mean
    size: docs/performance.md). Readers are not thread-safe: each thread keeps its own, a file opened at first read."""

    def __init__(self, instructions: list, reader_class: type):
        self.reader_class = reader_class
        self.paths = [os.fspath(instruction.filename) for instruction in instructions]
        record_bytes = [
            os.path.getsize(path) / max(1, instruction.examples_in_shard)
            for path, instruction in zip(self.paths, instructions)
        ]
        self.buffer_sizes = [min(2**20, max(2**12, 1 << math.ceil(2 * size).bit_length())) for size in record_bytes]
        takes = np.array([instruction.take for instruction in instructions], np.int64)
        self.ends, self.skips = np.cumsum(takes), np.array([instruction.skip for instruction in instructions], np.int64)
        self.firsts = self.ends - takes
        self._idle: list[list] = []
        self._lock = threading.Lock()

    @classmethod
    def of(cls, source: Any) -> _ArrayRecordFiles | None:
        """The files of ``source`` (a tfds data source) if they are ArrayRecord files read as its records are (its
        first, middle and last records compared), else None."""
        try:
            from array_record.python import array_record_module  # pylint: disable=import-outside-toplevel

            instructions = source.dataset_info.splits[source.split].file_instructions
            if type(source.data_source).__name__ != "ArrayRecordDataSource" or not instructions:
                return None
            files = cls(instructions, array_record_module.ArrayRecordReader)
            # array_record's range read takes 32-bit offsets.
            small = all(instruction.skip + instruction.take < 2**31 for instruction in instructions)
            probe = sorted({0, len(source) // 2, len(source) - 1})
            same = (
                small
                and int(files.ends[-1]) == len(source)
                and files(probe) == list(source.data_source.__getitems__(probe))
            )
        except Exception:  # pylint: disable=broad-except  # Not files this reading knows: the source's own reads.
            return None
        return files if same else None

    def __call__(self, positions: list[int]) -> list[bytes]:
        keys = np.asarray(positions, np.int64)
        files = np.searchsorted(self.ends, keys, side="right")
        offsets = (keys - self.firsts[files] + self.skips[files]).tolist()
        with self._lock:
            readers = self._idle.pop() if self._idle else [None] * len(self.paths)
        try:
            records = []
            for file, offset in zip(files.tolist(), offsets):
                reader = readers[file]
                if reader is None:  # random access, no thread pool
                    options, size = "readahead_buffer_size:0,max_parallelism:0", self.buffer_sizes[file]
                    reader = readers[file] = self.reader_class(self.paths[file], options, file_reader_buffer_size=size)
                records.append(reader.read(offset, offset + 1)[0])
        finally:
            with self._lock:
                self._idle.append(readers)
        return records


def _same_nest(first: Any, second: Any) -> bool:
    """Whether two nests of dicts, lists, arrays and scalars hold the same types, dtypes, shapes and values."""
    if type(first) is not type(second):
        return False
    if isinstance(first, dict):
        return first.keys() == second.keys() and all(_same_nest(first[key], second[key]) for key in first)
    if isinstance(first, (list, tuple)):
        return len(first) == len(second) and all(map(_same_nest, first, second))
    if isinstance(first, np.ndarray):
        return first.dtype == second.dtype and first.shape == second.shape and np.array_equal(first, second)
    return first == second
