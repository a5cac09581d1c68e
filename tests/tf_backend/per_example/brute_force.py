"""The reference for per-example clipping tests: a Python loop of single-example gradients, and comparisons."""

import numpy as np
import pytest
import tensorflow as tf

from keras_dyndp.tf_backend import per_example
from keras_dyndp.tf_backend.keras_compat import keras

LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")


def per_example_gradients(model, x, y, weights):
    """Each example's gradients (float64 arrays, one per trainable variable) and their global norms."""
    gradients = []
    for i in range(len(weights)):
        with tf.GradientTape() as tape:
            loss = LOSS(y[i : i + 1], model(x[i : i + 1], training=True))[0] * weights[i]
        grads = tape.gradient(loss, model.trainable_variables, unconnected_gradients=tf.UnconnectedGradients.ZERO)
        gradients.append([tf.convert_to_tensor(g).numpy().astype(np.float64) for g in grads])
    norms = np.array([np.sqrt(sum(np.sum(g**2) for g in grads)) for grads in gradients])
    return gradients, norms


def clipped(gradients, norms, clip_norm):
    """``(sums, norms)``: the sums of the per-example gradients clipped to ``clip_norm``."""
    factors = np.minimum(1.0, clip_norm / np.maximum(norms, 1e-30))
    sums = [sum(factors[i] * gradients[i][j] for i in range(len(gradients))) for j in range(len(gradients[0]))]
    return sums, norms


def reference(model, x, y, weights, clip_norm):
    """Clipped sum from a Python loop of single-example gradients."""
    return clipped(*per_example_gradients(model, x, y, weights), clip_norm)


def assert_close(actual, expected):
    """Largest absolute difference below 1e-5 of the largest expected value."""
    actual = np.asarray(actual, np.float64)
    scale = max(np.max(np.abs(expected)), 1e-12)
    assert np.max(np.abs(actual - expected)) / scale < 1e-5


def assert_matches(sums, norms, expected):
    """``(sums, norms)`` close to ``expected``, a `reference` result."""
    expected_sums, expected_norms = expected
    assert_close(norms, expected_norms)
    for actual, wanted in zip(sums, expected_sums):
        assert_close(actual, wanted)


def assert_matches_on_one_scale(sums, norms, expected):
    """``(sums, norms)`` close to ``expected`` (`brute_force.reference`), the sums relative to the largest of all
    variables' entries: attention's key bias has a gradient of exactly 0 (a softmax ignores a shift), its float32
    value rounding noise."""
    expected_sums, expected_norms = expected
    assert_close(norms, expected_norms)
    scale = max(np.max(np.abs(wanted)) for wanted in expected_sums)
    for actual, wanted in zip(sums, expected_sums):
        assert np.max(np.abs(np.asarray(actual, np.float64) - wanted)) / scale < 1e-5


def clip_case(model, x, y, weights):
    """``(model, x, y, per-example gradients, their norms, a clip norm)``, the clip norm the median of the weighted
    examples' norms: some examples clipped, some not."""
    gradients, norms = per_example_gradients(model, x, y, weights)
    return model, x, y, gradients, norms, float(np.median(norms[weights > 0]))


def assert_ghost_matches_the_brute_force(case, weights, matches=assert_matches, step=None):
    """The ghost path (eager and traced) gives the clipped sum and norms of the per-example loop, by ``matches``;
    ``step`` is the case's `traced` ghost path where a test shares it (traced here when None)."""
    model, x, y, gradients, norms, clip_norm = case
    assert per_example.ghost_supported(model, model.trainable_variables)
    expected = clipped(gradients, norms, clip_norm)
    weights = tf.constant(weights)
    matches(
        *per_example.clipped_gradient_sum(
            model, LOSS, x, y, weights, clip_norm, model.trainable_variables, method="ghost"
        ),
        expected,
    )
    step = step or traced(model, x, "ghost")
    matches(*step(x, y, weights, clip_norm), expected)


def traced(model, x, method):
    """The clipped sum traced as in fit: a tf.function whose batch size is unknown while tracing."""
    signature = [
        tf.TensorSpec([None, *x.shape[1:]], x.dtype),
        tf.TensorSpec([None], tf.int32),
        tf.TensorSpec([None]),
        tf.TensorSpec([]),
    ]
    return tf.function(
        lambda x, y, w, c: per_example.clipped_gradient_sum(
            model, LOSS, x, y, w, c, model.trainable_variables, method=method
        ),
        input_signature=signature,
    )


def assert_each_removal_moves_by_clipped_norm(model, x, y, weights, norms, clip_norm, step=None):
    """Neighbour sensitivity with sigma = 0 (the clipped sum is what the optimizer noises): removing example i from
    the ghost path's clipped sum moves it by min(||g_i||, C) <= C. ``step`` is the model's `traced` ghost path where a
    test shares it (traced here when None)."""
    step = step or traced(model, x, "ghost")
    weights = tf.constant(weights)
    sums, _ = step(x, y, weights, clip_norm)
    for i in range(len(norms)):
        keep = [j for j in range(len(norms)) if j != i]
        without, _ = step(tf.gather(x, keep), tf.gather(y, keep), tf.gather(weights, keep), clip_norm)
        distance = np.sqrt(sum(np.sum(np.square(np.float64(a) - np.float64(b))) for a, b in zip(sums, without)))
        assert distance == pytest.approx(min(norms[i], clip_norm), rel=1e-4, abs=1e-5 * clip_norm)  # float32 sums.
        assert distance <= clip_norm * (1 + 1e-5)
