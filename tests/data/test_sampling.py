"""sampling: `keras_dyndp.poisson_batches` checks its arguments once, with the same messages on every backend, and
returns what the backend's ``fit`` takes (a tf.data.Dataset on TensorFlow, a keras.utils.PyDataset on JAX)."""

import types

import numpy as np
import pytest

import keras_dyndp
from keras_dyndp.data import sampling

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
        ({"start_step": -1}, "`start_step` must be an integer >= 0"),
        ({"start_step": 2.0}, "`start_step` must be an integer >= 0"),
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
        (X, Y, np.ones(4), r"`sample_weight` must have 5 rows: shape \(5,\), one weight per example, or \(5, L"),
    ],
)
def test_arrays_must_share_their_rows(x, y, sample_weight, message):
    with pytest.raises(ValueError, match=message):
        keras_dyndp.poisson_batches(x, y, sample_weight, sampling_probability=P)


def test_per_entry_weights_are_taken_from_arrays_in_memory_only():
    with pytest.raises(ValueError, match=r"Per-entry sample weights .* without `map`.* shape \(5,\)"):
        keras_dyndp.poisson_batches(X, Y, np.ones((N, 3)), sampling_probability=P, map=lambda example: example)


def test_returns_the_backends_batches_with_their_sampling_and_defaults():
    batches = keras_dyndp.poisson_batches(
        {"a": X}, None, np.ones((N, 1)), sampling_probability=0.25, seed=0, start_step=4
    )
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
    assert (found.seed, found.start_step) == (0, 4)  # the sampler's state, carried for fit's check
    assert found.max_batch_size >= N and y is None and np.shape(x["a"])[0] == np.shape(weights)[0]


def test_arguments_are_checked_once_with_the_default_steps():
    arguments = sampling.check_arguments(0.3, seed=np.int64(7))
    assert (arguments.steps_per_epoch, arguments.seed, arguments.overflow) == (4, 7, "truncate")  # ceil(1 / 0.3)
    assert arguments.cap(1000, multiple_of=8) % 8 == 0 and sampling.check_arguments(0.3, max_batch_size=9).cap(10) == 9


def test_a_seed_is_mixed_with_the_start_step_into_63_bits_and_none_stays_none():
    assert sampling.sampler_seed(7, 0) == 7  # a new run's batches are unchanged
    assert sampling.sampler_seed(None, 5) is None
    mixed = {sampling.sampler_seed(7, k) for k in range(1, 50)} | {sampling.sampler_seed(8, 1)}
    assert len(mixed) == 50 and all(0 <= seed < 2**63 for seed in mixed) and 7 not in mixed
    assert sampling.sampler_seed(7, 3) == sampling.sampler_seed(7, 3)
    assert sampling.check_arguments(0.3, seed=7, start_step=3).stream_seed == sampling.sampler_seed(7, 3)


class _Optimizer:
    """What `sampling.check_resume` reads of a DP optimizer: its step counter (``dp_step.numpy()``)."""

    def __init__(self, steps):
        self.steps = steps

    @property
    def dp_step(self):
        return types.SimpleNamespace(numpy=lambda: np.int64(self.steps))


class _Data:
    pass


def test_check_resume_refuses_a_seeded_start_at_another_step_than_the_optimizers_unless_it_trained_on_it():
    seeded = sampling.PoissonSampling(N, P, N, seed=7)
    data, other_data, optimizer = _Data(), _Data(), _Optimizer(0)
    sampling.check_resume(data, seeded, optimizer)  # a new run: no step taken yet
    optimizer.steps = 300
    sampling.check_resume(data, seeded, optimizer)  # a second fit on the same batches continues fresh draws
    expected = (
        r"^poisson_batches\(seed=7, start_step=0\) would draw again the samples of steps the optimizer has already "
        r"taken \(it has taken 300\): pass start_step=int\(optimizer.iterations\) when resuming, or seed=None. "
        "Nothing was trained."
    )
    with pytest.raises(ValueError, match=expected):
        sampling.check_resume(other_data, seeded, optimizer)
    with pytest.raises(ValueError, match=expected):
        sampling.check_resume(data, seeded, _Optimizer(300))  # another optimizer (restored) on the same batches
    sampling.check_resume(other_data, sampling.PoissonSampling(N, P, N, seed=7, start_step=300), optimizer)
    sampling.check_resume(_Data(), sampling.PoissonSampling(N, P, N), optimizer)  # seed=None: fresh draws
    sampling.check_resume(_Data(), None, optimizer)  # not poisson_batches' batches: not this check's


def _keras():
    if keras_dyndp.keras_backend() == "jax":
        import keras  # pylint: disable=import-outside-toplevel

        return keras
    from keras_dyndp.tf_backend.keras_compat import keras  # pylint: disable=import-outside-toplevel

    return keras


def _private_model(keras):
    model = keras_dyndp.make_private(keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]))
    schedule = keras_dyndp.DPSchedule(np.ones(50), np.ones(50), 0.1)
    model.compile(
        optimizer=keras_dyndp.DynamicDPKerasSGD(schedule=schedule, expected_batch_size=20.0, learning_rate=0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none"),
    )
    return model


def _restored(keras, model, tmp_path):
    """A new model and optimizer restored from ``model``'s (a checkpoint on TensorFlow, a saved model on JAX)."""
    if keras_dyndp.keras_backend() == "jax":
        model.save(str(tmp_path / "model.keras"))
        return keras.models.load_model(str(tmp_path / "model.keras"))
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    path = tf.train.Checkpoint(model=model, optimizer=model.optimizer).save(str(tmp_path / "ckpt"))
    restored = _private_model(keras)
    tf.train.Checkpoint(model=restored, optimizer=restored.optimizer).restore(path)
    return restored


def _samples(batches, epochs=1):
    """Each batch's example ids (row i of x holds i + 1), sorted, in the order drawn."""
    if keras_dyndp.keras_backend() == "jax":
        drawn = [batches[index] for _ in range(epochs) for index in range(len(batches))]
    else:
        drawn = [tuple(part.numpy() for part in batch) for _ in range(epochs) for batch in batches]
    return [tuple(sorted(np.asarray(x)[np.asarray(w) > 0, 0].astype(int).tolist())) for x, _, w in drawn]


@pytest.mark.parametrize("on_disk", [False, True], ids=["arrays", "memmap"])
def test_a_resumed_fit_must_start_at_the_optimizers_step_and_draws_none_of_the_first_runs_samples(tmp_path, on_disk):
    keras, num_examples = _keras(), 200
    x = np.repeat(np.arange(1, num_examples + 1, dtype=np.float32)[:, None], 3, axis=1)
    if on_disk:  # read on demand
        np.save(tmp_path / "x.npy", x)
        x = np.load(tmp_path / "x.npy", mmap_mode="r")
    y = np.arange(num_examples, dtype=np.int32) % 2  # int32: JAX has no int64 by default

    def batches(**kwargs):
        return keras_dyndp.poisson_batches(x, y, sampling_probability=0.1, steps_per_epoch=3, **kwargs)

    model = _private_model(keras)
    first = batches(seed=7)
    model.fit(first, verbose=0)
    model.fit(first, verbose=0)  # the same batches object again: its draws continue, fresh
    resumed = _restored(keras, model, tmp_path)
    assert int(resumed.optimizer.dp_step.numpy()) == 6
    expected = r"poisson_batches\(seed=7, start_step=0\) would draw again .* \(it has taken 6\): pass start_step="
    with pytest.raises(ValueError, match=expected):
        resumed.fit(batches(seed=7), verbose=0)
    assert int(resumed.optimizer.dp_step.numpy()) == 6  # nothing trained
    resumed.fit(batches(seed=7, start_step=6), verbose=0)
    resumed.fit(batches(), verbose=0)  # seed=None: fresh draws, unaffected
    assert int(resumed.optimizer.dp_step.numpy()) == 12
    first_run = _samples(batches(seed=7), epochs=2)  # the batches the first run trained on, drawn again
    assert len(set(first_run)) == 6 and _samples(batches(seed=7)) == first_run[:3]  # what the refusal prevented
    resumed_run = _samples(batches(seed=7, start_step=6))
    assert not set(resumed_run) & set(first_run) and resumed_run == _samples(batches(seed=7, start_step=6))


def test_an_unbound_fit_runs_the_resume_check_too(tmp_path):
    """``keras.Model.fit(model, ...)`` (Keras's own fit, not the bound method make_private wraps) refuses the same
    replay before any step, on Keras 3 (TensorFlow and JAX) and Keras 2."""
    keras = _keras()
    x = np.repeat(np.arange(1, 201, dtype=np.float32)[:, None], 3, axis=1)
    y = np.arange(200, dtype=np.int32) % 2

    def batches(**kwargs):
        return keras_dyndp.poisson_batches(x, y, sampling_probability=0.1, steps_per_epoch=3, **kwargs)

    model = _private_model(keras)
    model.fit(batches(seed=7), verbose=0)
    resumed = _restored(keras, model, tmp_path)
    with pytest.raises(ValueError, match=r"poisson_batches\(seed=7, start_step=0\) would draw again"):
        keras.Model.fit(resumed, batches(seed=7), verbose=0, shuffle=False)
    assert int(resumed.optimizer.dp_step.numpy()) == 3  # nothing trained
