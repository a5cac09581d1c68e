"""Brute-force references for the rule tests of tests/rules (any backend, Keras 3): each example's gradients of a
layer's weights by the backend's vjp of the layer's own call, one example at a time."""

import keras
import numpy as np

from keras_dyndp import backend
from keras_dyndp.rules import registry

FACTORS = np.array([0.5, 0.0, 2.0], "float32")  # the clip factors the sums are checked at: one example left out
BATCH = len(FACTORS)


def built(layer, shape, dtype="float32"):
    """``layer`` built on inputs [BATCH, *shape], its trainable weights set to random values (not their init)."""
    layer(np.zeros((BATCH, *shape), dtype))
    rng = np.random.default_rng(1)
    for variable in layer.trainable_variables:
        variable.assign(rng.normal(size=variable.shape).astype("float32"))
    return layer


def _per_example_gradients(layer, a, g, **call_kwargs):
    """Each example's gradients of <layer(a_i), g_i> with respect to the layer's trainable weights (float64)."""
    vjp = backend.implementation("ops").vjp
    non_trainable = [keras.ops.convert_to_tensor(np.asarray(v)) for v in layer.non_trainable_variables]
    gradients = []
    for i in range(len(a)):

        def call(values, i=i):
            return layer.stateless_call(values, non_trainable, a[i : i + 1], **call_kwargs)[0]

        values = [keras.ops.convert_to_tensor(np.asarray(v)) for v in layer.trainable_variables]
        gradients.append([_dense(grad) for grad in vjp(call, values, keras.ops.convert_to_tensor(g[i : i + 1]))])
    return gradients


def _dense(gradient):
    """A gradient as a float64 array (TensorFlow's IndexedSlices of a lookup added into its rows)."""
    if hasattr(gradient, "indices") and hasattr(gradient, "dense_shape"):
        dense = np.zeros(np.asarray(gradient.dense_shape), np.float64)
        np.add.at(dense, np.asarray(gradient.indices), np.asarray(gradient.values, np.float64))
        return dense
    return np.asarray(gradient, np.float64)


def assert_rule_matches_brute_force(layer, a, g):
    """The registered rule's squared norms and clipped sums ([B, 1, ...] inputs) equal the brute-force ones."""
    rule = registry.rule_for(layer)
    assert rule is not None and rule.variables is not None
    by_variable = {id(v): i for i, v in enumerate(layer.trainable_variables)}
    order = [by_variable[id(v)] for v in rule.variables(layer)]
    assert sorted(order) == list(range(len(layer.trainable_variables)))  # every trainable weight covered
    gradients = _per_example_gradients(layer, a, g)
    squared, sums = rule.norms_and_sums(layer, *(keras.ops.convert_to_tensor(x[:, None]) for x in (a, g)))
    expected = [sum(np.sum(grad**2) for grad in grads) for grads in gradients]
    np.testing.assert_allclose(np.asarray(squared), expected, rtol=2e-5)
    factors = FACTORS
    for index, total in zip(order, sums(keras.ops.convert_to_tensor(factors))):
        wanted = sum(f * grads[index] for f, grads in zip(factors, gradients))
        np.testing.assert_allclose(np.asarray(total, np.float64), wanted, rtol=1e-5, atol=1e-6)
