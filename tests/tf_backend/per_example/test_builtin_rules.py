"""The built-in ghost rules (dense, conv1d, conv2d, depthwise, embedding, lstm, gru) against a loop of
single-example gradients: the clipped sum and norms of the ghost path (eagerly and traced with an unknown batch
size, as in fit) and of the vectorized fallback; with sigma = 0, removing one example moves the clipped sum by
min(||g_i||, C) <= C."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from brute_force import LOSS
from brute_force import assert_each_removal_moves_by_clipped_norm
from brute_force import assert_ghost_matches_the_brute_force
from brute_force import assert_matches
from brute_force import clip_case
from brute_force import clipped
from brute_force import per_example_gradients
from brute_force import traced

from keras_dyndp.rules import registry
from keras_dyndp.tf_backend import keras_compat
from keras_dyndp.tf_backend import per_example
from keras_dyndp.tf_backend.keras_compat import keras

pytestmark = pytest.mark.xdist_group("builtin_rules")  # its module fixtures run once (tests/conftest.py)

L = keras.layers
BATCH = 5
WEIGHTS = np.array([1.0, 2.0, 0.0, 1.0, 1.0], np.float32)


def conv1d() -> keras.Model:
    """Strided 'same', causal and dilated, unbiased 'valid' Conv1D layers on 3 channels."""
    return keras.Sequential(
        [
            L.Input((12, 3)),
            L.Conv1D(4, 3, strides=2, padding="same", activation="relu"),
            L.Conv1D(4, 2, dilation_rate=2, padding="causal", activation="tanh"),
            L.Conv1D(3, 2, padding="valid", use_bias=False),
            L.Flatten(),
            L.Dense(3),
        ]
    )


def conv1d_one_channel() -> keras.Model:
    """A 1-channel input (depthwise filter gradients, causal padding by hand), then a sequence axis of unknown
    length (image patches of an unknown size)."""
    inputs = L.Input((None, 1))
    hidden = L.Conv1D(3, 4, strides=2, padding="causal", activation="tanh")(inputs)
    hidden = L.Conv1D(4, 3, padding="same")(hidden)
    return keras.Model(inputs, L.Dense(3)(L.GlobalAveragePooling1D()(hidden)))


def conv2d() -> keras.Model:
    """Conv2D on a 1-channel input: unequal strides (image patches), then a dilated one (space_to_batch); beside
    them 16 output channels (image patches unless oneDNN is on, see conv2d.one_channel_by_depthwise_filter)."""
    inputs = L.Input((9, 8, 1))
    hidden = L.Conv2D(3, (3, 2), strides=(2, 1), padding="same", activation="relu")(inputs)
    hidden = L.Conv2D(2, 2, dilation_rate=2, activation="tanh")(hidden)
    wide = L.Conv2D(16, 3, strides=2, activation="relu")(inputs)
    merged = L.Concatenate()([L.Flatten()(hidden), L.Flatten()(wide)])
    return keras.Model(inputs, L.Dense(3)(merged))


def depthwise() -> keras.Model:
    """DepthwiseConv2D: depth multiplier 2, strided 'same'; dilated 'valid' without bias."""
    return keras.Sequential(
        [
            L.Input((9, 9, 3)),
            L.DepthwiseConv2D(3, depth_multiplier=2, strides=2, padding="same", activation="relu"),
            L.DepthwiseConv2D(2, dilation_rate=2, use_bias=False),
            L.Flatten(),
            L.Dense(3),
        ]
    )


def separable() -> keras.Model:
    """SeparableConv2D: depth multiplier 2 'same'; strided without bias; dilated 'same'."""
    return keras.Sequential(
        [
            L.Input((8, 8, 2)),
            L.SeparableConv2D(4, 3, depth_multiplier=2, padding="same", activation="relu"),
            L.SeparableConv2D(3, 2, strides=2, use_bias=False, activation="tanh"),
            L.SeparableConv2D(3, 3, dilation_rate=2, padding="same"),
            L.GlobalAveragePooling2D(),
            L.Dense(3),
        ]
    )


def time_distributed_conv() -> keras.Model:
    """Each example is 2 sequences of 6 steps: a Conv1D and a Dense see them folded into their rows."""
    inputs = L.Input((2, 6, 2))
    hidden = L.TimeDistributed(L.Conv1D(3, 2, activation="tanh"))(inputs)
    hidden = L.TimeDistributed(L.Dense(3))(L.TimeDistributed(L.Flatten())(hidden))
    return keras.Model(inputs, L.Dense(3)(L.Flatten()(hidden)))


def gru() -> keras.Model:
    """GRU with reset_after (Keras' default: bias [2, 3u]) returning sequences, then one with the reset gate applied
    before the recurrent kernel, without bias, returning its last state."""
    return keras.Sequential(
        [
            L.Input((6, 3)),
            L.GRU(4, return_sequences=True),
            L.GRU(3, reset_after=False, use_bias=False),
            L.Dense(3),
        ]
    )


def gru_reset_before() -> keras.Model:
    """The other combinations: reset gate before the recurrent kernel with bias, returning sequences; reset_after
    without bias, returning its last state."""
    return keras.Sequential(
        [
            L.Input((6, 3)),
            L.GRU(4, reset_after=False, return_sequences=True),
            L.GRU(3, use_bias=False),
            L.Dense(3),
        ]
    )


def recurrent_text() -> keras.Model:
    """Embedding, then LSTM and GRU over a sequence of unknown length, then Dense."""
    return keras.Sequential(
        [
            L.Input((None,), dtype="int32"),
            L.Embedding(7, 4),
            L.LSTM(4, return_sequences=True),
            L.GRU(3),
            L.Dense(3),
        ]
    )


def data(model: keras.Model):
    rng = np.random.default_rng(11)
    spec = model.inputs[0]
    shape = [BATCH] + [7 if d is None else d for d in spec.shape[1:]]
    if "int" in str(spec.dtype):
        x = tf.constant(rng.integers(0, 7, shape), tf.int32)
    else:
        x = tf.constant(rng.normal(size=shape) * 2, tf.float32)
    return x, tf.constant(rng.integers(0, 3, BATCH), tf.int32)


MODELS = {
    "conv1d": conv1d,
    "conv1d_one_channel": conv1d_one_channel,
    "conv2d": conv2d,
    "depthwise": depthwise,
    "gru": gru,
    "gru_reset_before": gru_reset_before,
    "recurrent_text": recurrent_text,
    "separable": separable,
    "time_distributed_conv": time_distributed_conv,
}


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


def test_ghost_rules_match_the_brute_force(case, ghost_step):
    assert_ghost_matches_the_brute_force(case, WEIGHTS, step=ghost_step)


def test_removing_one_example_moves_the_clipped_sum_by_its_clipped_norm(case, ghost_step):
    """Neighbour sensitivity with sigma = 0 (the clipped sum is what the optimizer noises): at most C."""
    model, x, y, _, norms, clip_norm = case
    assert_each_removal_moves_by_clipped_norm(model, x, y, WEIGHTS, norms, clip_norm, ghost_step)


def test_vectorized_fallback_matches_the_brute_force(case):
    model, x, y, gradients, norms, clip_norm = case
    expected = clipped(gradients, norms, clip_norm)
    assert_matches(*traced(model, x, "vectorized")(x, y, tf.constant(WEIGHTS), clip_norm), expected)


def test_ghost_rules_compile_with_xla():
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            L.Input((8, 8, 2)),
            L.SeparableConv2D(3, 3, padding="same", activation="relu"),
            L.DepthwiseConv2D(2, strides=2, activation="relu"),
            L.Reshape((8, 6)),
            L.Conv1D(3, 2, padding="causal", activation="relu"),
            L.Flatten(),
            L.Dense(3),
        ]
    )
    _assert_ghost_matches_under_xla(model)


def test_gru_rule_compiles_with_xla():
    """tf.scan's loop and both reset modes under jit_compile."""
    keras.utils.set_random_seed(0)
    model = gru()
    _assert_ghost_matches_under_xla(model)


@pytest.mark.parametrize(
    "layer,covered",
    [
        (lambda: L.Conv1D(2, 3, padding="causal"), True),
        (lambda: L.Conv1D(2, 3, groups=2), False),
        (lambda: L.DepthwiseConv2D(3, depth_multiplier=2), True),
        (lambda: L.DepthwiseConv2D(3, data_format="channels_first"), False),
        (lambda: L.SeparableConv2D(2, 3, data_format="channels_first"), False),
        (lambda: L.GRU(2), True),
        (lambda: L.GRU(2, reset_after=False, return_sequences=True, return_state=True), True),
        (lambda: L.GRU(2, stateful=True), False),
        (lambda: L.GRU(2, go_backwards=True), False),
        (lambda: L.GRU(2, dropout=0.1), False),
        (lambda: L.GRU(2, recurrent_dropout=0.1), False),
    ],
)
def test_rules_cover_the_supported_configurations(layer, covered):
    assert (registry.rule_for(layer()) is not None) == covered


@pytest.mark.skipif(keras_compat.KERAS_MAJOR_VERSION == 2, reason="LoRA is a Keras 3 feature")
def test_lora_enabled_convolutions_are_clipped_on_the_vectorized_path():
    """A LoRA convolution trains its low-rank factors, not the kernel its rule would differentiate (LoRA Dense,
    EinsumDense and Embedding have rules: test_lora.py)."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([L.Input((6, 2)), L.Conv1D(4, 3), L.Flatten(), L.Dense(3)])
    model.layers[0].enable_lora(2)
    x, y = data(model)
    assert registry.rule_for(model.layers[0]) is None
    assert not per_example.ghost_supported(model, model.trainable_variables)
    expected = clipped(*per_example_gradients(model, x, y, WEIGHTS), 0.1)
    assert_matches(
        *per_example.clipped_gradient_sum(model, LOSS, x, y, tf.constant(WEIGHTS), 0.1, model.trainable_variables),
        expected,
    )


def _assert_ghost_matches_under_xla(model: keras.Model) -> None:
    """The ghost clipped sum of ``model`` under jit_compile equals the per-example loop's, with clipping active."""
    x, y = data(model)
    expected = clipped(*per_example_gradients(model, x, y, WEIGHTS), 0.05)
    assert expected[1].max() > 0.05
    step = tf.function(
        lambda: per_example.clipped_gradient_sum(
            model, LOSS, x, y, tf.constant(WEIGHTS), 0.05, model.trainable_variables, method="ghost"
        ),
        jit_compile=True,
    )
    assert_matches(*step(), expected)
