"""A TensorFlow DP optimizer's randomness: a Philox generator of its own, seeded from OS entropy, never saved. Noise
following the global seed could be repeated and subtracted; a checkpointed generator would be rewound by a restore.
`NoiseSource` seeds with 192 bits of OS entropy and lives in a plain Python object (in no checkpoint or ``.keras``
file). ``noise_seed`` (tests only: it reveals the noise) is never saved. Not a cryptographic generator."""

from __future__ import annotations

import tensorflow as tf

from keras_dyndp.core import noise_seed as noise_seed_module
from keras_dyndp.core.noise_seed import NoiseSeedWarning  # noqa: F401  (re-exported: keras_dyndp.tf_backend names it)

_STATE_BITS = 192  # Philox: a 128-bit counter and a 64-bit key.


class NoiseSource:
    """The generator of one DP optimizer; ``noise_seed`` None seeds it from OS entropy, an int >= 0 (tests) warns."""

    def __init__(self, noise_seed: int | None = None):
        noise_seed = noise_seed_module.check_and_warn(noise_seed, stacklevel=4)
        self.reproducible = noise_seed is not None  # Whether the draws follow a user-given `noise_seed`.
        with tf.init_scope():
            state = noise_seed_module.state_seed(noise_seed, _STATE_BITS)
            self.generator = tf.random.Generator.from_seed(state, alg="philox")  # Every draw advances it.
