"""Per-example squared norms and clipped sums from a layer's recorded inputs and output gradients: the building
blocks of the layer rules. A weight used as ``a_t W`` at T positions has G_i = a_i^T g_i (`bilinear_norms_and_sum`,
in `keras_dyndp.rules.ghost_cost`'s form for the shapes); a bias has sum_t g_{i,t}."""

from __future__ import annotations

import sys
from collections.abc import Callable

import tensorflow as tf
from tensorflow.python.ops import control_flow_util  # pylint: disable=g-direct-tensorflow-import

from keras_dyndp.rules import ghost_cost
from keras_dyndp.rules import layer_rules
from keras_dyndp.tf_backend.keras_compat import keras
from keras_dyndp.tf_backend.per_example.taps import GhostGradient
from keras_dyndp.tf_backend.per_example.taps import Rows


def in_xla() -> bool:
    """Whether the graph being built is compiled by XLA (``jit_compile``)."""
    return control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())


def squared_norms(tensor: tf.Tensor, axis: int | list[int]) -> tf.Tensor:
    """Sum of squares over ``axis``: ``reduce_euclidean_norm`` squared (one fused kernel, faster on CPU than
    ``reduce_sum(square(.))``), except under XLA, which has no kernel for it but fuses the latter."""
    if in_xla():
        return tf.reduce_sum(tf.square(tensor), axis=axis)
    return tf.square(tf.math.reduce_euclidean_norm(tensor, axis=axis))


def rows_by_index(rows: tf.Tensor, index: tf.Tensor, weights: tf.Tensor, num_rows: tf.Tensor | int) -> tf.Tensor:
    """[num_rows, d]: row j = sum of ``weights[n] rows[n]`` over the ``rows`` [N, d] whose ``index`` [N] (int32, in
    [0, num_rows)) is j, as a sparse weight matrix times ``rows`` (one pass, fastest on CPU: docs/performance.md;
    XLA has no kernel for it). Send rows that are not finite to a row of their own: weight 0 times them is NaN."""
    shape = tf.stack([tf.cast(num_rows, tf.int64), tf.shape(rows, out_type=tf.int64)[0]])
    return tf.raw_ops.SparseTensorDenseMatMul(
        a_indices=_entries(index), a_values=tf.cast(weights, rows.dtype), a_shape=shape, b=rows
    )


def _entries(index: tf.Tensor) -> tf.Tensor:
    """int32 [N, 2]: (index[n], n), as the halves of one int64 (a bitcast: ``tf.stack`` copies element by element)."""
    columns = tf.range(tf.shape(index, out_type=tf.int64)[0], dtype=tf.int64) * 2**32
    entries = tf.bitcast(tf.cast(index, tf.int64) + columns, tf.int32)
    return entries if sys.byteorder == "little" else tf.reverse(entries, [1])  # the low half first


def flatten_positions(tensor: tf.Tensor, rows: Rows) -> tf.Tensor:
    """A tapped tensor [rows, ..., d] as [B, T, d]: each example's positions, its folded time steps included
    (TimeDistributed's rows are example-major, so a reshape to B rows groups them)."""
    if rows.fold == 1 and tensor.shape.rank == 2:
        return tensor[:, None, :]
    per_row = tensor.shape[1:-1].num_elements()
    positions = None if rows.fold is None or per_row is None else rows.fold * per_row
    flat = tf.reshape(tensor, [rows.batch, -1, tensor.shape[-1]])
    flat.set_shape([None, positions, tensor.shape[-1]])
    return flat


def bilinear_norms_and_sum(a: tf.Tensor, g: tf.Tensor) -> tuple[tf.Tensor, Callable[[tf.Tensor], tf.Tensor]]:
    """Squared norms of G_i = a_i^T g_i (a: [B, T, k], g: [B, T, c]), never below the exact ones (float32 rounding
    included, `keras_dyndp.rules.ghost_cost.rounding_coefficients`), and a function factors -> sum f_i G_i."""
    positions, fan_in, fan_out = a.shape[1], a.shape[-1], g.shape[-1]
    kept, scaled = layer_rules.kept_rows, layer_rules.scaled_rows
    if positions == 1:  # ||a^T g||^2 = ||a||^2 ||g||^2: no cancellation
        a2, g2 = a[:, 0, :], g[:, 0, :]
        squared = squared_norms(a2, 1) * squared_norms(g2, 1)
        return squared, lambda f: tf.matmul(kept(a2, f), scaled(g2, f), transpose_a=True)
    form = ghost_cost.form(positions, fan_in, fan_out)
    book_keeping = lambda f: tf.einsum("btk,btc->kc", kept(a, f), scaled(g, f))  # noqa: E731
    if form == ghost_cost.GRAM:
        gram_a = tf.matmul(a, a, transpose_b=True)
        gram_g = tf.matmul(g, g, transpose_b=True)
        return bounded_by_rounding(tf.reduce_sum(gram_a * gram_g, axis=[1, 2]), a, g, form), book_keeping
    # TF's own (Eigen) batched matmul is faster on CPU with the larger of k and c as the output's last axis
    # (G_i [B, k, c] or G_i^T [B, c, k]); with oneDNN the order makes no difference.
    transposed = fan_out < fan_in
    per_example = tf.matmul(g, a, transpose_a=True) if transposed else tf.matmul(a, g, transpose_a=True)
    squared = squared_norms(per_example, [1, 2])
    if form == ghost_cost.PER_EXAMPLE_NORMS:
        return bounded_by_rounding(squared, a, g, form), book_keeping
    if transposed:
        return squared, lambda f: tf.transpose(layer_rules.weighted_sum(f, per_example))
    return squared, lambda f: layer_rules.weighted_sum(f, per_example)


def bounded_by_rounding(squared: tf.Tensor, a: tf.Tensor, g: tf.Tensor, form: str) -> tf.Tensor:
    """``squared`` [B] of the bilinear a_i^T g_i (a: [B, T, k], g: [B, T, c]; an embedding's rows of g by id: a = 1)
    computed in ``form``, raised to the float32 rounding bound (`ghost_cost.bounded_squared_norms`)."""
    positions = a.shape[1] if a.shape[1] is not None else tf.cast(tf.shape(a)[1], tf.float32)
    second, first = ghost_cost.rounding_coefficients(form, positions, a.shape[-1], g.shape[-1])
    magnitude = tf.reduce_sum(tf.norm(a, axis=2) * tf.norm(g, axis=2), axis=1)  # sum_t ||a_t|| ||g_t||
    return ghost_cost.bounded_squared_norms(tf, squared, magnitude, second, first)


def bilinear_gradient(variable: tf.Variable, a: tf.Tensor, g: tf.Tensor) -> GhostGradient:
    """The per-example gradients G_i = a_i^T g_i of a weight ``variable`` (a: [B, T, k], g: [B, T, c])."""
    return GhostGradient(variable, *bilinear_norms_and_sum(a, g))


def bias_gradient(variable: tf.Variable, g: tf.Tensor) -> GhostGradient:
    """The per-example gradients sum_t g_{i,t} of a bias ``variable`` added at every position (g: [B, T, c])."""
    return materialised_gradient(variable, tf.reduce_sum(g, axis=1))


def with_bias(owner: keras.layers.Layer, g: tf.Tensor, gradients: list[GhostGradient]) -> list[GhostGradient]:
    """``gradients``, then ``owner.bias``'s `bias_gradient` (g: [B, T, c]) where ``owner`` uses a bias."""
    return [*gradients, bias_gradient(owner.bias, g)] if owner.use_bias else gradients


def summed_gradient(variable: tf.Variable, per_row: tf.Tensor, axes: list[int], batch: tf.Tensor) -> GhostGradient:
    """A variable broadcast along ``axes`` of a tapped tensor's rows: the gradient per row ``per_row`` summed over
    ``axes`` and over each of the ``batch`` examples' rows, materialised."""
    per_row = tf.reduce_sum(per_row, axis=axes) if axes else per_row
    per_row = tf.reshape(per_row, [batch, -1, variable.shape.num_elements()])
    return materialised_gradient(variable, tf.reshape(tf.reduce_sum(per_row, axis=1), [-1, *variable.shape]))


def materialised_gradient(variable: tf.Variable, per_example: tf.Tensor) -> GhostGradient:
    """A variable's per-example gradients given as such: ``per_example`` [B, *variable.shape]."""
    axes = list(range(1, per_example.shape.rank))
    return GhostGradient(variable, squared_norms(per_example, axes), lambda f: layer_rules.weighted_sum(f, per_example))
