"""Random layers in the DP step: one draw per step from a secret source, the same for every example (why:
docs/privacy.md, "Randomness"). `secret_randomness` draws one seed per step from a secret generator (the optimizer's,
in ``make_private``) for all the model's random layers, and Dropout draws one mask for all rows; on the vectorized
path each example runs alone with that seed. Random ops outside Keras's random layers are not covered."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from collections.abc import Iterator

import tensorflow as tf

from keras_dyndp.tf_backend import keras_compat
from keras_dyndp.tf_backend import noise_source
from keras_dyndp.tf_backend.keras_compat import keras

_default: list[noise_source.NoiseSource] = []


@contextlib.contextmanager
def secret_randomness(
    model: keras.Model, generator: tf.random.Generator | None = None, seed: tf.Tensor | None = None
) -> Iterator[None]:
    """Within the block, ``model``'s random layers draw from one seed of ``generator`` (None: this process's own,
    OS-seeded, never saved), or from ``seed`` (int64 [2]; a trace that is never run), and its Dropout layers one mask
    for all rows. Blocks nest: each restores what it replaced."""

    def draw_seed() -> tf.Tensor:
        if seed is not None:
            return seed
        if generator is not None:
            return generator.uniform_full_int([2], tf.int64)
        if not _default:
            _default.append(noise_source.NoiseSource())
        return _default[0].generator.uniform_full_int([2], tf.int64)

    dropouts = [layer for layer in keras_compat.flatten_layers(model) if type(layer) is keras.layers.Dropout]
    calls = [(layer, "call", _one_mask_for_all_rows(layer)) for layer in dropouts]
    with keras_compat.patched_attributes(calls), keras_compat.layer_randomness_from(model, draw_seed):
        yield


def _one_mask_for_all_rows(layer: keras.layers.Layer) -> Callable:
    """The Dropout layer's call with ``noise_shape`` 1 on the batch axis (its own ``noise_shape`` elsewhere)."""
    call = type(layer).call.__get__(layer)

    def one_mask_call(inputs, *args, **kwargs):
        own = layer.noise_shape
        shared = (1, *(own[1:] if own is not None else [None] * (len(inputs.shape) - 1)))
        with keras_compat.patched_attributes([(layer, "noise_shape", shared)]):  # Not tracked (Keras would wrap it).
            return call(inputs, *args, **kwargs)

    return one_mask_call
