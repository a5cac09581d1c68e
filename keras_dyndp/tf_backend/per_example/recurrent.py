"""Ghost-clipping rules for ``LSTM`` and ``GRU`` (no mask, dropout, state, reversal or time-major input). The tapped
call records the input projection x_t W + b_in (before the recurrence) and re-runs the recurrence with ``tf.scan``,
keeping what the recurrent norms need. g_t, the projection's gradient, is the gate pre-activations', so W and b_in are a
sequence Dense of x with gradient g; an LSTM's U and b one of h_{t-1}. GRU (gates z, r, h along the last axis of W [d,
3u], U [u, 3u] and the bias): with ``reset_after`` (bias [2, 3u]: b_in, b_rec) the candidate's pre-activation is x_h + r
* (h_{t-1} U + b_rec)_h, so U and b_rec are a sequence Dense of h_{t-1} with gradient [g_z, g_r, r * g_h]; without (bias
[3u]: b_in) it is x_h + (r * h_{t-1}) U_h, so U's z and r columns are a sequence Dense of h_{t-1} (gradient [g_z, g_r])
and its h columns one of r * h_{t-1} (gradient g_h)."""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf

from keras_dyndp.tf_backend.keras_compat import keras
from keras_dyndp.tf_backend.per_example import norms
from keras_dyndp.tf_backend.per_example.taps import GhostGradient
from keras_dyndp.tf_backend.per_example.taps import Tap
from keras_dyndp.tf_backend.per_example.taps import UnsupportedModel


def supports(layer: keras.layers.RNN) -> bool:
    """Not stateful, reversed, time-major (Keras 2 only) or with dropout."""
    options = (layer.stateful, layer.go_backwards, getattr(layer, "time_major", False), layer.dropout)
    return not any(options) and not layer.recurrent_dropout


def _project(tap: Tap, inputs, mask, initial_state, kwargs, bias: tf.Tensor | None) -> tuple[tf.Tensor, tf.Tensor]:
    """The projection x_t W (+ ``bias``) of the guarded inputs, recorded before the recurrence (so that the tape
    records it), time-major [T, B, 3u or 4u] for ``tf.scan``, and the zero state [B, u]."""
    layer, cell = tap.layer, tap.layer.cell
    if mask is not None or initial_state is not None or kwargs:
        raise UnsupportedModel(f"{type(layer).__name__} {layer.name!r} called with a mask or an initial state")
    inputs = tap.guard(tf.cast(inputs, cell.kernel.dtype))
    projection = tf.tensordot(inputs, tap.weight(cell.kernel), axes=[[2], [0]])
    projection = projection if bias is None else projection + bias
    tap.record(inputs, projection)
    return tf.transpose(projection, [1, 0, 2]), tf.zeros(tf.stack([tf.shape(inputs)[0], cell.units]), inputs.dtype)


def _outputs(layer: keras.layers.RNN, hs: tf.Tensor, *final_states: tf.Tensor):
    output = tf.transpose(hs, [1, 0, 2]) if layer.return_sequences else hs[-1]
    return [output, *final_states] if layer.return_state else output


def lstm_call(tap: Tap) -> Callable:
    """LSTM's call for the tapped pass, keeping the previous hidden states for the recurrent kernel's norms."""
    layer = tap.layer
    cell = layer.cell

    def call(inputs, mask=None, training=None, initial_state=None, **kwargs):
        del training
        bias = tap.weight(cell.bias) if cell.use_bias else None
        projections, zeros = _project(tap, inputs, mask, initial_state, kwargs, bias)
        recurrent_kernel = tap.weight(cell.recurrent_kernel)

        def step(carry, projection_t):
            h_prev, c_prev = carry
            z_i, z_f, z_c, z_o = tf.split(projection_t + tf.matmul(h_prev, recurrent_kernel), 4, axis=1)
            c = cell.recurrent_activation(z_f) * c_prev + cell.recurrent_activation(z_i) * cell.activation(z_c)
            return cell.recurrent_activation(z_o) * cell.activation(c), c

        hs, cs = tf.scan(step, projections, initializer=(zeros, zeros))
        # h_{t-1} for t = 0..T-1: the initial zeros, then hs shifted by one step (no third scan output to stack).
        tap.saved["previous_hidden_states"] = tf.transpose(tf.concat([zeros[None], hs[:-1]], axis=0), [1, 0, 2])
        return _outputs(layer, hs, hs[-1], cs[-1])

    return call


def lstm_norms_and_sums(tap: Tap, g: tf.Tensor) -> list[GhostGradient]:
    """Kernel, recurrent kernel and bias from g, the gradient of the gate pre-activations."""
    cell = tap.layer.cell
    g = norms.flatten_positions(g, tap.rows)
    h_prev = tap.saved["previous_hidden_states"]
    gradients = [
        norms.bilinear_gradient(variable, norms.flatten_positions(activations, tap.rows), g)
        for variable, activations in ((cell.kernel, tap.inputs), (cell.recurrent_kernel, h_prev))
    ]
    return norms.with_bias(cell, g, gradients)


def _gru_step(cell: keras.layers.Layer, recurrent_kernel: tf.Tensor, recurrent_bias: tf.Tensor | None) -> Callable:
    """One step of the cell for ``tf.scan``: from (h_{t-1}, _, _) and x_t W + b_in to (h_t, h_{t-1}, r_t)."""
    units = cell.units

    def step(carry, projection_t):
        h_prev = carry[0]
        x_zr, x_h = projection_t[:, : 2 * units], projection_t[:, 2 * units :]
        if cell.reset_after:
            recurrent = tf.matmul(h_prev, recurrent_kernel)
            recurrent = recurrent if recurrent_bias is None else recurrent + recurrent_bias
            z, r = tf.split(cell.recurrent_activation(x_zr + recurrent[:, : 2 * units]), 2, axis=1)
            candidate = cell.activation(x_h + r * recurrent[:, 2 * units :])
        else:
            z, r = tf.split(
                cell.recurrent_activation(x_zr + tf.matmul(h_prev, recurrent_kernel[:, : 2 * units])), 2, axis=1
            )
            candidate = cell.activation(x_h + tf.matmul(r * h_prev, recurrent_kernel[:, 2 * units :]))
        return z * h_prev + (1 - z) * candidate, h_prev, r

    return step


def gru_call(tap: Tap) -> Callable:
    """GRU's call for the tapped pass, keeping the previous hidden states and reset gates."""
    layer = tap.layer
    cell = layer.cell

    def call(inputs, mask=None, training=None, initial_state=None, **kwargs):
        del training
        input_bias, recurrent_bias = None, None
        if cell.use_bias:
            bias = tap.weight(cell.bias)
            input_bias, recurrent_bias = (bias[0], bias[1]) if cell.reset_after else (bias, None)
        projections, zeros = _project(tap, inputs, mask, initial_state, kwargs, input_bias)
        step = _gru_step(cell, tap.weight(cell.recurrent_kernel), recurrent_bias)
        hs, h_prevs, resets = tf.scan(step, projections, initializer=(zeros, zeros, zeros))
        tap.saved["previous_hidden_states"] = tf.transpose(h_prevs, [1, 0, 2])
        tap.saved["reset_gates"] = tf.transpose(resets, [1, 0, 2])
        return _outputs(layer, hs, hs[-1])

    return call


def gru_norms_and_sums(tap: Tap, g: tf.Tensor) -> list[GhostGradient]:
    """Kernel, recurrent kernel and bias from g, the gradient of x_t W + b_in (module docstring)."""
    cell = tap.layer.cell
    units = cell.units
    g = norms.flatten_positions(g, tap.rows)
    h_prev = norms.flatten_positions(tap.saved["previous_hidden_states"], tap.rows)
    r = norms.flatten_positions(tap.saved["reset_gates"], tap.rows)
    kernel = norms.bilinear_gradient(cell.kernel, norms.flatten_positions(tap.inputs, tap.rows), g)
    if cell.reset_after:
        g_recurrent = tf.concat([g[..., : 2 * units], r * g[..., 2 * units :]], axis=-1)
        gradients = [kernel, norms.bilinear_gradient(cell.recurrent_kernel, h_prev, g_recurrent)]
        if cell.use_bias:  # Rows b_in and b_rec get the summed gradients of the two projections.
            per_example = tf.stack([tf.reduce_sum(g, axis=1), tf.reduce_sum(g_recurrent, axis=1)], axis=1)
            gradients.append(norms.materialised_gradient(cell.bias, per_example))
        return gradients
    # U's column blocks are used as a_t U_j: its per-example gradient is [a_1^T g_1, a_2^T g_2], norms adding up.
    parts = [
        norms.bilinear_norms_and_sum(a, g_part)
        for a, g_part in ((h_prev, g[..., : 2 * units]), (r * h_prev, g[..., 2 * units :]))
    ]
    squared = tf.add_n([part_squared for part_squared, _ in parts])
    recurrent = GhostGradient(
        cell.recurrent_kernel, squared, lambda f: tf.concat([part_sum(f) for _, part_sum in parts], axis=1)
    )
    return norms.with_bias(cell, g, [kernel, recurrent])
