"""Examples read on demand for `keras_dyndp.poisson_batches`: data that need not fit in memory.

Two kinds of input are read row by row instead of being converted to tensors first:
- array-likes that index by a sorted integer array without loading everything: numpy memmaps (also an ndarray whose
  buffer is a memory map, as ``np.load(..., mmap_mode='r')`` returns), h5py / zarr-like datasets (anything with a
  ``shape`` and a fancy ``__getitem__`` that is not a numpy array or a tensor);
- random-access sources: ``len(source)`` examples, ``source[i]`` one example, ``source.__getitems__(list)`` several
  when present (the protocol of ``tfds.data_source`` and grain), each ``(x, y)`` or ``(x, y, sample_weight)``,
  after the optional per-example ``map``.

Each step draws its batch exactly as Poisson sampling does (every example independently with probability p): the
number selected k ~ Binomial(N, p), then a uniformly random k-subset (numpy's ``Generator.choice(N, k,
replace=False)``, O(k) for k << N; `draw`), so a step costs O(k), not O(N). The indices are read in increasing order
(locality) and padded as the in-memory batches are (`Rows.batch`). A batch's reads overlap where that pays: a memmap's
rows and the examples of a source without ``__getitems__`` are read by several threads (`_pread_rows`,
`_chunked_fetcher`), and a ``tfds.data_source`` has its records parsed a batch at a time (`tfds_reader.tfds_fetcher`). A
source is called from several threads at once only if it is `known_thread_safe` or declared so (``source_threads``); any
other is called one call at a time (`source_guard`): a source that seeks and reads a shared file, called from two
threads, returns one example's bytes for another's index, and that example counts twice in the batch.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import copy
import inspect
import math
import mmap
import os
import threading
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from keras_dyndp.core import batch_sizes
from keras_dyndp.data import tfds_reader

# Leaves that are in memory however they index: tensors of TensorFlow / JAX / torch, pandas objects.
_IN_MEMORY_MODULES = ("tensorflow", "jax", "jaxlib", "torch", "pandas", "keras")


def is_lazy_array(leaf: Any) -> bool:
    """Whether ``leaf`` is an array-like read by index on demand (memmap, h5py / zarr-like), not one in memory."""
    if isinstance(leaf, np.ndarray):
        base = leaf
        while isinstance(base, np.ndarray) and not isinstance(base, np.memmap):
            base = base.base
        return isinstance(base, (np.memmap, mmap.mmap))
    root = type(leaf).__module__.split(".")[0]
    return hasattr(leaf, "shape") and hasattr(leaf, "__getitem__") and root not in _IN_MEMORY_MODULES


def is_random_access(x: Any) -> bool:
    """Whether ``x`` is a random-access source: ``__len__`` and ``__getitem__`` but no ``shape``, not a nest."""
    if isinstance(x, (list, tuple, dict, str, bytes)) or hasattr(x, "shape"):
        return False
    return hasattr(x, "__len__") and hasattr(x, "__getitem__") and not hasattr(x, "element_spec")


def draw(rng: np.random.Generator, num_examples: int, sampling_probability: float, cap: int) -> tuple[int, np.ndarray]:
    """One Poisson sample: (k, the indices of min(k, cap) of the k selected examples, in random order).

    k ~ Binomial(N, p) and a uniform k-subset is the law of N independent coin flips of probability p; on overflow
    (k > cap) a uniform cap-subset of them is what truncating a uniform k-subset keeps.
    """
    num_selected = int(rng.binomial(num_examples, sampling_probability))
    return num_selected, rng.choice(num_examples, min(num_selected, cap), replace=False)


class Rows:
    """N examples read by index arrays: ``read(sorted indices)`` -> ``(x, y, sample_weight)`` numpy nests.

    ``y`` is None where the data has no labels; ``sample_weight`` is float32 of shape [k]. The first example, read
    once, gives every leaf's shape and dtype (the padding rows are zeros of them).
    """

    def __init__(self, num_examples: int, read: Callable[[np.ndarray], tuple[Any, Any, np.ndarray]]):
        self.num_examples = num_examples
        self._read, self.example = read, None
        self.example = self.read(np.zeros(1, np.int64))

    def read(self, indices: np.ndarray) -> tuple[Any, Any, np.ndarray]:
        """The rows ``indices`` (increasing), as numpy arrays with len(indices) rows."""
        if len(indices) == 0:
            return map_nest(lambda leaf: leaf[:0], self.example)
        rows = self._read(indices)
        counts = {np.shape(leaf)[0] if np.ndim(leaf) else None for leaf in batch_sizes.leaves(rows)}
        _check_one_per_index(counts, len(indices))
        if self.example is not None:
            map_nest(_check_like, self.example, rows)
        return rows

    def batch(
        self, chosen: np.ndarray, num_rows: int, keep_order: bool = False, read_at: np.ndarray | None = None
    ) -> tuple[Any, Any, np.ndarray]:
        """``(x, y, sample_weight)`` of ``num_rows`` >= len(chosen) rows: the examples ``chosen`` first (in
        increasing index order, or in ``chosen``'s order with ``keep_order``), then zero rows of weight 0. With
        ``read_at`` (positions in the batch; implies ``keep_order``) only the examples at those positions are read,
        the other rows are zeros of weight 0: another worker's share of the batch, which this one does not feed."""
        at = np.arange(len(chosen)) if read_at is None else read_at[read_at < len(chosen)]
        order = np.argsort(chosen[at], kind="stable")
        rows = self.read(chosen[at][order])
        # The batch position of each row read (in increasing index order): one copy into the padded batch.
        positions = at[order] if keep_order or read_at is not None else np.arange(len(at))

        def pad(leaf: np.ndarray) -> np.ndarray:
            # Native byte order: tf.numpy_function in tf.data reads a big-endian array's bytes as native ones.
            padded = np.zeros((num_rows,) + leaf.shape[1:], leaf.dtype.newbyteorder("="))
            padded[positions] = leaf
            return padded

        return map_nest(pad, rows)


def _check_one_per_index(counts: set[int | None], num_indices: int) -> None:
    """Raises ValueError unless a read of ``num_indices`` examples gave that many (``counts``: of each leaf; None: a
    scalar): padded into the batch, a short read would broadcast one example into several rows."""
    if counts != {num_indices}:
        raise ValueError(
            f"Reading {num_indices} examples of `x` gave {sorted(counts, key=str)} rows: a source's "
            "`__getitems__(indices)` (and an array-like's `x[indices]`) must return one element per index."
        )


def _check_like(example: np.ndarray, rows: np.ndarray) -> None:
    """Raises ValueError unless ``rows`` have the shape and dtype of ``example`` (rows of example 0; text of any
    length): each batch's tensors must match the first's (TensorFlow's pipeline fails obscurely, a JAX step
    recompiles or changes dtype)."""
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
    return _text_as_strings(np.stack([np.asarray(leaf) for leaf in leaves]))


def _text_as_strings(leaf: np.ndarray) -> np.ndarray:
    """An object array of bytes (TensorFlow string tensors as numpy gives them) or of str as a numpy string array:
    its padding rows are then empty strings, not the integer 0 of an object array, which TensorFlow refuses."""
    if leaf.dtype == object and leaf.size:
        for kind in (bytes, str):
            if all(isinstance(item, kind) for item in leaf.flat):
                return leaf.astype(kind)
    return leaf


def _examples(elements: list, map_fn: Callable | None) -> tuple[Any, Any, np.ndarray]:
    """Per-example elements ``(x, y[, w])`` (after ``map_fn``) stacked into ``(x, y, float32 weights)``."""
    if map_fn is not None:
        elements = [map_fn(element) for element in elements]
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


def source_rows(source: Any, map_fn: Callable | None, threads: int | None = None) -> Rows:
    """`Rows` of a random-access source: its elements fetched (`tfds_reader.tfds_fetcher`, else `_chunked_fetcher`),
    then ``map_fn``. ``threads`` (`keras_dyndp.poisson_batches`' ``source_threads``): at most this many calls of the
    source at once, across batches too (`source_guard`); None: unlimited for the sources `known_thread_safe`, one
    at a time for any other."""
    if threads is None and not known_thread_safe(source):
        threads = 1
    guard = contextlib.nullcontext() if threads is None else source_guard(source, threads)
    fetch = tfds_reader.tfds_fetcher(source, guard) or _chunked_fetcher(source, threads or _READ_THREADS, guard)

    def read(indices: np.ndarray) -> tuple[Any, Any, np.ndarray]:
        elements = fetch([int(index) for index in indices])
        if isinstance(elements, _BatchRows):
            return elements.examples(map_fn)
        _check_one_per_index({len(elements)}, len(indices))
        return _examples(elements, map_fn)

    return Rows(len(source), read)


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
            try:
                weakref.finalize(source, _guards.pop, key, None)
            except TypeError:
                pass
    return guard


def _chunked_fetcher(source: Any, threads: int, guard: Any) -> Callable[[list[int]], _BatchRows]:
    """``positions -> `_BatchRows```, each call of the source inside ``guard`` with the writing of what it returned:
    one ``source.__getitems__`` call when the source has one (it reads a batch as it knows best: ArrayRecord's reads
    are parallel in C++ already, and splitting them across threads only adds CPU); else ``source[i]`` per example, the
    first on the calling thread (it gives the batch's columns), the rest of a batch of 64 or more in chunks of
    increasing positions read by up to min(``threads``, 8) threads at once (`_parts`), so that file reads (which release
    the GIL) overlap: cold reads wait for the disk once per chunk rather than once per example."""
    get_many = getattr(source, "__getitems__", None)
    if get_many is not None:

        def fetch_many(positions: list[int]) -> _BatchRows:
            with guard:
                elements = get_many(positions)
                _check_one_per_index({len(elements)}, len(positions))
                batch = _BatchRows(len(positions), elements[0])
                batch.fill(elements)
            return batch

        return fetch_many

    def get(batch: _BatchRows, positions: list[int], rows: np.ndarray) -> None:
        for row in rows:
            with guard:
                batch.write(row, source[positions[row]])

    def fetch(positions: list[int]) -> _BatchRows:
        with guard:
            batch = _BatchRows(len(positions), source[positions[0]])
        _in_parts(lambda part: get(batch, positions, part + 1), len(positions) - 1, threads)
        return batch

    return fetch


class _BatchRows:
    """The elements of one batch read from a source, each written into arrays the batch owns before the source is
    called again: a source that refills one buffer of its own at each read and returns it, or a view of it (read-only
    or not, as a reader with its own decode buffer does), would otherwise put its last read in every row.

    The first element, ``(x, y)`` or ``(x, y, sample_weight)`` of nests of dicts, lists and tuples, gives one column per
    leaf: an array of one row per element for a numpy array or scalar (writing its row is the copy that stacking the
    batch makes anyway), a list of `_owned` leaves for any other. An element of another structure, shape or dtype is
    kept whole (`_owned`); the batch is then stacked element by element (`_examples`, which refuses what does not
    stack), as it is with ``map``. The rows' writers may be several threads, each its own rows.
    """

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
        rows = [self._leaves(element) for element in elements]
        try:
            if None in rows:
                raise ValueError("not of the first element's layout")
            for index, (column, shape, spec) in enumerate(self.columns):
                leaves = [leaves[index] for leaves in rows]
                if shape is not None:
                    np.stack(leaves, out=column, casting="no")
                elif spec is _LEAF and any(isinstance(leaf, (dict, list, tuple)) for leaf in leaves):
                    raise ValueError("a nest where the first element has a leaf")
                else:
                    column[:] = [_owned(leaf) for leaf in leaves]
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
        """`_examples` of the batch's elements: its columns stacked, when every element is in them and no ``map_fn``."""
        if self.whole or self.layout is None or map_fn is not None:
            return _examples(self.elements(), map_fn)
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
    if layout is _ANY or layout is _LEAF:
        return [layout]
    return [spec for part in layout[2] for spec in _leaf_specs(part)]


def _unflatten(layout: Any, leaves: Any) -> Any:
    """The nest of `_layout` ``layout`` with the next leaves of the iterator ``leaves``."""
    if layout is _ANY or layout is _LEAF:
        return next(leaves)
    kind, keys, specs = layout
    values = [_unflatten(spec, leaves) for spec in specs]
    return dict(zip(keys, values)) if kind is dict else kind(values)


def _owned(element: Any) -> Any:
    """``element`` (a nest a source call returned) with every leaf the source could still change copied, before the
    source is called again: a source that refills one buffer of its own at each read and returns it, or a view of it
    (read-only or not, as a reader with its own decode buffer does), would otherwise put its last read in every row.

    Every numpy array is copied (``leaf.copy()``, keeping its subclass): no flag proves an array fresh (a view marked
    read-only, or an array that owns its data, can be the buffer the next call refills), nor is a structured
    array's row (``np.void``, a view). Immutable leaves (None, Python numbers, str, bytes, numpy's other scalars) are
    kept; any other leaf is ``copy.deepcopy``-ed (TensorFlow's eager tensors return themselves), and one that cannot
    be copied is refused. What the copies cost beside a batch's read: benchmarks/source_copy.py.

    Raises:
        ValueError: a leaf that is neither a numpy array nor immutable and cannot be deep-copied.
    """
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
    if not isinstance(root, np.memmap) or root.mode == "c" or not getattr(root, "filename", None):
        return None
    return root


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
    """``indices -> leaf[indices]`` as a numpy array (a scipy.sparse matrix's rows as their dense array). An
    array-like of another package than `_THREAD_SAFE_ARRAYS` is read one call at a time (`source_guard`), its rows
    copied inside: one that seeks and reads a shared file, called by two of the pipeline's threads, put one example's
    bytes in another's row."""
    safe = type(leaf).__module__.split(".")[0] in _THREAD_SAFE_ARRAYS
    guard = contextlib.nullcontext() if safe else source_guard(leaf, 1)

    def read(indices: np.ndarray) -> np.ndarray:
        with guard:
            rows = leaf[indices]
            rows = rows.toarray() if hasattr(rows, "toarray") else rows
            return np.asarray(rows) if safe else np.array(rows)

    return read


# Rows of a batch read by this many threads (os.preadv releases the GIL): reads from disk overlap, not one at a time.
_READ_THREADS, _ROWS_PER_THREAD = 8, 32
_pool: list[concurrent.futures.ThreadPoolExecutor] = []


def _parts(num_rows: int, threads: int = _READ_THREADS) -> list[np.ndarray]:
    """The positions 0..num_rows-1 in consecutive parts of >= `_ROWS_PER_THREAD`, at most min(``threads``,
    `_READ_THREADS`) of them."""
    return np.array_split(np.arange(num_rows), min(threads, _READ_THREADS, max(1, num_rows // _ROWS_PER_THREAD)))


def _in_parts(function: Callable[[np.ndarray], Any], num_rows: int, threads: int = _READ_THREADS) -> list:
    """``function`` of each of the `_parts`, in order; on the reading threads (made at the first read that uses
    them) when there are several."""
    parts = _parts(num_rows, threads)
    if len(parts) == 1:
        return [function(parts[0])]
    if not _pool:
        _pool.append(concurrent.futures.ThreadPoolExecutor(_READ_THREADS, thread_name_prefix="keras_dyndp_read"))
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


def array_rows(x: Any, y: Any, sample_weight: Any, map_fn: Callable | None, num_examples: int) -> Rows:
    """`Rows` of (nests of) array-likes with ``num_examples`` rows, each read as ``leaf[indices]``; ``map_fn`` (if
    any) maps each example ``(x_i, y_i)``."""
    weights = None if sample_weight is None else np.asarray(sample_weight, np.float32)
    if weights is not None and weights.size != num_examples:
        raise ValueError(
            "Per-entry sample weights (such as a [N, L] padding mask) are taken from arrays in memory without `map`; "
            f"here give one weight per example, shape ({num_examples},). Received: shape={weights.shape}."
        )
    weights = None if weights is None else weights.reshape(num_examples)
    # In-memory leaves (tensors, pandas objects) as numpy: a TensorFlow tensor takes no index array, and pandas
    # indexes by labels (a shuffled Series would pair one example's x with another's y).
    readers = map_nest(lambda leaf: file_reader(leaf if is_lazy_array(leaf) else np.asarray(leaf)), (x, y))

    def read(indices: np.ndarray) -> tuple[Any, Any, np.ndarray]:
        rows_x, rows_y = map_nest(lambda reader: reader(indices), readers)
        rows_w = np.ones(len(indices), np.float32) if weights is None else weights[indices]
        if map_fn is None:
            return rows_x, rows_y, rows_w
        row = lambda nest, i: map_nest(lambda leaf: leaf[i], nest)  # noqa: E731
        mapped = [map_fn((row(rows_x, i), row(rows_y, i))) for i in range(len(indices))]
        if any(isinstance(element, tuple) and len(element) == 3 for element in mapped):
            raise ValueError(
                "With arrays, `map` maps (x_i, y_i) to (x_i, y_i); a weight it returned would be ignored: pass "
                "per-example weights as `sample_weight`."
            )
        mapped_x, mapped_y, _ = _examples(mapped, None)
        return mapped_x, mapped_y, rows_w

    return Rows(num_examples, read)


def rows(
    x: Any, y: Any, sample_weight: Any, map_fn: Callable | None, check_rows: Callable, threads: int | None = None
) -> Rows | None:
    """`Rows` for data read on demand (a random-access source, lazy array-likes, or any arrays with ``map_fn``);
    None for in-memory arrays and datasets, which each backend reads as before. ``check_rows(x, y, w)`` checks the
    arrays' rows and returns N (`keras_dyndp.data.sampling.check_rows`); ``threads``: a source's (`source_rows`)."""
    if threads is not None and not is_random_access(x):
        raise ValueError(
            "`source_threads` is for a random-access source `x` (len(x), x[i]); leave it None for arrays and "
            f"datasets. Received: source_threads={threads} with x of type {type(x).__name__}."
        )
    if map_fn is not None and hasattr(x, "element_spec"):
        raise ValueError("`map` is for arrays and random-access sources: map a tf.data.Dataset `x` with its own .map.")
    map_fn = None if map_fn is None else example_function(map_fn)
    if is_random_access(x):
        if any(_is_keras_batches(cls) for cls in type(x).__mro__):
            raise ValueError(
                f"`x` is a {type(x).__name__}, whose items are batches: poisson_batches samples examples (a source's "
                "x[i] must be one example, (x, y) or (x, y, sample_weight)). Pass the examples' arrays or a "
                "random-access source of examples."
            )
        if y is not None or sample_weight is not None:
            raise ValueError(
                "With a random-access source `x`, its elements hold y and sample_weight: leave `y` and "
                "`sample_weight` None."
            )
        if len(x) < 1:
            raise ValueError(f"`x` must hold at least 1 example (N >= 1). Received: N={len(x)}.")
        return source_rows(x, map_fn, threads)
    leaves = batch_sizes.leaves(x) + batch_sizes.leaves(y)
    if map_fn is None and not any(is_lazy_array(leaf) for leaf in leaves):
        return None
    return array_rows(x, y, sample_weight, map_fn, check_rows(x, y, sample_weight))


def example_function(map_fn: Callable) -> Callable[[Any], Any]:
    """``map_fn`` (`keras_dyndp.poisson_batches`' ``map``) as a function of one element, called as
    ``tf.data.Dataset.map`` calls its function where that is what ``map_fn`` takes: a tuple element (arrays'
    ``(x_i, y_i)``, a source's tuples) unpacked into its parts, ``map_fn(x_i, y_i)``, when ``map_fn`` takes two
    positional arguments or more (or ``*args``); an element whole, ``map_fn(element)``, when it takes one (a tfds
    dict, or a tuple to a function of one argument) or its signature cannot be read.

    Raises:
        ValueError: ``map_fn`` is not callable or takes no argument; or (when an element is read) ``map_fn`` takes
            the parts of a tuple and an element is not a tuple of as many parts.
    """
    if not callable(map_fn):
        raise ValueError(
            f"`map` must be a function of an example: map(element) or map(x_i, y_i). Received: {map_fn!r}."
        )
    try:
        parameters = inspect.signature(map_fn).parameters.values()
    except (TypeError, ValueError):  # builtins and C functions without a signature: the element whole.
        return map_fn
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = sum(p.default is p.empty for p in positional)
    variadic = any(p.kind == p.VAR_POSITIONAL for p in parameters)
    if not positional and not variadic:
        raise ValueError(
            "`map` must take the example: map(element) or map(x_i, y_i). Received a function of no positional "
            f"argument: {map_fn!r}."
        )
    if required <= 1 and positional:
        return map_fn
    most = math.inf if variadic else len(positional)

    def of_parts(element: Any) -> Any:
        if type(element) is not tuple or not required <= len(element) <= most:  # as tf.data: a tuple, not a subclass
            parts = f"a tuple of {len(element)}" if type(element) is tuple else f"a {type(element).__name__}"
            counts = f"{required}" if most == required else f"{required} or more" if variadic else f"{required}-{most}"
            raise ValueError(
                f"`map` takes {counts} positional arguments, the parts of a tuple element (map(x_i, y_i)); an element "
                f"here is {parts}: write map(element) for it."
            )
        return map_fn(*element)

    return of_parts


def _is_keras_batches(cls: type) -> bool:
    """Whether ``cls`` is Keras's ``PyDataset`` or ``Sequence`` (of batches; not collections.abc.Sequence)."""
    keras_module = cls.__module__.split(".")[0] in ("keras", "tf_keras", "tensorflow")
    return keras_module and cls.__name__ in ("PyDataset", "Sequence")


class DrawCounter:
    """Numbers the draws of one sampler (thread-safe): draw t's generator is ``default_rng([seed, t])``, so the
    batches are a function of (seed, draw number), none repeats, and several reading threads keep the law."""

    def __init__(self, seed: int):
        self.seed, self.draws = seed, 0
        self._lock = threading.Lock()

    def next_generator(self) -> np.random.Generator:
        """A fresh generator for the next draw."""
        with self._lock:
            draw_number, self.draws = self.draws, self.draws + 1
        return np.random.default_rng([self.seed, draw_number])
