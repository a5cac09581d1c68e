"""The `tf.distribute` strategy of a research run (``--strategy``) and which process writes its files."""

from __future__ import annotations

import functools

import tensorflow as tf

from research import run_config
from research import run_flags


def make_strategy(name: str) -> tf.distribute.Strategy:
    """The `tf.distribute` strategy of `--strategy=name` ('default', 'mirrored' or 'multi_worker').

    mirrored: `MirroredStrategy` over all local GPUs or, on a machine without one, over its logical CPU devices
    (one replica unless the CPU was split with `tf.config.set_logical_device_configuration`). multi_worker:
    `MultiWorkerMirroredStrategy` from the TF_CONFIG environment variable; it must be created before TensorFlow
    initialises its devices, so `train` makes it before loading any data.
    """
    if name == "default":
        return tf.distribute.get_strategy()
    if name not in run_flags.STRATEGIES:
        raise run_config.FlagError(f"--strategy must be one of {', '.join(run_flags.STRATEGIES)}. Received: {name!r}.")
    return _distributed_strategy(name)


@functools.cache
def _distributed_strategy(name: str) -> tf.distribute.Strategy:
    # One object per process and name, reused by every `train` (a sweep): TensorFlow sets up MultiWorkerMirrored's
    # collectives once, and two MirroredStrategy objects over the same devices number their collective ops alike.
    if name == "multi_worker":
        return tf.distribute.MultiWorkerMirroredStrategy()
    if tf.config.list_physical_devices("GPU"):
        return tf.distribute.MirroredStrategy()
    return tf.distribute.MirroredStrategy([device.name for device in tf.config.list_logical_devices("CPU")])


def is_chief(strategy: tf.distribute.Strategy) -> bool:
    """Whether this process writes the run's files: always, except on a non-chief worker of a multi-worker job."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not resolver.cluster_spec().as_dict() or resolver.task_type == "chief":
        return True
    return resolver.task_type == "worker" and resolver.task_id == 0 and "chief" not in resolver.cluster_spec().jobs
