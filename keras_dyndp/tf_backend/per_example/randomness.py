"""Random layers in the DP step: one draw per step from a secret source, the same for every example.

Dropout and Keras's other random layers draw from seeds that follow ``keras.utils.set_random_seed``, which users
publish for reproducibility. A batched forward pass then gives row i a mask that is a public function of i, so
deleting one example shifts the masks of every later example: the clipped sum moved by 3.0 C (TF 2.21, ghost path)
and 4.3 C (Keras 2, on the ghost and the vectorized path alike: ``tf.vectorized_map`` turns the legacy random op
into one batched op).

`secret_randomness` fixes both halves for the forward passes of one clipped sum:

* every random draw of the model's layers is a function of one seed drawn for the step from a secret generator
  (`keras_compat.layer_randomness_from`): ``make_private``'s step uses its DP optimizer's noise generator (OS
  entropy, never saved or restored; ``noise_seed`` makes it reproducible, with its warning), a direct call of
  ``clipped_gradient_sum`` this module's generator, seeded from OS entropy;
* no draw depends on an example's position: on the vectorized path each example runs alone with the step's seed
  (the same masks for every example), and on the batched (ghost) path ``Dropout``, the one random layer allowed
  there (`keras_dyndp.tf_backend.per_example.per_example_layers`), draws one mask for all rows (``noise_shape`` 1 on the
  batch axis), the mask each example draws alone.

Given the step's seed, each example's clipped gradient is then a function of that example alone, so deleting one
moves the clipped sum by at most C, whatever anyone knows about the seed; the secret source keeps the masks
unpredictable. Models without random layers draw nothing (their noise stream is unchanged). Random ops outside
Keras's random layers and their seed generators (``tf.random.uniform`` or ``keras.random`` with ``seed=None`` in a
custom layer) are not covered.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from collections.abc import Iterator

import tensorflow as tf

from keras_dyndp.tf_backend import keras_compat
from keras_dyndp.tf_backend import noise_source
from keras_dyndp.tf_backend.keras_compat import keras

_default: list[noise_source.NoiseSource] = []


def default_generator() -> tf.random.Generator:
    """This process's generator for random layers outside ``make_private``'s step: OS entropy, never saved."""
    if not _default:
        _default.append(noise_source.NoiseSource())
    return _default[0].generator


@contextlib.contextmanager
def secret_randomness(model: keras.Model, generator: tf.random.Generator | None = None) -> Iterator[None]:
    """Within the block, ``model``'s random layers draw from one seed of ``generator`` (None: `default_generator`),
    and its Dropout layers one mask for all rows (module docstring)."""

    def draw_seed() -> tf.Tensor:
        return (generator if generator is not None else default_generator()).uniform_full_int([2], tf.int64)

    dropouts = [layer for layer in keras_compat.flatten_layers(model) if type(layer) is keras.layers.Dropout]
    for layer in dropouts:
        layer.call = _one_mask_for_all_rows(layer)
    try:
        with keras_compat.layer_randomness_from(model, draw_seed):
            yield
    finally:
        for layer in dropouts:
            del layer.call


def _one_mask_for_all_rows(layer: keras.layers.Layer) -> Callable:
    """The Dropout layer's call with ``noise_shape`` 1 on the batch axis (its own ``noise_shape`` elsewhere)."""
    call = type(layer).call.__get__(layer)

    def one_mask_call(inputs, *args, **kwargs):
        own = layer.noise_shape
        shared = (1, *(own[1:] if own is not None else [None] * (len(inputs.shape) - 1)))
        object.__setattr__(layer, "noise_shape", shared)  # Not tracked (Keras would wrap it).
        try:
            return call(inputs, *args, **kwargs)
        finally:
            object.__setattr__(layer, "noise_shape", own)

    return one_mask_call
