"""The DP optimizers' `noise_seed`: each backend's random source is seeded from `secrets` (OS entropy, fresh in every
process and optimizer, whatever Keras's global seed: predictable noise protects nothing), or, for tests and research,
from an integer `noise_seed` via `numpy.random.SeedSequence`, with a `NoiseSeedWarning`. Never serialised."""

from __future__ import annotations

import secrets
import warnings

import numpy as np

from keras_dyndp.core import validation


class NoiseSeedWarning(UserWarning):
    """A known `noise_seed` makes the DP noise reproducible, hence removable: unfit for a released model."""


def check_noise_seed(noise_seed) -> int | None:
    """`noise_seed` as an int (None stays None); ValueError unless None or an integer >= 0."""
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
