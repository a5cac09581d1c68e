"""The reads behind `keras_dyndp.data.sources`' batches: array-likes read by index (a memmap's rows by positioned
file reads in several threads, `file_reader`), random-access sources read in chunks by several threads
(`chunked_fetcher`) under a guard unless `known_thread_safe` (`source_guard`), the batch's own copy of what a source
returns (`BatchRows`), and the elements stacked into ``(x, y, sample_weight)`` (`examples`)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import copy
import mmap
import os
import threading
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np


def check_one_per_index(counts: set[int | None], num_indices: int) -> None:
    """Raises ValueError unless a read of ``num_indices`` examples gave that many (``counts``: of each leaf; None: a
    scalar): padded into the batch, a short read would broadcast one example into several rows."""
    if counts != {num_indices}:
        raise ValueError(
            f"Reading {num_indices} examples of `x` gave {sorted(counts, key=str)} rows: a source's "
            "`__getitems__(indices)` (and an array-like's `x[indices]`) must return one element per index."
        )


def check_like(example: np.ndarray, rows: np.ndarray) -> None:
    """Raises ValueError unless ``rows`` have the shape and dtype of ``example`` (rows of example 0; text of any
    length): else TensorFlow's pipeline fails obscurely, a JAX step recompiles or changes dtype."""
    text = example.dtype.kind in "SUO" and rows.dtype.kind in "SUO"
    if rows.shape[1:] != example.shape[1:] or not (
        text or rows.dtype.newbyteorder("=") == example.dtype.newbyteorder("=")
    ):
        raise ValueError(
            f"Examples of `x` (after `map`) must all have the shapes and dtypes of example 0: it has shape "
            f"{example.shape[1:]} and dtype {example.dtype.name}, others {rows.shape[1:]} and {rows.dtype.name}. Pad, "
            "crop or cast them in `map`."
        )


def map_nest(function: Callable, *nests: Any) -> Any:
    """``function`` over the leaves of nests of dicts, lists and tuples alike (None stays None)."""
    first = nests[0]
    if first is None:
        return None
    if isinstance(first, (dict, list, tuple)):
        kind = dict if isinstance(first, dict) else (list, tuple)
        keys = list(first) if isinstance(first, dict) else range(len(first))
        if any(not isinstance(nest, kind) or len(nest) != len(first) for nest in nests) or (
            kind is dict and any(nest.keys() != first.keys() for nest in nests)
        ):
            # zip would drop the items past the shortest, silently.
            raise ValueError(f"Nests of different structures: {[_structure(nest) for nest in nests[:4]]}.")
        mapped = [map_nest(function, *(nest[key] for nest in nests)) for key in keys]
        if kind is dict:
            return dict(zip(keys, mapped))
        return type(first)(*mapped) if hasattr(first, "_fields") else type(first)(mapped)  # a namedtuple's fields
    return function(*nests)


def _structure(nest: Any) -> Any:
    """``nest`` with its leaves replaced by "*" (for error messages)."""
    if isinstance(nest, dict):
        return {key: _structure(value) for key, value in nest.items()}
    if isinstance(nest, (list, tuple)):
        return (list if isinstance(nest, list) else tuple)(map(_structure, nest))
    return "*"


def _stack(elements: list) -> Any:
    return map_nest(lambda *leaves: _stack_leaf(leaves), *elements)


def _stack_leaf(leaves: Any) -> np.ndarray:
    """The leaves stacked; an object array of bytes (TensorFlow's strings in numpy) or str as a numpy string array: its
    padding rows are then empty strings, not the integer 0 of an object array, which TensorFlow refuses."""
    leaf = np.stack([np.asarray(leaf) for leaf in leaves])
    if leaf.dtype == object and leaf.size:
        for kind in (bytes, str):
            if all(isinstance(item, kind) for item in leaf.flat):
                return leaf.astype(kind)
    return leaf


def examples(elements: list, map_fn: Callable | None) -> tuple[Any, Any, np.ndarray]:
    """Per-example elements ``(x, y[, w])`` (after ``map_fn``) stacked into ``(x, y, float32 weights)``."""
    elements = elements if map_fn is None else [map_fn(element) for element in elements]
    if any(not isinstance(element, tuple) or len(element) not in (2, 3) for element in elements):
        found = type(elements[0]).__name__
        raise ValueError(
            "Random-access source elements (after `map`) must be tuples (x, y) or (x, y, sample_weight); pass a "
            f"per-example `map` that makes them. Received: {found}."
        )
    try:
        x, y = _stack([element[0] for element in elements]), _stack([element[1] for element in elements])
    except ValueError as error:
        raise ValueError(
            f"Random-access source examples must all have the same shapes: {str(error).rstrip('.')}. Pad, crop or drop "
            "the features of varying shapes in `map`."
        ) from error
    # (x, y, None) has no weight, as in Keras's unpack_x_y_sample_weight: 1 (np.float32(None) is nan).
    weights = [1.0 if len(element) == 2 or element[2] is None else element[2] for element in elements]
    return x, y, np.asarray(weights, np.float32).reshape(len(elements))


def known_thread_safe(source: Any) -> bool:
    """Whether ``source`` is one of the sources known to be safe to call from several threads at once: tfds's data
    sources and ``ArrayRecordDataSource`` (grain's or array_record's; their reads are positional, in C++)."""
    cls = type(source)
    root = cls.__module__.split(".")[0]
    array_record = root in ("grain", "array_record") and cls.__name__ == "ArrayRecordDataSource"
    return root == "tensorflow_datasets" or array_record


# Per (source object, limit): the lock (limit 1) or semaphore its calls hold, shared by every reader of the object.
_guards: dict[tuple[int, int], Any] = {}
_guards_lock = threading.Lock()


def source_guard(source: Any, limit: int) -> Any:
    """The context every call of ``source`` holds so that at most ``limit`` run at once: one per object, so that
    the threads of a batch, of TensorFlow's parallel calls, of JAX's readers and of other batches of the same object
    share it. Forgotten with the object (an object that takes no weak reference keeps its entry)."""
    key = (id(source), limit)
    with _guards_lock:
        guard = _guards.get(key)
        if guard is None:
            guard = _guards[key] = threading.Lock() if limit == 1 else threading.BoundedSemaphore(limit)
            with contextlib.suppress(TypeError):
                weakref.finalize(source, _guards.pop, key, None)
    return guard


def chunked_fetcher(source: Any, threads: int, guard: Any) -> Callable[[list[int]], BatchRows]:
    """``positions -> `BatchRows```, each call of the source inside ``guard``: one ``source.__getitems__`` call when the
    source has one (it reads a batch as it knows best); else ``source[i]`` per example, a batch of 64 or more in chunks
    read by up to min(``threads``, 8) threads at once (`_parts`), so that cold file reads overlap."""
    get_many = getattr(source, "__getitems__", None)
    if get_many is not None:

        def fetch_many(positions: list[int]) -> BatchRows:
            with guard:
                elements = get_many(positions)
                check_one_per_index({len(elements)}, len(positions))
                batch = BatchRows(len(positions), elements[0])
                batch.fill(elements)
            return batch

        return fetch_many

    def get(batch: BatchRows, positions: list[int], rows: np.ndarray) -> None:
        for row in rows:
            with guard:
                batch.write(row, source[positions[row]])

    def fetch(positions: list[int]) -> BatchRows:
        with guard:
            batch = BatchRows(len(positions), source[positions[0]])
        _in_parts(lambda part: get(batch, positions, part + 1), len(positions) - 1, threads)
        return batch

    return fetch


class BatchRows:
    """The elements of one batch read from a source, each written into arrays the batch owns before the source is called
    again: a source that refills one buffer of its own at each read and returns it, or a view of it, would otherwise put
    its last read in every row. The first element gives one column per leaf: an array of one row per element for a numpy
    array or scalar, a list of `_owned` leaves for any other. An element of another structure, shape or dtype is kept
    whole (`_owned`) and the batch stacked element by element (`examples`). Several threads may write, each its rows."""

    def __init__(self, num_rows: int, first: Any):
        self.num_rows, self.whole = num_rows, {}
        self.layout = _layout(first) if type(first) is tuple and len(first) in (2, 3) else None
        # (x, y[, w]) of leaves: the element is its own list of leaves.
        self.flat = self.layout is not None and all(spec in (_LEAF, _ANY) for spec in self.layout[2])
        leaves = [] if self.layout is None else _flatten(first, self.layout, [])
        specs = _leaf_specs(self.layout) if self.layout else []
        # Per leaf (column, row shape, dtype): an array of a row per element, or (list, None, its spec).
        self.columns = [
            (np.empty((num_rows,) + leaf.shape, leaf.dtype), leaf.shape, leaf.dtype)
            if isinstance(leaf, _NUMPY) and leaf.dtype != object
            else ([None] * num_rows, None, spec)
            for leaf, spec in zip(leaves, specs)
        ]
        self.write(0, first)

    def write(self, row: int, element: Any) -> None:
        """Row ``row`` of the batch: ``element``, written into the columns or kept whole."""
        leaves = self._leaves(element)
        if leaves is not None:
            for (column, shape, dtype), leaf in zip(self.columns, leaves):
                if shape is None:
                    if dtype is _LEAF and isinstance(leaf, (dict, list, tuple)):
                        break
                    column[row] = _owned(leaf)
                elif isinstance(leaf, _NUMPY) and leaf.shape == shape and (leaf.dtype is dtype or leaf.dtype == dtype):
                    column[row] = leaf
                else:
                    break
            else:
                return
        self.whole[row] = _owned(element)

    def fill(self, elements: list) -> None:
        """Rows 1.. of the batch: ``elements[1:]`` (one ``__getitems__`` call's), each array column stacked by numpy
        in one call (which refuses another shape or dtype); row by row (`write`) when one does not fit."""
        rows = [self._leaves(element) for element in elements[1:]]
        try:
            if None in rows:
                raise ValueError("not of the first element's layout")
            for index, (column, shape, spec) in enumerate(self.columns):
                leaves = [leaves[index] for leaves in rows]
                if shape is not None:
                    np.stack(leaves, out=column[1:], casting="no")
                elif spec is _LEAF and any(isinstance(leaf, (dict, list, tuple)) for leaf in leaves):
                    raise ValueError("a nest where the first element has a leaf")
                else:
                    column[1:] = [_owned(leaf) for leaf in leaves]
        except (ValueError, TypeError):
            for row in range(1, len(elements)):
                self.write(row, elements[row])

    def _leaves(self, element: Any) -> Any:
        """The leaves of ``element`` in the columns' order, or None where it is not of the first element's layout."""
        if self.flat:
            return element if type(element) is tuple and len(element) == self.layout[1] else None
        return None if self.layout is None else _flatten(element, self.layout, [])

    def elements(self) -> list:
        """The batch's elements (rows in the columns as views of them)."""
        return [
            self.whole[row]
            if row in self.whole
            else _unflatten(self.layout, iter([c[row] for c, _, _ in self.columns]))
            for row in range(self.num_rows)
        ]

    def examples(self, map_fn: Callable | None) -> tuple[Any, Any, np.ndarray]:
        """`examples` of the batch's elements: its columns stacked, when every element is in them and no ``map_fn``."""
        if self.whole or self.layout is None or map_fn is not None:
            return examples(self.elements(), map_fn)
        weighted, columns = self.layout[1] == 3, [column for column, _, _ in self.columns]
        stacked = iter(
            [c if isinstance(c, np.ndarray) else _stack_leaf(c) for c in columns[: -1 if weighted else None]]
        )
        x, y = _unflatten(self.layout[2][0], stacked), _unflatten(self.layout[2][1], stacked)
        if not weighted:
            return x, y, np.ones(self.num_rows, np.float32)
        weights = [1.0 if weight is None else weight for weight in columns[-1]]
        return x, y, np.asarray(weights, np.float32).reshape(self.num_rows)


# The `_layout` of a leaf, and of (x, y, sample_weight)'s sample_weight: a leaf whatever it is.
_LEAF, _ANY = "leaf", "any"
_NUMPY = (np.ndarray, np.generic)


def _layout(nest: Any, top: bool = True) -> Any:
    """The structure of ``nest`` (exactly dicts, lists and tuples; `_LEAF` for anything else), for `_flatten`; None
    where part of it is a subclass of one of them (a namedtuple: `map_nest` builds it back by its fields)."""
    kind = type(nest)
    if kind in (dict, list, tuple):
        keys = tuple(nest) if kind is dict else len(nest)
        values = nest.values() if kind is dict else nest
        specs = [_ANY if top and i == 2 else _layout(value, False) for i, value in enumerate(values)]
        return None if None in specs else (kind, keys, specs)
    return None if isinstance(nest, (dict, list, tuple)) else _LEAF


def _flatten(nest: Any, layout: Any, leaves: list) -> list | None:
    """``leaves`` with the leaves of ``nest`` appended, in `_layout` order; None if ``nest`` is not of ``layout``."""
    if layout is _ANY or layout is _LEAF:
        if layout is _LEAF and isinstance(nest, (dict, list, tuple)):
            return None
        leaves.append(nest)
        return leaves
    kind, keys, specs = layout
    if type(nest) is not kind or (kind is dict and tuple(nest) != keys) or (kind is not dict and len(nest) != keys):
        return None
    for value, spec in zip(nest.values() if kind is dict else nest, specs):
        if _flatten(value, spec, leaves) is None:
            return None
    return leaves


def _leaf_specs(layout: Any) -> list[str]:
    """Each leaf's `_LEAF` or `_ANY`, in `_flatten` order."""
    return [layout] if layout is _ANY or layout is _LEAF else [spec for part in layout[2] for spec in _leaf_specs(part)]


def _unflatten(layout: Any, leaves: Any) -> Any:
    """The nest of `_layout` ``layout`` with the next leaves of the iterator ``leaves``."""
    if layout is _ANY or layout is _LEAF:
        return next(leaves)
    kind, keys, specs = layout
    values = [_unflatten(spec, leaves) for spec in specs]
    return dict(zip(keys, values)) if kind is dict else kind(values)


def _owned(element: Any) -> Any:
    """``element`` (a nest a source call returned) with every leaf the source could change copied (`BatchRows`): every
    numpy array (``leaf.copy()``, keeping its subclass: no flag proves an array fresh, nor is a structured array's
    row, ``np.void``, a view); immutable leaves kept; any other ``copy.deepcopy``-ed (ValueError if it cannot be)."""
    kind = type(element)
    if kind is np.ndarray:
        return element.copy()
    if kind in _IMMUTABLE:
        return element
    if kind is tuple:
        return tuple([_owned(leaf) for leaf in element])
    if kind is dict:
        return {key: _owned(value) for key, value in element.items()}
    if kind is list:
        return [_owned(leaf) for leaf in element]
    return _owned_other(element)


# Types of the leaves that no later call of a source can change: Python's immutable scalars and numpy's scalars,
# except np.void (a structured array's row, a view of its memory).
_IMMUTABLE = frozenset({type(None), bool, int, float, complex, str, bytes}) | frozenset(
    kind for kind in np.sctypeDict.values() if kind not in (np.void, np.object_)
)


def _owned_other(leaf: Any) -> Any:
    """`_owned` of what is not exactly an ndarray, tuple, dict, list or `_IMMUTABLE`: their subclasses (a namedtuple,
    a memmap, a structured array's row), else a ``copy.deepcopy``."""
    if isinstance(leaf, (np.ndarray, np.void)):
        return leaf.copy()
    if isinstance(leaf, tuple(_IMMUTABLE)):
        return leaf
    if isinstance(leaf, (tuple, dict, list)):
        return map_nest(_owned, leaf)
    try:
        return copy.deepcopy(leaf)
    except Exception as error:  # pylint: disable=broad-except  # deepcopy raises what the object's pickling raises.
        raise ValueError(
            f"A random-access source returned a {type(leaf).__name__}, which cannot be copied before the next read "
            "(a source may refill what it returned): return numpy arrays, numbers, str or bytes in its elements."
        ) from error


def _mapped_file(leaf: np.ndarray) -> np.memmap | None:
    """The np.memmap (of a file, shared) whose buffer ``leaf`` views, or None."""
    root = leaf
    while isinstance(root, np.ndarray) and not isinstance(root.base, mmap.mmap):
        root = root.base
    return root if isinstance(root, np.memmap) and root.mode != "c" and getattr(root, "filename", None) else None


def file_reader(leaf: Any) -> Callable[[np.ndarray], np.ndarray]:
    """``indices -> leaf[indices]``; for a memmap with contiguous rows, by positioned reads of its file (``os.preadv``
    into the batch): touching the mapping would map the pages around each row into the process (the kernel's fault-
    around), and resident memory would grow towards the file's size (docs/performance.md)."""
    root = _mapped_file(leaf) if isinstance(leaf, np.ndarray) and leaf.ndim else None
    row_strides = tuple(np.empty(leaf.shape[1:], leaf.dtype).strides) if root is not None else None
    if root is None or tuple(leaf.strides[1:]) != row_strides or not hasattr(os, "preadv"):
        return _indexer(leaf)
    start = root.offset + leaf.__array_interface__["data"][0] - root.__array_interface__["data"][0]
    descriptor = os.open(root.filename, os.O_RDONLY)
    reader = lambda indices: _pread_rows(descriptor, leaf, start, indices)  # noqa: E731
    weakref.finalize(reader, os.close, descriptor)
    return reader


# Array-likes whose reads may run in several threads at once (h5py's hold its own lock).
_THREAD_SAFE_ARRAYS = ("numpy", "h5py", "zarr", "scipy")


def _indexer(leaf: Any) -> Callable[[np.ndarray], np.ndarray]:
    """``indices -> leaf[indices]`` as a numpy array (a scipy.sparse matrix's rows dense). An array-like of another
    package than `_THREAD_SAFE_ARRAYS` is read one call at a time (`source_guard`), its rows copied inside."""
    safe = type(leaf).__module__.split(".")[0] in _THREAD_SAFE_ARRAYS
    guard = contextlib.nullcontext() if safe else source_guard(leaf, 1)

    def read(indices: np.ndarray) -> np.ndarray:
        with guard:
            rows = leaf[indices]
            rows = rows.toarray() if hasattr(rows, "toarray") else rows
            return np.asarray(rows) if safe else np.array(rows)

    return read


# Rows of a batch read by this many threads (os.preadv releases the GIL): reads from disk overlap, not one at a time.
READ_THREADS, _ROWS_PER_THREAD = 8, 32
_pool: list[concurrent.futures.ThreadPoolExecutor] = []


def _parts(num_rows: int, threads: int = READ_THREADS) -> list[np.ndarray]:
    """The positions 0..num_rows-1 in at most min(``threads``, `READ_THREADS`) parts of >= `_ROWS_PER_THREAD`."""
    return np.array_split(np.arange(num_rows), min(threads, READ_THREADS, max(1, num_rows // _ROWS_PER_THREAD)))


def _in_parts(function: Callable[[np.ndarray], Any], num_rows: int, threads: int = READ_THREADS) -> list:
    """``function`` of each of the `_parts`, in order; on the reading threads (made at first use) if several."""
    parts = _parts(num_rows, threads)
    if len(parts) == 1:
        return [function(parts[0])]
    if not _pool:
        _pool.append(concurrent.futures.ThreadPoolExecutor(READ_THREADS, thread_name_prefix="keras_dyndp_read"))
    return list(_pool[0].map(function, parts))


def _pread_rows(descriptor: int, leaf: np.ndarray, start: int, indices: np.ndarray) -> np.ndarray:
    """Rows ``indices`` of a memmap with contiguous rows whose row 0 is at byte ``start`` of the open file."""
    rows = np.empty((len(indices),) + leaf.shape[1:], leaf.dtype)
    row_bytes = rows.reshape(len(indices), -1).view(np.uint8)

    def read(positions: np.ndarray) -> None:
        for position in positions:
            offset = start + int(indices[position]) * leaf.strides[0]
            if os.preadv(descriptor, [row_bytes[position]], offset) != row_bytes.shape[1]:
                raise OSError(f"Short read from a memmap's file at byte {offset}.")

    _in_parts(read, len(indices))
    return rows
