"""Examples read on demand for `keras_dyndp.poisson_batches` (data that need not fit in memory): array-likes indexed by
a sorted integer array (numpy memmaps, h5py / zarr-like datasets) and random-access sources (``len(source)``,
``source[i]``, ``source.__getitems__(list)`` if present: ``tfds.data_source``'s and grain's protocol), each example
``(x, y)`` or ``(x, y, sample_weight)`` after the optional ``map``. Each step draws its batch as Poisson sampling does
(`draw`), in O(k), reads it in increasing index order and pads it as in-memory batches are (`Rows.batch`). A source is
called from several threads only if `readers.known_thread_safe` or declared so (``source_threads``; docs/privacy.md)."""

from __future__ import annotations

import contextlib
import inspect
import math
import mmap
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from keras_dyndp.core import batch_sizes
from keras_dyndp.data import readers

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
    """One Poisson sample: (k, the indices of min(k, cap) of the k selected examples, in random order). k ~
    Binomial(N, p) and a uniform k-subset is the law of N independent coin flips of probability p; on overflow (k >
    cap) a uniform cap-subset of them is what truncating a uniform k-subset keeps."""
    num_selected = int(rng.binomial(num_examples, sampling_probability))
    return num_selected, rng.choice(num_examples, min(num_selected, cap), replace=False)


class Rows:
    """N examples read by index arrays: ``read(sorted indices)`` -> ``(x, y, sample_weight)`` numpy nests (``y``
    None without labels, ``sample_weight`` float32 [k]); example 0, read once, sets the padding rows' shapes, dtypes."""

    def __init__(self, num_examples: int, read: Callable[[np.ndarray], tuple[Any, Any, np.ndarray]]):
        self.num_examples, self._read, self.example = num_examples, read, None
        self.example = self.read(np.zeros(1, np.int64))

    def read(self, indices: np.ndarray) -> tuple[Any, Any, np.ndarray]:
        """The rows ``indices`` (increasing), as numpy arrays with len(indices) rows."""
        if len(indices) == 0:
            return readers.map_nest(lambda leaf: leaf[:0], self.example)
        rows = self._read(indices)
        counts = {np.shape(leaf)[0] if np.ndim(leaf) else None for leaf in batch_sizes.leaves(rows)}
        readers.check_one_per_index(counts, len(indices))
        if self.example is not None:
            readers.map_nest(readers.check_like, self.example, rows)
        return rows

    def batch(
        self, chosen: np.ndarray, num_rows: int, keep_order: bool = False, read_at: np.ndarray | None = None
    ) -> tuple[Any, Any, np.ndarray]:
        """``(x, y, sample_weight)`` of ``num_rows`` >= len(chosen) rows: the examples ``chosen`` (in increasing index
        order, or ``chosen``'s with ``keep_order``), then zero rows of weight 0. With ``read_at`` (batch positions;
        implies ``keep_order``) only those are read, the others zero rows of weight 0: another worker's share."""
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

        return readers.map_nest(pad, rows)


def source_rows(source: Any, map_fn: Callable | None, threads: int | None = None) -> Rows:
    """`Rows` of a random-access source: its elements fetched (`tfds_reader.tfds_fetcher`, else
    `readers.chunked_fetcher`), then ``map_fn``; at most ``threads`` (``source_threads``) calls of it at once, across
    batches too (`readers.source_guard`); None: unlimited if `readers.known_thread_safe`, else one at a time."""
    # tfds, ArrayRecord and protobuf reading, imported with the first source read rather than with the optimizer.
    from keras_dyndp.data import tfds_reader  # pylint: disable=import-outside-toplevel

    threads = 1 if threads is None and not readers.known_thread_safe(source) else threads
    guard = contextlib.nullcontext() if threads is None else readers.source_guard(source, threads)
    fetch = tfds_reader.tfds_fetcher(source, guard) or readers.chunked_fetcher(
        source, threads or readers.READ_THREADS, guard
    )

    def read(indices: np.ndarray) -> tuple[Any, Any, np.ndarray]:
        elements = fetch([int(index) for index in indices])
        if isinstance(elements, readers.BatchRows):
            return elements.examples(map_fn)
        readers.check_one_per_index({len(elements)}, len(indices))
        return readers.examples(elements, map_fn)

    return Rows(len(source), read)


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
    leaf_readers = readers.map_nest(
        lambda leaf: readers.file_reader(leaf if is_lazy_array(leaf) else np.asarray(leaf)), (x, y)
    )

    def read(indices: np.ndarray) -> tuple[Any, Any, np.ndarray]:
        rows_x, rows_y = readers.map_nest(lambda reader: reader(indices), leaf_readers)
        rows_w = np.ones(len(indices), np.float32) if weights is None else weights[indices]
        if map_fn is None:
            return rows_x, rows_y, rows_w
        row = lambda nest, i: readers.map_nest(lambda leaf: leaf[i], nest)  # noqa: E731
        mapped = [map_fn((row(rows_x, i), row(rows_y, i))) for i in range(len(indices))]
        if any(isinstance(element, tuple) and len(element) == 3 for element in mapped):
            raise ValueError(
                "With arrays, `map` maps (x_i, y_i) to (x_i, y_i); a weight it returned would be ignored: pass "
                "per-example weights as `sample_weight`."
            )
        mapped_x, mapped_y, _ = readers.examples(mapped, None)
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
    """``map_fn`` (`keras_dyndp.poisson_batches`' ``map``) as a function of one element, called as tf.data calls it:
    a tuple element unpacked, ``map_fn(x_i, y_i)``, when it takes two positional arguments or more (or ``*args``); the
    element whole when it takes one or its signature cannot be read. ValueError for what cannot take an element."""
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
