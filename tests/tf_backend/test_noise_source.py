"""Tests for keras_dyndp.tf_backend.noise_source: OS entropy by default, no global seed, reproducible only on demand."""

import numpy as np
import pytest
import tensorflow as tf

from keras_dyndp.tf_backend import noise_source


def _draw(source: noise_source.NoiseSource, size: int = 1000) -> np.ndarray:
    return source.generator.normal([size]).numpy()


def test_default_sources_differ_whatever_the_global_seed():
    tf.keras.utils.set_random_seed(0)
    first = noise_source.NoiseSource()
    tf.keras.utils.set_random_seed(0)
    second = noise_source.NoiseSource()
    assert not first.reproducible
    assert abs(np.corrcoef(_draw(first), _draw(second))[0, 1]) < 0.15


def test_noise_seed_is_reproducible_warned_and_independent_of_the_global_seed():
    with pytest.warns(noise_source.NoiseSeedWarning, match="no privacy"):
        tf.keras.utils.set_random_seed(0)
        first = noise_source.NoiseSource(noise_seed=3)
    with pytest.warns(noise_source.NoiseSeedWarning):
        tf.keras.utils.set_random_seed(1)
        again = noise_source.NoiseSource(noise_seed=3)
    assert first.reproducible
    np.testing.assert_array_equal(_draw(first), _draw(again))


def test_neighbouring_seeds_give_unrelated_streams():
    # Seeding Philox's counter with the seed itself would make seed 2's stream a shifted copy of seed 1's.
    with pytest.warns(noise_source.NoiseSeedWarning):
        one, two = noise_source.NoiseSource(noise_seed=1), noise_source.NoiseSource(noise_seed=2)
    draws_one, draws_two = _draw(one, 4000), _draw(two, 4000)
    assert np.intersect1d(draws_one, draws_two).size == 0


def test_state_is_not_tracked_by_a_checkpoint(tmp_path):
    holder = tf.Module()
    holder.source = noise_source.NoiseSource()
    holder.weight = tf.Variable([1.0, 2.0])
    path = tf.train.Checkpoint(holder=holder).save(str(tmp_path / "ckpt"))
    names = [name for name, _ in tf.train.list_variables(path)]
    assert any("weight" in name for name in names)
    assert not any("source" in name or "generator" in name or "state" in name for name in names)


@pytest.mark.parametrize("noise_seed", [-1, 1.5, True, "3"])
def test_bad_noise_seed(noise_seed):
    with pytest.raises(ValueError, match=r"`noise_seed` must be None .* or an integer >= 0"):
        noise_source.NoiseSource(noise_seed=noise_seed)
