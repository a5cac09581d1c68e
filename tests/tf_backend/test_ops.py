"""Tests for keras_dyndp.tf_backend.ops: vectorized per-example clipping and the Gaussian noise."""

import numpy as np
import pytest
import tensorflow as tf

from keras_dyndp.tf_backend import ops


def _numpy_clipped_sum(grads, clip_norm):
    flat = np.concatenate([g.reshape(g.shape[0], -1) for g in grads], axis=1)
    norms = np.linalg.norm(flat, axis=1)
    factors = np.array([min(1.0, clip_norm / n) if n > 0 else 1.0 for n in norms])
    return [np.tensordot(factors, g, axes=1) for g in grads], norms


def test_clip_matches_numpy_with_zero_gradient_example():
    rng = np.random.default_rng(0)
    grads = [rng.normal(size=(5, 3, 2)).astype(np.float32), rng.normal(size=(5, 4)).astype(np.float32)]
    grads[0][2] = 0.0
    grads[1][2] = 0.0  # example 2 has a zero gradient: factor 1, no NaN
    grads[0][4] *= 1e-3
    grads[1][4] *= 1e-3  # example 4 is below the threshold: unchanged
    expected_sums, expected_norms = _numpy_clipped_sum(grads, 1.5)
    sums, norms = ops.clip_by_global_norm_per_example([tf.constant(g) for g in grads], 1.5)
    np.testing.assert_allclose(norms.numpy(), expected_norms, rtol=1e-6)
    for got, want in zip(sums, expected_sums):
        assert got.shape == want.shape
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)
    assert np.all(np.isfinite(sums[0].numpy()))


def test_clip_zero_threshold_gives_zero_and_none_passes_through():
    grads = [tf.ones([3, 2]), None, tf.zeros([3])]
    sums, norms = ops.clip_by_global_norm_per_example(grads, 0.0)
    assert sums[1] is None
    np.testing.assert_array_equal(sums[0].numpy(), np.zeros(2))
    np.testing.assert_array_equal(sums[2].numpy(), 0.0)
    np.testing.assert_allclose(norms.numpy(), np.full(3, np.sqrt(2.0)), rtol=1e-6)


def test_global_norms_rejects_all_none():
    with pytest.raises(ValueError, match="per_example_grads"):
        ops.per_example_global_norms([None])


def test_clip_compiles_under_xla():
    grads = [tf.random.normal([4, 3]), tf.random.normal([4, 2, 2])]
    compiled = tf.function(ops.clip_by_global_norm_per_example, jit_compile=True)
    sums, _ = compiled(grads, tf.constant(0.5))
    eager_sums, _ = ops.clip_by_global_norm_per_example(grads, 0.5)
    for got, want in zip(sums, eager_sums):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)


def test_noise_has_absolute_stddev():
    generator = tf.random.Generator.from_seed(1)
    noised = ops.add_gaussian_noise([tf.zeros([100, 100]), tf.ones([7], tf.float64)], 2.5, generator=generator)
    assert noised[1].dtype == tf.float64
    assert np.std(noised[0].numpy()) == pytest.approx(2.5, rel=0.05)
    assert abs(np.mean(noised[0].numpy())) < 0.1


def test_noise_comes_from_the_generator_alone_and_advances_it():
    draws = []
    for global_seed in (0, 0, 1):
        tf.keras.utils.set_random_seed(global_seed)
        generator = tf.random.Generator.from_seed(7)
        first = ops.add_gaussian_noise([tf.zeros([1000])], 1.0, generator=generator)[0].numpy()
        second = ops.add_gaussian_noise([tf.zeros([1000])], 1.0, generator=generator)[0].numpy()
        draws.append((first, second))
    # The same generator state gives the same noise whatever the global seed; each call draws anew.
    np.testing.assert_array_equal(draws[0][0], draws[2][0])
    assert abs(np.corrcoef(draws[0][0], draws[0][1])[0, 1]) < 0.15
    tf.keras.utils.set_random_seed(0)
    other = ops.add_gaussian_noise([tf.zeros([1000])], 1.0, generator=tf.random.Generator.from_seed(8))
    assert abs(np.corrcoef(draws[0][0], other[0].numpy())[0, 1]) < 0.15


def test_clip_factors_are_zero_safe_and_zero_at_zero_clip():
    norms = tf.constant([0.0, 0.5, 2.0])
    np.testing.assert_allclose(ops.clip_factors(norms, 1.0).numpy(), [1.0, 1.0, 0.5])
    np.testing.assert_allclose(ops.clip_factors(norms, 0.0).numpy(), [0.0, 0.0, 0.0])
