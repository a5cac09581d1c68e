"""``TimeDistributed`` in the tapped pass: the fold of time steps into rows, done where the taps can see it.

Keras folds [B, T, ...] into [B * T, ...] example-major only when the batch size is unknown (else it loops over
the steps). In the tapped pass the wrapper's call is replaced by one that always folds and pushes the fold onto
the `Tapping`'s rows, so that the rules inside know that example b owns T consecutive rows.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import tensorflow as tf

from keras_dyndp.tf_backend import keras_compat
from keras_dyndp.tf_backend.keras_compat import keras
from keras_dyndp.tf_backend.per_example.taps import Tapping
from keras_dyndp.tf_backend.per_example.taps import UnsupportedModel


def call(tapping: Tapping, layer: keras.layers.TimeDistributed) -> Callable:
    """The wrapper's call for the tapped pass: folds, pushes the fold onto the rows, and unfolds the outputs."""
    inner = layer.layer
    inner_takes_mask = "mask" in inspect.signature(type(inner).call).parameters

    def time_distributed_call(inputs, training=None, mask=None):
        if not isinstance(inputs, tf.Tensor) or (mask is not None and inner_takes_mask):
            raise UnsupportedModel(f"TimeDistributed {layer.name!r} received a nested, ragged or masked input")
        inputs = tapping.guard(inputs, f"the input of TimeDistributed {layer.name!r}")
        folded = tf.reshape(inputs, tf.concat([[-1], tf.shape(inputs)[2:]], axis=0))
        folded.set_shape(tf.TensorShape([None]).concatenate(inputs.shape[2:]))
        tapping.rows.append(tapping.rows[-1].times(tf.shape(inputs)[1], inputs.shape[1]))
        try:
            outputs = inner(folded, training=training)
        finally:
            tapping.rows.pop()

        def unfold(output):
            unfolded = tf.reshape(output, tf.concat([tf.shape(inputs)[:2], tf.shape(output)[1:]], axis=0))
            unfolded.set_shape(inputs.shape[:2].concatenate(output.shape[1:]))
            return unfolded

        return tf.nest.map_structure(unfold, outputs)

    return time_distributed_call


def compute_mask(layer: keras.layers.TimeDistributed) -> Callable:
    """TimeDistributed's output mask: None, as no mask enters (see above) and none is made inside.

    Keras's own ``compute_mask`` re-runs a functional inner model, which would record every tap twice.
    """
    inner = layer.layer
    sublayers = [inner, *keras_compat.flatten_layers(inner)]
    makes_masks = any(isinstance(sub, keras.layers.Masking) or getattr(sub, "mask_zero", False) for sub in sublayers)

    def time_distributed_mask(inputs, mask=None):
        del inputs
        if mask is not None or makes_masks:
            raise UnsupportedModel(f"TimeDistributed {layer.name!r} carries a mask")
        return None

    return time_distributed_mask
