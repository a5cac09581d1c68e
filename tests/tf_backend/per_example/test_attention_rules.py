"""The ghost rules of attention models (EinsumDense, also inside MultiHeadAttention; LayerNormalization and
GroupNormalization) against a loop of single-example gradients: the clipped sum and norms of the ghost path (eagerly
and traced with an unknown batch size); with sigma = 0, removing one example moves the clipped sum by min(||g_i||, C);
equations that mix the batch axis have no rule."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from brute_force import LOSS
from brute_force import assert_each_removal_moves_by_clipped_norm
from brute_force import assert_ghost_matches_the_brute_force
from brute_force import assert_matches_on_one_scale as assert_matches
from brute_force import clip_case
from brute_force import clipped
from brute_force import per_example_gradients
from brute_force import traced

from keras_dyndp.rules import registry
from keras_dyndp.tf_backend import keras_compat
from keras_dyndp.tf_backend import per_example
from keras_dyndp.tf_backend.keras_compat import keras
from keras_dyndp.tf_backend.per_example import per_example_layers

pytestmark = pytest.mark.xdist_group("attention_rules")  # its module fixtures run once (tests/conftest.py)

L = keras.layers
BATCH = 5
WEIGHTS = np.array([1.0, 2.0, 0.0, 1.0, 1.0], np.float32)


def einsum() -> keras.Model:
    """The equations of MultiHeadAttention's projections and of Dense-like encoders, biases over some axes, a
    kernel whose letters are not in the contraction's order, an output whose positions come last."""
    inputs = L.Input((5, 4))
    hidden = L.EinsumDense("abc,cd->abd", (5, 3), bias_axes="d", activation="relu")(inputs)
    heads = L.EinsumDense("abc,cde->abde", (5, 2, 3), bias_axes="de")(hidden)
    merged = L.EinsumDense("abcd,cde->abe", (5, 4), bias_axes="e", activation="tanh")(heads)
    swapped = L.EinsumDense("abc,dc->adb", (3, 5), bias_axes="b")(merged)
    flat = L.EinsumDense("...b,bc->...c", 3, bias_axes="c")(L.Flatten()(swapped))
    return keras.Model(inputs, L.EinsumDense("ab,bc->ac", 3)(flat))


def layer_norm() -> keras.Model:
    """LayerNormalization over the features, over (positions, features) without offset, and (Keras 3) RMS-scaled;
    RMSNormalization over the features and over (positions, features)."""
    inputs = L.Input((5, 4))
    hidden = L.LayerNormalization()(L.Dense(4)(inputs))
    hidden = L.LayerNormalization(axis=[1, 2], center=False)(L.Dense(4, activation="tanh")(hidden))
    if keras_compat.KERAS_MAJOR_VERSION == 3:
        hidden = L.LayerNormalization(rms_scaling=True)(L.Dense(4)(hidden))
    if hasattr(L, "RMSNormalization"):  # Keras 3.9 and later
        hidden = L.RMSNormalization()(L.Dense(4)(hidden))
        hidden = L.RMSNormalization(axis=[1, 2])(L.Dense(4, activation="relu")(hidden))
    return keras.Model(inputs, L.Dense(3)(L.Flatten()(hidden)))


def group_norm() -> keras.Model:
    """GroupNormalization of 4 channels in 2 groups after a convolution, and again without scale."""
    inputs = L.Input((6, 3))
    hidden = L.GroupNormalization(2)(L.Conv1D(4, 2, activation="tanh")(inputs))
    hidden = L.GroupNormalization(2, scale=False)(L.Dense(4, activation="relu")(hidden))
    return keras.Model(inputs, L.Dense(3)(L.GlobalAveragePooling1D()(hidden)))


def time_distributed_norm() -> keras.Model:
    """Each example is 2 sequences of 4 steps: EinsumDense and LayerNormalization see them folded into their rows."""
    inputs = L.Input((2, 4, 3))
    hidden = L.TimeDistributed(L.EinsumDense("abc,cd->abd", (4, 3), bias_axes="d"))(inputs)
    hidden = L.TimeDistributed(L.LayerNormalization())(hidden)
    return keras.Model(inputs, L.Dense(3)(L.Flatten()(hidden)))


def transformer() -> keras.Model:
    """Embedding, a self-attention block (MultiHeadAttention, Add, LayerNormalization, Dense feed-forward), average
    pooling and Dense."""
    inputs = L.Input((6,), dtype="int32")
    h = L.Embedding(11, 8)(inputs)
    h = L.LayerNormalization()(L.Add()([h, L.MultiHeadAttention(2, 4)(h, h)]))
    h = L.LayerNormalization()(L.Add()([h, L.Dense(8)(L.Dense(16, activation="relu")(h))]))
    return keras.Model(inputs, L.Dense(3)(L.GlobalAveragePooling1D()(h)))


def padded_cls() -> keras.Model:
    """Padding (id 0) masked by the Embedding's ``mask_zero`` through attention (a comparison op makes the mask), a
    pre-norm block, and a classifier on the first position (a slice ``h[:, 0]``): known to act per example."""
    inputs = L.Input((6,), dtype="int32")
    h = L.Embedding(11, 8, mask_zero=True)(inputs)
    a = L.LayerNormalization()(h)
    h = L.Add()([h, L.MultiHeadAttention(2, 4)(a, a)])
    return keras.Model(inputs, L.Dense(3)(L.Dense(8, activation="gelu")(h[:, 0])))


MODELS = {
    "einsum": einsum,
    "padded_cls": padded_cls,
    "group_norm": group_norm,
    "layer_norm": layer_norm,
    "time_distributed_norm": time_distributed_norm,
    "transformer": transformer,
}


def data(model: keras.Model):
    rng = np.random.default_rng(11)
    spec = model.inputs[0]
    shape = [BATCH, *spec.shape[1:]]
    if "int" in str(spec.dtype):
        x = tf.constant(rng.integers(0, 11, shape), tf.int32)
    else:
        x = tf.constant(rng.normal(size=shape) * 2, tf.float32)
    return x, tf.constant(rng.integers(0, 3, BATCH), tf.int32)


@pytest.fixture(scope="module", params=sorted(MODELS))
def case(request):
    """A model, its data, the per-example gradients and a clip norm between the smallest and largest norm."""
    keras.utils.set_random_seed(0)
    model = MODELS[request.param]()
    return clip_case(model, *data(model), WEIGHTS)


@pytest.fixture(scope="module")
def ghost_step(case):
    """The case's ghost path traced as in fit (unknown batch size), traced once for the tests that run it."""
    return traced(case[0], case[1], "ghost")


@pytest.mark.filterwarnings("ignore:You passed `rms_scaling=True`, which is deprecated:UserWarning")
def test_ghost_rules_match_the_brute_force(case, ghost_step):
    assert per_example_layers.first_unknown(case[0]) is None
    assert_ghost_matches_the_brute_force(case, WEIGHTS, assert_matches, step=ghost_step)


def test_removing_one_example_moves_the_clipped_sum_by_its_clipped_norm(case, ghost_step):
    """Neighbour sensitivity with sigma = 0 (the clipped sum is what the optimizer noises): at most C."""
    model, x, y, _, norms, clip_norm = case
    assert_each_removal_moves_by_clipped_norm(model, x, y, WEIGHTS, norms, clip_norm, ghost_step)


def test_unclipped_ghost_sum_is_the_non_private_gradient():
    """With C above every norm, the clipped sum is the gradient of the summed loss."""
    keras.utils.set_random_seed(0)
    model = transformer()
    x, y = data(model)
    weights = tf.ones([BATCH])
    with tf.GradientTape() as tape:
        total = tf.reduce_sum(LOSS(y, model(x, training=True)))
    expected = tape.gradient(total, model.trainable_variables)
    sums, _ = traced(model, x, "ghost")(x, y, weights, 1e6)
    for actual, wanted in zip(sums, expected):
        np.testing.assert_allclose(actual, tf.convert_to_tensor(wanted), rtol=1e-5, atol=1e-6)


def test_ghost_rules_compile_with_xla():
    keras.utils.set_random_seed(0)
    model = transformer()
    x, y = data(model)
    weights = tf.constant(WEIGHTS)
    step = tf.function(
        lambda x, y, w: per_example.clipped_gradient_sum(
            model, LOSS, x, y, w, 0.5, model.trainable_variables, method="ghost"
        ),
        jit_compile=True,
    )
    gradients, norms = per_example_gradients(model, x, y, WEIGHTS)
    assert_matches(*step(x, y, weights), clipped(gradients, norms, 0.5))


@pytest.mark.parametrize(
    "layer,covered",
    [
        (lambda: L.EinsumDense("abc,cd->abd", (None, 3)), True),
        (lambda: L.EinsumDense("abc,cde->abde", (None, 2, 3), bias_axes="e"), True),
        (lambda: L.EinsumDense("abc,bcd->abd", (5, 3)), False),  # a position axis in the kernel
        (lambda: L.LayerNormalization(axis=[1, 2]), True),
        (lambda: L.GroupNormalization(2), True),
    ],
)
def test_rules_cover_the_supported_configurations(layer, covered):
    layer = layer()
    layer.build((None, 5, 4))
    assert (registry.rule_for(layer) is not None) == covered


def test_an_unsupported_einsum_equation_takes_the_vectorized_path():
    """EinsumDense with a position axis in its kernel has no rule: 'auto' clips it on the vectorized path, 'ghost'
    refuses."""
    keras.utils.set_random_seed(0)
    inputs = L.Input((5, 4))
    model = keras.Model(inputs, L.Dense(3)(L.Flatten()(L.EinsumDense("abc,bcd->abd", (5, 3))(inputs))))
    x, y = data(model)
    assert not per_example.ghost_supported(model, model.trainable_variables)
    with pytest.raises(ValueError, match="method='ghost'"):
        per_example.clipped_gradient_sum(model, LOSS, x, y, None, 1.0, model.trainable_variables, method="ghost")


def test_attention_with_dropout_is_known_to_act_per_example():
    """MultiHeadAttention's softmax and dropout are sublayers (Dropout draws one secret mask for all rows)."""
    inputs = L.Input((6, 8))
    attention = L.MultiHeadAttention(2, 4, dropout=0.1)
    model = keras.Model(inputs, L.Dense(3)(L.GlobalAveragePooling1D()(attention(inputs, inputs))))
    assert per_example_layers.first_unknown(model) is None
    assert per_example.ghost_supported(model, model.trainable_variables)
