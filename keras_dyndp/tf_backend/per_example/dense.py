"""Ghost-clipping rules for ``Dense`` (a kernel used at every position of its input, and a bias) and ``Embedding``
(dense integer ids, no sparse or one-hot lookup)."""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf

from keras_dyndp.core import refusals
from keras_dyndp.rules import ghost_cost
from keras_dyndp.rules import layer_rules
from keras_dyndp.tf_backend.keras_compat import keras
from keras_dyndp.tf_backend.per_example import norms
from keras_dyndp.tf_backend.per_example.taps import GhostGradient
from keras_dyndp.tf_backend.per_example.taps import Tap
from keras_dyndp.tf_backend.per_example.taps import UnsupportedModel


def _dense_input(tap: Tap, inputs: tf.Tensor) -> tf.Tensor:
    if not isinstance(inputs, tf.Tensor):
        raise UnsupportedModel(f"{type(tap.layer).__name__} {tap.layer.name!r} received a non-dense input")
    return inputs


def call(tap: Tap) -> Callable:
    """Dense's call for the tapped pass: ``activation(inputs W + b)``, recording inputs and ``inputs W + b``."""
    layer = tap.layer

    def dense_call(inputs, *args, **kwargs):
        inputs = tap.guard(tf.cast(_dense_input(tap, inputs), layer.kernel.dtype))
        z = tf.tensordot(inputs, tap.weight(layer.kernel), axes=[[inputs.shape.rank - 1], [0]])
        return record_and_activate(tap, inputs, z)

    return dense_call


def record_and_activate(tap: Tap, inputs: tf.Tensor, kernel_output: tf.Tensor) -> tf.Tensor:
    """Adds the bias (if ``use_bias``; EinsumDense: if any), records (inputs, pre-activation) for the norms, and applies
    the activation."""
    layer = tap.layer
    bias = layer.bias if getattr(layer, "use_bias", True) else None
    z = kernel_output if bias is None else kernel_output + tf.cast(tap.weight(bias), kernel_output.dtype)
    tap.record(inputs, z)
    return layer.activation(z) if layer.activation is not None else z


def norms_and_sums(tap: Tap, g: tf.Tensor) -> list[GhostGradient]:
    """Kernel: G_i = a_i^T g_i over the example's positions (a sequence axis, TimeDistributed steps); bias."""
    g = norms.flatten_positions(g, tap.rows)
    kernel = norms.bilinear_gradient(tap.layer.kernel, norms.flatten_positions(tap.inputs, tap.rows), g)
    return norms.with_bias(tap.layer, g, [kernel])


def embedding_supports(layer: keras.layers.Embedding) -> bool:
    """A dense lookup (``sparse`` and Keras 2's one-hot matmul lookup are not supported)."""
    # Keras 2's Embedding keeps its lookup mode in the private `_use_one_hot_matmul` only.
    return not getattr(layer, "sparse", False) and not getattr(layer, "_use_one_hot_matmul", False)


def embedding_call(tap: Tap) -> Callable:
    """Embedding's call for the tapped pass: a gather of the rows, recording the ids and the gathered rows."""

    def call(inputs, *args, **kwargs):
        inputs = _dense_input(tap, inputs)
        inputs = inputs if inputs.dtype in (tf.int32, tf.int64) else tf.cast(inputs, tf.int32)
        inputs = tap.guard(checked_ids(tap.layer, inputs))
        z = tf.gather(tap.weight(tap.layer.embeddings), inputs)
        tap.record(inputs, z)
        return z

    return call


def checked_ids(layer: keras.layers.Layer, ids: tf.Tensor) -> tf.Tensor:
    """``ids`` once each is a row of ``layer``'s table, in [0, ``layer.input_dim``): else the step raises
    ``tf.errors.InvalidArgumentError`` at run time (`refusals.embedding_ids`; XLA drops the check, as it drops every
    Assert op). The one check of the Embedding rule, tapped itself or the sublayer of another layer's rule."""
    in_table = tf.reduce_all((ids >= 0) & (ids < tf.cast(layer.input_dim, ids.dtype)))
    refused = tf.debugging.Assert(in_table, [refusals.embedding_ids(layer.name, layer.input_dim)])
    with tf.control_dependencies([refused]):
        return tf.identity(ids)


def embedding_norms_and_sums(tap: Tap, g: tf.Tensor) -> list[GhostGradient]:
    """Example b's gradient has one row per distinct id in it: the sum of g over that id's positions
    (`_rows_per_pair`). Its squared norm is taken of those very rows, which the clipped sum then adds up (f_b times
    each: a scatter-add by id, `norms.rows_by_index`), so no rounding bound is needed (`ghost_cost.PER_EXAMPLE`). An
    id outside the table is refused (`checked_ids`). Under XLA, `_embedding_under_xla`."""
    layer = tap.layer
    batch = tap.rows.batch
    g = norms.flatten_positions(g, tap.rows)
    if norms.in_xla():
        return [_embedding_under_xla(tap, g)]
    ids = tf.reshape(checked_ids(layer, tap.inputs), [-1])
    rows = tf.reshape(g, [-1, g.shape[-1]])
    if g.shape[1] == 1:
        squared = norms.squared_norms(g, [1, 2])
        ids, examples = tf.cast(ids, tf.int32), None
    else:
        rows, ids, examples = _rows_per_pair(rows, ids, batch, layer.input_dim)
        squared = _per_example_sums(norms.squared_norms(rows, 1), examples, batch)

    def clipped_sum(f):
        return _sum_by_id(rows, ids, f if examples is None else tf.gather(f, examples), layer.input_dim)

    return [GhostGradient(layer.embeddings, squared, clipped_sum)]


def _rows_per_pair(rows: tf.Tensor, ids: tf.Tensor, batch: tf.Tensor, vocabulary: int) -> tuple:
    """``(rows, ids, examples)`` of the distinct (example, id) pairs of the B T ``ids``, example-major: each pair's row
    the sum of its ``rows`` [B T, d] (`norms.rows_by_index`); no [B, T, T] Gram matrix, no [V, d] table per example."""
    ids = tf.reshape(tf.cast(ids, tf.int64), [batch, -1])
    unique_pairs, pair_index = _unique_pairs(tf.range(tf.cast(batch, tf.int64))[:, None] * vocabulary + ids)
    pair_rows = norms.rows_by_index(rows, pair_index, tf.ones_like(pair_index, rows.dtype), tf.shape(unique_pairs)[0])
    return pair_rows, tf.cast(unique_pairs % vocabulary, tf.int32), tf.cast(unique_pairs // vocabulary, tf.int32)


_KEYS_PER_CHUNK = 8192


def _unique_pairs(keys: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """`tf.unique` of the keys [B, T] (b V + id), flattened: the distinct keys in order of first appearance and each
    key's index among them (int32), hashed in chunks of whole examples so that each hash map fits a core's cache."""
    batch, positions = keys.shape
    chunks = 8 if batch is None or positions is None else min(64, max(1, batch * positions // _KEYS_PER_CHUNK))
    bounds = tf.range(chunks + 1) * tf.shape(keys)[0] // chunks
    distinct, indices, offset = [], [], 0
    for chunk in range(chunks):
        unique, index = tf.unique(tf.reshape(keys[bounds[chunk] : bounds[chunk + 1]], [-1]))
        distinct.append(unique)
        indices.append(index + offset)
        offset += tf.shape(unique)[0]
    return tf.concat(distinct, 0), tf.concat(indices, 0)


def _sum_by_id(rows: tf.Tensor, ids: tf.Tensor, factors: tf.Tensor, vocabulary: int) -> tf.Tensor:
    """[V, d]: sum of ``factors[n] rows[n]`` by ``ids`` [N] (int32, in [0, V)). A row of factor 0 (a norm not finite,
    or C = 0) goes to row V, dropped: it adds exactly nothing (0 x inf is NaN), without a select over the rows."""
    return norms.rows_by_index(rows, tf.where(factors > 0, ids, vocabulary), factors, vocabulary + 1)[:vocabulary]


def _per_example_sums(values: tf.Tensor, examples: tf.Tensor, batch: tf.Tensor) -> tf.Tensor:
    """[B]: the sum of ``values`` over each example's pairs, ``examples`` sorted (one pass, `tf.math.segment_sum`);
    0 for examples without pairs at the end (a batch of empty sequences)."""
    sums = tf.math.segment_sum(values, examples)
    return tf.pad(sums, [[0, tf.cast(batch, tf.int32) - tf.shape(sums)[0]]])


def _embedding_under_xla(tap: Tap, g: tf.Tensor) -> GhostGradient:
    """Under XLA (static shapes): the (example, id) pairs' rows summed for the norms only, raised to float32's
    rounding bound (`ghost_cost.PER_EXAMPLE_NORMS`), and the clipped sum a scatter-add of the B T rows f_b g_t."""
    layer = tap.layer
    batch = tap.rows.batch
    ids = tf.reshape(tap.inputs, [batch, -1])
    if ids.shape[1] == 1:
        squared = norms.squared_norms(g, [1, 2])
    else:
        pairs = tf.cast(tf.range(batch), tf.int64)[:, None] * layer.input_dim + tf.cast(ids, tf.int64)
        unique_pairs, pair_index = tf.unique(tf.reshape(pairs, [-1]))
        num_pairs = tf.shape(unique_pairs)[0]
        pair_rows = tf.math.unsorted_segment_sum(tf.reshape(g, [-1, g.shape[-1]]), pair_index, num_pairs)
        squared = tf.math.unsorted_segment_sum(
            norms.squared_norms(pair_rows, 1), unique_pairs // layer.input_dim, batch
        )
        squared = norms.bounded_by_rounding(squared, tf.ones_like(g[..., :1]), g, ghost_cost.PER_EXAMPLE_NORMS)

    def clipped_sum(f):
        rows = tf.reshape(layer_rules.scaled_rows(g, f), [-1, g.shape[-1]])
        return tf.tensor_scatter_nd_add(tf.zeros_like(layer.embeddings), tf.reshape(ids, [-1, 1]), rows)

    return GhostGradient(layer.embeddings, squared, clipped_sum)
