"""jax_backend.ops: JAX's primitives of the DP step behave as keras_dyndp.core.mechanism assumes."""

import os

os.environ.setdefault("KERAS_BACKEND", "jax")

import jax  # noqa: E402
import jax.extend.random  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from keras_dyndp.core import mechanism  # noqa: E402
from keras_dyndp.jax_backend import ops  # noqa: E402
from keras_dyndp.jax_backend.ops import OPS  # noqa: E402


def test_divide_no_nan_is_zero_where_the_divisor_is_zero():
    result = OPS.divide_no_nan(jnp.asarray([1.0, 2.0, 0.0]), jnp.asarray([2.0, 0.0, 0.0]))
    np.testing.assert_array_equal(np.asarray(result), [0.5, 0.0, 0.0])


def test_normals_draw_independent_standard_normals_per_tensor_from_one_key():
    tensors = [jnp.zeros((200, 50)), jnp.zeros((200, 50)), jnp.zeros(3)]
    first, second, third = OPS.normals(jax.random.key(0), tensors)
    assert first.shape == (200, 50) and third.shape == (3,) and first.dtype == jnp.float32
    assert abs(float(jnp.std(first)) - 1.0) < 0.03 and abs(float(jnp.mean(first))) < 0.03
    assert abs(float(jnp.corrcoef(first.ravel(), second.ravel())[0, 1])) < 0.03  # not the same draw twice
    repeated = OPS.normals(jax.random.key(0), tensors)[0]
    np.testing.assert_array_equal(np.asarray(first), np.asarray(repeated))  # the key alone decides the noise


def test_standard_normals_are_jax_random_normal_with_each_threefry_block_giving_two_words():
    key = jax.random.key(7)
    for size in (1, 2, 7, 1001):
        with jax.threefry_partitionable(False):
            expected = jax.random.normal(key, (size,), jnp.float32)
        drawn = jax.jit(ops.standard_normals, static_argnums=1)(key, size)
        np.testing.assert_array_equal(np.asarray(drawn), np.asarray(expected))  # JAX's transform, bit for bit
    with jax.threefry_partitionable(False):  # each of a block's two words is one draw's bits (no XOR of the two)
        bits = np.asarray(jax.random.bits(key, (4,), jnp.uint32))
    blocks = jax.extend.random.threefry_2x32(jax.random.key_data(key), jnp.arange(4, dtype=jnp.uint32))
    np.testing.assert_array_equal(bits, np.asarray(blocks))


def test_the_mechanism_over_ops_matches_its_formulas():
    norms = jnp.asarray([0.0, 0.5, 2.0, 4.0])
    np.testing.assert_allclose(np.asarray(mechanism.clip_factors(OPS, norms, 2.0)), [1.0, 1.0, 1.0, 0.5])
    np.testing.assert_array_equal(np.asarray(mechanism.clip_factors(OPS, norms, 0.0)), [0.0, 0.0, 0.0, 0.0])
    clip_norm, sigma = mechanism.schedule_values(OPS, np.asarray([1.0, 2.0]), np.asarray([3.0, 4.0]), 5, 2)
    assert (float(clip_norm), float(sigma)) == (0.0, 0.0)  # past the budget nothing is released


def test_normals_of_an_odd_total_are_the_first_of_an_even_draw():
    """XLA:CPU draws an odd count of threefry words several times slower: `_normals` draws one more."""
    key = jax.random.key(3)
    odd = OPS.normals(key, [jnp.zeros(3), jnp.zeros(())])
    even = ops.standard_normals(key, 4)
    np.testing.assert_array_equal(np.concatenate([np.asarray(odd[0]), np.asarray(odd[1])[None]]), np.asarray(even))
