"""Shared pytest setup.

* absl flags are marked parsed, since pytest does not parse them (examples read FLAGS).
* The CPU is split into 2 logical devices before TensorFlow starts, so that ``MirroredStrategy`` tests run two
  replicas on this CPU-only machine (ops without a device still run on the first, as with one device).
* ``@pytest.mark.keras2_only(reason=...)`` marks a test of a Keras 2 feature (e.g. the optimizer's own per-example
  jacobian path, which Keras 3's train step cannot reach): it is skipped, with its reason, on Keras 3.
"""

import pytest
from absl import flags

NUM_LOGICAL_CPUS = 2


def _split_the_cpu() -> None:
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    (cpu,) = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * NUM_LOGICAL_CPUS)


def pytest_configure(config):
    flags.FLAGS.mark_as_parsed()
    _split_the_cpu()
    config.addinivalue_line("markers", "keras2_only(reason): the test needs Keras 2; skipped on Keras 3.")


def pytest_collection_modifyitems(config, items):
    del config  # Unused.
    marked = [item for item in items if item.get_closest_marker("keras2_only")]
    if not marked:
        return
    from keras_dyndp import keras_compat  # pylint: disable=import-outside-toplevel  (imports TensorFlow)

    if keras_compat.KERAS_MAJOR_VERSION == 2:
        return
    for item in marked:
        reason = item.get_closest_marker("keras2_only").kwargs.get("reason", "needs Keras 2")
        item.add_marker(pytest.mark.skip(reason=f"Keras 2 only: {reason}"))
