"""Ghost-clipping rule for ``LSTM`` (no mask, dropout, state, reversal or time-major input).

The tapped call re-runs the recurrence with ``tf.scan`` so that the gradient of the gate pre-activations and the
previous hidden states are available: kernel, recurrent kernel and bias are then sequence Dense rules.
"""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf

from keras_dyndp.tf_backend.keras_compat import keras
from keras_dyndp.tf_backend.per_example import norms
from keras_dyndp.tf_backend.per_example.taps import GhostGradient
from keras_dyndp.tf_backend.per_example.taps import Tap
from keras_dyndp.tf_backend.per_example.taps import UnsupportedModel


def supports(layer: keras.layers.RNN) -> bool:
    """Not stateful, reversed, time-major (Keras 2 only) or with dropout (the LSTM and GRU rules' conditions)."""
    return not (
        layer.stateful
        or layer.go_backwards
        or getattr(layer, "time_major", False)
        or layer.dropout
        or layer.recurrent_dropout
    )


def call(tap: Tap) -> Callable:
    """LSTM's call for the tapped pass: the input projection x_t W + b as one tensor (recorded), then the
    recurrence with ``tf.scan``, keeping the previous hidden states for the recurrent kernel's norms."""
    layer = tap.layer
    cell = layer.cell

    def lstm_call(inputs, mask=None, training=None, initial_state=None, **kwargs):
        del training
        if mask is not None or initial_state is not None or kwargs:
            raise UnsupportedModel(f"LSTM {layer.name!r} called with a mask or an initial state")
        inputs = tap.guard(tf.cast(inputs, cell.kernel.dtype))
        input_projection = tf.tensordot(inputs, tap.weight(cell.kernel), axes=[[2], [0]])
        if cell.use_bias:
            input_projection = input_projection + tap.weight(cell.bias)
        recurrent_kernel = tap.weight(cell.recurrent_kernel)
        tap.record(inputs, input_projection)  # Before the recurrence, so that the tape records it.
        batch = tf.shape(inputs)[0]
        zeros = tf.zeros(tf.stack([batch, cell.units]), inputs.dtype)

        def step(carry, projection_t):
            h_prev, c_prev = carry
            z = projection_t + tf.matmul(h_prev, recurrent_kernel)
            z_i, z_f, z_c, z_o = tf.split(z, 4, axis=1)
            c = cell.recurrent_activation(z_f) * c_prev + cell.recurrent_activation(z_i) * cell.activation(z_c)
            h = cell.recurrent_activation(z_o) * cell.activation(c)
            return h, c

        hs, cs = tf.scan(step, tf.transpose(input_projection, [1, 0, 2]), initializer=(zeros, zeros))
        # h_{t-1} for t = 0..T-1: the initial zeros, then hs shifted by one step (no third scan output to stack).
        tap.saved["previous_hidden_states"] = tf.transpose(tf.concat([zeros[None], hs[:-1]], axis=0), [1, 0, 2])
        output = tf.transpose(hs, [1, 0, 2]) if layer.return_sequences else hs[-1]
        if layer.return_state:
            return [output, hs[-1], cs[-1]]
        return output

    return lstm_call


def norms_and_sums(tap: Tap, g: tf.Tensor) -> list[GhostGradient]:
    """g is the gradient of the input projection x_t W + b, equal to that of the gate pre-activations z_t."""
    cell = tap.layer.cell
    g = norms.flatten_positions(g, tap.rows)
    previous_hidden_states = tap.saved["previous_hidden_states"]
    gradients = [
        norms.bilinear_gradient(variable, norms.flatten_positions(activations, tap.rows), g)
        for variable, activations in ((cell.kernel, tap.inputs), (cell.recurrent_kernel, previous_hidden_states))
    ]
    if cell.use_bias:
        gradients.append(norms.bias_gradient(cell.bias, g))
    return gradients
