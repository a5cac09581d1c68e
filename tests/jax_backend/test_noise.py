"""Tests for keras_dyndp.jax_backend.noise: fresh keys from OS entropy, reproducible ones from a seed."""

import pytest

jax = pytest.importorskip("jax")

import numpy as np  # noqa: E402

from keras_dyndp.jax_backend import noise  # noqa: E402
from keras_dyndp.noise_seed import NoiseSeedWarning  # noqa: E402


def test_every_draw_is_fresh_and_two_sources_differ():
    first, second = noise.NoiseSource(), noise.NoiseSource()
    draws = [first.draw_key_data() for _ in range(100)]
    assert all(d.dtype == np.uint32 and d.shape == (2,) for d in draws)
    assert len({tuple(d) for d in draws}) == 100
    assert not np.array_equal(first.draw_key_data(), second.draw_key_data())
    assert not first.reproducible


def test_a_seed_repeats_the_keys_and_warns():
    with pytest.warns(NoiseSeedWarning, match="no privacy"):
        first = noise.NoiseSource(5)
    with pytest.warns(NoiseSeedWarning):
        second = noise.NoiseSource(5)
    assert first.reproducible
    for _ in range(3):
        np.testing.assert_array_equal(first.draw_key_data(), second.draw_key_data())


def test_a_jitted_function_gets_a_fresh_key_of_the_source_at_every_call():
    with pytest.warns(NoiseSeedWarning):
        source, reference = noise.NoiseSource(3), noise.NoiseSource(3)
    draw = jax.jit(lambda: jax.random.key_data(source.jax_key()))
    first, second = np.asarray(draw()), np.asarray(draw())
    np.testing.assert_array_equal(first, reference.draw_key_data())  # the source's own draws, in order
    np.testing.assert_array_equal(second, reference.draw_key_data())
    assert not np.array_equal(first, second)
