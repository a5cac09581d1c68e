"""The DP step across the replicas of a `tf.distribute` strategy: one noise, one normaliser, one counter. Each replica
clips and sums its examples; ONE replica (the first of the sync group) adds the noise with the full sigma_t, so the sum
carries exactly one draw however the replicas' streams relate; every replica divides by the GLOBAL normaliser and the
base optimizer all-reduces with SUM. `split_direct_batches` splits batches that bypass ``fit``'s pipeline (else one
example moves the sum by R C_t). Supported (docs/scaling.md): no strategy, OneDevice, Mirrored, MultiWorkerMirrored."""

from __future__ import annotations

import itertools
import secrets
import types
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

_BITS_PER_WORD = 24  # Exact in float32, the dtype every all-reduce sums.

_SUPPORTED_STRATEGIES = (
    tf.distribute.MirroredStrategy,
    tf.distribute.MultiWorkerMirroredStrategy,
    tf.distribute.OneDeviceStrategy,
)


def check_distribution() -> tf.distribute.Strategy:
    """The current strategy; ValueError under one other than the default, OneDevice, Mirrored, MultiWorkerMirrored."""
    strategy = tf.distribute.get_strategy()
    if not tf.distribute.has_strategy() or isinstance(strategy, _SUPPORTED_STRATEGIES):
        return strategy
    raise ValueError(
        "Dynamic DP optimizers run under no strategy, OneDeviceStrategy, MirroredStrategy or "
        "MultiWorkerMirroredStrategy, where each global step adds the noise once to the all-reduced sum of the "
        f"clipped gradients. Received: {type(strategy).__name__}, whose update path is not that mechanism."
    )


def num_replicas() -> int:
    """Number of replicas taking part in each global step (1 without a strategy)."""
    return tf.distribute.get_strategy().num_replicas_in_sync


def noise_share() -> tf.Tensor:
    """float32 1 on the replica that draws the step's noise (the first of the sync group), 0 on the others."""
    context = tf.distribute.get_replica_context()
    if context is None or num_replicas() == 1:
        return tf.ones([], tf.float32)
    return tf.cast(tf.equal(context.replica_id_in_sync_group, 0), tf.float32)


def global_sum(values: tf.Tensor) -> tf.Tensor:
    """``values`` summed over the replicas, in its dtype (as float32: every all-reduce sums it; exact to 2^24)."""
    values = tf.convert_to_tensor(values)
    context = tf.distribute.get_replica_context()
    if context is None or num_replicas() == 1:
        return values
    return tf.cast(context.all_reduce(tf.distribute.ReduceOp.SUM, tf.cast(values, tf.float32)), values.dtype)


def is_multi_worker() -> bool:
    """Whether the current strategy is a MultiWorkerMirroredStrategy over more than one worker."""
    strategy = tf.distribute.get_strategy()
    return (
        tf.distribute.has_strategy()
        and isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
        and num_replicas() > len(strategy.extended.worker_devices)
    )


def input_pipeline() -> tuple[int, int]:
    """(index, count) of this worker's input pipeline among the workers of a MultiWorkerMirroredStrategy; (0, 1)
    elsewhere (every pipeline then feeds the whole batch)."""
    if not is_multi_worker():
        return 0, 1
    resolver = tf.distribute.get_strategy().cluster_resolver
    cluster = resolver.cluster_spec().as_dict()
    chiefs = len(cluster.get("chief", []))  # The chief is worker 0, as in tf.distribute's input contexts.
    index = resolver.task_id if resolver.task_type == "chief" else chiefs + resolver.task_id
    return int(index), chiefs + len(cluster.get("worker", []))


def worker_share(num_rows: int, pipeline: tuple[int, int], replicas: int) -> np.ndarray:
    """The positions of the rows of a global batch (``num_rows``, a multiple of the ``replicas`` in sync) that input
    pipeline ``pipeline`` = (index, count) feeds: ``experimental_distribute_dataset`` splits each batch into one
    part per replica, in order, and worker w of W keeps parts w, w + W, w + 2 W, ... (its rebatch and auto-shard
    by data); all rows for one pipeline. tests/multi_worker_job.py checks this against the strategy."""
    index, count = pipeline
    part = num_rows // replicas
    if count == 1:
        return np.arange(num_rows)
    return np.concatenate([np.arange(j * part, (j + 1) * part) for j in range(index, replicas, count)])


def agreed_random_bits(num_bits: int) -> int:
    """``num_bits`` (<= 72) secret random bits from the OS, the same on every worker (the first worker's, all-reduced):
    the workers take their shares of the same global batches, so they must sample the same Poisson batches."""
    words = [secrets.randbits(_BITS_PER_WORD) for _ in range(-(-num_bits // _BITS_PER_WORD))]
    if is_multi_worker():
        strategy = tf.distribute.get_strategy()
        local = tf.constant(words, tf.float32)
        shared = tf.function(lambda: strategy.run(lambda: global_sum(local * noise_share())))()
        words = [int(word) for word in strategy.experimental_local_results(shared)[0].numpy()]
    return sum(word << (_BITS_PER_WORD * index) for index, word in enumerate(words)) & ((1 << num_bits) - 1)


def split_direct_batches(model: Any) -> None:
    """Splits each undistributed batch reaching ``model``'s train function (``train_on_batch``'s) across the replicas
    as ``fit`` does (``experimental_distribute_dataset``, at most ``steps_per_execution`` per call); ``fit``'s pass."""

    def make_train_function(self, force: bool = False):
        if self.train_function is not None and not force:
            return self.train_function
        type(self).make_train_function(self, force=True)
        strategy = self.distribute_strategy
        if strategy.num_replicas_in_sync > 1:
            self.train_function = _split_across_replicas(self.train_function, strategy, self.steps_per_execution)
        return self.train_function

    model.make_train_function = types.MethodType(make_train_function, model)


def _split_across_replicas(train_function: Callable, strategy: tf.distribute.Strategy, steps: int) -> Callable:
    def function(iterator):
        if isinstance(iterator, tf.distribute.DistributedIterator):
            return train_function(iterator)
        outputs = None
        for data in itertools.islice(iterator, steps):
            batch = tf.data.Dataset.from_tensors(_without_trailing_none(data))
            outputs = train_function(iter(strategy.experimental_distribute_dataset(batch)))
        if outputs is None:
            raise StopIteration
        return outputs

    return function


def _without_trailing_none(data: Any) -> Any:
    """``(x, y, sample_weight)`` without the absent (None) trailing parts, as ``fit``'s batches come."""
    while isinstance(data, tuple) and len(data) > 1 and data[-1] is None:
        data = data[:-1]
    return data
