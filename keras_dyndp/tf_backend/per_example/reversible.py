"""TensorFlow's tapped form of the ``ReversibleEmbedding`` rule (Keras's class and KerasHub's subclass;
`keras_dyndp.rules.keras_hub_rules.reversible_embedding`), which also covers the reverse call a CausalLM's output
projection makes (``layer(h, reverse=True)``: logits h R, or h W^T with ``tie_weights``): each call of the layer in a
pass is recorded in a tap of its own, the lookup's by Embedding's rule (`dense`), the projection's as a bilinear
weight (`norms.bilinear_gradient`). Untied, the two calls train different variables (the table, ``reverse_embeddings``)
and their squared norms add up; tied, the projection's tap returns the table's gradient of both calls (`_tied`), the
lookup's none."""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf

from keras_dyndp.rules import ghost_cost
from keras_dyndp.rules import keras_hub_rules
from keras_dyndp.rules import layer_rules
from keras_dyndp.rules import sublayers
from keras_dyndp.tf_backend.keras_compat import keras
from keras_dyndp.tf_backend.per_example import dense
from keras_dyndp.tf_backend.per_example import norms
from keras_dyndp.tf_backend.per_example.taps import GhostGradient
from keras_dyndp.tf_backend.per_example.taps import Tap
from keras_dyndp.tf_backend.per_example.taps import UnsupportedModel


def supports(layer: keras.layers.Layer) -> bool:
    """`keras_hub_rules.covered_configuration`, dense ids, and every recorded call on one input, ``reverse`` or not."""
    return (
        keras_hub_rules.covered_configuration(layer)
        and dense.embedding_supports(layer)
        and all(len(args) == 1 and set(kwargs) <= {"reverse"} for args, kwargs in sublayers.recorded_calls(layer))
    )


def call(tap: Tap) -> Callable:
    """The layer's call for the tapped pass: the lookup recorded in ``tap``, each reverse call in a new tap."""
    layer = tap.layer
    lookup = dense.embedding_call(tap)

    def reversible_call(inputs, *args, **kwargs):
        if args or set(kwargs) - {"reverse"}:
            raise UnsupportedModel(f"ReversibleEmbedding {layer.name!r} was called with arguments beyond `reverse`")
        if not kwargs.get("reverse", False):
            return lookup(inputs)
        projection = Tap(layer, tap.tapping)
        tap.tapping.taps.append(projection)
        table = projection.weight(layer.embeddings if layer.tie_weights else layer.reverse_embeddings)
        kernel = tf.transpose(table) if layer.tie_weights else table
        dtype = kernel.dtype if layer.reverse_dtype is None else tf.as_dtype(layer.reverse_dtype)
        h = projection.guard(tf.cast(inputs, dtype))
        logits = tf.tensordot(h, tf.cast(kernel, dtype), axes=[[h.shape.rank - 1], [0]])
        projection.record(h, logits)
        if layer.logit_soft_cap is None:
            return logits
        return tf.tanh(logits / layer.logit_soft_cap) * layer.logit_soft_cap

    return reversible_call


def norms_and_sums(tap: Tap, g: tf.Tensor) -> list[GhostGradient]:
    """Each call's gradient of the variable it reads (module docstring), ``reverse_embeddings``'s zero where no reverse
    call read it; tied, the table's gradient of both calls together, from the projection's tap (`_tied`)."""
    layer = tap.layer
    calls = [other for other in ([tap] if tap.tapping is None else tap.tapping.taps) if other.layer is layer]
    projections = [other for other in calls if other.inputs is not None and not other.inputs.dtype.is_integer]
    if tap.inputs.dtype.is_integer:
        if layer.tie_weights and projections:
            return []
        gradients = dense.embedding_norms_and_sums(tap, g)
        if not layer.tie_weights and not projections:
            zeros = tf.zeros(layer.reverse_embeddings.shape, tf.float32)
            gradients.append(GhostGradient(layer.reverse_embeddings, 0 * gradients[0].squared_norms, lambda f: zeros))
        return gradients
    h, g = norms.flatten_positions(tap.inputs, tap.rows), norms.flatten_positions(g, tap.rows)
    if not layer.tie_weights:
        return [norms.bilinear_gradient(layer.reverse_embeddings, h, g)]
    lookups = [other for other in calls if other.inputs is not None and other.inputs.dtype.is_integer]
    if not lookups:
        return [norms.bilinear_gradient(layer.embeddings, g, h)]  # logits = h W^T: the table's gradient g^T h
    if len(projections) > 1:
        raise UnsupportedModel(f"ReversibleEmbedding {layer.name!r} (tied) was called in reverse more than once")
    return [_tied(lookups[0], h, g)]


def _tied(lookup: Tap, h: tf.Tensor, g: tf.Tensor) -> GhostGradient:
    """The table's per-example gradient A + g^T h, A the lookup's rows by id (Embedding's rule, from ``lookup``'s
    ids and gradient) and g^T h the projection's (h: [B, S, d], g: [B, S, V]). Its squared norm is the Gram form over
    the T + S positions of both calls, a lookup position being the one-hot row of its id: ||A||^2 (the rule's) +
    sum (h h^T)(g g^T) + 2 sum_{s,t} g_s[id_t] (h_s . g1_t), raised to that form's float32 rounding bound
    (`ghost_cost.rounding_coefficients`, V long dot products)."""
    layer = lookup.layer
    (rows,) = dense.embedding_norms_and_sums(lookup, lookup.gradient)
    g1 = norms.flatten_positions(lookup.gradient, lookup.rows)
    ids = tf.reshape(lookup.inputs, tf.shape(g1)[:2])
    gram = tf.reduce_sum(tf.matmul(h, h, transpose_b=True) * tf.matmul(g, g, transpose_b=True), axis=[1, 2])
    at_ids = tf.gather(g, tf.cast(ids, tf.int32), axis=2, batch_dims=1)  # [B, S, T]: g_s[id_t]
    cross = tf.reduce_sum(tf.einsum("bsd,btd->bst", h, g1) * at_ids, axis=[1, 2])
    positions = tf.cast(tf.shape(g1)[1] + tf.shape(h)[1], tf.float32)
    second, first = ghost_cost.rounding_coefficients(ghost_cost.GRAM, positions, g.shape[-1], h.shape[-1])
    magnitude = tf.reduce_sum(tf.norm(g1, axis=2), axis=1) + tf.reduce_sum(tf.norm(h, axis=2) * tf.norm(g, axis=2), 1)
    squared = ghost_cost.bounded_squared_norms(tf, rows.squared_norms + gram + 2 * cross, magnitude, second, first)
    kept, scaled = layer_rules.kept_rows, layer_rules.scaled_rows
    projected = lambda f: tf.einsum("bsv,bsd->vd", kept(g, f), scaled(h, f))  # noqa: E731
    return GhostGradient(layer.embeddings, squared, lambda f: rows.clipped_sum(f) + projected(f))
