"""sampling: `keras_dyndp.poisson_batches` checks its arguments once, with the same messages on every backend, and
returns what the backend's ``fit`` takes (a tf.data.Dataset on TensorFlow, a keras.utils.PyDataset on JAX)."""

import numpy as np
import pytest

import keras_dyndp
from keras_dyndp import sampling

N, P = 5, 0.1
X, Y = np.ones((N, 3), np.float32), np.zeros(N, np.int64)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"sampling_probability": 0.0}, r"`sampling_probability` must be in \(0, 1\]"),
        ({"sampling_probability": float("nan")}, r"`sampling_probability` must be in \(0, 1\]"),
        ({"steps_per_epoch": 0}, "`steps_per_epoch` must be an integer >= 1"),
        ({"max_batch_size": 0}, "`max_batch_size` must be an integer >= 1"),
        ({"pad_to_multiple": 0}, "`pad_to_multiple` must be an integer >= 1"),
        ({"overflow": "drop"}, "`overflow` must be one of"),
        ({"seed": -1}, "`seed` must be None"),
        ({"seed": 1.5}, "`seed` must be None"),
        ({"num_examples": 0}, "`num_examples` must be an integer >= 1"),
        ({"num_examples": 4}, "`x` must have num_examples=4 rows. Received: 5"),
    ],
)
def test_bad_arguments_are_refused_naming_the_argument_and_its_range(kwargs, message):
    with pytest.raises(ValueError, match=message):
        keras_dyndp.poisson_batches(X, Y, **{"sampling_probability": P, **kwargs})


@pytest.mark.parametrize(
    "x, y, sample_weight, message",
    [
        (X[:0], Y[:0], None, r"N >= 1"),
        (X, Y[:4], None, "same number of rows"),
        ({"a": X, "b": X[:3]}, Y, None, "same number of rows"),
        (np.float32(1.0), Y, None, "leading example dimension"),
        (X, Y, np.ones(4), r"`sample_weight` must have shape \(5,\)"),
    ],
)
def test_arrays_must_share_their_rows(x, y, sample_weight, message):
    with pytest.raises(ValueError, match=message):
        keras_dyndp.poisson_batches(x, y, sample_weight, sampling_probability=P)


def test_returns_the_backends_batches_with_their_sampling_and_defaults():
    batches = keras_dyndp.poisson_batches({"a": X}, None, np.ones((N, 1)), sampling_probability=0.25, seed=0)
    if keras_dyndp.keras_backend() == "jax":
        import keras  # pylint: disable=import-outside-toplevel

        assert isinstance(batches, keras.utils.PyDataset) and len(batches) == 4
        found = batches.sampling
        x, y, weights = batches[0]
    else:
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        from keras_dyndp.tf_backend import data  # pylint: disable=import-outside-toplevel

        assert isinstance(batches, tf.data.Dataset) and len(list(batches)) == 4
        found = data.poisson_sampling(batches)
        x, y, weights = next(iter(batches))
    assert found == sampling.PoissonSampling(N, 0.25, found.max_batch_size)
    assert found.max_batch_size >= N and y is None and np.shape(x["a"])[0] == np.shape(weights)[0]


def test_arguments_are_checked_once_with_the_default_steps():
    arguments = sampling.check_arguments(0.3, seed=np.int64(7))
    assert (arguments.steps_per_epoch, arguments.seed, arguments.overflow) == (3, 7, "truncate")
    assert arguments.cap(1000, multiple_of=8) % 8 == 0 and sampling.check_arguments(0.3, max_batch_size=9).cap(10) == 9
