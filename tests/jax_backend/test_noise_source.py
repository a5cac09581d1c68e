"""Tests for keras_dyndp.jax_backend.noise_source: the secret base key, the run nonces and each step's keys."""

import pytest

jax = pytest.importorskip("jax")
keras = pytest.importorskip("keras")
if keras.backend.backend() != "jax":
    pytest.skip("Keras is not running on JAX (set KERAS_BACKEND=jax)", allow_module_level=True)

import numpy as np  # noqa: E402

from keras_dyndp.core.noise_seed import NoiseSeedWarning  # noqa: E402
from keras_dyndp.jax_backend import noise_source  # noqa: E402


def test_run_states_take_never_used_nonces_and_the_key_only_when_asked():
    source = noise_source.NoiseSource()
    with_key, at_rest = source.fresh_run_state(with_key=True), source.fresh_run_state(with_key=False)
    assert (with_key[0], at_rest[0]) == (1, 2) and not with_key[1:3].any()
    np.testing.assert_array_equal(with_key[noise_source.KEY_WORDS].view(np.uint32), source.base_key)
    assert not at_rest[noise_source.KEY_WORDS].any()


def test_each_nonce_step_and_purpose_has_its_own_key_and_a_seed_reproduces_them():
    with pytest.warns(NoiseSeedWarning):
        first, second = noise_source.NoiseSource(noise_seed=3), noise_source.NoiseSource(noise_seed=3)
    run = first.fresh_run_state(with_key=True)
    np.testing.assert_array_equal(run, second.fresh_run_state(with_key=True))

    def data(run_state, step, purpose):
        return tuple(np.asarray(jax.random.key_data(noise_source.step_key(run_state, step, purpose))).tolist())

    keys = {data(run, step, purpose) for step in (0, 1) for purpose in (noise_source.NOISE, noise_source.MICROBATCHES)}
    keys.add(data(first.fresh_run_state(with_key=True), 0, noise_source.NOISE))  # the next run's nonce
    assert len(keys) == 5
