"""Where a DP optimizer's randomness comes from: a generator of its own, seeded from OS entropy, never saved.

Noise that can be predicted, repeated or cancelled protects nothing. TensorFlow's stateful random ops
(`tf.random.normal`) follow the program's global seed: two processes after `tf.keras.utils.set_random_seed(0)`
draw the same values, so a run resumed from a checkpoint repeats the noise of its first steps, and two released
updates with the same noise can be subtracted to cancel it, leaving the difference of two clipped sums in the
clear. A generator whose state were checkpointed would be rewound by every restore, with the same effect.

`NoiseSource` therefore holds a `tf.random.Generator` (Philox) that

* is seeded, by default, with 192 bits from `secrets` (the OS's entropy) when the optimizer is built: fresh in every
  process and for every optimizer, whatever the global seed;
* lives in a plain Python object, not a trackable one: `tf.train.Checkpoint`, SavedModel and `.keras` files never
  contain its state and a restore never rewinds it;
* advances on every draw: its ops are stateful ops on a resource variable, so each step draws new values in eager
  mode, in a `tf.function`, under XLA (`jit_compile=True`) and inside a `steps_per_execution` loop.

`noise_seed` (an integer) derives the 192-bit state from the seed with `numpy.random.SeedSequence`, for tests and
research that need reproducible noise. Anyone who knows the seed can regenerate the noise and subtract it from the
released updates: a model trained with a known `noise_seed` has no privacy (a `NoiseSeedWarning` says so). The
seed is never serialised (`get_config`), so an optimizer rebuilt from a saved model draws OS entropy again instead of
replaying the noise of step 0.

As in TF-Privacy and Opacus's default mode, the generator is not a cryptographically secure one; its guarantee is
that the noise cannot be predicted without the state, which never leaves the process.
"""

from __future__ import annotations

import numbers
import secrets
import warnings

import numpy as np
import tensorflow as tf

_STATE_BITS = 192  # Philox: a 128-bit counter and a 64-bit key.


class NoiseSeedWarning(UserWarning):
    """A known `noise_seed` makes the DP noise reproducible, hence removable: unfit for a released model."""


def check_noise_seed(noise_seed) -> int | None:
    """Returns `noise_seed` as an int (None stays None).

    Raises:
      ValueError: if `noise_seed` is not None or an integer >= 0.
    """
    if noise_seed is None:
        return None
    if isinstance(noise_seed, bool) or not isinstance(noise_seed, numbers.Integral) or noise_seed < 0:
        raise ValueError(
            "`noise_seed` must be None (fresh OS entropy, the only choice for a model you release) or an integer "
            f">= 0 (reproducible noise for tests and research). Received: noise_seed={noise_seed!r}."
        )
    return int(noise_seed)


def _state_seed(noise_seed: int | None) -> int:
    if noise_seed is None:
        return secrets.randbits(_STATE_BITS)
    words = np.random.SeedSequence(noise_seed).generate_state(_STATE_BITS // 64, dtype=np.uint64)
    return sum(int(word) << (64 * index) for index, word in enumerate(words))


class NoiseSource:
    """The `tf.random.Generator` of one DP optimizer, out of reach of checkpoints and of the global seed.

    Args:
      noise_seed: None (default) seeds from OS entropy; an integer >= 0 gives reproducible draws and a
        `NoiseSeedWarning`, since the noise is then known to whoever knows the seed.
    """

    def __init__(self, noise_seed: int | None = None):
        noise_seed = check_noise_seed(noise_seed)
        if noise_seed is not None:
            warnings.warn(
                f"noise_seed={noise_seed} makes the DP noise reproducible: anyone who knows the seed can regenerate "
                "the noise and subtract it from the released updates, so the model has no privacy. Use it for tests "
                "and research only; leave noise_seed=None (OS entropy) for a model you release.",
                NoiseSeedWarning,
                stacklevel=3,
            )
        self._reproducible = noise_seed is not None
        with tf.init_scope():
            self._generator = tf.random.Generator.from_seed(_state_seed(noise_seed), alg="philox")

    @property
    def generator(self) -> tf.random.Generator:
        """The generator; every draw advances it."""
        return self._generator

    @property
    def reproducible(self) -> bool:
        """Whether the draws follow a user-given `noise_seed` (True) or OS entropy (False)."""
        return self._reproducible
