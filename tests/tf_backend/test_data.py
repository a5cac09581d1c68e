"""Tests for keras_dyndp.tf_backend.data (`keras_dyndp.poisson_batches` on TensorFlow): Poisson batch statistics,
padding, seeding, overflow, datasets as input, registration, shuffled batches. The argument checks: test_sampling."""

import numpy as np
import pytest
import tensorflow as tf

import keras_dyndp
from keras_dyndp.tf_backend import data

NUM_EXAMPLES = 200
P = 0.1


def _arrays(num_examples: int = NUM_EXAMPLES) -> tuple[np.ndarray, np.ndarray]:
    # Row i holds i + 1 in every feature, so rows identify examples and padding (zeros) is distinguishable.
    x = np.repeat(np.arange(1, num_examples + 1, dtype=np.float32)[:, None], 3, axis=1)
    return x, np.arange(1, num_examples + 1, dtype=np.int64)


def _selections(dataset: tf.data.Dataset) -> list[np.ndarray]:
    """Example ids (0-based) of the real rows of each batch."""
    return [y.numpy()[w.numpy() > 0] - 1 for _, y, w in dataset]


def test_batch_size_and_inclusion_statistics():
    x, y = _arrays()
    num_steps = 2000
    selections = _selections(
        keras_dyndp.poisson_batches(x, y, sampling_probability=P, steps_per_epoch=num_steps, seed=0)
    )
    sizes = np.array([len(s) for s in selections])
    mean, variance = NUM_EXAMPLES * P, NUM_EXAMPLES * P * (1 - P)
    assert abs(sizes.mean() - mean) < 5 * np.sqrt(variance / num_steps)
    assert variance * 0.85 < sizes.var() < variance * 1.15
    counts = np.bincount(np.concatenate(selections), minlength=NUM_EXAMPLES)
    # Each example's inclusion count is Binomial(num_steps, P); all within 5 standard deviations, and the
    # counts spread like a binomial (chi-square-like check on their variance).
    assert np.all(np.abs(counts - num_steps * P) < 5 * np.sqrt(num_steps * P * (1 - P)))
    assert 0.7 < counts.var() / (num_steps * P * (1 - P)) < 1.3
    assert all(len(np.unique(s)) == len(s) for s in selections)  # without replacement within a batch


def test_fixed_shape_and_zero_weight_padding_rows():
    x, y = _arrays()
    weights_in = np.linspace(0.5, 2.0, NUM_EXAMPLES).astype(np.float32)
    cap = data.default_max_batch_size(NUM_EXAMPLES, P)
    dataset = keras_dyndp.poisson_batches(
        x, y, sampling_probability=P, sample_weight=weights_in, steps_per_epoch=20, seed=1
    )
    assert dataset.element_spec[0].shape == (cap, 3)
    assert dataset.element_spec[2] == tf.TensorSpec((cap,), tf.float32)
    for batch_x, batch_y, weights in dataset:
        real = weights.numpy() > 0
        assert np.all(batch_x.numpy()[~real] == 0) and np.all(batch_y.numpy()[~real] == 0)
        ids = batch_y.numpy()[real] - 1
        np.testing.assert_array_equal(batch_x.numpy()[real], x[ids])
        np.testing.assert_allclose(weights.numpy()[real], weights_in[ids])


def test_pad_to_multiple_puts_the_examples_first_and_pads_to_the_next_multiple_up_to_the_cap():
    x, y = _arrays()
    weights_in = np.linspace(0.5, 2.0, NUM_EXAMPLES).astype(np.float32)
    cap = data.default_max_batch_size(NUM_EXAMPLES, P)
    dataset = keras_dyndp.poisson_batches(
        x, y, sampling_probability=P, sample_weight=weights_in, steps_per_epoch=200, seed=1, pad_to_multiple=8
    )
    assert dataset.element_spec[0].shape.as_list() == [None, 3]
    assert data.poisson_sampling(dataset) == data.PoissonSampling(NUM_EXAMPLES, P, cap, pad_to_multiple=8)
    rows, sizes = set(), []
    for batch_x, batch_y, weights in dataset:
        size = int(np.sum(weights.numpy() > 0))
        assert len(batch_x) == len(batch_y) == len(weights) == min(cap, max(8, -(-size // 8) * 8))
        ids = batch_y.numpy()[:size] - 1  # the examples first, then only padding
        np.testing.assert_array_equal(batch_x.numpy()[:size], x[ids])
        np.testing.assert_allclose(weights.numpy()[:size], weights_in[ids])
        assert np.all(batch_x.numpy()[size:] == 0) and np.all(weights.numpy()[size:] == 0)
        rows.add(len(batch_x))
        sizes.append(size)
    assert 3 <= len(rows) and max(rows) < cap  # about 20 +- 4.2 examples: a few multiples of 8, never the cap (41)
    mean, variance = NUM_EXAMPLES * P, NUM_EXAMPLES * P * (1 - P)
    assert abs(np.mean(sizes) - mean) < 5 * np.sqrt(variance / len(sizes))  # still Binomial(N, p)


def test_pad_to_multiple_keeps_the_cap_on_overflow_and_pads_empty_batches_to_one_multiple(capfd):
    x, y = _arrays()
    overflowing = keras_dyndp.poisson_batches(
        x, y, sampling_probability=0.5, max_batch_size=10, steps_per_epoch=3, seed=0, pad_to_multiple=4
    )
    assert [int(np.sum(w.numpy() > 0)) for _, _, w in overflowing] == [10, 10, 10]
    assert [len(w) for _, _, w in overflowing] == [10, 10, 10]
    assert "truncated to max_batch_size=10" in capfd.readouterr().err
    sparse = keras_dyndp.poisson_batches(
        x, y, sampling_probability=0.002, steps_per_epoch=50, seed=0, pad_to_multiple=4
    )
    empty = [len(w) for _, _, w in sparse if np.all(w.numpy() == 0)]  # about 2/3 of the batches (e^-0.4)
    assert empty and set(empty) == {4}


def test_pad_to_multiple_is_rounded_up_to_a_multiple_of_the_replicas():
    x, y = _arrays()
    devices = [device.name for device in tf.config.list_logical_devices("CPU")][:2]
    with tf.distribute.MirroredStrategy(devices, cross_device_ops=tf.distribute.ReductionToOneDevice()).scope():
        dataset = keras_dyndp.poisson_batches(
            x, y, sampling_probability=P, steps_per_epoch=30, seed=0, pad_to_multiple=3
        )
    assert data.poisson_sampling(dataset).pad_to_multiple == 6
    assert all(len(w) % 6 == 0 for _, _, w in dataset)


def test_seed_determinism_and_fresh_epochs():
    x, y = _arrays()

    def make(seed):
        return keras_dyndp.poisson_batches(x, y, sampling_probability=P, steps_per_epoch=5, seed=seed)

    first = make(7)
    epoch_1, epoch_2 = _selections(first), _selections(first)
    for a, b in zip(epoch_1, _selections(make(7))):
        np.testing.assert_array_equal(np.sort(a), np.sort(b))
    assert any(set(a) != set(b) for a, b in zip(epoch_1, epoch_2))  # re-iteration resamples
    assert any(set(a) != set(b) for a, b in zip(epoch_1, _selections(make(8))))


def test_empty_batches_have_all_zero_weights():
    x, y = _arrays(3)
    dataset = keras_dyndp.poisson_batches(x, y, sampling_probability=0.01, max_batch_size=2, steps_per_epoch=50, seed=0)
    weights = np.stack([w.numpy() for _, _, w in dataset])
    assert weights.shape == (50, 2)
    assert np.any(np.all(weights == 0, axis=1))


def test_cap_larger_than_dataset_pads():
    x, y = _arrays(3)
    ((batch_x, _, weights),) = keras_dyndp.poisson_batches(
        x, y, sampling_probability=1.0, max_batch_size=5, steps_per_epoch=1, seed=0
    )
    np.testing.assert_array_equal(weights.numpy(), [1, 1, 1, 0, 0])
    assert batch_x.shape == (5, 3)


def test_overflow_truncates_with_warning(capfd):
    x, y = _arrays()
    selections = _selections(
        keras_dyndp.poisson_batches(x, y, sampling_probability=0.5, max_batch_size=10, steps_per_epoch=3, seed=0)
    )
    assert [len(s) for s in selections] == [10, 10, 10]
    assert "truncated to max_batch_size=10" in capfd.readouterr().err


def test_overflow_raise():
    x, y = _arrays()
    dataset = keras_dyndp.poisson_batches(
        x, y, sampling_probability=0.5, max_batch_size=10, steps_per_epoch=1, seed=0, overflow="raise"
    )
    with pytest.raises(tf.errors.InvalidArgumentError, match="larger than max_batch_size=10"):
        list(dataset)


def test_poisson_batches_from_dataset_with_weights():
    x, y = _arrays()
    weights_in = np.full(NUM_EXAMPLES, 3.0, np.float32)
    dataset = tf.data.Dataset.from_tensor_slices((x, y, weights_in))
    from_dataset = keras_dyndp.poisson_batches(dataset, sampling_probability=P, seed=4, steps_per_epoch=3)
    from_tensors = keras_dyndp.poisson_batches(
        x, y, sampling_probability=P, sample_weight=weights_in, seed=4, steps_per_epoch=3
    )
    for (_, y_a, w_a), (_, y_b, w_b) in zip(from_dataset, from_tensors):
        np.testing.assert_array_equal(y_a.numpy(), y_b.numpy())
        np.testing.assert_array_equal(w_a.numpy(), w_b.numpy())
        assert set(np.unique(w_a.numpy())) <= {0.0, 3.0}


def test_poisson_batches_checks_dataset_size_and_structure():
    x, y = _arrays(10)
    dataset = tf.data.Dataset.from_tensor_slices((x, y))
    with pytest.raises(ValueError, match="exactly num_examples=11 elements. Received: 10"):
        keras_dyndp.poisson_batches(dataset, sampling_probability=P, num_examples=11)
    with pytest.raises(ValueError, match="exactly num_examples=9 elements. Received: more"):
        keras_dyndp.poisson_batches(dataset, sampling_probability=P, num_examples=9)
    with pytest.raises(ValueError, match="tuples"):
        keras_dyndp.poisson_batches(tf.data.Dataset.from_tensor_slices(x), sampling_probability=P)
    with pytest.raises(ValueError, match="unknown .or infinite.*pass num_examples"):
        keras_dyndp.poisson_batches(dataset.filter(lambda x, y: True), sampling_probability=P)
    with pytest.raises(ValueError, match="leave `y` and `sample_weight` None"):
        keras_dyndp.poisson_batches(dataset, y, sampling_probability=P)


def test_shuffled_batches():
    x, y = _arrays(10)
    dataset = data.shuffled_batches(x, y, batch_size=3, seed=0)
    batches = [(by.numpy(), w.numpy()) for _, by, w in dataset]
    assert len(batches) == 3  # remainder dropped
    ids = np.concatenate([b for b, _ in batches])
    assert len(np.unique(ids)) == 9
    assert all(np.all(w == 1) for _, w in batches)
    again = np.concatenate([by.numpy() for _, by, _ in data.shuffled_batches(x, y, batch_size=3, seed=0)])
    np.testing.assert_array_equal(ids, again)


def test_bad_arguments():
    x, y = _arrays(5)
    with pytest.raises(ValueError, match="`num_examples` must be an integer >= 1"):
        data.default_max_batch_size(0, P)
    with pytest.raises(ValueError, match="`num_examples` must be an integer >= 1"):
        keras_dyndp.poisson_batches(tf.data.Dataset.from_tensor_slices((x, y)), sampling_probability=P, num_examples=0)
    with pytest.raises(ValueError, match=r"`batch_size` must be in \[1, N=5\]"):
        data.shuffled_batches(x, y, batch_size=6)


@pytest.mark.parametrize(
    "make",
    [
        lambda x, y: keras_dyndp.poisson_batches(x, y, sampling_probability=P, steps_per_epoch=5),
        lambda x, y: data.shuffled_batches(x, y, batch_size=20),
    ],
)
def test_seed_none_draws_os_entropy_whatever_the_global_seed(make):
    x, y = _arrays()
    selections = []
    for _ in range(2):
        tf.keras.utils.set_random_seed(1234)  # as two processes, or a resumed run, would
        selections.append(_selections(make(x, y)))
    assert any(set(a) != set(b) for a, b in zip(*selections))


def test_poisson_datasets_are_registered_with_their_sampling():
    x, y = _arrays()
    from_tensors = keras_dyndp.poisson_batches(x, y, sampling_probability=P, max_batch_size=40, seed=0)
    from_dataset = keras_dyndp.poisson_batches(
        tf.data.Dataset.from_tensor_slices((x, y)), sampling_probability=0.2, seed=0
    )
    assert data.poisson_sampling(from_tensors) == data.PoissonSampling(NUM_EXAMPLES, P, 40)
    assert data.poisson_sampling(from_dataset) == data.PoissonSampling(
        NUM_EXAMPLES, 0.2, data.default_max_batch_size(NUM_EXAMPLES, 0.2)
    )
    for other in (from_tensors.repeat(), data.shuffled_batches(x, y, batch_size=20), x, [1, 2], None):
        assert data.poisson_sampling(other) is None


def test_examples_read_on_demand_of_a_dtype_tensorflow_has_no_tensor_of_are_refused_naming_it(tmp_path):
    path = str(tmp_path / "dates.npy")
    np.save(path, np.arange(NUM_EXAMPLES).astype("datetime64[s]"))
    with pytest.raises(ValueError, match=r"holds dtype datetime64\[s\], which TensorFlow has no tensor of: cast it"):
        keras_dyndp.poisson_batches(np.load(path, mmap_mode="r"), _arrays()[1], sampling_probability=P)


def test_only_maps_and_prefetches_yield_the_batches_of_poisson_batches():
    x, y = _arrays()
    given = keras_dyndp.poisson_batches(x, y, sampling_probability=0.1, steps_per_epoch=3)
    per_batch = given.map(lambda *batch: batch, num_parallel_calls=2).prefetch(1).map(lambda *batch: batch)
    assert data.yields_batches_of(given, given)
    assert data.yields_batches_of(per_batch, given)
    for other in (
        given.unbatch().batch(10),
        given.rebatch(5),
        given.filter(lambda *batch: True),
        given.shuffle(3),
        given.repeat(2),
        given.take(2),
        given.skip(1),
        given.concatenate(given),
        per_batch.with_options(tf.data.Options()),  # options can shard the batches across workers
        per_batch.take(2).map(lambda *batch: batch),  # a cut hidden under a map
        keras_dyndp.poisson_batches(x, y, sampling_probability=0.1, steps_per_epoch=3),  # other batches alike
        x,
    ):
        assert not data.yields_batches_of(other, given), other
