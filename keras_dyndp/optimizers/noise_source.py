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

import tensorflow as tf

from keras_dyndp import noise_seed as noise_seed_module
from keras_dyndp.noise_seed import NoiseSeedWarning  # noqa: F401  (re-exported: keras_dyndp.optimizers names it)

_STATE_BITS = 192  # Philox: a 128-bit counter and a 64-bit key.


class NoiseSource:
    """The `tf.random.Generator` of one DP optimizer, out of reach of checkpoints and of the global seed.

    Args:
      noise_seed: None (default) seeds from OS entropy; an integer >= 0 gives reproducible draws and a
        `NoiseSeedWarning`, since the noise is then known to whoever knows the seed.
    """

    def __init__(self, noise_seed: int | None = None):
        noise_seed = noise_seed_module.check_and_warn(noise_seed, stacklevel=4)
        self._reproducible = noise_seed is not None
        with tf.init_scope():
            state = noise_seed_module.state_seed(noise_seed, _STATE_BITS)
            self._generator = tf.random.Generator.from_seed(state, alg="philox")

    @property
    def generator(self) -> tf.random.Generator:
        """The generator; every draw advances it."""
        return self._generator

    @property
    def reproducible(self) -> bool:
        """Whether the draws follow a user-given `noise_seed` (True) or OS entropy (False)."""
        return self._reproducible
