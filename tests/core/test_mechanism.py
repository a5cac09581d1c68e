"""Tests of keras_dyndp.core.mechanism over a numpy primitive set (no TensorFlow, no JAX)."""

import types

import numpy as np
import pytest

from keras_dyndp.core import mechanism


def _divide_no_nan(x, y):
    return np.where(y != 0, x / np.where(y != 0, y, 1), 0).astype(np.result_type(x, y))


OPS = types.SimpleNamespace(
    where=np.where,
    minimum=np.minimum,
    maximum=lambda x, y: np.maximum(x, y, dtype=np.asarray(x).dtype),  # Python scalars are weak, as in TF and JAX
    take=np.take,
    cast=lambda x, dtype: np.asarray(x, dtype),
    divide_no_nan=_divide_no_nan,
    is_finite=np.isfinite,
    sqrt=np.sqrt,
    mean=np.mean,
    normals=lambda rng, tensors: [rng.standard_normal(np.shape(t)).astype(np.float32) for t in tensors],
)

CLIP_NORMS = np.array([3.0, 2.0, 1.0], np.float32)
NOISE_STDDEVS = np.array([6.0, 5.0, 4.0], np.float32)


@pytest.mark.parametrize("step, expected", [(0, (3.0, 6.0)), (2, (1.0, 4.0)), (3, (0.0, 0.0)), (10, (0.0, 0.0))])
def test_schedule_values_index_the_step_and_read_zero_past_the_budget(step, expected):
    values = mechanism.schedule_values(OPS, CLIP_NORMS, NOISE_STDDEVS, np.int64(step), 3)
    assert tuple(float(v) for v in values) == expected
    assert all(v.dtype == np.float32 for v in values)


def test_schedule_values_read_zero_when_the_step_may_not_run():
    refused = mechanism.schedule_values(OPS, CLIP_NORMS, NOISE_STDDEVS, np.int64(1), 3, np.bool_(False))
    allowed = mechanism.schedule_values(OPS, CLIP_NORMS, NOISE_STDDEVS, np.int64(1), 3, np.bool_(True))
    assert [float(v) for v in refused] == [0.0, 0.0]
    assert [float(v) for v in allowed] == [2.0, 5.0]


def test_clip_factors_are_min_one_c_over_norm_zero_safe_and_zero_at_zero_clip():
    norms = np.array([0.0, 0.5, 1.0, 4.0], np.float32)
    np.testing.assert_array_equal(mechanism.clip_factors(OPS, norms, 1.0), [1.0, 1.0, 1.0, 0.25])
    np.testing.assert_array_equal(mechanism.clip_factors(OPS, norms, 0.0), [0.0, 0.0, 0.0, 0.0])


def test_a_norm_that_is_not_finite_gets_factor_zero():
    norms = np.array([np.nan, np.inf, 2.0, 1e38], np.float32)
    np.testing.assert_allclose(mechanism.clip_factors(OPS, norms, 1.0), [0.0, 0.0, 0.5, 1e-38], rtol=1e-6, atol=0)


def test_clipped_gradients_never_exceed_the_clip_norm():
    grads = np.random.default_rng(0).normal(size=(50, 7)).astype(np.float32) * 10
    norms = np.linalg.norm(grads, axis=1)
    clipped = grads * mechanism.clip_factors(OPS, norms, 1.5)[:, None]
    assert np.all(np.linalg.norm(clipped, axis=1) <= 1.5 * (1 + 1e-6))


def test_microbatches_double_the_noise_whatever_their_number():
    assert mechanism.sensitivity(None) == 1.0
    assert mechanism.sensitivity(1) == mechanism.sensitivity(7) == 2.0
    assert mechanism.noise_stddev(np.float32(3.0), None) == 3.0
    assert mechanism.noise_stddev(np.float32(3.0), 4) == 6.0


@pytest.mark.parametrize(
    "expected_batch_size, num_microbatches, num_rows, rescale, expected",
    [
        (8.0, None, 5, False, 8.0),  # p N, whatever the rows
        (None, None, 5, False, 5.0),  # public batch size: the rows
        (None, None, 0, False, 1.0),  # an empty public batch: pure noise over 1
        (8.0, 4, 5, False, 4.0),  # microbatches: M
        (8.0, None, 5, True, 4.0),  # times C_t = 0.5
    ],
)
def test_normaliser(expected_batch_size, num_microbatches, num_rows, rescale, expected):
    n = mechanism.normaliser(
        OPS,
        clip_norm=np.float32(0.5),
        num_rows=num_rows,
        expected_batch_size=expected_batch_size,
        num_microbatches=num_microbatches,
        rescale_to_unit_norm=rescale,
    )
    assert float(n) == expected and n.dtype == np.float32


def test_private_update_adds_the_noise_once_to_the_sum_then_normalises():
    sums = [np.full([2, 3], 4.0, np.float32), np.zeros([5], np.float32)]
    kwargs = dict(clip_norm=np.float32(1.0), num_rows=3, expected_batch_size=2.0, rescale_to_unit_norm=False)
    noises = OPS.normals(np.random.default_rng(1), sums)
    for num_microbatches, scale in ((None, 1.5), (3, 3.0)):
        update = mechanism.private_update(
            OPS, sums, np.random.default_rng(1), sigma=np.float32(1.5), num_microbatches=num_microbatches, **kwargs
        )
        normaliser = 2.0 if num_microbatches is None else 3.0
        for total, noise, result in zip(sums, noises, update):
            np.testing.assert_allclose(result, (total + scale * noise) / normaliser, rtol=1e-6)


def test_extra_normals_come_from_the_same_draw_after_the_noise_and_leave_the_update_alone():
    """Adaptive clipping's count noise: one more standard normal of the step's one draw (no second generator call)."""
    sums = [np.full([2, 3], 4.0, np.float32), np.zeros([5], np.float32)]
    kwargs = dict(clip_norm=np.float32(1.0), sigma=np.float32(1.5), num_rows=3, expected_batch_size=2.0)
    kwargs.update(num_microbatches=None, rescale_to_unit_norm=False)
    plain = mechanism.private_update(OPS, sums, np.random.default_rng(1), **kwargs)
    *update, extra = mechanism.private_update(OPS, sums, np.random.default_rng(1), num_extra=1, **kwargs)
    for a, b in zip(plain, update):
        np.testing.assert_array_equal(a, b)
    draw = np.random.default_rng(1)
    expected = OPS.normals(draw, [*sums, np.float32(0.0)])[-1]
    assert np.shape(extra) == () and float(extra) == float(expected)


def test_a_zero_normaliser_gives_a_zero_update():
    update = mechanism.private_update(
        OPS,
        [np.ones([4], np.float32)],
        np.random.default_rng(0),
        clip_norm=np.float32(0.0),
        sigma=np.float32(0.0),
        num_rows=4,
        expected_batch_size=2.0,
        num_microbatches=None,
        rescale_to_unit_norm=True,
    )
    np.testing.assert_array_equal(update[0], np.zeros([4]))


def test_noise_std_is_sigma_on_the_sum():
    noised = mechanism.add_noise(OPS, [np.zeros([200_000], np.float32)], np.float32(2.0), np.random.default_rng(3))
    assert abs(np.std(noised[0]) - 2.0) < 0.02


def test_per_example_losses_reduce_each_example_alone_with_its_own_weights():
    """[B, L] losses with a [B, L] mask: each row's masked sum over L positions (Keras's per-example weighting), never
    over the batch's token count; per-row weights ([B], [B, 1]) as before; trailing axes averaged."""
    losses = np.array([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]], np.float32)
    mask = np.array([[1, 1, 1, 1], [1, 0, 0, 0]], np.float32)
    np.testing.assert_allclose(mechanism.per_example_losses(OPS, losses, mask), [10 / 4, 5 / 4])
    np.testing.assert_allclose(mechanism.per_example_losses(OPS, losses), [10 / 4, 26 / 4])
    for row_weights in (np.array([2.0, 0.0]), np.array([[2.0], [0.0]])):
        np.testing.assert_allclose(mechanism.per_example_losses(OPS, losses, row_weights), [5.0, 0.0])
        np.testing.assert_allclose(mechanism.per_example_losses(OPS, losses[:, 0], row_weights), [2.0, 0.0])
    per_class = np.stack([losses, 3 * losses], axis=-1)  # [B, L, 2]: averaged over the last axis first
    np.testing.assert_allclose(mechanism.per_example_losses(OPS, per_class, mask), [20 / 4, 10 / 4])
    with pytest.raises(ValueError, match=r"`sample_weight` must hold one weight per example .* axes \(4,\) after"):
        mechanism.per_example_losses(OPS, losses[:, 0], mask)
