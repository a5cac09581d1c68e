"""Tests for keras_dyndp.jax_backend.per_example.rules: each rule's per-example norms and clipped sums equal those of
the per-example gradients of the variables it covers (one jax.grad of the layer's call per example), in each
`ghost_cost` form."""

import pytest

jax = pytest.importorskip("jax")
keras = pytest.importorskip("keras")
if keras.backend.backend() != "jax":
    pytest.skip("Keras is not running on JAX (set KERAS_BACKEND=jax)", allow_module_level=True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from keras_dyndp.rules import registry  # noqa: E402

LAYERS = [  # (layer, one example's rows and shape)
    (lambda: keras.layers.Dense(3), (1, 4)),  # one position
    (lambda: keras.layers.Dense(16), (1, 2, 16)),  # T^2 (p + d) < p d: Gram
    (lambda: keras.layers.Dense(3), (1, 2, 4)),  # materialised
    (lambda: keras.layers.Dense(2), (3, 3, 3)),  # materialised; 3 rows (a model that tiles the example's row)
    (lambda: keras.layers.Conv1D(3, 3, dilation_rate=2, padding="same"), (1, 11, 2)),
    (lambda: keras.layers.Conv2D(6, 3, strides=2), (2, 7, 7, 4)),  # T = 2 * 9: materialised
    (lambda: keras.layers.Conv2D(32, 3, strides=2), (1, 5, 5, 16)),  # T = 4, p = 144, d = 32: Gram
    (lambda: keras.layers.Conv2D(300, 1), (1, 2, 2, 300)),  # p d > ghost_cost.MAX_MATERIALISED: Gram
    (lambda: keras.layers.Conv2D(128, 3, padding="same"), (1, 12, 12, 128)),  # G_i for the norms, then book-keeping
    (lambda: keras.layers.Dense(300), (1, 160, 300)),  # the same
    (lambda: keras.layers.Conv2D(2, 2, padding="same"), (1, 6, 5, 1)),  # T = 30: materialised
    (lambda: keras.layers.Conv2D(8, 3, padding="same"), (2, 20, 20, 16)),  # materialised, patches > cap: per offset
    (lambda: keras.layers.Conv2D(3, (2, 4), strides=(2, 3), padding="same"), (1, 9, 10, 2)),  # uneven padding
    (lambda: keras.layers.Conv1D(5, 4, strides=3), (1, 13, 3)),
    (lambda: keras.layers.Conv2D(512, 3, padding="same"), (1, 6, 6, 256)),  # Gram, patches > cap: per offset
    (lambda: keras.layers.Conv1D(2, 2), (1, 2, 40_000)),  # one position, patches > cap: per offset
    (lambda: keras.layers.DepthwiseConv2D(3, depth_multiplier=2, strides=2, padding="same"), (2, 7, 7, 3)),
    (lambda: keras.layers.SeparableConv2D(4, 3, depth_multiplier=2, strides=2, padding="same"), (2, 7, 7, 3)),
    (lambda: keras.layers.SeparableConv2D(64, 3, use_bias=False), (1, 4, 4, 64)),  # pointwise: T = 4, Gram
    (lambda: keras.layers.SeparableConv2D(3, (2, 3), dilation_rate=2, padding="same"), (1, 9, 8, 2)),
    (lambda: keras.layers.LayerNormalization(), (2, 3, 4)),
    (lambda: keras.layers.LayerNormalization(axis=[1, 3], center=False), (1, 3, 2, 4)),
    (lambda: keras.layers.LayerNormalization(axis=[-1, 1]), (1, 3, 2, 4)),  # gamma [4, 3] on axes (1, 3)
    (lambda: keras.layers.GroupNormalization(2, epsilon=0.1), (2, 5, 5, 6)),
    (lambda: keras.layers.GroupNormalization(-1, axis=1), (1, 4, 3)),  # channels first, one group per channel
    (lambda: keras.layers.RMSNormalization(epsilon=0.1), (2, 3, 4)),
    (lambda: keras.layers.RMSNormalization(axis=[1, 2]), (1, 3, 4)),  # scale [3, 4] over positions and features
    (lambda: keras.layers.EinsumDense("abc,cd->abd", (5, 3), bias_axes="d"), (1, 5, 4)),  # materialised
    (lambda: keras.layers.EinsumDense("abc,cde->abde", (5, 2, 3)), (1, 5, 4)),  # attention's query projection
    (lambda: keras.layers.EinsumDense("abcd,cde->abe", (5, 4)), (2, 5, 2, 3)),  # its output projection; 2 rows
    (lambda: keras.layers.EinsumDense("abc,dc->adb", (3, 5)), (1, 5, 4)),  # kernel and output axes reordered
    (lambda: keras.layers.EinsumDense("ab,bc->ac", 3), (1, 4)),  # one position
    (lambda: keras.layers.EinsumDense("...b,bc->...c", 16), (1, 2, 16)),  # Gram
]


@pytest.mark.parametrize("make_layer, shape", LAYERS)
def test_norms_and_clipped_sums_equal_the_per_example_gradients(make_layer, shape):
    rng = np.random.default_rng(0)
    layer = make_layer()
    layer.build(shape)
    rule = registry.registered()[type(layer)]
    covered = [[v is variable for v in layer.trainable_variables].index(True) for variable in rule.variables(layer)]
    values = [jnp.asarray(rng.normal(size=v.shape), jnp.float32) for v in layer.trainable_variables]
    for variable, value in zip(layer.trainable_variables, values):  # a rule may read them (SeparableConv2D's)
        variable.assign(value)
    a = jnp.asarray(rng.normal(size=(5, *shape)) * 3 + 1, jnp.float32)

    def loss(covered_values, a_i, g_i):
        trainable = list(values)
        for index, value in zip(covered, covered_values):
            trainable[index] = value
        return jnp.sum(layer.stateless_call(trainable, [], a_i)[0] * g_i)

    g = jnp.asarray(rng.normal(size=(5, *layer.compute_output_shape(shape))), jnp.float32)
    factors = jnp.asarray(rng.uniform(size=5), jnp.float32)
    with jax.default_matmul_precision("highest"):
        grads = jax.vmap(jax.grad(loss), (None, 0, 0))([values[i] for i in covered], a, g)
        squared_norms = sum(jnp.sum(grad**2, axis=range(1, grad.ndim)) for grad in grads)
        squared, clipped_sums = rule.norms_and_sums(layer, a, g)
        # Never below the exact norms; above them by float32's rounding bound (ghost_cost: <1% on these shapes).
        ratio = np.asarray(squared, np.float64) / np.asarray(squared_norms, np.float64)
        assert np.all(ratio >= 1 - 1e-5) and np.all(ratio <= 1.01), ratio
        sums = clipped_sums(factors)
        assert len(sums) == len(grads) == len(covered) > 0
        for total, grad in zip(sums, grads):
            expected = jnp.tensordot(factors, grad, 1)  # float32 sums over T positions: absolute error ~ its scale
            np.testing.assert_allclose(total, expected, 1e-5, 1e-5 * max(1.0, float(jnp.max(jnp.abs(expected)))))


def test_a_separable_convolutions_example_whose_factor_is_zero_adds_nothing_even_if_not_finite():
    layer = keras.layers.SeparableConv2D(4, 3, depth_multiplier=2, padding="same")
    layer.build((None, 6, 6, 3))
    rng = np.random.default_rng(4)
    a = jnp.asarray(rng.normal(size=(4, 1, 6, 6, 3)), jnp.float32)
    g = jnp.asarray(rng.normal(size=(4, 1, 6, 6, 4)), jnp.float32)
    factors = jnp.asarray([0.5, 0.0, 1.0, 2.0], jnp.float32)
    rule = registry.registered()[keras.layers.SeparableConv2D]
    _, sums = rule.norms_and_sums(layer, a, g)
    squared, nan_sums = rule.norms_and_sums(layer, a.at[1, 0, 2].set(jnp.inf), g.at[1].set(jnp.nan))
    assert not np.isfinite(squared[1]) and np.all(np.isfinite(np.asarray(squared)[[0, 2, 3]]))
    for total, with_nan in zip(sums(factors), nan_sums(factors)):
        np.testing.assert_array_equal(np.asarray(with_nan), np.asarray(total))


@pytest.mark.parametrize("lowest_id", [0, -6])
def test_embedding_norms_and_clipped_sum_equal_the_dense_per_example_gradients(lowest_id):
    """Also with negative ids, which Keras's lookup (jnp.take) reads as row N + id: -1 and 5 are one row (counted as
    two, one example moved the sum by 1.41 C)."""
    rng = np.random.default_rng(0)
    ids = rng.integers(lowest_id, 6, size=(5, 9))  # 9 tokens from 6 ids: repeats in every row
    ids[:, :2] = [-1 if lowest_id else 0, 5]  # one row under two names where ids may be negative
    deltas = rng.normal(size=(5, 9, 3))
    factors = rng.uniform(size=5)
    dense = np.zeros((5, 6, 3))
    for example in range(5):
        np.add.at(dense[example], ids[example] % 6, deltas[example])
    rule = registry.registered()[keras.layers.Embedding]
    ids, deltas = jnp.asarray(ids), jnp.asarray(deltas, "float32")
    layer = keras.layers.Embedding(6, 3)
    layer.build()
    squared, clipped_sums = rule.norms_and_sums(layer, ids, deltas)
    ratio = np.asarray(squared, np.float64) / np.sum(dense**2, axis=(1, 2))  # an upper bound: float32 rounding
    assert np.all(ratio >= 1 - 1e-6) and np.all(ratio <= 1 + 1e-4), ratio
    (sums,) = clipped_sums(jnp.asarray(factors, "float32"))
    np.testing.assert_allclose(sums, np.tensordot(factors, dense, axes=1), rtol=1e-5, atol=1e-6)


@pytest.mark.filterwarnings("ignore::keras_dyndp.optimizer_base.DegenerateNoiseWarning")  # noise 0: sums compared
@pytest.mark.filterwarnings("ignore::keras_dyndp.SamplingWarning")  # the test's own fixed batches
def test_the_documented_custom_rule_clips_as_the_per_example_loop():
    import jax_brute_force as brute_force  # pylint: disable=import-outside-toplevel  (tests/jax_backend)
    import transformer_layers  # pylint: disable=import-outside-toplevel  (tests/)

    from keras_dyndp import schedules  # pylint: disable=import-outside-toplevel
    from keras_dyndp.jax_backend import DynamicDPKerasSGD  # pylint: disable=import-outside-toplevel
    from keras_dyndp.jax_backend import make_private  # pylint: disable=import-outside-toplevel
    from keras_dyndp.jax_backend.per_example import taps  # pylint: disable=import-outside-toplevel

    scale_shift = transformer_layers.documented_rule_example()["ScaleShift"]
    keras.utils.set_random_seed(3)
    layer = scale_shift()
    inputs = keras.Input((3, 4))
    outputs = keras.layers.Dense(2)(keras.layers.Flatten()(layer(keras.layers.Dense(4)(inputs))))
    model = make_private(keras.Model(inputs, outputs), "ghost")
    loss = keras.losses.MeanSquaredError(reduction="none")
    schedule = schedules.DPSchedule(np.full(1, 0.3), np.zeros(1), 0.5)
    model.compile(
        optimizer=DynamicDPKerasSGD(
            schedule=schedule, allow_degenerate_noise=True, expected_batch_size=3.0, learning_rate=1.0
        ),
        loss=loss,
    )
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(6, 3, 4)).astype("float32"), rng.normal(size=(6, 2)).astype("float32")
    layer.scale.assign(rng.normal(size=4).astype("float32"))  # not ones: the rule's gradient must not assume them
    values = [[v.value for v in variables] for variables in (model.trainable_variables, model.non_trainable_variables)]
    assert layer in [tapped for tapped, *_ in taps.tappable(model, *values, x).values()]
    before = [np.asarray(v.value, np.float64) for v in model.trainable_variables]
    with jax.default_matmul_precision("highest"):
        expected = brute_force.clipped_sum(model, loss, x, y, 0.3)
        model.fit(brute_force.FixedBatches(x, y, 6), epochs=1, verbose=0)
    for old, variable, total in zip(before, model.trainable_variables, expected):
        np.testing.assert_allclose(np.asarray(variable.value), old - total / 3.0, rtol=1e-5, atol=1e-7)


def test_register_layer_rule_refuses_what_is_not_a_rule():
    parts = dict(variables=lambda layer: [], norms_and_sums=lambda layer, a, g: (a, lambda f: []))
    with pytest.raises(TypeError, match="`layer_class` must be a Keras layer class"):
        registry.register_layer_rule(object, **parts)
    with pytest.raises(TypeError, match="`norms_and_sums` must be callable"):
        registry.register_layer_rule(keras.layers.Dense, **{**parts, "norms_and_sums": None})
    with pytest.raises(TypeError, match="`supports` must be callable"):
        registry.register_layer_rule(keras.layers.Dense, **parts, supports=True)
    assert registry.registered()[keras.layers.Dense].variables is not parts["variables"]  # nothing registered


def test_keras_dyndp_register_layer_rule_is_the_backends():
    import keras_dyndp  # pylint: disable=import-outside-toplevel

    assert keras_dyndp.register_layer_rule is registry.register_layer_rule
    assert keras_dyndp.LayerRule is registry.LayerRule


@pytest.mark.parametrize("shape", [(1, 20, 20, 16), (1, 5, 5, 16)])  # one kernel offset at a time; whole patches
def test_bfloat16_taps_give_float32_norms_and_sums_of_their_values(shape):
    """Under mixed_bfloat16 the taps are bfloat16: the rule computes in float32 from their exact values."""
    rng = np.random.default_rng(1)
    layer = keras.layers.Conv2D(8, 3, padding="same")
    layer.build(shape)
    rule = registry.registered()[keras.layers.Conv2D]
    a = jnp.asarray(rng.normal(size=(3, *shape)), jnp.bfloat16)
    g = jnp.asarray(rng.normal(size=(3, *layer.compute_output_shape(shape))), jnp.bfloat16)
    factors = jnp.asarray(rng.uniform(size=3), jnp.float32)
    with jax.default_matmul_precision("highest"):
        squared, sums = rule.norms_and_sums(layer, a, g)
        expected, expected_sums = rule.norms_and_sums(layer, a.astype(jnp.float32), g.astype(jnp.float32))
        assert squared.dtype == jnp.float32 and sums(factors)[0].dtype == jnp.float32
        np.testing.assert_allclose(squared, expected, 1e-6)
        np.testing.assert_allclose(sums(factors)[0], expected_sums(factors)[0], 1e-6, 1e-6)


@pytest.mark.filterwarnings("ignore::keras_dyndp.optimizer_base.DegenerateNoiseWarning")  # noise 0: sums compared
@pytest.mark.filterwarnings("ignore::keras_dyndp.SamplingWarning")  # the test's own fixed batches
def test_a_transformers_attention_projections_are_tapped_and_clip_as_the_per_example_loop():
    """MultiHeadAttention's four EinsumDense projections, the feed-forward Dense and LayerNormalization take their
    rules; the step equals the per-example loop (rtol 1e-5 at full matmul precision)."""
    import jax_brute_force as brute_force  # pylint: disable=import-outside-toplevel  (tests/jax_backend)

    from keras_dyndp import schedules  # pylint: disable=import-outside-toplevel
    from keras_dyndp.jax_backend import DynamicDPKerasSGD  # pylint: disable=import-outside-toplevel
    from keras_dyndp.jax_backend import make_private  # pylint: disable=import-outside-toplevel
    from keras_dyndp.jax_backend.per_example import taps  # pylint: disable=import-outside-toplevel

    keras.utils.set_random_seed(4)
    layers = keras.layers
    inputs = keras.Input((6,), dtype="int32")
    h = layers.Embedding(11, 8)(inputs)
    h = layers.LayerNormalization()(layers.Add()([h, layers.MultiHeadAttention(2, 4)(h, h)]))
    h = layers.Add()([h, layers.Dense(8)(layers.Dense(16, activation="relu")(h))])
    model = make_private(keras.Model(inputs, layers.Dense(3)(layers.GlobalAveragePooling1D()(h))))
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    schedule = schedules.DPSchedule(np.full(1, 0.05), np.zeros(1), 0.5)
    model.compile(
        optimizer=DynamicDPKerasSGD(
            schedule=schedule, allow_degenerate_noise=True, expected_batch_size=3.0, learning_rate=1.0
        ),
        loss=loss,
    )
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 11, (6, 6)).astype("int32"), rng.integers(0, 3, 6).astype("int32")
    values = [[v.value for v in variables] for variables in (model.trainable_variables, model.non_trainable_variables)]
    tapped = sorted(type(layer).__name__ for layer, *_ in taps.tappable(model, *values, x).values())
    assert tapped == ["Dense"] * 3 + ["EinsumDense"] * 4 + ["Embedding", "LayerNormalization"]
    before = [np.asarray(v.value, np.float64) for v in model.trainable_variables]
    with jax.default_matmul_precision("highest"):
        expected = brute_force.clipped_sum(model, loss, x, y, 0.05)
        model.fit(brute_force.FixedBatches(x, y, 6), epochs=1, verbose=0)
    scale = max(np.max(np.abs(total)) for total in expected)  # the key bias's gradient is 0 (softmax ignores it)
    for old, variable, total in zip(before, model.trainable_variables, expected):
        np.testing.assert_allclose(np.asarray(variable.value), old - total / 3.0, rtol=1e-5, atol=1e-6 * scale)
