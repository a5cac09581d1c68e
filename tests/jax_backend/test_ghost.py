"""Tests for keras_dyndp.jax_backend.ghost: each rule's per-example norms and clipped sum equal those of the
per-example kernel gradients (one jax.grad per example), in the Gram and the materialised form."""

import pytest

jax = pytest.importorskip("jax")
keras = pytest.importorskip("keras")
if keras.backend.backend() != "jax":
    pytest.skip("Keras is not running on JAX (set KERAS_BACKEND=jax)", allow_module_level=True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from keras_dyndp.jax_backend import ghost  # noqa: E402

LAYERS = [  # (layer, one example's rows and shape)
    (lambda: keras.layers.Dense(3), (1, 4)),  # one position
    (lambda: keras.layers.Dense(3), (1, 2, 4)),  # 2 T^2 < p d: Gram
    (lambda: keras.layers.Dense(2), (3, 3, 3)),  # materialised; 3 rows (a model that tiles the example's row)
    (lambda: keras.layers.Conv1D(3, 3, dilation_rate=2, padding="same"), (1, 11, 2)),
    (lambda: keras.layers.Conv2D(6, 3, strides=2), (2, 7, 7, 4)),  # T = 2 * 9: Gram
    (lambda: keras.layers.Conv2D(2, 2, padding="same"), (1, 6, 5, 1)),  # T = 30: materialised
    (lambda: keras.layers.DepthwiseConv2D(3, depth_multiplier=2, strides=2, padding="same"), (2, 7, 7, 3)),
]


@pytest.mark.parametrize("make_layer, shape", LAYERS)
def test_norms_and_clipped_sum_equal_the_per_example_kernel_gradients(make_layer, shape):
    rng = np.random.default_rng(0)
    layer = make_layer()
    a = jnp.asarray(rng.normal(size=(5, *shape)), jnp.float32)
    layer.build(shape)
    rule = ghost.RULES[type(layer)]
    kernel = jnp.asarray(layer.kernel.value)
    g = jnp.asarray(rng.normal(size=jax.vmap(lambda a_i: rule.op(layer, a_i, kernel))(a).shape), jnp.float32)
    factors = jnp.asarray(rng.uniform(size=5), jnp.float32)
    with jax.default_matmul_precision("highest"):
        grads = jax.vmap(jax.grad(lambda k, a_i, g_i: jnp.sum(rule.op(layer, a_i, k) * g_i)), (None, 0, 0))(
            kernel, a, g
        )
        np.testing.assert_allclose(rule.squared_norms(layer, a, g), jnp.sum(grads**2, axis=range(1, grads.ndim)), 1e-5)
        np.testing.assert_allclose(
            ghost.clipped_sum(rule, layer, kernel, a, g, factors), jnp.tensordot(factors, grads, 1), 1e-5, 1e-6
        )


def test_embedding_norms_and_clipped_sum_equal_the_dense_per_example_gradients():
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 6, size=(5, 9))  # 9 tokens from 6 ids: repeats in every row
    deltas = rng.normal(size=(5, 9, 3))
    factors = rng.uniform(size=5)
    dense = np.zeros((5, 6, 3))
    for example in range(5):
        np.add.at(dense[example], ids[example], deltas[example])
    rule = ghost.RULES[keras.layers.Embedding]
    ids, deltas = jnp.asarray(ids), jnp.asarray(deltas, "float32")
    np.testing.assert_allclose(rule.squared_norms(None, ids, deltas), np.sum(dense**2, axis=(1, 2)), rtol=1e-5)
    sums = ghost.clipped_sum(rule, None, jnp.zeros((6, 3)), ids, deltas, jnp.asarray(factors, "float32"))
    np.testing.assert_allclose(sums, np.tensordot(factors, dense, axes=1), rtol=1e-5, atol=1e-6)
