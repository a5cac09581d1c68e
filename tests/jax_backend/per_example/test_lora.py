"""Tests for keras_dyndp.jax_backend.per_example.lora: the LoRA rules' per-example norms and clipped sums equal those of
the adapters' per-example gradients (never below them), an example whose factor is 0 adds nothing, and a made-private
LoRA model's steps apply the per-example loop's clipped sum (at each step's values), move by at most C when one example
leaves, and leave the frozen weights as they were."""

import pytest

jax = pytest.importorskip("jax")
keras = pytest.importorskip("keras")
if keras.backend.backend() != "jax":
    pytest.skip("Keras is not running on JAX (set KERAS_BACKEND=jax)", allow_module_level=True)

import jax.numpy as jnp  # noqa: E402
import jax_brute_force as brute_force  # noqa: E402
import numpy as np  # noqa: E402

from keras_dyndp import schedules  # noqa: E402
from keras_dyndp.jax_backend import DynamicDPKerasSGD  # noqa: E402
from keras_dyndp.jax_backend import make_private  # noqa: E402
from keras_dyndp.jax_backend.per_example import taps  # noqa: E402
from keras_dyndp.rules import registry  # noqa: E402

LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
L = keras.layers
LORA_CLASSES = (L.Dense, L.EinsumDense, L.Embedding)
pytestmark = [
    pytest.mark.filterwarnings(
        "ignore:model.fit received x of type FixedBatches:keras_dyndp.core.batch_sizes.SamplingWarning"
    ),
    pytest.mark.filterwarnings("ignore::keras_dyndp.optimizer_base.DegenerateNoiseWarning"),
]

LAYERS = [  # (layer, one example's rows and shape)
    (lambda: L.Dense(3), (1, 4)),  # one position
    (lambda: L.Dense(5, use_bias=False), (2, 3, 4)),  # 2 rows, 3 positions
    (lambda: L.Dense(300), (1, 40, 300)),  # A: G_i for the norms, then book-keeping
    (lambda: L.EinsumDense("abc,cde->abde", (5, 2, 3), bias_axes="de"), (1, 5, 4)),  # attention's query
    (lambda: L.EinsumDense("abcd,cde->abe", (5, 4)), (2, 5, 2, 3)),  # its output projection; 2 rows
    (lambda: L.EinsumDense("...b,bc->...c", 16), (1, 2, 16)),
    (lambda: L.Embedding(4, 3), (1, 6)),  # repeated ids
    (lambda: L.Embedding(9, 5), (1,)),  # one id
]


def _lora_layer(make_layer, shape, rng):
    layer = make_layer()
    layer.build(shape)
    layer.enable_lora(2, lora_alpha=3.0)
    for variable in layer.trainable_variables:
        variable.assign(rng.normal(size=variable.shape).astype("float32"))
    return layer


def _inputs(layer, shape, rng):
    if isinstance(layer, L.Embedding):
        return jnp.asarray(rng.integers(0, layer.input_dim, size=(5, *shape)), jnp.int32)
    return jnp.asarray(rng.normal(size=(5, *shape)) * 3 + 1, jnp.float32)


@pytest.mark.parametrize("make_layer, shape", LAYERS)
def test_norms_and_clipped_sums_equal_the_adapters_per_example_gradients(make_layer, shape):
    rng = np.random.default_rng(0)
    layer = _lora_layer(make_layer, shape, rng)
    rule = registry.registered()[type(layer)]
    assert rule.supports(layer)
    adapters = rule.variables(layer)
    assert all("lora" in v.path for v in adapters) and len(adapters) == 2
    covered = [[v is variable for v in layer.trainable_variables].index(True) for variable in adapters]
    values = [v.value for v in layer.trainable_variables]
    a = _inputs(layer, shape, rng)

    def loss(covered_values, a_i, g_i):
        trainable = list(values)
        for index, value in zip(covered, covered_values):
            trainable[index] = value
        return jnp.sum(layer.stateless_call(trainable, list(layer.non_trainable_variables), a_i)[0] * g_i)

    g = jnp.asarray(rng.normal(size=(5, *layer.compute_output_shape(shape))), jnp.float32)
    factors = jnp.asarray(rng.uniform(size=5), jnp.float32).at[2].set(0.0)
    grads = jax.vmap(jax.grad(loss), (None, 0, 0))([values[i] for i in covered], a, g)
    squared_norms = sum(jnp.sum(grad**2, axis=range(1, grad.ndim)) for grad in grads)
    squared, clipped_sums = rule.norms_and_sums(layer, a, g)
    ratio = np.asarray(squared, np.float64) / np.asarray(squared_norms, np.float64)
    assert np.all(ratio >= 1 - 1e-5) and np.all(ratio <= 1.01), ratio  # never below the exact norms
    sums = clipped_sums(factors)
    assert len(sums) == len(grads) == 2
    for total, grad in zip(sums, grads):
        expected = jnp.tensordot(factors, grad, 1)
        np.testing.assert_allclose(total, expected, 1e-5, 1e-5 * max(1.0, float(jnp.max(jnp.abs(expected)))))
    # An example whose values are not finite, factor 0: the sums are the others' exactly.
    _, nan_sums = rule.norms_and_sums(layer, a, g.at[2].set(jnp.nan))
    for total, with_nan in zip(sums, nan_sums(factors)):
        np.testing.assert_array_equal(np.asarray(with_nan), np.asarray(total))


def test_an_equation_whose_kernel_ends_in_an_input_letter_keeps_the_vmap_path():
    layer = L.EinsumDense("abc,dc->adb", (3, 5))
    layer.build((None, 5, 4))
    assert registry.registered()[L.EinsumDense].supports(layer)
    layer.enable_lora(2)
    assert not registry.registered()[L.EinsumDense].supports(layer)


def _transformer():
    """Embedding, a self-attention block, a Dense feed-forward, every Dense, EinsumDense and Embedding with LoRA
    (B random: Keras starts it at 0)."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((6,), dtype="int32")
    h = L.Embedding(11, 8)(inputs)
    h = L.LayerNormalization()(L.Add()([h, L.MultiHeadAttention(2, 4)(h, h)]))
    h = L.LayerNormalization()(L.Add()([h, L.Dense(8)(L.Dense(16, activation="relu")(h))]))
    model = keras.Model(inputs, L.Dense(3)(L.GlobalAveragePooling1D()(h)))
    rng = np.random.default_rng(3)
    for layer in model._flatten_layers():  # noqa: SLF001
        if type(layer) in LORA_CLASSES:
            layer.enable_lora(2, lora_alpha=4.0)
            b = layer.lora_embeddings_b if isinstance(layer, L.Embedding) else layer.lora_kernel_b
            b.assign(rng.normal(size=b.shape).astype("float32") * 0.5)
    return model


def _data(num_rows, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 11, (num_rows, 6)).astype("int32"), rng.integers(0, 3, num_rows).astype("int32")


def _compiled(model, clip_norms):
    model = make_private(model)
    clip_norms = np.asarray(clip_norms, float)
    optimizer = DynamicDPKerasSGD(
        schedule=schedules.DPSchedule(clip_norms, np.zeros_like(clip_norms), 0.5),
        allow_degenerate_noise=True,
        expected_batch_size=4.0,
        learning_rate=1.0,
    )
    model.compile(optimizer=optimizer, loss=LOSS)
    return model


def _weights(model):
    return [np.asarray(v.value, np.float64) for v in model.trainable_variables]


def test_each_step_applies_the_per_example_loops_clipped_sum_and_leaves_the_frozen_weights():
    """Three steps of one compiled step (the rules read each step's adapters), the LoRA layers tapped."""
    model = _compiled(_transformer(), [0.3, 1.0, 0.2])
    x, y = _data(12)
    values = [[v.value for v in variables] for variables in (model.trainable_variables, model.non_trainable_variables)]
    tapped = [layer for layer, *_ in taps.tappable(model, *values, x[:4]).values()]
    lora_layers = [layer for layer in model._flatten_layers() if type(layer) in LORA_CLASSES]  # noqa: SLF001
    assert len(lora_layers) == 8 and all(any(layer is t for t in tapped) for layer in lora_layers)
    frozen = [np.asarray(v.value) for v in model.non_trainable_variables]
    for step, clip_norm in enumerate([0.3, 1.0, 0.2]):
        batch = slice(4 * step, 4 * step + 4)
        before = _weights(model)
        expected = brute_force.clipped_sum(model, LOSS, x[batch], y[batch], clip_norm)
        model.fit(brute_force.FixedBatches(x[batch], y[batch], 4), epochs=1, verbose=0)
        for old, new, total in zip(before, _weights(model), expected):
            np.testing.assert_allclose(new, old - total / 4.0, rtol=1e-4, atol=1e-6)
    for value, variable in zip(frozen, model.non_trainable_variables):
        np.testing.assert_array_equal(np.asarray(variable.value), value)


def test_removing_one_example_moves_the_update_by_its_clipped_norm_at_most():
    """sigma = 0: the update times p N is the clipped sum; an example given weight 0 leaves it."""
    x, y = _data(4, seed=1)
    clip_norm = 0.05
    model = _compiled(_transformer(), [clip_norm] * 6)
    start = _weights(model)
    sums = []
    for removed in [None, 0, 1, 2, 3]:
        for variable, value in zip(model.trainable_variables, start):
            variable.assign(value.astype("float32"))
        weights = np.ones(4, "float32")
        if removed is not None:
            weights[removed] = 0.0
        model.fit(brute_force.FixedBatches(x, y, 4, weights), epochs=1, verbose=0)
        sums.append(np.concatenate([(old - new).ravel() * 4.0 for old, new in zip(start, _weights(model))]))
    norms = [np.linalg.norm(sums[0] - without) for without in sums[1:]]
    assert max(norms) <= clip_norm * (1 + 1e-4)
    assert min(norms) > 0.5 * clip_norm  # the examples are clipped: each moves it by about C
