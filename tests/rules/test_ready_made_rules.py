"""keras_dyndp.rules.layer_rules' ready-made rules on layers of their own (on KerasHub's:
tests/rules/test_keras_hub_rules.py), on the backend Keras runs on: each rule's per-example squared norms and clipped
sums equal brute-force per-example gradients (`rule_brute_force`)."""

import numpy as np
import pytest

from keras_dyndp import backend  # noqa: E402

keras = backend.keras_module()  # tf_keras where TF_USE_LEGACY_KERAS is set
if not hasattr(keras, "ops"):
    pytest.skip("the ready-made rules need Keras 3's keras.ops", allow_module_level=True)

import rule_brute_force  # noqa: E402

import keras_dyndp  # noqa: E402
from keras_dyndp.rules import layer_rules  # noqa: E402
from keras_dyndp.rules import registry  # noqa: E402

LENGTH, WIDTH = 5, 4


class _NormOverTheSecondLast(keras.layers.Layer):
    """An RMS norm over axis -2, its scale the positions' (`rms_normalization(axis=-2)`)."""

    def build(self, input_shape):
        self.gain = self.add_weight(shape=(input_shape[-2],), initializer="ones", name="gain")
        self.eps = 1e-3

    def call(self, x):
        normed = x * keras.ops.rsqrt(keras.ops.mean(keras.ops.square(x), axis=-2, keepdims=True) + self.eps)
        return normed * self.gain[:, None]


def test_the_rms_rule_takes_the_attributes_and_axis_it_is_given():
    try:
        keras_dyndp.register_layer_rule(_NormOverTheSecondLast, **layer_rules.rms_normalization("gain", "eps", axis=-2))
        layer = rule_brute_force.built(_NormOverTheSecondLast(), (LENGTH, WIDTH))
        rng = np.random.default_rng(4)
        a = rng.normal(size=(rule_brute_force.BATCH, LENGTH, WIDTH)).astype("float32")
        rule_brute_force.assert_rule_matches_brute_force(layer, a, rng.normal(size=a.shape).astype("float32"))
    finally:
        registry.registered().pop(_NormOverTheSecondLast, None)
    with pytest.raises(ValueError, match="must count from the last axis"):
        layer_rules.rms_normalization(axis=1)


class _LongPositions(keras.layers.Layer):
    """Adds rows 0..L-1 of its (L + 2, d) table to its input [..., L, d] (`added_weight`)."""

    def build(self, input_shape):
        self.table = self.add_weight(shape=(input_shape[-2] + 2, input_shape[-1]), name="table")

    def call(self, x):
        return x + self.table[: x.shape[-2]]


def test_an_added_weight_longer_than_the_input_gets_its_first_rows():
    try:
        keras_dyndp.register_layer_rule(_LongPositions, **layer_rules.added_weight("table"))
        layer = rule_brute_force.built(_LongPositions(), (LENGTH, WIDTH))
        rng = np.random.default_rng(5)
        a = rng.normal(size=(rule_brute_force.BATCH, 2, LENGTH, WIDTH)).astype("float32")  # summed over axis 1 too
        rule_brute_force.assert_rule_matches_brute_force(layer, a, rng.normal(size=a.shape).astype("float32"))
    finally:
        registry.registered().pop(_LongPositions, None)
