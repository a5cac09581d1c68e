"""The shared rule contract on TensorFlow (`keras_dyndp.rules.layer_rules`, tapped by `generic`): the keras.io
Transformer example's layers and a learned position embedding, each registered in one line, take the ghost path and clip
like the per-example loop; a rule's sums add nothing from an example whose factor is 0."""

import numpy as np
import pytest
import tensorflow as tf
import transformer_layers
from brute_force import LOSS
from brute_force import assert_ghost_matches_the_brute_force
from brute_force import assert_matches
from brute_force import assert_matches_on_one_scale
from brute_force import clip_case
from brute_force import reference

import keras_dyndp
from keras_dyndp.rules import layer_rules
from keras_dyndp.rules import registry
from keras_dyndp.tf_backend import per_example
from keras_dyndp.tf_backend.keras_compat import keras


def _registered_classifier(learned_positions):
    classes = transformer_layers.layers(keras, tf.range)
    transformer_layers.register(keras_dyndp, classes)
    keras.utils.set_random_seed(0)
    return transformer_layers.classifier(keras, classes, learned_positions=learned_positions)


@pytest.mark.parametrize("learned_positions", [False, True])
def test_the_transformer_example_takes_the_ghost_path_and_clips_like_the_per_example_loop(learned_positions):
    model = _registered_classifier(learned_positions)
    rng = np.random.default_rng(3)
    x = tf.constant(rng.integers(0, 12, size=(6, 5)), tf.int32)  # ids repeat within examples
    y = tf.constant(rng.integers(0, 3, size=6), tf.int32)
    weights = np.array([1.0, 0.0, 2.0, 1.0, 1.0, 0.5], np.float32)
    assert_ghost_matches_the_brute_force(clip_case(model, x, y, weights), weights, assert_matches_on_one_scale)


def test_a_rules_sums_add_nothing_from_an_example_whose_factor_is_zero():
    *_, position = transformer_layers.layers(keras, tf.range)
    layer = position()
    layer.build((None, 3, 2))
    rule = layer_rules.added_weight("position_embeddings")
    g = np.random.default_rng(0).normal(size=(3, 1, 3, 2)).astype(np.float32)
    g[1] = np.nan
    squared, sums = rule["norms_and_sums"](layer, tf.zeros_like(g), tf.constant(g))
    (total,) = sums(tf.constant([0.5, 0.0, 2.0]))
    np.testing.assert_allclose(total, 0.5 * g[0, 0] + 2.0 * g[2, 0], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(squared)[[0, 2]], np.sum(g[[0, 2]] ** 2, axis=(1, 2, 3)), rtol=1e-6)


def test_a_rule_of_another_layers_sublayer_is_applied_through_it():
    embedding = keras.layers.Embedding(7, 3)
    embedding.build((None, 4))
    ids = tf.constant([[[1, 1, 2, 6]], [[0, 3, 3, 3]]])
    g = tf.constant(np.random.default_rng(1).normal(size=(2, 1, 4, 3)), tf.float32)
    variables, squared, sums = layer_rules.sublayer_norms_and_sums(embedding, ids, g)
    assert variables == [embedding.embeddings]
    table = np.zeros((2, 7, 3))
    for i in range(2):
        np.add.at(table[i], ids.numpy()[i, 0], g.numpy()[i, 0])
    assert np.all(np.asarray(squared) >= np.sum(table**2, axis=(1, 2)) * (1 - 1e-7))
    np.testing.assert_allclose(sums(tf.constant([1.0, 0.5]))[0], table[0] + 0.5 * table[1], rtol=1e-6)
    with pytest.raises(ValueError, match="no ghost rule supports layer"):
        layer_rules.sublayer_norms_and_sums(keras.layers.Dropout(0.1), ids, g)


def test_per_example_declarations_share_the_registry_and_refuse_a_rules_parts():
    class Wiring(keras.layers.Layer):
        def call(self, inputs):
            return inputs

    assert not registry.acts_per_example(Wiring())
    keras_dyndp.register_layer_rule(Wiring, per_example=True, supports=lambda layer: layer.name != "no")
    assert registry.acts_per_example(Wiring()) and not registry.acts_per_example(Wiring(name="no"))
    assert registry.acts_per_example(keras.layers.Dropout(0.5)) and registry.rule_for(Wiring()) is None
    with pytest.raises(TypeError, match="leave out variables"):
        keras_dyndp.register_layer_rule(Wiring, per_example=True, variables=lambda layer: [])


EXAMPLE = transformer_layers.documented_rule_example(keras, layer_rules.keras_ops())


class ShapedScaleShift(EXAMPLE["ScaleShift"]):
    """The documented layer with the output shape Keras 3's TimeDistributed asks for."""

    def compute_output_shape(self, input_shape):
        return input_shape


def test_a_shared_contract_rule_under_time_distributed_sees_each_examples_steps():
    keras_dyndp.register_layer_rule(
        ShapedScaleShift,
        variables=lambda layer: [layer.scale, layer.shift],
        norms_and_sums=EXAMPLE["scale_shift_norms_and_sums"],
    )
    keras.utils.set_random_seed(1)
    inputs = keras.Input((4, 3, 2))
    layer = ShapedScaleShift()
    hidden = keras.layers.TimeDistributed(layer)(keras.layers.Dense(2, activation="tanh")(inputs))
    model = keras.Model(inputs, keras.layers.Dense(3)(keras.layers.Flatten()(hidden)))
    layer.scale.assign(np.random.default_rng(2).normal(size=2).astype(np.float32))
    rng = np.random.default_rng(4)
    x = tf.constant(rng.normal(size=(5, 4, 3, 2)), tf.float32)
    y = tf.constant(rng.integers(0, 3, size=5), tf.int32)
    weights = np.array([1.0, 1.0, 0.0, 2.0, 1.0], np.float32)
    assert_ghost_matches_the_brute_force(clip_case(model, x, y, weights), weights)


class ReadsTheScale(keras.Model):
    """The custom layer's scale also read outside its call: its gradient has a part the rule does not see."""

    def __init__(self):
        super().__init__()
        self.scale_shift = EXAMPLE["ScaleShift"]()
        self.out = keras.layers.Dense(3)

    def call(self, inputs):
        hidden = self.scale_shift(inputs)
        return self.out(tf.reduce_mean(hidden, axis=1) * self.scale_shift.scale)


def test_a_covered_variable_read_outside_the_layers_call_is_refused(monkeypatch):
    monkeypatch.setattr(registry, "_PER_EXAMPLE", {**registry._PER_EXAMPLE, ReadsTheScale: None})  # pylint: disable=W0212
    model = ReadsTheScale()
    rng = np.random.default_rng(5)
    x = tf.constant(rng.normal(size=(4, 3, 2)), tf.float32)
    y = tf.constant(rng.integers(0, 3, size=4), tf.int32)
    model(x[:1])
    with pytest.raises(ValueError, match="tied weights"):
        per_example.clipped_gradient_sum(model, LOSS, x, y, None, 0.1, model.trainable_variables, method="ghost")
    expected = reference(model, x, y, np.ones(4, np.float32), 0.1)  # 'auto': the vectorized path
    assert_matches(*per_example.clipped_gradient_sum(model, LOSS, x, y, None, 0.1, model.trainable_variables), expected)


@pytest.mark.parametrize("bad_id", [-1, -12, 12])
@pytest.mark.parametrize("composite", [False, True])
def test_an_id_outside_the_table_is_refused_alike_inside_a_composite_rule(bad_id, composite):
    """Keras 3's lookup reads -1 and -V as rows V - 1 and 0 (a GPU's reads V as zeros): the Embedding rule refuses
    them, with one message whether the Embedding is tapped itself or is the token table of a composite's rule (whose
    own lookup, not tapped, may refuse first on the CPU)."""
    keras.utils.set_random_seed(0)
    if composite:
        model = _registered_classifier(learned_positions=False)
    else:
        model = keras.Sequential(
            [keras.Input((5,), dtype="int32"), keras.layers.Embedding(12, 4), keras.layers.GlobalAveragePooling1D()]
            + [keras.layers.Dense(3)]
        )
    x = np.random.default_rng(3).integers(0, 12, size=(4, 5)).astype(np.int32)
    x[1, 2] = bad_id
    y = tf.constant([0, 1, 2, 0], tf.int32)
    model(x[:1])
    refusal = r"Embedding '[a-z_0-9]+' received an id outside \[0, 12\) \(its input_dim\): map the ids into 0..11"
    if composite:  # or its own lookup on the CPU, not tapped: id V on Keras 3, any id outside on Keras 2
        refusal += f"|indices\\[1,2\\] = {bad_id} is not in \\[0, 12\\)"
    with pytest.raises(tf.errors.InvalidArgumentError, match=refusal):
        per_example.clipped_gradient_sum(
            model, LOSS, tf.constant(x), y, None, 0.1, model.trainable_variables, method="ghost"
        )
