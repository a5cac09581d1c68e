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
    for i in range(len(weights)):
        with tf.GradientTape() as tape:
            loss = LOSS(y[i:i + 1], model(x[i:i + 1], training=True))[0] * weights[i]
        grads = tape.gradient(loss, model.trainable_variables)
        per_example_grads.append([tf.convert_to_tensor(g).numpy() for g in grads])
    norms = np.array([np.sqrt(sum(np.sum(g.astype(np.float64) ** 2) for g in grads))
                      for grads in per_example_grads])
    factors = np.minimum(1.0, clip_norm / np.maximum(norms, 1e-30))
    sums = [sum(factors[i] * per_example_grads[i][j] for i in range(len(weights)))
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


def assert_matches(sums, norms, expected):
    expected_sums, expected_norms = expected
    assert_close(norms, expected_norms)
    for actual, wanted in zip(sums, expected_sums):
        assert_close(actual, wanted)


def clipped_sum_step(model, x, clip_norm, method):
    """The clipped sum traced as in model.fit: a tf.function whose batch size is unknown while tracing."""
    signature = [tf.TensorSpec([None, *x.shape[1:]], x.dtype), tf.TensorSpec([None], tf.int32)]
    return tf.function(lambda x, y: per_example.clipped_gradient_sum(
        model, LOSS, x, y, None, clip_norm, model.trainable_variables, method=method), input_signature=signature)


def time_distributed() -> tf.keras.Model:
    """Each example is 2 steps of 5 ids; Embedding and Dense see the steps folded into their rows."""
    inputs = tf.keras.Input(shape=(2, 5), dtype=tf.int32)
    hidden = tf.keras.layers.TimeDistributed(tf.keras.layers.Embedding(7, 4))(inputs)
    hidden = tf.keras.layers.TimeDistributed(tf.keras.layers.Dense(3, activation="tanh"))(hidden)
    hidden = tf.keras.layers.Reshape((2, 15))(hidden)
    hidden = tf.keras.layers.TimeDistributed(tf.keras.layers.Dense(3))(hidden)
    return tf.keras.Model(inputs, tf.keras.layers.GlobalAveragePooling1D()(hidden))


def time_distributed_data():
    rng = np.random.default_rng(4)
    return tf.constant(rng.integers(0, 7, (BATCH, 2, 5)), tf.int32), tf.constant(rng.integers(0, 3, BATCH), tf.int32)


@pytest.mark.parametrize("batch", [1, 2, BATCH])
def test_time_distributed_is_clipped_per_example_on_the_ghost_path(batch):
    tf.keras.utils.set_random_seed(0)
    model = time_distributed()
    x, y = time_distributed_data()
    x, y = x[:batch], y[:batch]
    clip_norm = 0.05
    expected = reference(model, x, y, np.ones(batch, np.float32), clip_norm)
    assert expected[1].min() > clip_norm  # Every example is clipped.
    step = clipped_sum_step(model, x, clip_norm, "ghost")
    sums, norms = step(x, y)
    assert_matches(sums, norms, expected)
    # Neighbour sensitivity: adding the last example to the others moves the clipped sum by exactly C.
    without = step(x[:-1], y[:-1])[0] if batch > 1 else [tf.zeros_like(v) for v in model.trainable_variables]
    distance = np.sqrt(sum(np.sum(np.square(np.float64(a) - np.float64(b))) for a, b in zip(sums, without)))
    assert distance == pytest.approx(clip_norm, rel=1e-4)


class TiedEmbedding(tf.keras.Model):
    """The embedding matrix is also the output layer (tied weights): its gradient has two parts."""

    def __init__(self):
        super().__init__()
        self.embedding = tf.keras.layers.Embedding(5, 4)
        self.hidden = tf.keras.layers.Dense(4, activation="tanh")

    def call(self, ids):
        hidden = self.hidden(tf.reduce_mean(self.embedding(ids), axis=1))
        return tf.matmul(hidden, self.embedding.embeddings, transpose_b=True)


class SharedKernel(tf.keras.Model):
    """Two Dense layers with one kernel: its per-example gradient is the sum of both layers' parts."""

    def __init__(self):
        super().__init__()
        self.first = tf.keras.layers.Dense(4, activation="tanh", use_bias=False)
        self.second = tf.keras.layers.Dense(4, use_bias=False)

    def build(self, input_shape):
        self.first.build(input_shape)
        self.second.kernel = self.first.kernel
        self.second.built = True
        super().build(input_shape)

    def call(self, inputs):
        return self.second(self.first(tf.reduce_mean(inputs, axis=1)))


class FoldedByHand(tf.keras.Model):
    """A Dense over the 5 steps of each example, folded into rows with tf.reshape (not TimeDistributed)."""

    def __init__(self):
        super().__init__()
        self.dense = tf.keras.layers.Dense(3)

    def call(self, inputs):
        rows = self.dense(tf.reshape(inputs, [-1, 4]))
        return tf.reduce_mean(tf.reshape(rows, [-1, 5, 3]), axis=1)


class FixedTable(tf.keras.Model):
    """A Dense applied to a table of BATCH rows that are not examples, broadcast onto the batch."""

    def __init__(self):
        super().__init__()
        self.table = tf.constant(np.random.default_rng(5).normal(size=(BATCH, 4)), tf.float32)
        self.keys = tf.keras.layers.Dense(3)
        self.out = tf.keras.layers.Dense(3)

    def call(self, inputs):
        return self.out(tf.reduce_mean(inputs, axis=1)) * tf.reduce_mean(self.keys(self.table), axis=0)


@pytest.mark.parametrize("build,reason", [
    (TiedEmbedding, "tied weights"),
    (SharedKernel, "shares a variable"),
    (FoldedByHand, "not have one row per example"),
    (FixedTable, "not have one row per example"),
])
def test_rows_that_are_not_examples_fall_back_to_the_vectorized_path(build, reason):
    tf.keras.utils.set_random_seed(0)
    model = build()
    rng = np.random.default_rng(6)
    if build is TiedEmbedding:
        x = tf.constant(rng.integers(0, 5, (BATCH, 3)), tf.int32)
    else:
        x = tf.constant(rng.normal(size=(BATCH, 5, 4)), tf.float32)
    y = tf.constant(rng.integers(0, 3, BATCH), tf.int32)
    model(x[:1])
    expected = reference(model, x, y, WEIGHTS, 0.1)
    # Eagerly (the batch size is known: BATCH, as many as the table's rows) and traced as in fit (unknown).
    assert_matches(*per_example.clipped_gradient_sum(
        model, LOSS, x, y, tf.constant(WEIGHTS), 0.1, model.trainable_variables), expected)
    step = tf.function(lambda x, y, w: per_example.clipped_gradient_sum(
        model, LOSS, x, y, w, 0.1, model.trainable_variables), input_signature=[
        tf.TensorSpec([None, *x.shape[1:]], x.dtype), tf.TensorSpec([None], tf.int32), tf.TensorSpec([None])])
    assert_matches(*step(x, y, tf.constant(WEIGHTS)), expected)
    with pytest.raises(ValueError, match=reason):
        per_example.clipped_gradient_sum(model, LOSS, x, y, None, 0.1, model.trainable_variables, method="ghost")


def test_row_guard_fails_at_run_time_also_under_xla():
    """Where the rows cannot be compared while tracing, a reshape to exactly the expected rows fails when run."""
    signature = [tf.TensorSpec([None, 3]), tf.TensorSpec([None, 3])]

    @tf.function(jit_compile=True, input_signature=signature)
    def guarded(batch, tapped):
        return per_example._Tapping(per_example._Rows.of_batch(batch), None).guard(tapped, "the tapped input")

    np.testing.assert_array_equal(guarded(tf.ones([2, 3]), tf.ones([2, 3])), np.ones([2, 3]))
    with pytest.raises(tf.errors.InvalidArgumentError):
        guarded(tf.ones([2, 3]), tf.ones([4, 3]))  # Two rows per example, e.g. a fold by hand.
