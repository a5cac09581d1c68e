"""Ghost-clipping rule for ``GRU`` (no mask, dropout, state, reversal or time-major input), both reset modes.

Keras orders the gates z (update), r (reset), h (candidate) along the last axis of the kernel W [d, 3u], the
recurrent kernel U [u, 3u] and the bias. The tapped call records the input projection x_t W + b_in as one tensor
(before the recurrence) and re-runs the recurrence with ``tf.scan``, keeping each step's previous hidden state
h_{t-1} and reset gate r_t. The gradient g_t of the input projection is that of the three pre-activations, so W
and b_in are a sequence Dense of x with gradient g. For U (and the recurrent bias):

* ``reset_after=True`` (the default; bias [2, 3u] holds b_in and b_rec): the candidate's pre-activation is
  x_h + r * (h_{t-1} U + b_rec)_h, so the recurrent projection h_{t-1} U + b_rec has the gradient
  [g_z, g_r, r * g_h] and U and b_rec are a sequence Dense of h_{t-1} with that gradient.
* ``reset_after=False`` (bias [3u] is b_in): the candidate's pre-activation is x_h + (r * h_{t-1}) U_h, so U's
  z and r columns are a sequence Dense of h_{t-1} (gradient [g_z, g_r]) and its h columns one of r * h_{t-1}
  (gradient g_h).
"""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf

from keras_dyndp.tf_backend.keras_compat import keras
from keras_dyndp.tf_backend.per_example import lstm
from keras_dyndp.tf_backend.per_example import norms
from keras_dyndp.tf_backend.per_example.taps import GhostGradient
from keras_dyndp.tf_backend.per_example.taps import Tap
from keras_dyndp.tf_backend.per_example.taps import UnsupportedModel

supports = lstm.supports
"""Not stateful, reversed, time-major (Keras 2 only) or with dropout: the conditions of the LSTM rule."""


def _biases(tap: Tap) -> tuple[tf.Tensor | None, tf.Tensor | None]:
    """The input bias b_in and recurrent bias b_rec read through ``tap.weight`` (None where the cell has none)."""
    cell = tap.layer.cell
    if not cell.use_bias:
        return None, None
    bias = tap.weight(cell.bias)
    return (bias[0], bias[1]) if cell.reset_after else (bias, None)


def _step(cell: keras.layers.Layer, recurrent_kernel: tf.Tensor, recurrent_bias: tf.Tensor | None) -> Callable:
    """One step of the cell for ``tf.scan``: from (h_{t-1}, _, _) and x_t W + b_in to (h_t, h_{t-1}, r_t)."""
    units = cell.units

    def step(carry, projection_t):
        h_prev = carry[0]
        x_zr, x_h = projection_t[:, : 2 * units], projection_t[:, 2 * units :]
        if cell.reset_after:
            recurrent = tf.matmul(h_prev, recurrent_kernel)
            if recurrent_bias is not None:
                recurrent = recurrent + recurrent_bias
            z, r = tf.split(cell.recurrent_activation(x_zr + recurrent[:, : 2 * units]), 2, axis=1)
            candidate = cell.activation(x_h + r * recurrent[:, 2 * units :])
        else:
            z, r = tf.split(
                cell.recurrent_activation(x_zr + tf.matmul(h_prev, recurrent_kernel[:, : 2 * units])), 2, axis=1
            )
            candidate = cell.activation(x_h + tf.matmul(r * h_prev, recurrent_kernel[:, 2 * units :]))
        h = z * h_prev + (1 - z) * candidate
        return h, h_prev, r

    return step


def call(tap: Tap) -> Callable:
    """GRU's call for the tapped pass: the input projection x_t W + b_in as one tensor (recorded), then the
    recurrence with ``tf.scan``, keeping the previous hidden states and reset gates for the recurrent norms."""
    layer = tap.layer
    cell = layer.cell

    def gru_call(inputs, mask=None, training=None, initial_state=None, **kwargs):
        del training
        if mask is not None or initial_state is not None or kwargs:
            raise UnsupportedModel(f"GRU {layer.name!r} called with a mask or an initial state")
        inputs = tap.guard(tf.cast(inputs, cell.kernel.dtype))
        input_bias, recurrent_bias = _biases(tap)
        input_projection = tf.tensordot(inputs, tap.weight(cell.kernel), axes=[[2], [0]])
        if input_bias is not None:
            input_projection = input_projection + input_bias
        tap.record(inputs, input_projection)  # Before the recurrence, so that the tape records it.
        zeros = tf.zeros(tf.stack([tf.shape(inputs)[0], cell.units]), inputs.dtype)
        hs, h_prevs, resets = tf.scan(
            _step(cell, tap.weight(cell.recurrent_kernel), recurrent_bias),
            tf.transpose(input_projection, [1, 0, 2]),
            initializer=(zeros, zeros, zeros),
        )
        tap.saved["previous_hidden_states"] = tf.transpose(h_prevs, [1, 0, 2])
        tap.saved["reset_gates"] = tf.transpose(resets, [1, 0, 2])
        output = tf.transpose(hs, [1, 0, 2]) if layer.return_sequences else hs[-1]
        if layer.return_state:
            return [output, hs[-1]]
        return output

    return gru_call


def _column_blocks(variable: tf.Variable, blocks: list[tuple[tf.Tensor, tf.Tensor]]) -> GhostGradient:
    """A weight whose column blocks are used as a_t W_j (blocks: (a [B, T, k], g_j [B, T, c_j]) in column order):
    its per-example gradient is [a_1^T g_1, a_2^T g_2, ...], with the squared norms of the blocks adding up."""
    parts = [norms.bilinear_norms_and_sum(a, g) for a, g in blocks]
    squared = tf.add_n([part_squared for part_squared, _ in parts])
    return GhostGradient(variable, squared, lambda f: tf.concat([part_sum(f) for _, part_sum in parts], axis=1))


def _reset_after_gradients(
    cell: keras.layers.Layer, h_prev: tf.Tensor, r: tf.Tensor, g: tf.Tensor
) -> list[GhostGradient]:
    """reset_after=True: recurrent kernel (a sequence Dense of h_{t-1} with gradient [g_z, g_r, r * g_h]) and the
    bias [2, 3u], whose rows b_in and b_rec get the summed gradients of the two projections."""
    units = cell.units
    g_recurrent = tf.concat([g[..., : 2 * units], r * g[..., 2 * units :]], axis=-1)
    gradients = [norms.bilinear_gradient(cell.recurrent_kernel, h_prev, g_recurrent)]
    if cell.use_bias:
        per_example = tf.stack([tf.reduce_sum(g, axis=1), tf.reduce_sum(g_recurrent, axis=1)], axis=1)
        gradients.append(norms.materialised_gradient(cell.bias, per_example))
    return gradients


def _reset_before_gradients(
    cell: keras.layers.Layer, h_prev: tf.Tensor, r: tf.Tensor, g: tf.Tensor
) -> list[GhostGradient]:
    """reset_after=False: recurrent kernel (z and r columns from h_{t-1}, h columns from r * h_{t-1}) and the
    bias b_in [3u]."""
    units = cell.units
    blocks = [(h_prev, g[..., : 2 * units]), (r * h_prev, g[..., 2 * units :])]
    gradients = [_column_blocks(cell.recurrent_kernel, blocks)]
    if cell.use_bias:
        gradients.append(norms.bias_gradient(cell.bias, g))
    return gradients


def norms_and_sums(tap: Tap, g: tf.Tensor) -> list[GhostGradient]:
    """Kernel, recurrent kernel and bias from g, the gradient of x_t W + b_in (see the module docstring)."""
    cell = tap.layer.cell
    g = norms.flatten_positions(g, tap.rows)
    h_prev = norms.flatten_positions(tap.saved["previous_hidden_states"], tap.rows)
    r = norms.flatten_positions(tap.saved["reset_gates"], tap.rows)
    recurrent = _reset_after_gradients if cell.reset_after else _reset_before_gradients
    return [
        norms.bilinear_gradient(cell.kernel, norms.flatten_positions(tap.inputs, tap.rows), g),
        *recurrent(cell, h_prev, r, g),
    ]
