"""`poisson_batches`: the batches the accountants assume (Poisson subsampling: each example joins each batch
independently with probability p; shuffle-and-slice has no tight analysis, tensorflow/privacy #483), for ``fit``.

Batches are padded with sample-weight-0 rows to ``max_batch_size`` (or to the next multiple of ``pad_to_multiple``):
the rows follow the private batch size, so the optimizers divide by p N and ``public_batch_size=True`` refuses them.
More than ``max_batch_size`` selected: a random ``max_batch_size`` of them are kept with a warning ('truncate') or the
step fails ('raise'). Not free: one example can push another out (sensitivity 2C), so the run is
(epsilon, delta + (1 + e^epsilon) T eta)-DP, eta = P[Binomial(N + 1, p) > cap] (`batch_sizes.truncation_delta`);
the default cap makes eta <= 1e-15 (adds 4e-11 for T = 4800, epsilon = 2: negligible; with a small hand-picked cap,
report it). ``seed=None`` draws from OS entropy (the only choice for a release). Each backend's ``data`` module
materialises the batches.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from typing import Any

import numpy as np

from keras_dyndp import backend
from keras_dyndp import batch_sizes
from keras_dyndp import sources
from keras_dyndp import validation

__all__ = ["PoissonSampling", "poisson_batches"]


OVERFLOW_POLICIES = ("truncate", "raise")


@dataclasses.dataclass(frozen=True)
class PoissonSampling:
    """How `poisson_batches` samples; ``same_on_every_worker`` (TensorFlow): its seed was given or agreed by all."""

    num_examples: int
    sampling_probability: float
    max_batch_size: int
    same_on_every_worker: bool = True
    pad_to_multiple: int | None = None


@dataclasses.dataclass(frozen=True)
class SamplerArguments:
    """`poisson_batches`' arguments, checked; what a backend's materialiser receives."""

    sampling_probability: float
    steps_per_epoch: int
    max_batch_size: int | None
    pad_to_multiple: int | None
    overflow: str
    seed: int | None

    def cap(self, num_examples: int, multiple_of: int = 1) -> int:
        """``max_batch_size``, or the default cap for N examples rounded up to a multiple of ``multiple_of``."""
        if self.max_batch_size is not None:
            return self.max_batch_size
        default = batch_sizes.default_max_batch_size(num_examples, self.sampling_probability)
        return -(-default // multiple_of) * multiple_of


def poisson_batches(
    x: Any,
    y: Any = None,
    sample_weight: Any = None,
    *,
    sampling_probability: float,
    steps_per_epoch: int | None = None,
    max_batch_size: int | None = None,
    pad_to_multiple: int | None = None,
    overflow: str = "truncate",
    seed: int | None = None,
    num_examples: int | None = None,
    map: Callable[[Any], Any] | None = None,
) -> Any:
    """Poisson-sampled, padded batches ``(x, y, sample_weight)`` for ``model.fit`` (module docstring); pass them
    unchanged: the DP optimizers check that they sample at the schedule's p.

    Args:
        x: an array or a nest of arrays with N rows; or array-likes read by index on demand (numpy memmaps, h5py /
            zarr-like datasets: anything with a ``shape`` and a ``__getitem__`` taking an integer array); or a
            random-access source of N examples (``len(x)``, ``x[i]`` and, when present, ``x.__getitems__(list)``:
            ``tfds.data_source``, grain) whose elements (after ``map``) are ``(x, y[, sample_weight])`` with fixed
            shapes; on TensorFlow also a finite, unbatched ``tf.data.Dataset`` of ``(x, y[, sample_weight])`` with
            fixed shapes, read into memory. With a source or a dataset, ``y`` and ``sample_weight`` are None.
        y: an array or a nest of arrays (or array-likes) with N rows, or None.
        sample_weight: per-example weights, shape [N]; default 1 (padding rows: 0).
        sampling_probability: p in (0, 1], the schedule's.
        steps_per_epoch: batches per epoch, >= 1; default ``round(1 / p)``.
        max_batch_size: rows of every batch, >= 1; default `batch_sizes.default_max_batch_size(N, p)` (TensorFlow:
            rounded up to a multiple of the replicas).
        pad_to_multiple: None: every batch has ``max_batch_size`` rows. m >= 1: pad to the next multiple of m (at
            least m, at most ``max_batch_size``; TensorFlow: m rounded up to a multiple of the replicas).
        overflow: 'truncate' (keep a random ``max_batch_size`` of them, with a warning) or 'raise'.
        seed: None: OS entropy. An integer: reproducible batches, for tests and research.
        num_examples: N, checked against the data's rows (a ``tf.data.Dataset``'s: None counts them).
        map: None, or a function applied to each sampled example after it is read (decode, normalise): of a
            source's element, returning ``(x, y[, sample_weight])``; of arrays, ``(x_i, y_i)`` -> ``(x_i, y_i)``.
            Public (it sees only the example it maps).

    Returns:
        TensorFlow: a finite ``tf.data.Dataset`` of ``steps_per_epoch`` batches; JAX: a ``keras.utils.PyDataset``.
    """
    arguments = check_arguments(sampling_probability, steps_per_epoch, max_batch_size, pad_to_multiple, overflow, seed)
    if num_examples is not None:
        num_examples = validation.check_positive_int("num_examples", num_examples)
    data = importlib.import_module(f"keras_dyndp.{'jax' if backend.keras_backend() == 'jax' else 'tf'}_backend.data")
    on_demand = sources.rows(x, y, sample_weight, map, lambda *arrays: check_rows(*arrays, num_examples))
    if on_demand is not None:
        if num_examples is not None and on_demand.num_examples != num_examples:
            raise ValueError(
                f"`x` must have num_examples={num_examples} rows. Received: {on_demand.num_examples} rows."
            )
        x, y, sample_weight = on_demand, None, None
    return data.make_poisson_batches(x, y, sample_weight, arguments, num_examples)


def check_arguments(
    sampling_probability: float,
    steps_per_epoch: int | None = None,
    max_batch_size: int | None = None,
    pad_to_multiple: int | None = None,
    overflow: str = "truncate",
    seed: int | None = None,
) -> SamplerArguments:
    """`poisson_batches`' arguments checked (ValueError naming the argument), with the default ``steps_per_epoch``."""
    validation.check_choice("overflow", overflow, OVERFLOW_POLICIES)
    p = validation.check_probability(sampling_probability)

    def positive(name: str, value: int | None) -> int | None:
        return None if value is None else validation.check_positive_int(name, value)

    return SamplerArguments(
        p,
        positive("steps_per_epoch", steps_per_epoch) or batch_sizes.expected_steps_per_epoch(p),
        positive("max_batch_size", max_batch_size),
        positive("pad_to_multiple", pad_to_multiple),
        overflow,
        validation.check_int("seed", seed, 0, none_means="OS entropy"),
    )


def check_rows(x: Any, y: Any, sample_weight: Any, num_examples: int | None = None) -> int:
    """N, the rows of every array in ``x`` and ``y`` and of ``sample_weight`` (shape [N] or [N, 1]), checked.

    Raises:
        ValueError: if an array has no leading example dimension, N < 1, the rows differ or are not
            ``num_examples`` (when given).
    """
    shapes = [tuple(np.shape(leaf)) for leaf in batch_sizes.leaves(x) + batch_sizes.leaves(y)]
    if not shapes or any(not shape for shape in shapes):
        raise ValueError("`x` and `y` must be arrays (or nests of arrays) with a leading example dimension.")
    num_rows = shapes[0][0]
    if num_rows < 1:
        raise ValueError(f"`x` must hold at least 1 example (N >= 1). Received: N={num_rows}.")
    if num_examples is not None and num_rows != num_examples:
        raise ValueError(f"`x` must have num_examples={num_examples} rows. Received: {num_rows} rows.")
    if any(shape[0] != num_rows for shape in shapes):
        raise ValueError(
            f"All arrays in `x` and `y` must have the same number of rows. Received: {[s[0] for s in shapes]}."
        )
    if sample_weight is not None and tuple(np.shape(sample_weight)) not in ((num_rows,), (num_rows, 1)):
        raise ValueError(
            f"`sample_weight` must have shape ({num_rows},). Received: shape={tuple(np.shape(sample_weight))}."
        )
    return int(num_rows)
