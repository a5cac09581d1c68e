"""The `noise_seed` argument of the DP optimizers, on every backend: OS entropy unless a seed is given.

Noise that can be predicted, repeated or cancelled protects nothing, so each backend's random source
(`keras_dyndp.tf_backend.noise_source` for TensorFlow, `keras_dyndp.jax_backend.noise` for JAX) is seeded here:
by default with bits from `secrets` (the OS's entropy), fresh in every process and for every optimizer, whatever
Keras's global seed; with an integer `noise_seed`, with bits derived from it by `numpy.random.SeedSequence`, for
tests and research only (a `NoiseSeedWarning` says why). The seed is never serialised by the optimizers.
"""

from __future__ import annotations

import secrets
import warnings

import numpy as np

from keras_dyndp import validation


class NoiseSeedWarning(UserWarning):
    """A known `noise_seed` makes the DP noise reproducible, hence removable: unfit for a released model."""


def check_noise_seed(noise_seed) -> int | None:
    """Returns `noise_seed` as an int (None stays None).

    Raises:
      ValueError: if `noise_seed` is not None or an integer >= 0.
    """
    return validation.check_int(
        "noise_seed", noise_seed, 0, none_means="fresh OS entropy, the only choice for a model you release"
    )


def check_and_warn(noise_seed, stacklevel: int) -> int | None:
    """`check_noise_seed`, and a `NoiseSeedWarning` (attributed ``stacklevel`` frames up) when a seed is given."""
    noise_seed = check_noise_seed(noise_seed)
    if noise_seed is not None:
        warnings.warn(
            f"noise_seed={noise_seed} makes the DP noise reproducible: anyone who knows the seed can regenerate "
            "the noise and subtract it from the released updates, so the model has no privacy. Use it for tests "
            "and research only; leave noise_seed=None (OS entropy) for a model you release.",
            NoiseSeedWarning,
            stacklevel=stacklevel + 1,
        )
    return noise_seed


def state_seed(noise_seed: int | None, bits: int) -> int:
    """A ``bits``-bit integer: from OS entropy when ``noise_seed`` is None, else derived from it."""
    if noise_seed is None:
        return secrets.randbits(bits)
    words = np.random.SeedSequence(noise_seed).generate_state(-(-bits // 64), dtype=np.uint64)
    return sum(int(word) << (64 * index) for index, word in enumerate(words)) % (1 << bits)
