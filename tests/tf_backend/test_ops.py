"""Tests for keras_dyndp.tf_backend.ops: vectorized per-example clipping and the Gaussian noise."""

import threading

import numpy as np
import pytest
import tensorflow as tf
from scipy import stats

from keras_dyndp.rules import layer_rules
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


def test_standard_normals_are_standard_normal():
    """Box-Muller on the generator's uniforms: N(0, 1) by a Kolmogorov-Smirnov test and the 3-sigma tail mass, an odd
    count (the last pair's second normal dropped), no value beyond sqrt(2 log 2^23) (the 23-bit uniforms' limit)."""
    draws = ops.standard_normals(tf.random.Generator.from_seed(3), tf.TensorShape([400_001]), None).numpy()
    assert draws.shape == (400_001,) and draws.dtype == np.float32
    assert stats.kstest(draws, "norm").pvalue > 1e-3
    assert np.mean(np.abs(draws) > 3) == pytest.approx(2 * stats.norm.sf(3), rel=0.1)
    assert np.max(np.abs(draws)) <= np.sqrt(2 * 23 * np.log(2)) + 1e-5
    assert abs(np.corrcoef(draws[:200_000], draws[200_000:400_000])[0, 1]) < 0.01  # the pairs' two halves


@pytest.mark.parametrize("shape", [[], [0, 3], [3, 5], [2, 1, 4]])
def test_normals_take_each_tensors_shape_static_or_not(shape):
    generator = tf.random.Generator.from_seed(4)
    (static,) = ops.OPS.normals(generator, [tf.zeros(shape)])
    assert static.shape == shape
    dynamic = tf.function(lambda t: ops.OPS.normals(generator, [t])[0], input_signature=[tf.TensorSpec(None)])
    assert dynamic(tf.zeros(shape)).shape == shape


def test_a_static_shape_draws_the_noise_without_waiting_for_the_tensor():
    """The draw does not depend on the tensor noised, so TensorFlow's executor may run it alongside the computation
    of the clipped sums."""
    generator = tf.random.Generator.from_seed(5)
    graph = (
        tf.function(lambda t: ops.OPS.normals(generator, [t * 2.0])[0])
        .get_concrete_function(tf.TensorSpec([3, 4]))
        .graph
    )
    (placeholder,) = graph.inputs[:1]
    ancestors, frontier = set(), [graph.outputs[0].op]
    while frontier:
        op = frontier.pop()
        for parent in [t.op for t in op.inputs] + list(op.control_inputs):
            if parent not in ancestors:
                ancestors.add(parent)
                frontier.append(parent)
    assert placeholder.op not in ancestors


def test_clip_factors_are_zero_safe_and_zero_at_zero_clip():
    norms = tf.constant([0.0, 0.5, 2.0])
    np.testing.assert_allclose(ops.clip_factors(norms, 1.0).numpy(), [1.0, 1.0, 0.5])
    np.testing.assert_allclose(ops.clip_factors(norms, 0.0).numpy(), [0.0, 0.0, 0.0])


def test_rows_without_select_holds_only_in_the_thread_that_entered_it():
    """tf.distribute traces each replica in a thread: one replica's fast clipped sums must not drop another's
    selects."""
    rows, factors = tf.constant([[np.nan], [2.0]]), tf.constant([0.0, 1.0])
    entered, leave = threading.Event(), threading.Event()

    def inside():
        with layer_rules.rows_without_select():
            entered.set()
            leave.wait(30)

    thread = threading.Thread(target=inside)
    thread.start()
    try:
        assert entered.wait(30)
        np.testing.assert_array_equal(layer_rules.kept_rows(rows, factors).numpy(), [[0.0], [2.0]])
        with layer_rules.rows_without_select():
            assert np.isnan(layer_rules.kept_rows(rows, factors).numpy()[0, 0])
        np.testing.assert_array_equal(layer_rules.kept_rows(rows, factors).numpy(), [[0.0], [2.0]])
    finally:
        leave.set()
        thread.join()
