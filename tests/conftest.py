"""Shared pytest setup.

* absl flags are marked parsed, since pytest does not parse them (examples read FLAGS).
* ``@pytest.mark.keras2_only(reason=...)`` marks a test of a Keras 2 feature (e.g. the optimizer's own per-example
  jacobian path, which Keras 3's train step cannot reach): it is skipped, with its reason, on Keras 3.
"""

import pytest
from absl import flags


def pytest_configure(config):
    flags.FLAGS.mark_as_parsed()
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
