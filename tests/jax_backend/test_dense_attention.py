"""The rules of `keras_dyndp.rules.dense_attention` on JAX: AdditiveAttention and Attention (``use_scale=True``,
``score_mode="concat"``) are tapped and one DP step clips like the loop of single-example gradients (also traced by
``jax.jit`` alone); removing one example moves the clipped sum by min(||g_i||, C) <= C; a factor-0 example adds
nothing; the calls the rule cannot reproduce (dropout, masks, causal masks) keep their weights' vmap gradients."""

import pytest

jax = pytest.importorskip("jax")
keras = pytest.importorskip("keras")
if keras.backend.backend() != "jax":
    pytest.skip("Keras is not running on JAX (set KERAS_BACKEND=jax)", allow_module_level=True)

import attention_models  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import jax_brute_force as brute_force  # noqa: E402
import numpy as np  # noqa: E402

from keras_dyndp import schedules  # noqa: E402
from keras_dyndp.jax_backend import DynamicDPKerasSGD  # noqa: E402
from keras_dyndp.jax_backend import make_private  # noqa: E402
from keras_dyndp.jax_backend.per_example import taps  # noqa: E402
from keras_dyndp.rules import dense_attention  # noqa: E402

PN = 2.5  # the expected batch size p N: the update times -p N is the clipped sum
LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
pytestmark = [
    pytest.mark.filterwarnings("ignore::keras_dyndp.optimizer_base.DegenerateNoiseWarning"),  # noise 0: sums compared
    pytest.mark.filterwarnings("ignore::keras_dyndp.SamplingWarning"),  # the test's own fixed batches
]

LAYERS = attention_models.layers(keras)
UNCOVERED = attention_models.uncovered(keras)


def tapped(model, x) -> set:
    values = [[v.value for v in variables] for variables in (model.trainable_variables, model.non_trainable_variables)]
    return {type(layer).__name__ for layer, *_ in taps.tappable(model, *values, x).values()}


def private(model, clip_norm: float, steps: int = 1):
    """``make_private(model)`` compiled for noiseless steps at C = ``clip_norm``, SGD at learning rate 1, p N = 2.5."""
    model = make_private(model)
    schedule = schedules.DPSchedule(np.full(steps, clip_norm), np.zeros(steps), 0.5)
    optimizer = DynamicDPKerasSGD(
        schedule=schedule, allow_degenerate_noise=True, expected_batch_size=PN, learning_rate=1.0
    )
    model.compile(optimizer=optimizer, loss=LOSS)
    return model


def clipped_sum(model, x, y) -> list:
    """One step's clipped sum, from the update (times -p N); the variables put back after."""
    before = [np.asarray(v.value, np.float64) for v in model.trainable_variables]
    model.fit(brute_force.FixedBatches(x, y, len(x)), epochs=1, verbose=0)
    sums = [(old - np.asarray(v.value, np.float64)) * PN for old, v in zip(before, model.trainable_variables)]
    for variable, old in zip(model.trainable_variables, before):
        variable.assign(old.astype(np.float32))
    return sums


def assert_one_step_is_the_clipped_sum_of_the_loop(model, x, y, clip_norm):
    expected = brute_force.clipped_sum(model, LOSS, x, y, clip_norm)
    scale = max(np.max(np.abs(total)) for total in expected)  # the key bias's gradient is 0 (softmax ignores it)
    for actual, total in zip(clipped_sum(private(model, clip_norm), x, y), expected):
        np.testing.assert_allclose(actual, total, rtol=0, atol=1e-5 * scale)


@pytest.mark.parametrize("name", LAYERS)
def test_the_layer_is_tapped_and_one_step_clips_like_the_per_example_loop(name):
    model, layer = attention_models.model_with(keras, name)
    x, y = attention_models.data(5)
    assert type(layer).__name__ in tapped(model, x)
    assert {id(v) for v in dense_attention.variables(layer)} == {id(v) for v in layer.trainable_weights}
    assert_one_step_is_the_clipped_sum_of_the_loop(model, x, y, clip_norm=0.05)


def test_removing_one_example_moves_the_clipped_sum_by_its_clipped_norm():
    model, _ = attention_models.model_with(keras, "additive")
    x, y = attention_models.data(5)
    norms = [  # each example's gradient norm, from the loop without clipping
        np.sqrt(sum(np.sum(g**2) for g in brute_force.clipped_sum(model, LOSS, x[i : i + 1], y[i : i + 1], 1e9)))
        for i in range(len(x))
    ]
    clip_norm = float(np.median(norms))
    model = private(model, clip_norm, steps=len(x) + 1)
    sums = clipped_sum(model, x, y)
    for i in range(len(x)):
        keep = [j for j in range(len(x)) if j != i]
        without = clipped_sum(model, x[keep], y[keep])
        distance = np.sqrt(sum(np.sum((a - b) ** 2) for a, b in zip(sums, without)))
        assert distance == pytest.approx(min(norms[i], clip_norm), rel=1e-4)
        assert distance <= clip_norm * (1 + 1e-5)


def test_an_example_whose_factor_is_zero_adds_nothing():
    _, layer = attention_models.model_with(keras, "concat_scaled")
    rng = np.random.default_rng(2)
    query, value = (jnp.asarray(rng.normal(size=(3, 1, length, 3)), jnp.float32) for length in (4, 3))
    g = rng.normal(size=(3, 1, 4, 3)).astype(np.float32)
    g[1] = np.nan
    squared, sums = dense_attention.norms_and_sums(layer, [query, value], jnp.asarray(g))
    kept = np.array([0, 2])
    kept_squared, kept_sums = dense_attention.norms_and_sums(layer, [query[kept], value[kept]], jnp.asarray(g[kept]))
    for total, kept_total in zip(sums(jnp.asarray([0.5, 0.0, 2.0])), kept_sums(jnp.asarray([0.5, 2.0]))):
        np.testing.assert_allclose(total, kept_total, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(squared)[kept], kept_squared, rtol=1e-6)


def test_the_rule_traces_under_jit_alone():
    _, layer = attention_models.model_with(keras, "additive")
    rng = np.random.default_rng(5)
    a = [jnp.asarray(rng.normal(size=(2, 1, length, 3)), jnp.float32) for length in (4, 3)]
    g = jnp.asarray(rng.normal(size=(2, 1, 4, 3)), jnp.float32)

    def norms_and_sum(a, g):
        squared, sums = dense_attention.norms_and_sums(layer, a, g)
        return squared, sums(jnp.ones(2))[0]

    for actual, eager in zip(jax.jit(norms_and_sum)(a, g), norms_and_sum(a, g)):
        np.testing.assert_allclose(actual, eager, rtol=1e-6)


@pytest.mark.parametrize("name", UNCOVERED)
def test_a_call_the_rule_cannot_reproduce_keeps_its_weights_vmap_gradients(name):
    model = UNCOVERED[name]()
    x, y = attention_models.data(4, padding_mask=name == "padding_mask")
    names = tapped(model, x)
    assert "Dense" in names and not names & {"Attention", "AdditiveAttention"}
    if name != "dropout":  # dropout's masks are secret: no loop to compare with
        assert_one_step_is_the_clipped_sum_of_the_loop(model, x, y, clip_norm=0.05)
