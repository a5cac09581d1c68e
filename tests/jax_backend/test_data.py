"""Tests for keras_dyndp.jax_backend.data (`keras_dyndp.poisson_batches` on JAX): sampling, padding, seeding, overflow,
and fit's checks. The argument checks: test_sampling."""

import warnings

import pytest

jax = pytest.importorskip("jax")
keras = pytest.importorskip("keras")
if keras.backend.backend() != "jax":
    pytest.skip("Keras is not running on JAX (set KERAS_BACKEND=jax)", allow_module_level=True)

import numpy as np  # noqa: E402

import keras_dyndp  # noqa: E402
from keras_dyndp import schedules  # noqa: E402
from keras_dyndp.core import batch_sizes  # noqa: E402
from keras_dyndp.jax_backend import DynamicDPKerasSGD  # noqa: E402
from keras_dyndp.jax_backend import PoissonBatches  # noqa: E402  (the class of what poisson_batches returns)
from keras_dyndp.jax_backend import SamplingWarning  # noqa: E402
from keras_dyndp.jax_backend import make_private  # noqa: E402

N, P = 200, 0.1


def _arrays():
    # Row i holds i + 1, so rows identify examples and padding (zeros) is told apart.
    return np.repeat(np.arange(1, N + 1, dtype=np.float32)[:, None], 3, axis=1), np.arange(1, N + 1)


def test_batches_are_poisson_samples_padded_with_zero_weight_rows():
    x, y = _arrays()
    batches = keras_dyndp.poisson_batches(x, y, sampling_probability=P, steps_per_epoch=400, seed=0)
    assert len(batches) == 400 and batches.max_batch_size == batch_sizes.default_max_batch_size(N, P)
    counts, sizes = np.zeros(N), []
    for index in range(len(batches)):
        bx, by, weights = batches[index]
        assert bx.shape == (batches.max_batch_size, 3) and weights.shape == (batches.max_batch_size,)
        real = weights > 0
        sizes.append(real.sum())
        assert np.all(bx[~real] == 0) and np.all(by[~real] == 0)
        np.testing.assert_array_equal(bx[real, 0], by[real])  # rows stay whole
        assert len(set(by[real])) == real.sum()  # no example twice
        counts[by[real] - 1] += 1
    # Sizes follow Binomial(N, p), each example's inclusion count Binomial(400, p): means within 5 standard errors,
    # variances within 30%.
    sizes, variance = np.array(sizes), N * P * (1 - P)
    assert abs(sizes.mean() - N * P) < 5 * np.sqrt(variance / 400) and 0.7 < sizes.var() / variance < 1.3
    assert np.all(np.abs(counts - 400 * P) < 5 * np.sqrt(400 * P * (1 - P)))
    assert 0.7 < counts.var() / (400 * P * (1 - P)) < 1.3


def test_a_seed_repeats_the_batches_and_none_draws_fresh_ones():
    x, y = _arrays()
    first, second = (keras_dyndp.poisson_batches(x, y, sampling_probability=P, seed=3) for _ in range(2))
    np.testing.assert_array_equal(first[0][1], second[0][1])
    fresh = [keras_dyndp.poisson_batches(x, y, sampling_probability=P)[0][1] for _ in range(2)]
    assert not np.array_equal(*fresh)


def test_overflow_is_truncated_to_the_cap():
    x, y = _arrays()
    batch = keras_dyndp.poisson_batches(x, y, sampling_probability=0.5, max_batch_size=5, seed=0)[0]
    assert batch[0].shape == (5, 3) and np.all(batch[2] == 1)


def test_pad_to_multiple_pads_each_batch_to_the_next_multiple_up_to_the_cap():
    x, y = _arrays()
    batches = keras_dyndp.poisson_batches(x, y, sampling_probability=P, pad_to_multiple=8, steps_per_epoch=200, seed=1)
    assert batches.pad_to_multiple == 8
    shapes = set()
    for index in range(len(batches)):
        bx, by, weights = batches[index]
        real = int((weights > 0).sum())
        assert len(bx) == len(by) == len(weights) == min(batches.max_batch_size, max(8, -(-real // 8) * 8))
        assert np.all(bx[real:] == 0) and np.all(weights[real:] == 0)
        shapes.add(len(bx))
    assert 2 <= len(shapes) <= 5  # about 20 +- 4.2 examples: a few multiples of 8, never the cap of 51
    assert max(shapes) < batches.max_batch_size


def test_fit_refuses_poisson_batches_when_the_step_would_normalise_by_rows():
    x, y = _arrays()
    y = (y % 2).astype("int32")
    model = make_private(keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]))
    schedule = schedules.DPSchedule(np.ones(5), np.ones(5), P)
    optimizer = DynamicDPKerasSGD(schedule=schedule, public_batch_size=True, learning_rate=0.01)
    model.compile(
        optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    )
    bucketed = keras_dyndp.poisson_batches(x, y, sampling_probability=P, pad_to_multiple=8, steps_per_epoch=2)
    with pytest.raises(ValueError, match="Poisson batches, whose sizes are private, but .* public_batch_size=True"):
        model.fit(bucketed, verbose=0)
    with_normaliser = _model(P)  # expected_batch_size = p N: the rows do not matter
    with_normaliser.fit(bucketed, verbose=0)
    assert int(with_normaliser.optimizer.dp_step.numpy()) == 2


def test_overflow_raise_fails_the_step_and_the_former_constructor_still_samples():
    x, y = _arrays()
    batches = keras_dyndp.poisson_batches(x, y, sampling_probability=0.5, max_batch_size=5, overflow="raise", seed=0)
    with pytest.raises(RuntimeError, match="larger than max_batch_size=5"):
        batches[0]  # noqa: B018
    former = PoissonBatches(x, y, sampling_probability=P, steps_per_epoch=2, seed=0)
    assert (len(former), former.sampling_probability, former.num_examples) == (2, P, N)


def _model(p, public_batch_size=False):
    model = make_private(keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]))
    schedule = schedules.DPSchedule(np.ones(50), np.ones(50), p)
    normaliser = dict(public_batch_size=True) if public_batch_size else dict(expected_batch_size=p * N)
    optimizer = DynamicDPKerasSGD(schedule=schedule, learning_rate=0.01, **normaliser)
    model.compile(
        optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    )
    return model


def test_fit_refuses_poisson_batches_of_another_dataset_size_before_the_first_step():
    x, y = _arrays()
    model = _model(P)
    y = (y % 2).astype("int32")
    half = keras_dyndp.poisson_batches(x[: N // 2], y[: N // 2], sampling_probability=P, steps_per_epoch=2)
    expected = f"num_examples={N} was given to DynamicDPKerasSGD but the data has {N // 2} examples: pass num_examples"
    with pytest.raises(ValueError, match=expected):
        model.fit(half, verbose=0)
    assert int(model.optimizer.dp_step.numpy()) == 0


def test_fit_accepts_poisson_batches_at_the_schedules_rate_and_refuses_another():
    x, y = _arrays()
    y = (y % 2).astype("int32")
    model = _model(P)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SamplingWarning)
        model.fit(keras_dyndp.poisson_batches(x, y, sampling_probability=P, steps_per_epoch=3), verbose=0)
    assert int(model.optimizer.dp_step.numpy()) == 3
    with pytest.raises(ValueError, match=r"sampled at p=0.2, but the optimizer's schedule is accounted at p=0.1"):
        model.fit(keras_dyndp.poisson_batches(x, y, sampling_probability=0.2, steps_per_epoch=1), verbose=0)


def test_fit_refuses_arrays_unless_batch_sizes_are_public_then_warns_once():
    x, y = _arrays()
    y = (y % 2).astype("int32")
    fix = r"keras_dyndp.poisson_batches\(x, y, sampling_probability=0.1\)"
    with pytest.raises(ValueError, match=rf"(?s)received arrays.*{fix}"):
        _model(20 / N).fit(x, y, batch_size=20, epochs=1, verbose=0)
    model = _model(20 / N, public_batch_size=True)  # fixed-size batches, stated
    with pytest.warns(SamplingWarning, match=r"not batches returned by keras_dyndp.poisson_batches.*p=0.1"):
        model.fit(x, y, batch_size=20, epochs=1, verbose=0, shuffle=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SamplingWarning)
        model.fit(x, y, batch_size=20, epochs=1, verbose=0)
    assert int(model.optimizer.dp_step.numpy()) == 20


def test_train_on_batch_warns_too():
    x, y = _arrays()
    model = _model(20 / N)
    with pytest.warns(SamplingWarning, match="model.train_on_batch received x of type ndarray"):
        model.train_on_batch(x[:20], (y[:20] % 2).astype("int32"))
