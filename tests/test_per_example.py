"""Per-example clipped sums of keras_dyndp.per_example against a loop of single-example tape.gradient."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from keras_dyndp import per_example

BATCH = 6
WEIGHTS = np.array([1.0, 0.0, 1.0, 2.0, 0.0, 1.0], np.float32)
LOSS = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=tf.keras.losses.Reduction.NONE)


def cnn() -> tf.keras.Model:
    return tf.keras.Sequential([
        tf.keras.layers.InputLayer(input_shape=(16, 16, 1)),
        tf.keras.layers.Conv2D(4, 8, strides=2, padding="same", activation="relu"),
        tf.keras.layers.MaxPool2D(2, 1),
        tf.keras.layers.Conv2D(6, 3, strides=2, padding="valid", activation="relu"),
        tf.keras.layers.MaxPool2D(2, 1),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(8, activation="relu"),
        tf.keras.layers.Dense(3),
    ])


def lstm() -> tf.keras.Model:
    return tf.keras.Sequential([
        tf.keras.layers.InputLayer(input_shape=(5,)),
        tf.keras.layers.Embedding(7, 4),
        tf.keras.layers.LSTM(5, return_sequences=True),
        tf.keras.layers.LSTM(3),
        tf.keras.layers.Dense(3),
    ])


def text() -> tf.keras.Model:
    inputs = tf.keras.Input(shape=(6,), dtype=tf.int32)
    hidden = tf.keras.layers.Embedding(5, 4)(inputs)
    hidden = tf.keras.layers.Dense(4, activation="tanh")(hidden)  # Dense over a sequence axis.
    hidden = tf.keras.layers.GlobalAveragePooling1D()(hidden)
    return tf.keras.Model(inputs, tf.keras.layers.Dense(3)(hidden))


class WithoutRule(tf.keras.Model):
    """Subclassed model with a LayerNormalization: no ghost rule, so the whole model is vectorized."""

    def __init__(self):
        super().__init__()
        self.dense = tf.keras.layers.Dense(5, activation="relu")
        self.norm = tf.keras.layers.LayerNormalization()
        self.out = tf.keras.layers.Dense(3)

    def call(self, inputs):
        return self.out(self.norm(self.dense(inputs)))


def data(name: str):
    rng = np.random.default_rng(1)
    y = tf.constant(rng.integers(0, 3, BATCH), tf.int32)
    if name == "cnn":
        return tf.constant(rng.normal(size=(BATCH, 16, 16, 1)), tf.float32), y
    if name == "lstm":
        return tf.constant(rng.integers(0, 7, (BATCH, 5)), tf.int32), y
    if name == "text":
        return tf.constant(rng.integers(0, 5, (BATCH, 6)), tf.int32), y
    return tf.constant(rng.normal(size=(BATCH, 4)), tf.float32), y


MODELS = {"cnn": cnn, "lstm": lstm, "text": text, "without_rule": WithoutRule}


def reference(model, x, y, weights, clip_norm):
    """Clipped sum from a Python loop of single-example gradients."""
    per_example_grads = []
    for i in range(BATCH):
        with tf.GradientTape() as tape:
            loss = LOSS(y[i:i + 1], model(x[i:i + 1], training=True))[0] * weights[i]
        grads = tape.gradient(loss, model.trainable_variables)
        per_example_grads.append([tf.convert_to_tensor(g).numpy() for g in grads])
    norms = np.array([np.sqrt(sum(np.sum(g.astype(np.float64) ** 2) for g in grads))
                      for grads in per_example_grads])
    factors = np.minimum(1.0, clip_norm / np.maximum(norms, 1e-30))
    sums = [sum(factors[i] * per_example_grads[i][j] for i in range(BATCH))
            for j in range(len(model.trainable_variables))]
    return sums, norms


def assert_close(actual, expected):
    actual = np.asarray(actual, np.float64)
    scale = max(np.max(np.abs(expected)), 1e-12)
    assert np.max(np.abs(actual - expected)) / scale < 1e-5


@pytest.fixture(scope="module", params=sorted(MODELS))
def case(request):
    tf.keras.utils.set_random_seed(0)
    model = MODELS[request.param]()
    x, y = data(request.param)
    model(x[:1])
    clip_norm = 0.3
    return request.param, model, x, y, clip_norm, reference(model, x, y, WEIGHTS, clip_norm)


@pytest.mark.parametrize("method", ["auto", "vectorized"])
def test_clipped_sum_matches_reference(case, method):
    name, model, x, y, clip_norm, (expected_sums, expected_norms) = case
    if name == "lstm" and method == "vectorized":
        pytest.skip("pfor cannot vectorise Keras LSTM gradients; the tf.map_fn fallback is tested below.")
    step = tf.function(lambda: per_example.clipped_gradient_sum(
        model, LOSS, x, y, tf.constant(WEIGHTS), clip_norm, model.trainable_variables, method=method))
    sums, norms = step()
    assert_close(norms, expected_norms)
    for actual, expected in zip(sums, expected_sums):
        assert_close(actual, expected)
    assert np.all(norms.numpy()[WEIGHTS == 0] == 0)


def test_ghost_path_compiles_with_xla(case):
    name, model, x, y, clip_norm, (expected_sums, expected_norms) = case
    if name not in ("cnn", "text"):
        pytest.skip("One conv and one embedding model keep the test short.")
    step = tf.function(lambda: per_example.clipped_gradient_sum(
        model, LOSS, x, y, tf.constant(WEIGHTS), clip_norm, model.trainable_variables), jit_compile=True)
    sums, norms = step()
    assert_close(norms, expected_norms)
    for actual, expected in zip(sums, expected_sums):
        assert_close(actual, expected)


def test_ghost_rules_cover_models(case):
    name, model, *_ = case
    assert per_example.ghost_supported(model, model.trainable_variables) == (name != "without_rule")


def test_map_fn_fallback_for_lstm():
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.layers.Embedding(7, 3), tf.keras.layers.LSTM(2), tf.keras.layers.Dense(3)])
    x, y = data("lstm")
    model(x[:1])
    expected_sums, expected_norms = reference(model, x, y, WEIGHTS, 0.1)
    sums, norms = tf.function(lambda: per_example.clipped_gradient_sum(
        model, LOSS, x, y, tf.constant(WEIGHTS), 0.1, model.trainable_variables, method="vectorized"))()
    assert_close(norms, expected_norms)
    for actual, expected in zip(sums, expected_sums):
        assert_close(actual, expected)


def test_ghost_refuses_model_without_rule():
    model = WithoutRule()
    x, y = data("without_rule")
    model(x[:1])
    with pytest.raises(ValueError, match="method='ghost'"):
        per_example.clipped_gradient_sum(model, LOSS, x, y, None, 1.0, model.trainable_variables, method="ghost")


def test_shared_layer_falls_back_to_vectorized():
    dense = tf.keras.layers.Dense(4)
    inputs = tf.keras.Input(shape=(4,))
    model = tf.keras.Model(inputs, tf.keras.layers.Dense(3)(dense(dense(inputs))))
    x, y = data("without_rule")
    expected_sums, expected_norms = reference(model, x, y, WEIGHTS, 0.5)
    sums, norms = per_example.clipped_gradient_sum(
        model, LOSS, x, y, tf.constant(WEIGHTS), 0.5, model.trainable_variables)
    assert_close(norms, expected_norms)
    for actual, expected in zip(sums, expected_sums):
        assert_close(actual, expected)


def test_zero_clip_norm_gives_zero_sums_and_scalar_loss_is_refused():
    model = text()
    x, y = data("text")
    sums, _ = per_example.clipped_gradient_sum(model, LOSS, x, y, None, 0.0, model.trainable_variables)
    assert all(np.all(s.numpy() == 0) for s in sums)
    with pytest.raises(ValueError, match="one loss per example"):
        per_example.clipped_gradient_sum(
            model, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), x, y, None, 1.0,
            model.trainable_variables)
    with pytest.raises(ValueError, match="`method`"):
        per_example.clipped_gradient_sum(model, LOSS, x, y, None, 1.0, model.trainable_variables, method="x")


@pytest.mark.parametrize("positions,fan_in,fan_out", [(2, 64, 64), (5, 3, 4), (4, 300, 300)])
def test_bilinear_norms_and_sum_gram_and_materialised_forms(positions, fan_in, fan_out):
    """(2, 64, 64) and (4, 300, 300) (too large to materialise) take the Gram form, (5, 3, 4) the other."""
    rng = np.random.default_rng(2)
    a = rng.normal(size=(3, positions, fan_in)).astype(np.float32)
    g = rng.normal(size=(3, positions, fan_out)).astype(np.float32)
    factors = np.array([0.5, 1.0, 0.0], np.float32)
    per_example_grads = np.einsum("btk,btc->bkc", a.astype(np.float64), g.astype(np.float64))
    squared, kernel_sum = per_example._bilinear_norms_and_sum(tf.constant(a), tf.constant(g))
    assert_close(squared, np.sum(per_example_grads**2, axis=(1, 2)))
    assert_close(kernel_sum(tf.constant(factors)), np.einsum("b,bkc->kc", factors, per_example_grads))


@pytest.mark.parametrize("shape,kernel,strides,dilation,padding", [
    ((2, 9, 8, 3), (3, 2), (2, 2), (1, 1), "same"),
    ((1, 10, 7, 2), (3, 3), (1, 1), (2, 2), "valid"),
    ((2, 11, 11, 1), (4, 4), (3, 2), (1, 1), "same"),
])
def test_image_patches_match_extract_patches(shape, kernel, strides, dilation, padding):
    layer = tf.keras.layers.Conv2D(2, kernel, strides=strides, dilation_rate=dilation, padding=padding)
    inputs = tf.constant(np.random.default_rng(3).normal(size=shape), tf.float32)
    expected = tf.image.extract_patches(
        inputs, [1, *kernel, 1], [1, *strides, 1], [1, *dilation, 1], padding.upper())
    actual = per_example._image_patches(layer, inputs)
    np.testing.assert_array_equal(actual.numpy(), tf.reshape(expected, actual.shape).numpy())
    # An unknown image size takes tf.image.extract_patches.
    unknown_size = tf.function(
        lambda t: per_example._image_patches(layer, t),
        input_signature=[tf.TensorSpec([None, None, None, shape[-1]], tf.float32)])
    np.testing.assert_array_equal(unknown_size(inputs).numpy(), actual.numpy())
