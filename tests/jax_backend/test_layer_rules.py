"""The shared rule contract on JAX (`keras_dyndp.rules.layer_rules`): the keras.io Transformer example's layers and a
learned position embedding, each registered in one line, are tapped and clip like the per-example loop; a rule's
sums add nothing from an example whose factor is 0."""

import pytest

jax = pytest.importorskip("jax")
keras = pytest.importorskip("keras")
if keras.backend.backend() != "jax":
    pytest.skip("Keras is not running on JAX (set KERAS_BACKEND=jax)", allow_module_level=True)

import jax.numpy as jnp  # noqa: E402
import jax_brute_force as brute_force  # noqa: E402
import numpy as np  # noqa: E402
import transformer_layers  # noqa: E402

import keras_dyndp  # noqa: E402
from keras_dyndp import schedules  # noqa: E402
from keras_dyndp.jax_backend import DynamicDPKerasSGD  # noqa: E402
from keras_dyndp.jax_backend import make_private  # noqa: E402
from keras_dyndp.jax_backend.per_example import taps  # noqa: E402
from keras_dyndp.rules import layer_rules  # noqa: E402
from keras_dyndp.rules import registry  # noqa: E402

LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")


def _tapped(model, x):
    values = [[v.value for v in variables] for variables in (model.trainable_variables, model.non_trainable_variables)]
    return [layer for layer, *_ in taps.tappable(model, *values, x).values()]


def _step_update(model, x, y, clip_norm, method="ghost", loss=LOSS):
    """The change of each trainable variable in one noiseless step of ``make_private(model, method)`` on (x, y),
    times -p N (= -len(x) / 2): the clipped sum, float64."""
    model = make_private(model, method)
    schedule = schedules.DPSchedule(np.full(1, clip_norm), np.zeros(1), 0.5)
    optimizer = DynamicDPKerasSGD(
        schedule=schedule, allow_degenerate_noise=True, expected_batch_size=len(x) / 2, learning_rate=1.0
    )
    model.compile(optimizer=optimizer, loss=loss)
    before = [np.asarray(v.value, np.float64) for v in model.trainable_variables]
    model.fit(brute_force.FixedBatches(x, y, len(x)), epochs=1, verbose=0)
    return [(old - np.asarray(v.value, np.float64)) * len(x) / 2 for old, v in zip(before, model.trainable_variables)]


def _assert_one_step_is_the_clipped_sum_of_the_loop(model, x, y, clip_norm):
    expected = brute_force.clipped_sum(model, LOSS, x, y, clip_norm)
    scale = max(np.max(np.abs(total)) for total in expected)  # attention's key bias: a gradient of exactly 0
    for actual, total in zip(_step_update(model, x, y, clip_norm), expected):
        np.testing.assert_allclose(actual, total, rtol=0, atol=1e-5 * scale)


@pytest.mark.filterwarnings("ignore::keras_dyndp.optimizer_base.DegenerateNoiseWarning")  # noise 0: sums compared
@pytest.mark.filterwarnings("ignore::keras_dyndp.SamplingWarning")  # the test's own fixed batches
def test_the_documented_rule_is_tapped_and_steps_as_the_vmap_path():
    scale_shift = transformer_layers.documented_rule_example()["ScaleShift"]
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(6, 3, 4)).astype("float32"), rng.normal(size=(6, 2)).astype("float32")
    scale = rng.normal(size=4).astype("float32")  # not ones: the rule must not assume them
    updates = {}
    for method in ("ghost", "vectorized"):
        keras.utils.set_random_seed(5)
        inputs = keras.Input((3, 4))
        layer = scale_shift()
        model = keras.Model(inputs, keras.layers.Dense(2)(keras.layers.Flatten()(layer(inputs))))
        layer.scale.assign(scale)
        if method == "ghost":
            assert layer in _tapped(model, x)
        updates[method] = _step_update(model, x, y, 0.3, method, keras.losses.MeanSquaredError(reduction="none"))
    for ghost_update, vmap_update in zip(updates["ghost"], updates["vectorized"]):
        np.testing.assert_allclose(ghost_update, vmap_update, rtol=1e-5, atol=1e-7)


@pytest.mark.filterwarnings("ignore::keras_dyndp.optimizer_base.DegenerateNoiseWarning")  # noise 0: sums compared
@pytest.mark.filterwarnings("ignore::keras_dyndp.SamplingWarning")  # the test's own fixed batches
def test_a_separable_convolution_is_tapped_and_steps_as_the_vmap_path():
    rng = np.random.default_rng(6)
    x, y = rng.normal(size=(6, 7, 7, 3)).astype("float32"), rng.integers(0, 3, size=6).astype("int32")
    updates = {}
    for method in ("ghost", "vectorized"):
        keras.utils.set_random_seed(5)
        inputs = keras.Input((7, 7, 3))
        layer = keras.layers.SeparableConv2D(4, 3, depth_multiplier=2, strides=2, activation="relu")
        outputs = keras.layers.Dense(3)(keras.layers.Flatten()(layer(inputs)))
        model = keras.Model(inputs, outputs)
        if method == "ghost":
            assert layer in _tapped(model, x)
        updates[method] = _step_update(model, x, y, 0.1, method)
    for ghost_update, vmap_update in zip(updates["ghost"], updates["vectorized"]):
        np.testing.assert_allclose(ghost_update, vmap_update, rtol=1e-5, atol=1e-6)


@pytest.mark.filterwarnings("ignore::keras_dyndp.optimizer_base.DegenerateNoiseWarning")  # noise 0: sums compared
@pytest.mark.filterwarnings("ignore::keras_dyndp.SamplingWarning")  # the test's own fixed batches
@pytest.mark.parametrize("learned_positions", [False, True])
def test_the_transformer_example_is_tapped_and_clips_like_the_per_example_loop(learned_positions):
    classes = transformer_layers.layers(keras, keras.ops.arange)
    transformer_layers.register(keras_dyndp, classes)
    keras.utils.set_random_seed(0)
    model = transformer_layers.classifier(keras, classes, learned_positions=learned_positions)
    rng = np.random.default_rng(3)
    x, y = rng.integers(0, 12, size=(6, 5)).astype("int32"), rng.integers(0, 3, size=6).astype("int32")
    tapped = _tapped(model, x)
    assert {type(layer).__name__ for layer in tapped} >= {"TokenAndPositionEmbedding", "EinsumDense", "Dense"}
    assert ("PositionEmbedding" in {type(layer).__name__ for layer in tapped}) == learned_positions
    assert all(type(layer) is not keras.layers.Embedding for layer in tapped)  # inside the composite's rule
    _assert_one_step_is_the_clipped_sum_of_the_loop(model, x, y, clip_norm=0.05)


@pytest.mark.filterwarnings("ignore::keras_dyndp.optimizer_base.DegenerateNoiseWarning")  # noise 0: sums compared
@pytest.mark.filterwarnings("ignore::keras_dyndp.SamplingWarning")  # the test's own fixed batches
def test_the_token_table_inside_a_composite_rule_takes_negative_ids_as_the_lookup_reads_them():
    """Keras's lookup (jnp.take) reads -1 and -V as rows V - 1 and 0: the token Embedding's rule, applied through the
    composite's, clips the gradient of those rows with their example (one example has -1 beside V - 1: one row)."""
    classes = transformer_layers.layers(keras, keras.ops.arange)
    transformer_layers.register(keras_dyndp, classes)
    keras.utils.set_random_seed(0)
    model = transformer_layers.classifier(keras, classes)
    rng = np.random.default_rng(3)
    x, y = rng.integers(0, 12, size=(6, 5)).astype("int32"), rng.integers(0, 3, size=6).astype("int32")
    x[0, :2], x[3, 1], x[4, 4] = [-1, 11], -12, -5
    _assert_one_step_is_the_clipped_sum_of_the_loop(model, x, y, clip_norm=0.05)


def test_a_rules_sums_add_nothing_from_an_example_whose_factor_is_zero():
    token_and_position, *_ = transformer_layers.layers(keras, keras.ops.arange)
    layer = token_and_position(6, 7, 2)
    layer(np.zeros((1, 4), "int32"))
    rule = layer_rules.token_and_position_embedding()
    ids = jnp.asarray([[[1, 1, 2, 6]], [[0, 3, 3, 3]], [[5, 5, 5, 5]]])
    g = np.random.default_rng(0).normal(size=(3, 1, 4, 2)).astype(np.float32)
    g[1] = np.nan
    squared, sums = rule["norms_and_sums"](layer, ids, jnp.asarray(g))
    tokens, positions = sums(jnp.asarray([0.5, 0.0, 2.0]))
    expected = np.zeros((7, 2))
    np.add.at(expected, ids[0, 0], 0.5 * g[0, 0])
    np.add.at(expected, ids[2, 0], 2.0 * g[2, 0])
    np.testing.assert_allclose(tokens, expected, rtol=1e-6)
    np.testing.assert_allclose(positions[:4], 0.5 * g[0, 0] + 2.0 * g[2, 0], rtol=1e-6)
    assert np.all(np.asarray(positions[4:]) == 0)
    exact = [np.sum(np.square(np.asarray([g[i, 0][ids[i, 0] == t].sum(0) for t in range(7)]))) for i in (0, 2)]
    exact = [e + np.sum(g[i] ** 2) for e, i in zip(exact, (0, 2))]
    # The embedding rule takes the norm of exactly the rows it sums (no Gram to cancel): within float32's rounding of
    # the float64 norm, as any float32 clipping path is, never below it by more.
    assert np.all(np.asarray(squared)[[0, 2]] >= np.asarray(exact) * (1 - 2.0**-20))


class _Block(keras.layers.Layer):
    """A subclassed block nobody declared: a gated residual Dense, a LayerNormalization of the centred sum, and a
    scale of its own (which keeps the vmap path)."""

    def __init__(self, reads_kernel=False, **kwargs):
        super().__init__(**kwargs)
        self.dense = keras.layers.Dense(4, activation="tanh")
        self.norm = keras.layers.LayerNormalization()
        self.reads_kernel = reads_kernel

    def build(self, input_shape):
        self.scale = self.add_weight(shape=(4,), initializer="ones")

    def call(self, inputs):
        h = inputs + self.dense(inputs) * self.scale
        if self.reads_kernel:  # a second use of the kernel, outside the Dense's call: the tap would miss its gradient
            h = h + keras.ops.matmul(inputs, self.dense.kernel)
        return self.norm(h - keras.ops.mean(h, axis=-1, keepdims=True))


class _Transformed(keras.layers.Layer):
    """Its Dense called once in Python inside a JAX transformation of its own: a scan over the positions (run T
    times), a vmap over them, or a checkpoint."""

    def __init__(self, kind, **kwargs):
        super().__init__(**kwargs)
        self.dense = keras.layers.Dense(4)
        self.kind = kind

    def call(self, inputs):
        if self.kind == "checkpoint":
            return jax.checkpoint(self.dense)(inputs)
        by_position = keras.ops.transpose(inputs, (1, 0, 2))
        if self.kind == "vmap":
            return keras.ops.transpose(keras.ops.vectorized_map(self.dense, by_position), (1, 0, 2))

        def step(carry, h_t):
            carry = keras.ops.tanh(self.dense(h_t) + carry)
            return carry, carry

        return keras.ops.scan(step, keras.ops.zeros_like(inputs[:, 0]), by_position)[0]


def _with_block(block):
    keras.utils.set_random_seed(4)
    inputs = keras.Input((3, 4))
    h = block(keras.layers.Dense(4)(inputs))
    return keras.Model(inputs, keras.layers.Dense(3)(keras.layers.Flatten()(h)))


def _sequence_batch():
    rng = np.random.default_rng(7)
    return rng.normal(size=(6, 3, 4)).astype("float32"), rng.integers(0, 3, 6).astype("int32")


@pytest.mark.filterwarnings("ignore::keras_dyndp.optimizer_base.DegenerateNoiseWarning")  # noise 0: sums compared
@pytest.mark.filterwarnings("ignore::keras_dyndp.SamplingWarning")  # the test's own fixed batches
def test_the_sublayers_of_an_undeclared_block_are_tapped_and_clip_as_the_per_example_loop():
    """The forward pass runs one example at a time: a subclassed layer's own code cannot mix examples, so its ruled
    sublayers are tapped without a declaration; its own weight keeps the vmap path."""
    x, y = _sequence_batch()
    block = _Block()
    model = _with_block(block)
    model(x[:1])
    assert not registry.acts_per_example(block)
    tapped = _tapped(model, x)
    assert block.dense in tapped and block.norm in tapped and len(tapped) == 4
    _assert_one_step_is_the_clipped_sum_of_the_loop(model, x, y, clip_norm=0.3)


@pytest.mark.filterwarnings("ignore::keras_dyndp.optimizer_base.DegenerateNoiseWarning")
@pytest.mark.filterwarnings("ignore::keras_dyndp.SamplingWarning")
def test_a_kernel_the_block_reads_outside_its_layers_call_keeps_the_vmap_path():
    x, y = _sequence_batch()
    block = _Block(reads_kernel=True)
    model = _with_block(block)
    model(x[:1])
    tapped = _tapped(model, x)
    assert block.dense not in tapped and block.norm in tapped
    _assert_one_step_is_the_clipped_sum_of_the_loop(model, x, y, clip_norm=0.3)


@pytest.mark.filterwarnings("ignore::keras_dyndp.optimizer_base.DegenerateNoiseWarning")
@pytest.mark.filterwarnings("ignore::keras_dyndp.SamplingWarning")
@pytest.mark.parametrize("kind", ["scan", "vmap", "checkpoint"])
def test_a_layer_called_inside_a_transformation_of_the_models_own_keeps_the_vmap_path(kind):
    """Its input, recorded inside the transformation, escapes it (the probe's trace holds it as a constant); tapped,
    the step would fail or miss the other runs' gradients."""
    x, y = _sequence_batch()
    transformed = _Transformed(kind)
    model = _with_block(transformed)
    model(x[:1])
    tapped = _tapped(model, x)
    assert transformed.dense not in tapped and len(tapped) == 2  # the functional model's own Dense layers
    _assert_one_step_is_the_clipped_sum_of_the_loop(model, x, y, clip_norm=0.3)


def test_per_example_declarations_refuse_a_rules_parts():
    class Wiring(keras.layers.Layer):
        pass

    keras_dyndp.register_per_example_layer(Wiring)
    assert registry.acts_per_example(Wiring())
    with pytest.raises(TypeError, match="leave out norms_and_sums"):
        keras_dyndp.register_layer_rule(Wiring, per_example=True, norms_and_sums=lambda layer, a, g: None)
