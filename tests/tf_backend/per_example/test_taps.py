"""taps: the row guard of a tapped pass."""

import numpy as np
import pytest
import tensorflow as tf

from keras_dyndp.tf_backend.per_example import taps


def test_row_guard_fails_at_run_time_also_under_xla():
    """Where the rows cannot be compared while tracing, a reshape to exactly the expected rows fails when run."""
    signature = [tf.TensorSpec([None, 3]), tf.TensorSpec([None, 3])]

    @tf.function(jit_compile=True, input_signature=signature)
    def guarded(batch, tapped):
        return taps.Tapping(taps.Rows.of_batch(batch), None).guard(tapped, "the tapped input")

    np.testing.assert_array_equal(guarded(tf.ones([2, 3]), tf.ones([2, 3])), np.ones([2, 3]))
    with pytest.raises(tf.errors.InvalidArgumentError):
        guarded(tf.ones([2, 3]), tf.ones([4, 3]))  # Two rows per example, e.g. a fold by hand.
