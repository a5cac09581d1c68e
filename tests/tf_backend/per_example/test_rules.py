"""rules: the registry; docs/usage.md's rule for a custom layer (the contract both backends share) clips it per
example like the brute force and the vectorized path."""

import numpy as np
import pytest
import tensorflow as tf
import transformer_layers
from brute_force import LOSS
from brute_force import assert_matches
from brute_force import reference

from keras_dyndp.rules import layer_rules
from keras_dyndp.rules import registry
from keras_dyndp.tf_backend import per_example
from keras_dyndp.tf_backend.keras_compat import keras
from keras_dyndp.tf_backend.per_example import dense

EXAMPLE = transformer_layers.documented_rule_example(keras, layer_rules.keras_ops())
ScaleShift = EXAMPLE["ScaleShift"]


class Unregistered(ScaleShift):
    """A subclass: rules are looked up by exact class, so it has none."""


def model_with(layer_class) -> keras.Model:
    """[B, 3, 4] -> Dense -> the custom layer, at each of 3 positions -> mean -> Dense."""
    inputs = keras.Input(shape=(3, 4))
    hidden = layer_class()(keras.layers.Dense(4, activation="tanh")(inputs))
    hidden = keras.layers.GlobalAveragePooling1D()(hidden)
    return keras.Model(inputs, keras.layers.Dense(3)(hidden))


def test_custom_layer_rule_clips_like_the_brute_force():
    keras.utils.set_random_seed(0)
    model = model_with(ScaleShift)
    rng = np.random.default_rng(7)
    x = tf.constant(rng.normal(size=(5, 3, 4)) * 3, tf.float32)
    y = tf.constant(rng.integers(0, 3, 5), tf.int32)
    weights = np.array([1.0, 0.0, 2.0, 1.0, 1.0], np.float32)
    expected = reference(model, x, y, weights, 0.2)
    assert expected[1].max() > 0.2  # Clipping is active.
    assert per_example.ghost_supported(model, model.trainable_variables)
    # Eagerly, and traced with an unknown batch size as in fit.
    assert_matches(
        *per_example.clipped_gradient_sum(
            model, LOSS, x, y, tf.constant(weights), 0.2, model.trainable_variables, method="ghost"
        ),
        expected,
    )
    step = tf.function(
        lambda x, y, w: per_example.clipped_gradient_sum(
            model, LOSS, x, y, w, 0.2, model.trainable_variables, method="ghost"
        ),
        input_signature=[tf.TensorSpec([None, 3, 4]), tf.TensorSpec([None], tf.int32), tf.TensorSpec([None])],
    )
    assert_matches(*step(x, y, tf.constant(weights)), expected)
    vectorized = per_example.clipped_gradient_sum(
        model, LOSS, x, y, tf.constant(weights), 0.2, model.trainable_variables, method="vectorized"
    )
    assert_matches(*vectorized, expected)


def test_rules_apply_to_their_exact_class_and_supported_configurations():
    model = model_with(Unregistered)
    assert not per_example.ghost_supported(model, model.trainable_variables)
    assert registry.rule_for(keras.layers.Conv2D(2, 3)) is not None
    assert registry.rule_for(keras.layers.Conv2D(2, 3, groups=2)) is None
    assert registry.rule_for(keras.layers.LSTM(2, go_backwards=True)) is None
    assert registry.rule_for(keras.layers.GRU(2)) is not None
    assert registry.rule_for(keras.layers.GRU(2, go_backwards=True)) is None
    assert registry.rule_for(keras.layers.PReLU()) is None


def test_register_layer_rule_refuses_what_is_not_a_rule():
    parts = {
        "variables": EXAMPLE["scale_shift_norms_and_sums"],
        "norms_and_sums": EXAMPLE["scale_shift_norms_and_sums"],
    }
    with pytest.raises(TypeError, match="`layer_class` must be a Keras layer class"):
        per_example.register_layer_rule(object, **parts)
    with pytest.raises(TypeError, match="`norms_and_sums` must be callable"):
        per_example.register_layer_rule(Unregistered, **{**parts, "norms_and_sums": None})
    with pytest.raises(TypeError, match="`supports` must be callable"):
        per_example.register_layer_rule(Unregistered, **parts, supports=True)
    with pytest.raises(TypeError, match="takes neither `variables`"):
        per_example.register_layer_rule(Unregistered, call=dense.call, **parts)
    assert registry.rule_for(Unregistered()) is None


def test_the_specialised_form_registers_a_tapped_call():
    class OwnDense(keras.layers.Dense):
        """Dense's rule, registered in the built-ins' specialised form."""

    per_example.register_layer_rule(OwnDense, call=dense.call, norms_and_sums=dense.norms_and_sums)
    rule = registry.rule_for(OwnDense(2))
    assert rule.call is dense.call and rule.variables is None
