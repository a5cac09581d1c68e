"""Poisson-sampled batches as a ``tf.data.Dataset`` (`keras_dyndp.poisson_batches` on TensorFlow), and shuffled ones.
`keras_dyndp.data.sampling` holds the sampler's arguments, checks and privacy argument. ``seed=None`` draws 63 bits from
the OS (never the global seed; agreed by multi-worker workers, `distribution.agreed_random_bits`) and every iteration
draws fresh batches; an integer seed and ``start_step`` repeat them (with the same global seed, which TensorFlow mixes
in). The datasets are registered with their `PoissonSampling` (`poisson_sampling`) for the DP optimizer's checks; a
derived one is not. `shuffled_batches` is an approximation the accounting does not cover."""

from __future__ import annotations

import dataclasses
import math
import sys
import weakref
from typing import Any

import numpy as np
import tensorflow as tf

from keras_dyndp.core import validation
from keras_dyndp.core.batch_sizes import batch_size_range  # noqa: F401  (re-exported)
from keras_dyndp.core.batch_sizes import default_max_batch_size  # noqa: F401  (re-exported)
from keras_dyndp.core.batch_sizes import expected_steps_per_epoch  # noqa: F401  (re-exported)
from keras_dyndp.data import sampling
from keras_dyndp.data import sources
from keras_dyndp.data.sampling import PoissonSampling
from keras_dyndp.tf_backend import distribution

# The datasets this module returned, with their sampling; weak keys, so registering keeps no dataset alive.
_POISSON_DATASETS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def poisson_sampling(dataset: Any) -> PoissonSampling | None:
    """The `PoissonSampling` of a dataset returned by `keras_dyndp.poisson_batches` (not one derived), else None."""
    try:
        return _POISSON_DATASETS.get(dataset)
    except TypeError:  # Not weak-referenceable or not hashable (numpy arrays, lists, ...): not ours.
        return None


def _as_tensors(x: Any, y: Any, sample_weight: Any, num_examples: int | None = None) -> tuple[Any, Any, tf.Tensor, int]:
    """Converts (nests of) arrays to tensors, checked by `keras_dyndp.data.sampling.check_rows`."""
    num_rows = sampling.check_rows(x, y, sample_weight, num_examples)
    x = tf.nest.map_structure(tf.convert_to_tensor, x)
    y = None if y is None else tf.nest.map_structure(tf.convert_to_tensor, y)
    if sample_weight is None:
        sample_weight = tf.ones([num_rows], tf.float32)
    else:
        sample_weight = tf.cast(tf.convert_to_tensor(sample_weight), tf.float32)
        if sample_weight.shape.rank == 2 and sample_weight.shape[1] == 1:  # [N, 1]: one per example
            sample_weight = sample_weight[:, 0]
    return x, y, sample_weight, num_rows


def _read_dataset(dataset: tf.data.Dataset, num_examples: int | None) -> tuple[Any, Any, Any]:
    """``(x, y, sample_weight or None)``: all of a finite dataset of unbatched ``(x, y[, w])`` elements, checked."""
    spec = dataset.element_spec
    if not isinstance(spec, tuple) or len(spec) not in (2, 3):
        raise ValueError(
            f"`x` dataset elements must be tuples (x, y) or (x, y, sample_weight). Received: element_spec={spec}."
        )
    if num_examples is None:
        num_examples = int(dataset.cardinality())
        if num_examples < 1:
            raise ValueError(
                "The size of the `x` dataset is unknown (or infinite) to tf.data: pass num_examples=N, its number "
                f"of elements. Received: cardinality={num_examples}."
            )
    # One batch of N + 1 detects a dataset that is larger than announced.
    everything = next(iter(dataset.batch(num_examples + 1)), None)
    size = 0 if everything is None else int(tf.nest.flatten(everything)[0].shape[0])
    if size != num_examples:
        received = "more" if size > num_examples else str(size)
        raise ValueError(
            f"The `x` dataset must have exactly num_examples={num_examples} elements. Received: {received} elements."
        )
    return everything[0], everything[1], everything[2] if len(everything) == 3 else None


def _gather_rows(
    tensors: Any, indices: tf.Tensor, keep: tf.Tensor, num_padding_rows: int, num_rows: tf.Tensor | None = None
) -> Any:
    """Rows ``indices`` of every tensor in a nest (None stays None); rows where ``keep`` is False and padding rows
    are zeros; only the first ``num_rows`` rows when it is not None."""

    def gather(tensor: tf.Tensor) -> tf.Tensor:
        rows = tf.gather(tensor, indices)
        mask = tf.reshape(keep, [-1] + [1] * (rows.shape.rank - 1))
        rows = tf.where(mask, rows, tf.zeros_like(rows))
        if num_padding_rows:
            padding = tf.zeros([num_padding_rows] + rows.shape[1:].as_list(), rows.dtype)
            rows = tf.concat([rows, padding], axis=0)
        return rows if num_rows is None else rows[:num_rows]

    return None if tensors is None else tf.nest.map_structure(gather, tensors)


def make_poisson_batches(
    x: Any, y: Any, sample_weight: Any, arguments: sampling.SamplerArguments, num_examples: int | None
) -> tf.data.Dataset:
    """`keras_dyndp.poisson_batches` on TensorFlow: each step keeps every example with probability p (one float64
    uniform each), gathers the kept rows first and pads with zero rows of weight 0. ``x`` may be a finite, unbatched
    dataset of ``(x, y[, w])`` elements of fixed shapes, read once into memory; data read on demand
    (`keras_dyndp.data.sources.Rows`) goes to `_source_batches`."""
    if isinstance(x, sources.Rows):
        return _source_batches(x, arguments)
    if isinstance(x, tf.data.Dataset):
        if y is not None or sample_weight is not None:
            raise ValueError(
                "With a tf.data.Dataset `x`, its elements hold y and sample_weight: leave `y` and `sample_weight` None."
            )
        x, y, sample_weight = _read_dataset(x, num_examples)
    x, y, sample_weight, num_examples = _as_tensors(x, y, sample_weight, num_examples)
    p, overflow, pad_to_multiple = arguments.sampling_probability, arguments.overflow, arguments.pad_to_multiple
    # A multiple of the replicas: Keras 3 needs the first batch to split evenly (keras-team/keras#19246).
    max_batch_size = arguments.cap(num_examples, distribution.num_replicas())
    if pad_to_multiple is not None:
        pad_to_multiple = math.lcm(pad_to_multiple, distribution.num_replicas())
    num_gathered = min(max_batch_size, num_examples)
    num_padding_rows = max_batch_size - num_gathered

    def make_batch(step_seed: tf.Tensor) -> tuple[Any, Any, tf.Tensor]:
        # float64: p down to ~1e-15 is represented without bias.
        uniforms = tf.random.stateless_uniform([num_examples], seed=step_seed, dtype=tf.float64)
        selected = uniforms < p
        num_selected = tf.reduce_sum(tf.cast(selected, tf.int32))
        # The examples with the smallest uniforms: all selected ones, and on overflow a uniformly random subset of
        # them (the uniforms of the selected examples are i.i.d. U(0, p)); sorted puts them first.
        _, indices = tf.math.top_k(-uniforms, k=num_gathered, sorted=pad_to_multiple is not None)
        keep = tf.gather(selected, indices)
        num_rows = None
        if pad_to_multiple is not None:
            num_rows = tf.minimum(max_batch_size, tf.maximum(1, -(-num_selected // pad_to_multiple)) * pad_to_multiple)
        _check_overflow(num_selected, max_batch_size, overflow)
        return tuple(
            _gather_rows(tensors, indices, keep, num_padding_rows, num_rows) for tensors in (x, y, sample_weight)
        )

    return _step_batches(make_batch, arguments, PoissonSampling(num_examples, p, max_batch_size, True, pad_to_multiple))


def _check_overflow(num_selected: tf.Tensor, max_batch_size: int, overflow: str) -> None:
    """More than ``max_batch_size`` selected: fails the step ('raise') or prints a warning ('truncate')."""
    if overflow == "raise":
        message = f"keras_dyndp.poisson_batches: Poisson batch larger than max_batch_size={max_batch_size}."
        tf.debugging.assert_less_equal(num_selected, max_batch_size, message=message)
    else:
        warn = lambda: tf.print(  # noqa: E731
            "WARNING keras_dyndp.poisson_batches: Poisson sampling selected",
            num_selected,
            f"examples; truncated to max_batch_size={max_batch_size}. This adds to delta, see "
            "keras_dyndp.core.batch_sizes.truncation_delta.",
            output_stream=sys.stderr,
        )
        tf.cond(num_selected > max_batch_size, warn, tf.no_op)


def _step_batches(make_batch: Any, arguments: sampling.SamplerArguments, poisson: PoissonSampling) -> tf.data.Dataset:
    """``steps_per_epoch`` batches ``make_batch(step_seed)``, a fresh int64 pair each at every iteration (from
    `sampling.sampler_seed`), made in parallel and prefetched; registered with their sampling, seed and start step."""
    seed = arguments.stream_seed
    same_on_every_worker = seed is not None or distribution.is_multi_worker()
    if seed is None:  # Not left to TensorFlow, whose None follows the global seed.
        seed = distribution.agreed_random_bits(63)
    step_seeds = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True).batch(2, drop_remainder=True)
    batches = step_seeds.take(arguments.steps_per_epoch).map(
        make_batch, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True
    )
    batches = batches.prefetch(tf.data.AUTOTUNE)
    _POISSON_DATASETS[batches] = dataclasses.replace(
        poisson, same_on_every_worker=same_on_every_worker, seed=arguments.seed, start_step=arguments.start_step
    )
    return batches


_PER_BATCH_DATASETS = ("_MapDataset", "_ParallelMapDataset", "_PrefetchDataset")
"""The tf.data datasets that yield their input's elements one for one, in order: ``map`` and ``prefetch`` (not
``with_options``, whose options can shard or reorder the batches across workers)."""


def yields_batches_of(received: Any, given: Any) -> bool:
    """Whether ``received`` yields the batches of ``given`` one for one, in order: ``given`` itself, or ``given``
    through ``map`` (trusted to treat each example alone) and ``prefetch`` only; batches re-cut, filtered, shuffled,
    repeated, cut short or mixed with other data are not."""
    while received is not given:
        if not isinstance(received, tf.data.Dataset) or type(received).__name__ not in _PER_BATCH_DATASETS:
            return False
        received = received._input_dataset  # noqa: SLF001  (tf.data: no public lineage of a derived dataset)
    return True


def check_resume(x: Any, optimizer: Any) -> None:
    """`keras_dyndp.data.sampling.check_resume` of what ``fit`` received (only this module's batches are checked)."""
    sampling.check_resume(x, poisson_sampling(x), optimizer)


def _source_batches(rows: sources.Rows, arguments: sampling.SamplerArguments) -> tf.data.Dataset:
    """`keras_dyndp.poisson_batches` of data read on demand (`keras_dyndp.data.sources`): each step's sample drawn in
    numpy from its step seed, its rows read inside the input pipeline (``tf.numpy_function``, parallel calls,
    prefetch) and padded as in-memory batches are. Under MultiWorkerMirroredStrategy every worker draws the same
    sample and reads only its share's rows (`distribution.worker_share`), leaving the others' rows zero."""
    num_examples, p = rows.num_examples, arguments.sampling_probability
    max_batch_size = arguments.cap(num_examples, distribution.num_replicas())
    multiple = arguments.pad_to_multiple
    multiple = None if multiple is None else math.lcm(multiple, distribution.num_replicas())
    structure = rows.example if rows.example[1] is not None else (rows.example[0], rows.example[2])
    example_leaves = tf.nest.flatten(structure)
    for leaf in example_leaves:
        try:
            tf.as_dtype(leaf.dtype)
        except TypeError as error:
            raise ValueError(
                f"An example of `x` (after `map`) holds dtype {leaf.dtype}, which TensorFlow has no tensor of: cast "
                "it in `map` (or leave that field out)."
            ) from error
    pipeline, num_replicas = distribution.input_pipeline(), distribution.num_replicas()

    def draw_and_read(step_seed: np.ndarray) -> list[np.ndarray]:
        rng = np.random.default_rng(np.asarray(step_seed).view(np.uint64))
        num_selected, chosen = sources.draw(rng, num_examples, p, min(max_batch_size, num_examples))
        num_rows = (
            max_batch_size if multiple is None else min(max_batch_size, max(1, -(-num_selected // multiple)) * multiple)
        )
        read_at = None if pipeline[1] == 1 else distribution.worker_share(num_rows, pipeline, num_replicas)
        batch_x, batch_y, weights = rows.batch(chosen, num_rows, keep_order=True, read_at=read_at)
        parts = (batch_x, weights) if batch_y is None else (batch_x, batch_y, weights)
        return [np.int32(num_selected)] + tf.nest.flatten(parts)

    def make_batch(step_seed: tf.Tensor) -> tuple[Any, Any, tf.Tensor]:
        dtypes = [tf.int32] + [tf.as_dtype(leaf.dtype) for leaf in example_leaves]
        num_selected, *leaves = tf.numpy_function(draw_and_read, [step_seed], dtypes, stateful=True)
        _check_overflow(num_selected, max_batch_size, arguments.overflow)
        rows_dimension = max_batch_size if multiple is None else None
        for leaf, example in zip(leaves, example_leaves):
            leaf.set_shape([rows_dimension] + list(example.shape[1:]))
        parts = tf.nest.pack_sequence_as(structure, leaves)
        return parts if len(parts) == 3 else (parts[0], None, parts[1])

    return _step_batches(make_batch, arguments, PoissonSampling(num_examples, p, max_batch_size, True, multiple))


def shuffled_batches(
    x: Any, y: Any, batch_size: int, seed: int | None = None, *, sample_weight: Any = None
) -> tf.data.Dataset:
    """Shuffle-and-slice ``(x, y, sample_weight)`` batches, a fresh permutation each epoch: not Poisson sampling,
    so the accounting does not strictly hold (tensorflow/privacy #483); `keras_dyndp.poisson_batches` is the
    sampling the schedules account for.

    Args:
      x: the N examples' features (an array or a nest of arrays with N rows).
      y: their labels, N rows, or None (unlabelled).
      batch_size: rows per batch, an int in [1, N]; the last partial batch of an epoch is dropped.
      seed: the shuffle's seed, an int; None (default) draws it from OS entropy.
      sample_weight: per-example weights, N rows; None (default): 1 for every row.

    Raises:
      ValueError: if ``batch_size`` is outside [1, N] or the rows disagree.
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
        seed = distribution.agreed_random_bits(63)
    indices = tf.data.Dataset.range(num_examples).shuffle(num_examples, seed=seed, reshuffle_each_iteration=True)
    batches = indices.batch(batch_size, drop_remainder=True).map(make_batch, num_parallel_calls=tf.data.AUTOTUNE)
    return batches.prefetch(tf.data.AUTOTUNE)
