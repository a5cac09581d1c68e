"""The rules of `keras_dyndp.rules.dense_attention` on TensorFlow (Keras 3 and 2): a model with AdditiveAttention or
Attention (``use_scale=True``, ``score_mode="concat"``) takes the ghost path and clips like the loop of single-example
gradients (eagerly and traced with an unknown batch size, also sequence length); removing one example moves the
clipped sum by min(||g_i||, C) <= C; a factor-0 example adds nothing; the calls the rule cannot reproduce (dropout,
masks, causal masks, attention scores returned) keep the path they had before."""

import attention_models
import numpy as np
import pytest
import tensorflow as tf
from brute_force import LOSS
from brute_force import assert_each_removal_moves_by_clipped_norm
from brute_force import assert_ghost_matches_the_brute_force
from brute_force import assert_matches_on_one_scale
from brute_force import clip_case
from brute_force import reference

from keras_dyndp.rules import dense_attention
from keras_dyndp.rules import registry
from keras_dyndp.tf_backend import per_example
from keras_dyndp.tf_backend.keras_compat import keras
from keras_dyndp.tf_backend.per_example import per_example_layers

L = keras.layers
WEIGHTS = np.array([1.0, 2.0, 0.0, 1.0, 0.5], np.float32)
LAYERS = attention_models.layers(keras)
UNCOVERED = attention_models.uncovered(keras)


def data(rows=5, padding_mask=False):
    return tuple(tf.constant(part) for part in attention_models.data(rows, padding_mask))


@pytest.mark.parametrize("name", LAYERS)
def test_a_model_with_the_layer_takes_the_ghost_path_and_clips_like_the_per_example_loop(name):
    model, layer = attention_models.model_with(keras, name)
    assert registry.rule_for(layer) is not None
    assert {id(v) for v in dense_attention.variables(layer)} == {id(v) for v in layer.trainable_weights}
    x, y = data()
    # The key's bias has a gradient of exactly 0 (a softmax ignores a shift): rounding noise, on one scale.
    assert_ghost_matches_the_brute_force(clip_case(model, x, y, WEIGHTS), WEIGHTS, assert_matches_on_one_scale)


@pytest.mark.parametrize("name", ["additive", "concat_scaled"])
def test_removing_one_example_moves_the_clipped_sum_by_its_clipped_norm(name):
    model, _ = attention_models.model_with(keras, name)
    x, y = data()
    _, _, _, _, norms, clip_norm = clip_case(model, x, y, WEIGHTS)
    assert_each_removal_moves_by_clipped_norm(model, x, y, WEIGHTS, norms, clip_norm)


def test_an_example_whose_factor_is_zero_adds_nothing():
    _, layer = attention_models.model_with(keras, "additive")
    rng = np.random.default_rng(2)
    query, value = (tf.constant(rng.normal(size=(3, 1, length, 3)), tf.float32) for length in (4, 3))
    g = rng.normal(size=(3, 1, 4, 3)).astype(np.float32)
    g[1] = np.nan
    squared, sums = dense_attention.norms_and_sums(layer, [query, value], tf.constant(g))
    kept = [0, 2]
    kept_squared, kept_sums = dense_attention.norms_and_sums(
        layer, [tf.gather(query, kept), tf.gather(value, kept)], tf.gather(tf.constant(g), kept)
    )
    (total,) = sums(tf.constant([0.5, 0.0, 2.0]))
    np.testing.assert_allclose(total, kept_sums(tf.constant([0.5, 2.0]))[0], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(squared)[kept], kept_squared, rtol=1e-6)


def test_without_trained_weights_the_layer_needs_no_rule():
    layer = L.Attention()
    model = attention_models.attention_model(keras, layer, own_key=False)
    assert not dense_attention.variables(layer) and registry.rule_for(layer) is None
    assert per_example.ghost_supported(model, model.trainable_variables)


@pytest.mark.parametrize("name", UNCOVERED)
def test_a_call_the_rule_cannot_reproduce_keeps_the_vectorized_path(name):
    model = UNCOVERED[name]()
    layer = next(layer for layer in model.layers if "attention" in type(layer).__name__.lower())
    assert registry.rule_for(layer) is None and not per_example.ghost_supported(model, model.trainable_variables)
    if name == "dropout":  # its draws differ row by row: not known to act per example either
        assert layer.name in per_example_layers.first_unknown(model)
    x, y = data(4, padding_mask=name == "padding_mask")
    with pytest.raises(ValueError, match="method='ghost'"):
        per_example.clipped_gradient_sum(model, LOSS, x, y, None, 1.0, model.trainable_variables, method="ghost")
    if name != "dropout":  # 'auto': the vectorized path, as the loop
        expected = reference(model, x, y, np.ones(4, np.float32), 0.1)
        sums = per_example.clipped_gradient_sum(model, LOSS, x, y, None, 0.1, model.trainable_variables)
        assert_matches_on_one_scale(*sums, expected)


def test_returned_attention_scores_are_not_covered():
    layer = L.Attention(use_scale=True)
    inputs = L.Input((4, 3))
    outputs, scores = layer([inputs, inputs], return_attention_scores=True)
    keras.Model(inputs, [outputs, scores])
    assert not dense_attention.supports(layer)


def test_a_layer_without_recorded_calls_is_not_covered():
    layer = L.AdditiveAttention()
    layer([tf.zeros((1, 4, 3)), tf.zeros((1, 2, 3))])  # called eagerly: no functional node
    assert dense_attention.variables(layer) and not dense_attention.supports(layer)


@pytest.mark.keras2_only(reason="Keras 3's Attention has no `causal` argument")
def test_keras_2s_causal_argument_is_not_covered():
    layer = L.Attention(use_scale=True, causal=True)
    attention_models.attention_model(keras, layer, own_key=False)
    assert registry.rule_for(layer) is None


def test_sequences_of_a_length_unknown_while_tracing_take_the_ghost_path():
    keras.utils.set_random_seed(0)
    inputs = L.Input((None, 3))
    attended = L.AdditiveAttention()([L.Dense(3, activation="tanh")(inputs), L.Dense(3)(inputs)])
    model = keras.Model(inputs, L.Dense(3)(L.GlobalAveragePooling1D()(attended)))
    rng = np.random.default_rng(0)
    x = tf.constant(rng.normal(size=(5, 6, 3)), tf.float32)
    y = tf.constant(rng.integers(0, 3, size=5), tf.int32)
    assert_ghost_matches_the_brute_force(clip_case(model, x, y, WEIGHTS), WEIGHTS, assert_matches_on_one_scale)
