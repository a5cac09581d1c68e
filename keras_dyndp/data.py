"""Batching for DP-SGD: Poisson subsampling as the accountants assume it.

Every accountant in this package (GDP-CLT, RDP, PLD) assumes *Poisson subsampling*: at each step every training
example joins the batch independently with probability ``p``, so the batch size is Binomial(N, p) and changes
from step to step. Shuffle-and-slice batching, the usual Keras habit, has no tight analysis under these
accountants (tensorflow/privacy #483); it is offered here only as the common, documented approximation.

Keras wants fixed shapes (a varying batch size retraces the train step), so the Poisson batches are padded to a
fixed number of rows, ``max_batch_size``. Padding rows hold zeros and have sample weight 0, so a per-example
clipped-gradient sum ignores them; a batch in which nobody was selected is all padding and all-zero weights.
``pad_to_multiple=m`` pads each batch only to the next multiple of m instead (at most ``max_batch_size``): a few
batch shapes, each traced once, and far fewer padding rows to compute (the default cap is 385 rows for an
expected 250; with m = 32, about 270 on average). The number of rows then follows the private batch size, so the
step must not normalise by it.
The real number of examples in a batch is the number of non-zero weights (with unit weights, their sum), and it is
private too. The DP optimizers divide the noisy gradient sum by the expected batch size ``p * N`` (their
``expected_batch_size``), never by the rows or the examples; an optimizer built with ``public_batch_size=True``
(rows as the normaliser, for batches of a public size) refuses these datasets.

Overflow and truncation
-----------------------
When more than ``max_batch_size`` examples are selected (an *overflow*), a uniformly random subset of
``max_batch_size`` of them is kept and a warning is printed to stderr (``overflow='truncate'``, the default), or
the input pipeline fails with ``tf.errors.InvalidArgumentError`` (``overflow='raise'``).

Truncation is *not* free post-processing under add/remove adjacency: once the cap is hit, adding one example can
push another one out of the batch, so the two batches differ by a swap (sensitivity 2C instead of C). It is safe
only up to a small additive delta. The truncated run and the untruncated (exact Poisson) run, driven by the same
randomness, differ only when some step overflows, which happens with probability at most ``T * eta``, where
``eta = P[Binomial(N + 1, p) > max_batch_size]`` (``N + 1``: the larger neighbour). Hence, if the exact Poisson
mechanism is (epsilon, delta)-DP, the truncated one is (epsilon, delta + (1 + e^epsilon) * T * eta)-DP; see
`truncation_delta`. The default cap, `default_max_batch_size`, makes ``P[Binomial(N, p) > cap] <= 1e-15``, so this
extra delta is about ``(1 + e^epsilon) * T * 1e-15`` (4e-11 for T = 4800, epsilon = 2), negligible next to the
usual ``delta = 1 / (10 N)``. A looser tail such as 1e-9 would NOT be negligible: 4e-5 for the same T and epsilon,
more than delta itself. The price of the safe cap is padding: 385 rows for an expected 250 (N = 60000). With a
hand-picked small cap, check `truncation_delta` and add it to the reported delta.
``overflow='raise'`` is no better in this respect: whether the run fails also differs between neighbours only
on overflow, so the same extra delta applies; it only makes an overflow impossible to miss.

Randomness
----------
The selections must stay secret and must never repeat. ``seed=None`` (the default, and the only choice for a
model you release) draws 63 bits from the OS (`secrets`) when the dataset is built, so every process samples
afresh; TensorFlow's global seed (``tf.keras.utils.set_random_seed``) cannot make two processes draw the same
batches, as it would if the dataset's seed were left to TensorFlow. Every new iteration over the *same* dataset
object (Keras re-iterates a finite dataset each epoch) draws fresh, independent batches, so epochs never repeat
the same selections. An integer ``seed`` makes the batches reproducible, for tests and research: a new dataset
object built with the same seed (and the same global seed, which TensorFlow mixes into every op seed) yields the
same batches. When resuming a run from a checkpoint with a seed, build the dataset with a new seed: replaying the
same selections would correlate steps, which the accountants do not allow for. Under a multi-worker
``tf.distribute`` strategy (dataset built in its scope) the workers agree on the OS-drawn seed, since each worker
takes its share of the same global batches (`keras_dyndp.replicas.agreed_random_bits`).

Telling the optimizer what it trains on
---------------------------------------
The datasets returned by `poisson_batches_from_tensors` and `poisson_batches` are registered with their N, p and
cap (`poisson_sampling`), so a keras_dyndp DP optimizer can check that ``model.fit`` received Poisson batches at
its schedule's p, and warn once when it received anything else. Pass the returned dataset to ``fit`` unchanged (a
derived dataset, e.g. ``.repeat()``, is a new object and not registered). `batch_size_range` is the range of batch
sizes the optimizers accept at each step.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import weakref
from typing import Any

import tensorflow as tf

from keras_dyndp import replicas
from keras_dyndp import validation
from keras_dyndp.batch_sizes import BATCH_SIZE_TAIL  # noqa: F401  (re-exported)
from keras_dyndp.batch_sizes import DEFAULT_OVERFLOW_TAIL  # noqa: F401  (re-exported)
from keras_dyndp.batch_sizes import batch_size_range  # noqa: F401  (re-exported)
from keras_dyndp.batch_sizes import default_max_batch_size
from keras_dyndp.batch_sizes import expected_steps_per_epoch  # noqa: F401  (re-exported)
from keras_dyndp.batch_sizes import truncation_delta  # noqa: F401  (re-exported)

_OVERFLOW_POLICIES = ("truncate", "raise")


@dataclasses.dataclass(frozen=True)
class PoissonSampling:
    """How a dataset made by this module samples: N examples, rate p, batches padded to ``max_batch_size`` rows
    (or to the next multiple of ``pad_to_multiple``, at most that); ``same_on_every_worker``: its seed was given, or
    agreed by the workers of a multi-worker strategy."""

    num_examples: int
    sampling_probability: float
    max_batch_size: int
    same_on_every_worker: bool = True
    pad_to_multiple: int | None = None


# The datasets this module returned, with their sampling; weak keys, so registering keeps no dataset alive.
_POISSON_DATASETS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def poisson_sampling(dataset: Any) -> PoissonSampling | None:
    """The `PoissonSampling` of a dataset returned by `poisson_batches_from_tensors` / `poisson_batches`, else None.

    Anything else, including a dataset derived from one of them (``.repeat()``, ``.take()``, ...), gives None.
    """
    try:
        return _POISSON_DATASETS.get(dataset)
    except TypeError:  # Not weak-referenceable or not hashable (numpy arrays, lists, ...): not ours.
        return None


def _as_tensors(x: Any, y: Any, sample_weight: Any) -> tuple[Any, Any, tf.Tensor, int]:
    """Converts (nests of) arrays to tensors and checks that all share the leading dimension N >= 1."""
    x = tf.nest.map_structure(tf.convert_to_tensor, x)
    y = tf.nest.map_structure(tf.convert_to_tensor, y)
    leaves = tf.nest.flatten((x, y))
    if not leaves or any(leaf.shape.rank == 0 for leaf in leaves):
        raise ValueError("`x` and `y` must be arrays (or nests of arrays) with a leading example dimension.")
    num_examples = int(leaves[0].shape[0])
    if num_examples < 1:
        raise ValueError(f"`x` must hold at least 1 example (N >= 1). Received: N={num_examples}.")
    if any(int(leaf.shape[0]) != num_examples for leaf in leaves):
        raise ValueError(
            "All arrays in `x` and `y` must have the same number of rows. Received: "
            f"{[int(leaf.shape[0]) for leaf in leaves]}."
        )
    if sample_weight is None:
        sample_weight = tf.ones([num_examples], tf.float32)
    else:
        sample_weight = tf.cast(tf.convert_to_tensor(sample_weight), tf.float32)
        if sample_weight.shape != (num_examples,):
            raise ValueError(
                f"`sample_weight` must have shape ({num_examples},). Received: shape={tuple(sample_weight.shape)}."
            )
    return x, y, sample_weight, num_examples


def _gather_rows(
    tensors: Any, indices: tf.Tensor, keep: tf.Tensor, num_padding_rows: int, num_rows: tf.Tensor | None = None
) -> Any:
    """Rows ``indices`` of every tensor in a nest; rows where ``keep`` is False and padding rows are zeros; only the
    first ``num_rows`` rows when it is not None."""

    def gather(tensor: tf.Tensor) -> tf.Tensor:
        rows = tf.gather(tensor, indices)
        mask = tf.reshape(keep, [-1] + [1] * (rows.shape.rank - 1))
        rows = tf.where(mask, rows, tf.zeros_like(rows))
        if num_padding_rows:
            padding = tf.zeros([num_padding_rows] + rows.shape[1:].as_list(), rows.dtype)
            rows = tf.concat([rows, padding], axis=0)
        return rows if num_rows is None else rows[:num_rows]

    return tf.nest.map_structure(gather, tensors)


def poisson_batches_from_tensors(
    x: Any,
    y: Any,
    sampling_probability: float,
    *,
    sample_weight: Any = None,
    max_batch_size: int | None = None,
    num_steps: int | None = None,
    seed: int | None = None,
    overflow: str = "truncate",
    pad_to_multiple: int | None = None,
) -> tf.data.Dataset:
    """Poisson-sampled, padded batches ``(x, y, sample_weight)`` from in-memory arrays.

    At each step every example is selected independently with probability p (one uniform draw per example), the
    selected rows are gathered and the batch is padded to ``max_batch_size`` rows of zeros with sample weight 0
    (or, with ``pad_to_multiple``, to the next multiple of it; see the module docstring).
    Cost per step: O(N) random numbers plus a gather of ``max_batch_size`` rows; nothing is materialised per
    epoch. See the module docstring for the overflow (truncation) policy and its privacy cost, and for seeding.

    Typical use, one Keras epoch = ``round(1 / p)`` steps, fresh samples every epoch::

        ds = poisson_batches_from_tensors(x_train, y_train, p, seed=0)
        model.fit(ds, epochs=epochs)

    Args:
        x: Features: an array or a nest (dict, tuple) of arrays, all with N rows.
        y: Labels: an array or a nest of arrays with N rows.
        sampling_probability: Poisson sampling rate p, in (0, 1].
        sample_weight: Optional per-example weights, shape [N]; default 1. Padding rows get weight 0.
        max_batch_size: Number of rows of every batch, >= 1; default `default_max_batch_size(N, p)`, rounded up to a
            multiple of the replicas when built under a tf.distribute strategy's scope.
        num_steps: Steps (batches) per iteration over the dataset, >= 1; default `expected_steps_per_epoch(p)`.
        seed: Sampling seed for reproducible research runs; None (default) draws it from OS entropy, whatever the
            global seed. See the module docstring.
        overflow: 'truncate' (keep a uniformly random ``max_batch_size`` of the selected examples and print a
            warning) or 'raise' (fail with ``tf.errors.InvalidArgumentError``).
        pad_to_multiple: None (default): every batch has ``max_batch_size`` rows. An integer m >= 1: each batch
            has the selected examples first, then padding up to the next multiple of m (at least m rows, at most
            ``max_batch_size``); under a tf.distribute strategy's scope m is first rounded up to a multiple of the
            replicas, so that every batch splits evenly.

    Returns:
        A finite ``tf.data.Dataset`` of ``num_steps`` elements ``(x, y, sample_weight)`` whose leading dimension
        is ``max_batch_size`` (unknown with ``pad_to_multiple``); ``sample_weight`` is float32.

    Raises:
        ValueError: On an invalid argument.
    """
    sampling_probability = validation.check_probability(sampling_probability)
    x, y, sample_weight, num_examples = _as_tensors(x, y, sample_weight)
    if max_batch_size is None:
        # A multiple of the replicas: Keras 3 needs the first batch to split evenly (keras-team/keras#19246).
        max_batch_size = -(-default_max_batch_size(num_examples, sampling_probability) // replicas.num_replicas())
        max_batch_size *= replicas.num_replicas()
    max_batch_size = validation.check_positive_int("max_batch_size", max_batch_size)
    if num_steps is None:
        num_steps = expected_steps_per_epoch(sampling_probability)
    num_steps = validation.check_positive_int("num_steps", num_steps)
    if overflow not in _OVERFLOW_POLICIES:
        raise ValueError(f"`overflow` must be one of {_OVERFLOW_POLICIES}. Received: overflow={overflow!r}.")
    if pad_to_multiple is not None:
        pad_to_multiple = validation.check_positive_int("pad_to_multiple", pad_to_multiple)
        pad_to_multiple = math.lcm(pad_to_multiple, replicas.num_replicas())

    num_gathered = min(max_batch_size, num_examples)
    num_padding_rows = max_batch_size - num_gathered

    def make_batch(step_seed: tf.Tensor) -> tuple[Any, Any, tf.Tensor]:
        # float64: p down to ~1e-15 is represented without bias.
        uniforms = tf.random.stateless_uniform([num_examples], seed=step_seed, dtype=tf.float64)
        selected = uniforms < sampling_probability
        num_selected = tf.reduce_sum(tf.cast(selected, tf.int32))
        # The examples with the smallest uniforms: all selected ones, and on overflow a uniformly random subset of
        # them (the uniforms of the selected examples are i.i.d. U(0, p)); sorted puts them first.
        _, indices = tf.math.top_k(-uniforms, k=num_gathered, sorted=pad_to_multiple is not None)
        keep = tf.gather(selected, indices)
        num_rows = None
        if pad_to_multiple is not None:
            num_rows = tf.minimum(max_batch_size, tf.maximum(1, -(-num_selected // pad_to_multiple)) * pad_to_multiple)
        if overflow == "raise":
            tf.debugging.assert_less_equal(
                num_selected,
                max_batch_size,
                message=f"keras_dyndp.data: Poisson batch larger than max_batch_size={max_batch_size}.",
            )
        else:
            tf.cond(
                num_selected > max_batch_size,
                lambda: tf.print(
                    "WARNING keras_dyndp.data: Poisson sampling selected",
                    num_selected,
                    f"examples; truncated to max_batch_size={max_batch_size}. This adds to "
                    "delta, see keras_dyndp.data.truncation_delta.",
                    output_stream=sys.stderr,
                ),
                tf.no_op,
            )
        batch_x, batch_y = _gather_rows((x, y), indices, keep, num_padding_rows, num_rows)
        weights = _gather_rows(sample_weight, indices, keep, num_padding_rows, num_rows)
        return batch_x, batch_y, weights

    same_on_every_worker = seed is not None or replicas.is_multi_worker()
    if seed is None:
        # Left to TensorFlow, a None seed would follow the global seed; the workers of a multi-worker strategy must
        # agree on it (see `replicas.agreed_random_bits`).
        seed = replicas.agreed_random_bits(63)
    step_seeds = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True).batch(2, drop_remainder=True)
    batches = step_seeds.take(num_steps).map(make_batch, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    batches = batches.prefetch(tf.data.AUTOTUNE)
    _POISSON_DATASETS[batches] = PoissonSampling(
        num_examples, sampling_probability, max_batch_size, same_on_every_worker, pad_to_multiple
    )
    return batches


def poisson_batches(
    dataset: tf.data.Dataset,
    num_examples: int,
    sampling_probability: float,
    max_batch_size: int | None = None,
    seed: int | None = None,
    num_steps: int | None = None,
    overflow: str = "truncate",
    pad_to_multiple: int | None = None,
) -> tf.data.Dataset:
    """Poisson-sampled, padded batches from a finite, unbatched dataset of (x, y) or (x, y, w) elements.

    The dataset is read once into memory (the same requirement as ``dataset.cache()``; elements must have fixed
    shapes, pad variable-length features first) and then sampled by `poisson_batches_from_tensors`; see there
    and the module docstring.

    Args:
        dataset: Finite dataset of exactly ``num_examples`` unbatched elements ``(x, y)`` or ``(x, y, w)``.
        num_examples: Number of elements N in ``dataset``, >= 1 (checked).
        sampling_probability: Poisson sampling rate p, in (0, 1].
        max_batch_size: Rows per batch, >= 1; default `default_max_batch_size(N, p)`.
        seed: Sampling seed; None (default) draws it from OS entropy, as in `poisson_batches_from_tensors`.
        num_steps: Steps per iteration, >= 1; default `expected_steps_per_epoch(p)`.
        overflow: 'truncate' or 'raise', as in `poisson_batches_from_tensors`.
        pad_to_multiple: None or m >= 1, as in `poisson_batches_from_tensors`.

    Returns:
        A dataset of ``(x, y, sample_weight)`` batches with ``max_batch_size`` rows (or as ``pad_to_multiple``
        says).

    Raises:
        ValueError: On an invalid argument, an element structure other than (x, y) / (x, y, w), or a dataset
            whose size is not ``num_examples``.
    """
    num_examples = validation.check_positive_int("num_examples", num_examples)
    sampling_probability = validation.check_probability(sampling_probability)
    spec = dataset.element_spec
    if not isinstance(spec, tuple) or len(spec) not in (2, 3):
        raise ValueError(
            f"`dataset` elements must be tuples (x, y) or (x, y, sample_weight). Received: element_spec={spec}."
        )
    # One batch of N + 1 detects a dataset that is larger than announced.
    everything = next(iter(dataset.batch(num_examples + 1)), None)
    size = 0 if everything is None else int(tf.nest.flatten(everything)[0].shape[0])
    if size != num_examples:
        received = "more" if size > num_examples else str(size)
        raise ValueError(
            f"`dataset` must have exactly num_examples={num_examples} elements. Received: {received} elements."
        )
    x, y = everything[0], everything[1]
    sample_weight = everything[2] if len(everything) == 3 else None
    return poisson_batches_from_tensors(
        x,
        y,
        sampling_probability,
        sample_weight=sample_weight,
        max_batch_size=max_batch_size,
        num_steps=num_steps,
        seed=seed,
        overflow=overflow,
        pad_to_multiple=pad_to_multiple,
    )


def shuffled_batches(
    x: Any, y: Any, batch_size: int, seed: int | None = None, *, sample_weight: Any = None
) -> tf.data.Dataset:
    """Shuffle-and-slice batches of exactly ``batch_size`` rows: an approximation, not what accountants assume.

    Each iteration (Keras epoch) is a fresh permutation cut into ``N // batch_size`` batches (the remainder is
    dropped, so shapes are fixed). This is the common practice, but every example appears exactly once per epoch
    instead of independently with probability p, so the Poisson-subsampling accounting of this package does not
    strictly hold for it (tensorflow/privacy #483). Use `poisson_batches_from_tensors` for an exact guarantee.

    Args:
        x: Features: an array or nest of arrays with N rows.
        y: Labels: an array or nest of arrays with N rows.
        batch_size: Rows per batch, in [1, N].
        seed: Shuffle seed; None (default) draws it from OS entropy, whatever the global seed.
        sample_weight: Optional per-example weights, shape [N]; default 1.

    Returns:
        A dataset of ``(x, y, sample_weight)`` batches with ``batch_size`` rows.

    Raises:
        ValueError: On an invalid argument.
    """
    x, y, sample_weight, num_examples = _as_tensors(x, y, sample_weight)
    batch_size = validation.check_positive_int("batch_size", batch_size)
    if batch_size > num_examples:
        raise ValueError(f"`batch_size` must be in [1, N={num_examples}]. Received: batch_size={batch_size}.")
    keep_all = tf.ones([batch_size], tf.bool)

    def make_batch(indices: tf.Tensor) -> tuple[Any, Any, tf.Tensor]:
        batch_x, batch_y = _gather_rows((x, y), indices, keep_all, 0)
        return batch_x, batch_y, tf.gather(sample_weight, indices)

    if seed is None:
        seed = replicas.agreed_random_bits(63)
    indices = tf.data.Dataset.range(num_examples).shuffle(num_examples, seed=seed, reshuffle_each_iteration=True)
    batches = indices.batch(batch_size, drop_remainder=True).map(make_batch, num_parallel_calls=tf.data.AUTOTUNE)
    return batches.prefetch(tf.data.AUTOTUNE)
