"""Where a TensorFlow DP optimizer's randomness comes from: a generator of its own, seeded from OS entropy, never saved.

Noise that can be predicted, repeated or cancelled protects nothing: TensorFlow's stateful random ops follow the
global seed (two runs after ``set_random_seed(0)`` draw the same noise, and two updates with the same noise can be
subtracted), and a generator whose state were checkpointed would be rewound by every restore. `NoiseSource` holds a
Philox `tf.random.Generator` that is seeded with 192 bits of OS entropy when the optimizer is built (whatever the
global seed), lives in a plain Python object (no checkpoint, SavedModel or ``.keras`` file contains its state) and
advances on every draw, in eager mode, in a ``tf.function``, under XLA and in a ``steps_per_execution`` loop.
``noise_seed`` (`keras_dyndp.noise_seed`) makes it reproducible for tests only: whoever knows the seed can remove the
noise (a `NoiseSeedWarning` says so), and it is never serialised. As in TF-Privacy and Opacus's default mode, the
generator is not a cryptographically secure one.
"""

from __future__ import annotations

import tensorflow as tf

from keras_dyndp import noise_seed as noise_seed_module
from keras_dyndp.noise_seed import NoiseSeedWarning  # noqa: F401  (re-exported: keras_dyndp.tf_backend names it)

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
