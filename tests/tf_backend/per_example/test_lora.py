"""The LoRA ghost rules (Keras 3's ``enable_lora`` on Dense, EinsumDense, Embedding; also MultiHeadAttention's
projections) against a loop of single-example gradients: the clipped sum and norms of the ghost path (eagerly and
traced with an unknown batch size); with sigma = 0, removing one example moves the clipped sum by min(||g_i||, C);
an example whose factor is 0 adds nothing; a DP step leaves the frozen kernels as they were."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from brute_force import LOSS
from brute_force import assert_close
from brute_force import assert_each_removal_moves_by_clipped_norm
from brute_force import assert_ghost_matches_the_brute_force
from brute_force import clip_case
from brute_force import traced

from keras_dyndp.tf_backend import keras_compat

if keras_compat.KERAS_MAJOR_VERSION == 2:
    pytest.skip("LoRA is a Keras 3 feature", allow_module_level=True)

from keras_dyndp import schedules  # noqa: E402
from keras_dyndp.core.batch_sizes import SamplingWarning  # noqa: E402
from keras_dyndp.rules import registry  # noqa: E402
from keras_dyndp.tf_backend import per_example  # noqa: E402
from keras_dyndp.tf_backend import train_step  # noqa: E402
from keras_dyndp.tf_backend.keras_compat import keras  # noqa: E402
from keras_dyndp.tf_backend.optimizer import DynamicDPKerasSGD  # noqa: E402

pytestmark = pytest.mark.xdist_group("tf_lora")  # its module fixtures run once (tests/conftest.py)

L = keras.layers
BATCH = 5
WEIGHTS = np.array([1.0, 2.0, 0.0, 1.0, 1.0], np.float32)
LORA_CLASSES = (L.Dense, L.EinsumDense, L.Embedding)


def with_lora(model: keras.Model, rank: int = 2, alpha: float = 3.0) -> keras.Model:
    """LoRA (scale alpha / rank) on every Dense, EinsumDense and Embedding, B random (Keras starts it at 0: A's
    gradient would be 0)."""
    rng = np.random.default_rng(3)
    for layer in keras_compat.flatten_layers(model):
        if type(layer) in LORA_CLASSES:
            layer.enable_lora(rank, lora_alpha=alpha)
            b = layer.lora_embeddings_b if isinstance(layer, L.Embedding) else layer.lora_kernel_b
            b.assign(rng.normal(size=b.shape).astype(np.float32) * 0.5)
    return model


def dense() -> keras.Model:
    """Over a sequence axis with a bias and an activation, without a bias, and at one position."""
    inputs = L.Input((5, 4))
    hidden = L.Dense(6, activation="tanh")(inputs)
    hidden = L.Dense(3, use_bias=False)(hidden)
    return keras.Model(inputs, L.Dense(3)(L.Flatten()(hidden)))


def einsum() -> keras.Model:
    """MultiHeadAttention's projection equations and a Dense written as one, biases over some axes."""
    inputs = L.Input((5, 4))
    hidden = L.EinsumDense("abc,cd->abd", (5, 3), bias_axes="d", activation="relu")(inputs)
    heads = L.EinsumDense("abc,cde->abde", (5, 2, 3), bias_axes="de")(hidden)
    merged = L.EinsumDense("abcd,cde->abe", (5, 4), bias_axes="e", activation="tanh")(heads)
    return keras.Model(inputs, L.EinsumDense("...b,bc->...c", 3, bias_axes="c")(L.Flatten()(merged)))


def embedding() -> keras.Model:
    """Repeated ids within an example."""
    inputs = L.Input((6,), dtype="int32")
    return keras.Model(inputs, L.Dense(3)(L.Flatten()(L.Embedding(4, 3)(inputs))))


def transformer() -> keras.Model:
    """Embedding, a self-attention block (its projections LoRA EinsumDense layers), a Dense feed-forward."""
    inputs = L.Input((6,), dtype="int32")
    h = L.Embedding(11, 8)(inputs)
    h = L.LayerNormalization()(L.Add()([h, L.MultiHeadAttention(2, 4)(h, h)]))
    h = L.LayerNormalization()(L.Add()([h, L.Dense(8)(L.Dense(16, activation="relu")(h))]))
    return keras.Model(inputs, L.Dense(3)(L.GlobalAveragePooling1D()(h)))


MODELS = {"dense": dense, "einsum": einsum, "embedding": embedding, "transformer": transformer}


def data(model: keras.Model):
    rng = np.random.default_rng(11)
    spec = model.inputs[0]
    shape = [BATCH, *spec.shape[1:]]
    if "int" in str(spec.dtype):
        x = tf.constant(rng.integers(0, 4, shape), tf.int32)
    else:
        x = tf.constant(rng.normal(size=shape) * 2, tf.float32)
    return x, tf.constant(rng.integers(0, 3, BATCH), tf.int32)


def assert_matches(sums, norms, expected):
    """``(sums, norms)`` close to ``expected``, the sums relative to the largest of all variables' entries (the
    attention's key bias has a gradient of exactly 0)."""
    expected_sums, expected_norms = expected
    assert_close(norms, expected_norms)
    scale = max(np.max(np.abs(wanted)) for wanted in expected_sums)
    for actual, wanted in zip(sums, expected_sums):
        assert np.max(np.abs(np.asarray(actual, np.float64) - wanted)) / scale < 1e-5


@pytest.fixture(scope="module", params=sorted(MODELS))
def case(request):
    """A LoRA model, its data, the per-example gradients and a clip norm between the smallest and largest norm."""
    keras.utils.set_random_seed(0)
    model = with_lora(MODELS[request.param]())
    return clip_case(model, *data(model), WEIGHTS)


@pytest.fixture(scope="module")
def ghost_step(case):
    """The case's ghost path traced as in fit (unknown batch size), traced once for the tests that run it."""
    return traced(case[0], case[1], "ghost")


def test_only_the_adapters_train_and_each_lora_layer_has_a_rule(case):
    model = case[0]
    trainable = {id(v) for v in model.trainable_variables}
    for layer in keras_compat.flatten_layers(model):
        if type(layer) in LORA_CLASSES:
            assert registry.rule_for(layer) is not None
            frozen = layer.embeddings if isinstance(layer, L.Embedding) else layer._kernel  # noqa: SLF001
            assert id(frozen) not in trainable


def test_ghost_rules_match_the_brute_force(case, ghost_step):
    assert_ghost_matches_the_brute_force(case, WEIGHTS, assert_matches, step=ghost_step)


def test_removing_one_example_moves_the_clipped_sum_by_its_clipped_norm(case, ghost_step):
    """Neighbour sensitivity with sigma = 0 (the clipped sum is what the optimizer noises): at most C."""
    model, x, y, _, norms, clip_norm = case
    assert_each_removal_moves_by_clipped_norm(model, x, y, WEIGHTS, norms, clip_norm, ghost_step)


def test_an_example_with_factor_zero_adds_nothing(case):
    """An example whose gradient is not finite (weight inf) gets factor 0: the sum is that of the others."""
    model, x, y, _, _, clip_norm = case
    weights = WEIGHTS.copy()
    weights[1] = np.inf
    sums, _ = per_example.clipped_gradient_sum(
        model, LOSS, x, y, tf.constant(weights), clip_norm, model.trainable_variables, method="ghost"
    )
    keep = [0, 2, 3, 4]
    others, _ = per_example.clipped_gradient_sum(
        model, LOSS, tf.gather(x, keep), tf.gather(y, keep), tf.constant(weights[keep]), clip_norm,
        model.trainable_variables, method="ghost",
    )  # fmt: skip
    for total, wanted in zip(sums, others):
        assert np.all(np.isfinite(total))
        np.testing.assert_allclose(total, wanted, rtol=1e-5, atol=1e-6)


def test_an_equation_whose_kernel_ends_in_an_input_letter_has_no_lora_rule():
    layer = L.EinsumDense("abc,dc->adb", (3, 5))
    layer.build((None, 5, 4))
    assert registry.rule_for(layer) is not None
    layer.enable_lora(2)
    assert registry.rule_for(layer) is None


def test_a_dp_step_leaves_the_frozen_weights_as_they_were():
    keras.utils.set_random_seed(0)
    model = with_lora(transformer())
    x, y = data(model)
    frozen = [v for v in model.weights if not v.trainable]
    before = [v.numpy() for v in frozen]
    adapters = [v for v in model.trainable_variables if "lora" in v.path]
    adapters_before = [v.numpy() for v in adapters]
    schedule = schedules.DPSchedule(np.ones(10), np.ones(10), 0.01)
    model = train_step.make_private(model, "ghost")
    model.compile(
        optimizer=DynamicDPKerasSGD(schedule=schedule, public_batch_size=True, learning_rate=0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none"),
    )
    with pytest.warns(SamplingWarning):  # one fixed batch, not Poisson batches
        model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    assert frozen and adapters
    for variable, value in zip(frozen, before):
        np.testing.assert_array_equal(variable.numpy(), value)
    assert all(np.any(v.numpy() != value) for v, value in zip(adapters, adapters_before))
