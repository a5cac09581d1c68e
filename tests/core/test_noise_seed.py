"""Tests for keras_dyndp.core.noise_seed: OS entropy by default, reproducible bits from a seed, with a warning."""

import warnings

import pytest

from keras_dyndp.core import noise_seed


def test_os_entropy_differs_and_a_seed_repeats():
    assert noise_seed.state_seed(None, 128) != noise_seed.state_seed(None, 128)
    assert noise_seed.state_seed(7, 192) == noise_seed.state_seed(7, 192)
    assert noise_seed.state_seed(7, 192) != noise_seed.state_seed(8, 192)
    assert 0 <= noise_seed.state_seed(7, 64) < 2**64
    assert noise_seed.state_seed(7, 128) < 2**128


@pytest.mark.parametrize("bad", [-1, 1.5, "3", True])
def test_bad_seeds_are_refused(bad):
    with pytest.raises(ValueError, match="`noise_seed` must be None"):
        noise_seed.check_noise_seed(bad)


def test_a_seed_warns_at_the_given_frame_and_none_is_silent():
    def constructor(seed):
        return noise_seed.check_and_warn(seed, stacklevel=2)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert constructor(None) is None
        assert constructor(3) == 3
    assert len(caught) == 1 and issubclass(caught[0].category, noise_seed.NoiseSeedWarning)
    assert caught[0].filename == __file__ and "no privacy" in str(caught[0].message)
