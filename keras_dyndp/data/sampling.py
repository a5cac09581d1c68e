"""`poisson_batches`: the batches the accountants assume (Poisson subsampling: each example joins each batch
independently with probability p; shuffle-and-slice has no tight analysis, tensorflow/privacy #483), for ``fit``.
Batches are padded with sample-weight-0 rows to ``max_batch_size`` (or to the next multiple of ``pad_to_multiple``): the
rows follow the private batch size, so the optimizers divide by p N and ``public_batch_size=True`` refuses them.
Truncating to the cap is not free (one example can push another out), so it adds to delta (`batch_sizes`;
docs/privacy.md, "What a reported epsilon covers"). ``seed=None`` draws from OS entropy (the only choice for a release);
a resumed seeded run draws fresh batches (`sampler_seed`, `check_resume`). Each backend's ``data`` builds them."""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from keras_dyndp import backend
from keras_dyndp.core import batch_sizes
from keras_dyndp.core import refusals
from keras_dyndp.core import validation
from keras_dyndp.data import sources

__all__ = ["PoissonSampling", "poisson_batches"]


OVERFLOW_POLICIES = ("truncate", "raise")


@dataclasses.dataclass(frozen=True)
class PoissonSampling:
    """How `poisson_batches` samples; ``same_on_every_worker`` (TensorFlow): its seed was given or agreed by all;
    ``seed`` (None: OS entropy) and ``start_step``: the sampler's state (`check_resume`), not its law (not in ==)."""

    num_examples: int
    sampling_probability: float
    max_batch_size: int
    same_on_every_worker: bool = True
    pad_to_multiple: int | None = None
    seed: int | None = dataclasses.field(default=None, compare=False)
    start_step: int = dataclasses.field(default=0, compare=False)


@dataclasses.dataclass(frozen=True)
class SamplerArguments:
    """`poisson_batches`' arguments, checked; what a backend's materialiser receives."""

    sampling_probability: float
    steps_per_epoch: int
    max_batch_size: int | None
    pad_to_multiple: int | None
    overflow: str
    seed: int | None
    start_step: int = 0

    @property
    def stream_seed(self) -> int | None:
        """The seed the batches are drawn from (`sampler_seed`); None: OS entropy."""
        return sampler_seed(self.seed, self.start_step)

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
    map: Callable[..., Any] | None = None,
    start_step: int = 0,
    source_threads: int | None = None,
) -> Any:
    """Poisson-sampled, padded batches ``(x, y, sample_weight)`` for ``model.fit`` (module docstring); pass them
    unchanged: the DP optimizers check that they sample at the schedule's p.

    Args:
        x: an array or a nest of arrays with N rows; or array-likes read by index on demand (numpy memmaps, h5py /
            zarr-like datasets); or a random-access source of N examples (``len(x)``, ``x[i]``, optionally
            ``x.__getitems__(list)``: ``tfds.data_source``, grain); on TensorFlow also a finite, unbatched
            ``tf.data.Dataset``, read into memory. A source's or dataset's elements (after ``map``) are ``(x, y[,
            sample_weight])`` with fixed shapes, and ``y`` and ``sample_weight`` are None.
        y: an array or a nest of arrays (or array-likes) with N rows, or None.
        sample_weight: weights, [N] or per loss entry [N, L, ...] (a padding mask); default 1 (padding rows: 0).
        sampling_probability: p in (0, 1], the schedule's.
        steps_per_epoch: batches per epoch, >= 1; default ceil(1 / p) (`batch_sizes.expected_steps_per_epoch`).
        max_batch_size: rows of every batch, >= 1; default `batch_sizes.default_max_batch_size(N, p)` (TensorFlow:
            rounded up to a multiple of the replicas).
        pad_to_multiple: None: every batch has ``max_batch_size`` rows. m >= 1: pad to the next multiple of m (at
            least m, at most ``max_batch_size``; TensorFlow: m rounded up to a multiple of the replicas).
        overflow: 'truncate' (keep a random ``max_batch_size`` of them, with a warning) or 'raise'.
        seed: None: OS entropy. An integer >= 0: reproducible batches, for tests and research; with ``start_step``
            the sampler's state, saved by you beside the optimizer's checkpoint.
        num_examples: N, checked against the data's rows (a ``tf.data.Dataset``'s: None counts them).
        map: None, or a public function of each sampled example after it is read (decode, normalise) returning
            ``(x, y[, sample_weight])``: ``map(x_i, y_i)`` of a tuple's parts, as tf.data's, or ``map(element)``.
        start_step: the optimizer's step (``int(optimizer.iterations)``) these batches start at, >= 0 (default 0).
            A seeded run resumed at step k passes ``start_step=k``: its batches are drawn from (seed, k); ``fit``
            refuses another once steps were taken on other batches. Ignored with ``seed=None``.
        source_threads: how many threads may call a random-access ``x`` at once. None (default): several for
            tfds's data sources and ``ArrayRecordDataSource``, one at a time for any other (a source that seeks and
            reads a shared file would mix examples up). An integer n >= 1: you declare ``x`` safe for n threads.

    Returns:
        TensorFlow: a finite ``tf.data.Dataset`` of ``steps_per_epoch`` batches; JAX: a ``keras.utils.PyDataset``.
    """
    arguments = check_arguments(
        sampling_probability, steps_per_epoch, max_batch_size, pad_to_multiple, overflow, seed, start_step
    )
    num_examples = None if num_examples is None else validation.check_positive_int("num_examples", num_examples)
    data = backend.implementation("data")
    on_demand = _rows_on_demand(x, y, sample_weight, map, num_examples, source_threads)
    if on_demand is not None:
        x, y, sample_weight = on_demand, None, None
    return data.make_poisson_batches(x, y, sample_weight, arguments, num_examples)


def _rows_on_demand(x, y, sample_weight, map, num_examples, source_threads) -> Any:
    """`sources.rows` of data read on demand, checked to hold ``num_examples`` rows; None for in-memory data."""
    source_threads = validation.check_int("source_threads", source_threads, 1, none_means="the package decides")
    on_demand = sources.rows(
        x, y, sample_weight, map, lambda *arrays: check_rows(*arrays, num_examples), source_threads
    )
    if on_demand is not None and num_examples is not None and on_demand.num_examples != num_examples:
        raise ValueError(f"`x` must have num_examples={num_examples} rows. Received: {on_demand.num_examples} rows.")
    return on_demand


def check_arguments(
    sampling_probability: float,
    steps_per_epoch: int | None = None,
    max_batch_size: int | None = None,
    pad_to_multiple: int | None = None,
    overflow: str = "truncate",
    seed: int | None = None,
    start_step: int = 0,
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
        validation.check_int("start_step", start_step, 0),
    )


def sampler_seed(seed: int | None, start_step: int) -> int | None:
    """The seed of batches starting at ``start_step``: ``seed`` at step 0 (None, OS entropy, included), else 63 bits
    mixed from (seed, start_step) by numpy's ``SeedSequence``, so a resumed run draws independently of the first."""
    if seed is None or start_step == 0:
        return seed
    return int(np.random.SeedSequence([seed, start_step]).generate_state(1, np.uint64)[0] >> np.uint64(1))


# Per data object `poisson_batches` returned, the optimizers that trained on it (weak: nothing is kept alive).
_TRAINED_ON: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def check_resume(data: Any, poisson: PoissonSampling | None, optimizer: Any) -> None:
    """Raises ValueError, before ``fit``'s first step, when seeded batches ``data`` (sampled as ``poisson``; None: not
    ours) would draw again the samples of steps ``optimizer`` has taken: their ``start_step`` is not its step count and
    it has not trained on ``data`` here (a later ``fit`` continues its draws). Else records that it trains on it."""
    if poisson is None or poisson.seed is None:
        return
    trained = _TRAINED_ON.setdefault(data, weakref.WeakSet())
    steps = int(optimizer.dp_step.numpy())
    if steps > 0 and poisson.start_step != steps and optimizer not in trained:
        raise refusals.user_error(
            ValueError(
                f"poisson_batches(seed={poisson.seed}, start_step={poisson.start_step}) would draw again the samples "
                f"of steps the optimizer has already taken (it has taken {steps}): pass "
                "start_step=int(optimizer.iterations) when resuming, or seed=None. Nothing was trained. A resumed "
                "run's batches must be fresh Poisson samples: the privacy accounting assumes every step's sample "
                "is drawn anew."
            )
        )
    trained.add(optimizer)


def check_rows(x: Any, y: Any, sample_weight: Any, num_examples: int | None = None) -> int:
    """N, the rows of the arrays in ``x``, ``y`` and ``sample_weight`` ([N], [N, 1] or per loss entry [N, L, ...]);
    ValueError without a leading example dimension, for N < 1, or rows that differ or are not ``num_examples``."""
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
    if sample_weight is not None and tuple(np.shape(sample_weight))[:1] != (num_rows,):
        raise ValueError(
            f"`sample_weight` must have {num_rows} rows: shape ({num_rows},), one weight per example, or "
            f"({num_rows}, L, ...), one per loss entry (such as a causal language model's padding mask). "
            f"Received: shape={tuple(np.shape(sample_weight))}."
        )
    return int(num_rows)
