"""The DP step across the replicas of a `tf.distribute` strategy: one noise, one normaliser, one counter.

Under ``MirroredStrategy`` (several devices of one machine) or ``MultiWorkerMirroredStrategy`` (several machines),
``model.fit`` splits each global batch across the R replicas and runs the train step on every replica. The DP step
must release exactly what one device would release for the whole global batch:

    update = (sum over all examples of the clipped gradients + N(0, sigma_t^2 I)) / n.

Each replica clips its own examples and sums them (one example lives on one replica, so it moves the global sum by
at most C_t). The noise is drawn by ONE replica, the first of the sync group (``replica_id_in_sync_group == 0``), with
the full std sigma_t; the others add none. Every replica divides its part by the GLOBAL normaliser n (the expected
global batch size, or the all-reduced number of rows) and the base optimizer all-reduces the parts with SUM before
its update rule (Keras 2's ``apply_gradients`` aggregation, Keras 3's ``_all_reduce_sum_gradients``). The released
sum then carries exactly one N(0, sigma_t^2 I) draw, whatever R is and whether or not the replicas' random streams
are independent (one replica's noise cannot be cancelled by another's, since no other adds any). The alternative,
every replica adding std sigma_t / sqrt(R), has std sigma_t only if the R streams are independent, which seeds shared
across workers would break. What the replicas exchange inside the all-reduce (un-noised partial sums) stays inside
the training job, whose workers see the raw data anyway; what leaves it is the noised update.

The step counter (Keras's ``iterations``, aggregated ONLY_FIRST_REPLICA) advances once per global step, so the
schedule index and the privacy ledger are those of one device training on the global batch. The batch-size check of
`keras_dyndp.tf_backend.sampling_check` counts the examples of the global batch (all-reduced), so a replica that got
zero rows, or only padding, changes neither the noise nor the count.

Batches that bypass ``fit``'s input pipeline must be split the same way. Keras 3's ``train_on_batch`` (and a direct
call of ``model.train_function`` with batches that are not a distributed iterator) hands its batch to
``strategy.run`` as it is, so EVERY replica would clip the whole batch: one example would move the all-reduced sum by
R C_t against noise calibrated to C_t, and the batch-size check would count R times the rows. `split_direct_batches`
gives a private model a train function that first distributes such a batch, as ``fit`` (and Keras 2's
``train_on_batch``) do.

Supported: the default (no) strategy, ``OneDeviceStrategy``, ``MirroredStrategy`` and
``MultiWorkerMirroredStrategy``. Others (TPU, parameter-server, central-storage) are refused: their update paths
are not the one analysed here.
"""

from __future__ import annotations

import itertools
import secrets
import types
from collections.abc import Callable
from typing import Any

import tensorflow as tf

_BITS_PER_WORD = 24  # Exact in float32, the dtype every all-reduce sums.

_SUPPORTED_STRATEGIES = (
    tf.distribute.MirroredStrategy,
    tf.distribute.MultiWorkerMirroredStrategy,
    tf.distribute.OneDeviceStrategy,
)


def check_strategy() -> tf.distribute.Strategy:
    """Returns the current strategy if a DP step can run under it.

    Raises:
      ValueError: under a strategy other than the default one, OneDevice, Mirrored or MultiWorkerMirrored.
    """
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
    """``values`` summed over the replicas of the step, in its dtype; the identity for one replica.

    Counts travel as float32 (every all-reduce implementation sums it; exact up to 2^24).
    """
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


def agreed_random_bits(num_bits: int) -> int:
    """``num_bits`` (<= 72) secret random bits from the OS, the same on every worker of a multi-worker strategy.

    Under ``MultiWorkerMirroredStrategy`` every worker builds its own input pipeline, and tf.data then gives each
    worker its share of every global batch: the workers must sample the SAME Poisson batches, or the global batch
    would join pieces of different samples (an example could be in two of them, and the sampling rate would not be
    p). The first worker's bits are all-reduced to all; elsewhere they are this process's own.
    """
    words = [secrets.randbits(_BITS_PER_WORD) for _ in range(-(-num_bits // _BITS_PER_WORD))]
    if is_multi_worker():
        strategy = tf.distribute.get_strategy()
        local = tf.constant(words, tf.float32)
        shared = tf.function(lambda: strategy.run(lambda: global_sum(local * noise_share())))()
        words = [int(word) for word in strategy.experimental_local_results(shared)[0].numpy()]
    bits = sum(word << (_BITS_PER_WORD * index) for index, word in enumerate(words))
    return bits & ((1 << num_bits) - 1)


def split_direct_batches(model: Any) -> None:
    """Makes each batch that reaches ``model``'s train function undistributed split across the replicas.

    Keras 3's ``train_on_batch`` calls ``model.train_function`` with a Python iterator over its one batch, and the
    train function hands that batch to ``strategy.run`` whole: every replica would clip every example. The model
    gets a ``make_train_function`` (on the instance) that wraps the train function under a strategy of more than one
    replica: a distributed iterator (``fit``'s) passes through; any other iterable's batches are distributed one by
    one with ``strategy.experimental_distribute_dataset``, which splits each batch's rows across the replicas as
    ``fit`` does. Under one replica the train function is Keras's own.
    """

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
    """``train_function`` (Keras 3's, taking an iterator) that distributes batches not distributed yet.

    Like Keras's own, it runs at most ``steps`` (``steps_per_execution``) batches of a plain iterator and returns
    the logs of the last.
    """

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
    if not isinstance(data, tuple):
        return data
    while len(data) > 1 and data[-1] is None:
        data = data[:-1]
    return data
