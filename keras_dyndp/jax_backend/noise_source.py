"""A JAX DP optimizer's randomness: a secret base key in host memory, written into the never-saved run state, and each
step's keys (`step_key`). How and why: docs/jax.md, "What JAX does its own way"; docs/privacy.md, "Randomness"."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from keras_dyndp.core import noise_seed as noise_seed_module
from keras_dyndp.jax_backend import distribution

NOISE, MICROBATCHES, LAYER_SEEDS = range(3)  # The purposes `step_key` folds in: one key for each use.
KEY_WORDS = slice(3, 5)  # The base key's two int32 words in a run state [nonce, refusal, its count, key, key].


class NoiseSource:
    """The base key and run nonces of one DP optimizer; ``noise_seed`` None draws the key from OS entropy, an int
    >= 0 (tests) warns. A plain object, so nothing of it is saved."""

    def __init__(self, noise_seed: int | None = None):
        # Attributed to the caller of the optimizer's constructor (DPOptimizerBase.__init__, _build_dp_state, here).
        noise_seed = noise_seed_module.check_and_warn(noise_seed, stacklevel=4)
        self.base_key = distribution.agreed(  # Process 0's under several processes: one program, one noise.
            np.asarray(divmod(noise_seed_module.state_seed(noise_seed, 64), 2**32), np.uint32)
        )
        self._runs = 0  # The last run nonce handed out: nonces only grow, whatever the run state is restored to.

    def fresh_run_state(self, with_key: bool) -> np.ndarray:
        """A run state with a never-used nonce, no refusal, the base key's words or zeros."""
        self._runs += 1
        key_words = self.base_key.view(np.int32) if with_key else np.zeros(2, np.int32)
        return np.concatenate([np.asarray([self._runs, 0, 0], np.int32), key_words])


def step_key(run_state: jax.Array, step: jax.Array, purpose: int) -> jax.Array:
    """The secret key of step ``step`` for ``purpose``: the base key, read from ``run_state`` (a runtime input,
    never a constant of the compiled step), folded with the run nonce, the step and ``purpose``."""
    words = jax.lax.bitcast_convert_type(run_state[KEY_WORDS], jnp.uint32)
    key = jax.random.wrap_key_data(words, impl="threefry2x32")
    for data in (run_state[0], step, purpose):
        key = jax.random.fold_in(key, data)
    return key
