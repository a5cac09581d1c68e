"""One ghost-clipping rule contract for TensorFlow and JAX, and ready-made rules for sequence models.

A rule for exactly one layer class, registered with ``keras_dyndp.register_layer_rule(layer_class, *, variables,
norms_and_sums, supports=None)`` into the one registry of both backends (`registry`): ``variables(layer)`` lists the
trainable variables it covers (its sublayers' too); ``norms_and_sums(layer, a, g)`` sees the layer, its input ``a``
and the loss's gradient ``g`` at its output (before its activation where it has one), each [B, rows, ...] (``rows``
the layer's own leading axis for one example: 1, or the steps TimeDistributed folds in), and returns the
per-example squared norms [B] of the covered variables' gradients together and a function ``factors [B] -> [sum_i
factors_i (example i's gradient), one per variable]``; ``supports(layer)`` says which configurations it covers.
Written over ``keras.ops``, the same rule code registers on both backends. A layer whose own call acts on each
example alone and only wires its sublayers together is declared with ``register_layer_rule(layer_class,
per_example=True)``: its sublayers' rules then apply on TensorFlow, whose batched pass needs every layer so declared or
known (JAX runs the forward pass one example at a time and needs no declaration).

A wrong rule breaks privacy silently: check it against ``make_private(model, method='vectorized')``. Its squared
norms must never be below the exact ones in float32 (`ghost_cost`'s ``bounded_squared_norms``; a materialised
per-example gradient summed as computed needs no bound), and its sums must add exactly nothing from an example whose
factor is 0 (`weighted_sum`: a select, as 0 x inf is NaN).

Ready-made (below), over ``keras.ops`` (on Keras 2.15, which has none, the TensorFlow functions of the same names);
KerasHub's own layers get theirs automatically (`keras_dyndp.rules.keras_hub_rules`).
"""

from __future__ import annotations

import contextlib
import importlib
import threading
import types
from collections.abc import Callable
from typing import Any

from keras_dyndp.rules import registry


def keras_ops():
    """``keras.ops``; on Keras 2.15 (TensorFlow, no ``keras.ops``) the few TensorFlow functions the rules here use."""
    try:
        return importlib.import_module("keras.ops")
    except ModuleNotFoundError:
        tf = importlib.import_module("tensorflow")
        return types.SimpleNamespace(
            broadcast_to=tf.broadcast_to,
            cast=tf.cast,
            where=tf.where,
            reshape=tf.reshape,
            tensordot=tf.tensordot,
            sum=tf.reduce_sum,
            mean=tf.reduce_mean,
            rsqrt=tf.math.rsqrt,
            moveaxis=tf.experimental.numpy.moveaxis,
            square=tf.square,
            pad=tf.pad,
            shape=lambda x: tuple(tf.shape(x)[i] if size is None else size for i, size in enumerate(x.shape)),
        )


def register_per_example_layer(layer_class: type) -> None:
    """``register_layer_rule(layer_class, per_example=True)``: declares that ``layer_class``'s own call acts on each
    example alone, so models using it can take TensorFlow's ghost path (JAX needs no declaration). Only if that holds
    (`register_layer_rule` says what it means), else privacy breaks silently; its sublayers' trainable variables still
    need rules.

    Args:
      layer_class: the Keras layer class declared (not its subclasses).

    Raises:
      TypeError: if ``layer_class`` is not a Keras layer class.
    """
    registry.register_layer_rule(layer_class, per_example=True)


def sublayer_norms_and_sums(
    sublayer: Any, a: Any, g: Any, layer_class: type | None = None
) -> tuple[list, Any, Callable]:
    """The rule registered for ``sublayer``'s class applied to its input ``a`` and output gradient ``g`` ([B, rows,
    ...], as a rule sees them): for a rule of a layer that calls ``sublayer`` (an Embedding's ids and gradient), or of
    a subclass whose call is its parent's (``layer_class``).

    Args:
      sublayer: a layer with a registered rule that supports it (on TensorFlow, one computed from its input and
        output gradient alone: Dense, EinsumDense, Conv, Embedding or a ``register_layer_rule`` one).
      a: the sublayer's input, [B, rows, ...].
      g: the loss's gradient at the sublayer's output (before its activation), [B, rows, ...].
      layer_class: the class whose rule is applied to ``sublayer`` (its own exact class where None).

    Returns:
      ``(variables, squared_norms, sums)``: the variables the rule covers, in its order, their per-example squared
      norms [B] and the function ``factors -> [clipped weighted sum per variable]``.

    Raises:
      ValueError: if no registered rule supports ``sublayer``.
    """
    return registry.sublayer_norms_and_sums(sublayer, a, g, layer_class)


_tracing = threading.local()  # per thread: tf.distribute traces each replica's step in a thread of its own


@contextlib.contextmanager
def rows_without_select():
    """While this thread traces inside it, `kept_rows` returns its tensor unchanged: for a caller that keeps the
    result only where it is finite (then every row summed was finite, and a factor-0 row added 0 x row, exactly 0)."""
    outer = getattr(_tracing, "selects_skipped", False)
    _tracing.selects_skipped = True
    try:
        yield
    finally:
        _tracing.selects_skipped = outer


def _by_row(factors: Any, tensor: Any) -> Any:
    """``factors`` [N] shaped to broadcast over the rows of ``tensor`` [N, ...]."""
    return keras_ops().reshape(factors, (-1,) + (1,) * (len(tensor.shape) - 1))


def _float32(tensor: Any) -> Any:
    """``tensor`` in float32, the dtype of the sums (float64 stays float64)."""
    return keras_ops().cast(tensor, "float64" if tensor.dtype == "float64" else "float32")


def kept_rows(tensor: Any, factors: Any) -> Any:
    """``tensor`` [N, ...] with exactly 0 in the rows whose factor is 0 (a select: 0 x inf and 0 x NaN are NaN)."""
    if getattr(_tracing, "selects_skipped", False):
        return tensor
    ops = keras_ops()
    return ops.where(_by_row(factors > 0, tensor), tensor, ops.cast(0, tensor.dtype))


def scaled_rows(tensor: Any, factors: Any) -> Any:
    """Row i of ``tensor`` [N, ...] times ``factors[i]``, in float32; exactly 0 where the factor is 0 (`kept_rows`)."""
    tensor = _float32(tensor)
    return kept_rows(tensor * _by_row(keras_ops().cast(factors, tensor.dtype), tensor), factors)


def weighted_sum(factors: Any, per_example: Any) -> Any:
    """sum_i factors_i per_example_i over the leading axis ([B] and [B, ...]), in float32, both backends' one; a row
    whose factor is 0 adds exactly 0, whatever it holds (not finite included)."""
    per_example = _float32(per_example)
    factors = keras_ops().cast(factors, per_example.dtype)
    return keras_ops().tensordot(factors, kept_rows(per_example, factors), axes=1)


def _added_rows(weight: Any, g: Any) -> tuple[Any, Callable]:
    """``(squared norms [B], sums)`` of rows 0..L-1 of the (S, d) ``weight`` added to an output [B, rows, ..., L, d]
    with gradient ``g``: example i's gradient is g summed over the axes between B and the last two, materialised
    (exact); its sum padded with zeros to S rows."""
    ops = keras_ops()
    per_example = ops.sum(ops.reshape(ops.cast(g, "float32"), (ops.shape(g)[0], -1, *g.shape[-2:])), axis=1)
    squared = ops.sum(ops.square(per_example), axis=(1, 2))
    pad = lambda rows: ops.pad(rows, [[0, weight.shape[0] - ops.shape(rows)[0]], [0, 0]])  # noqa: E731
    return squared, lambda factors: [pad(weighted_sum(factors, per_example))]


def added_weight(name: str = "position_embeddings") -> dict[str, Callable]:
    """The rule of a layer whose output [..., L, d] is its input plus (or just) rows 0..L-1 of its (S, d) weight
    ``layer.<name>``, L <= S (a learned position embedding): example i's gradient is its output gradient summed over
    its leading axes in those rows, materialised (exact).

    ``keras_dyndp.register_layer_rule(PositionEmbedding, **keras_dyndp.layer_rules.added_weight())``

    Args:
      name: the attribute of the layer holding the weight.

    Returns:
      ``register_layer_rule``'s ``variables``, ``norms_and_sums`` and ``supports``.
    """

    return {
        "variables": lambda layer: [getattr(layer, name)],
        "norms_and_sums": lambda layer, a, g: _added_rows(getattr(layer, name), g),
        "supports": lambda layer: getattr(layer, name, None) is not None and len(getattr(layer, name).shape) == 2,
    }


def token_and_position_embedding(token: str = "token_emb", position: str = "pos_emb") -> dict[str, Callable]:
    """The rule of a layer computing ``token(x) + position(arange(L))`` from ids x [..., L] (two Embedding
    sublayers, as the keras.io "Text classification with Transformer" example's ``TokenAndPositionEmbedding``): the
    token table by the Embedding rule (ids grouped per example, bounded where positions repeat an id), the position
    table's rows 0..L-1 by example i's output gradient summed over its leading axes (materialised, exact).

    ``keras_dyndp.register_layer_rule(TokenAndPositionEmbedding, **layer_rules.token_and_position_embedding())``

    Args:
      token: the attribute of the layer holding the token Embedding.
      position: the attribute holding the position Embedding, called on ``arange(L)``.

    Returns:
      ``register_layer_rule``'s ``variables``, ``norms_and_sums`` and ``supports``.
    """

    def variables(layer):
        return [getattr(layer, token).embeddings, getattr(layer, position).embeddings]

    def norms_and_sums(layer, a, g):
        token_layer = getattr(layer, token)
        covered, token_squared, token_sums = sublayer_norms_and_sums(token_layer, keras_ops().cast(a, "int32"), g)
        if len(covered) != 1 or covered[0] is not token_layer.embeddings:
            raise ValueError(f"the rule of {token_layer.name!r} does not cover its table alone")
        squared, sums = _added_rows(getattr(layer, position).embeddings, g)
        return token_squared + squared, lambda factors: [*token_sums(factors), *sums(factors)]

    def supports(layer):
        sublayers = getattr(layer, token, None), getattr(layer, position, None)
        return all(sub is not None and getattr(sub, "embeddings", None) is not None for sub in sublayers)

    return {"variables": variables, "norms_and_sums": norms_and_sums, "supports": supports}


def rms_normalization(scale: str = "scale", epsilon: str = "epsilon", axis: int = -1) -> dict[str, Callable]:
    """The rule of an RMS normalisation ``y = x_hat * (c + layer.<scale>)`` with ``x_hat = x / sqrt(mean(x^2, axis) +
    layer.<epsilon>)`` computed in float32 (KerasHub's Gemma ``RMSNormalization``, c = 1; ``LlamaLayerNorm``, Mistral's
    and Qwen 3's, c = 0; any constant c, which the gradient does not see): example i's gradient of the scale is the
    sum over its positions of ``g * x_hat``, materialised (exact).

    ``keras_dyndp.register_layer_rule(MyRMSNorm, **keras_dyndp.layer_rules.rms_normalization())``

    Args:
      scale: the attribute of the layer holding the scale, shaped like the input's ``axis``.
      epsilon: the attribute holding epsilon (a float > 0), added to the mean square.
      axis: the axis normalised over, counted from the last (negative: -1 is the last).

    Returns:
      ``register_layer_rule``'s ``variables``, ``norms_and_sums`` and ``supports``.

    Raises:
      ValueError: if ``axis`` is not negative.
    """
    if axis >= 0:
        raise ValueError(f"`axis` must count from the last axis (be negative). Received: axis={axis!r}.")

    def norms_and_sums(layer, a, g):
        ops = keras_ops()
        x = ops.moveaxis(ops.cast(a, "float32"), axis, -1)
        normed = x * ops.rsqrt(ops.mean(ops.square(x), axis=-1, keepdims=True) + getattr(layer, epsilon))
        terms = normed * ops.moveaxis(ops.cast(g, "float32"), axis, -1)
        per_example = ops.sum(ops.reshape(terms, (ops.shape(terms)[0], -1, terms.shape[-1])), axis=1)  # [B, d]
        squared = ops.sum(ops.square(per_example), axis=1)
        weight = getattr(layer, scale)
        return squared, lambda factors: [ops.reshape(weighted_sum(factors, per_example), weight.shape)]

    return {
        "variables": lambda layer: [getattr(layer, scale)],
        "norms_and_sums": norms_and_sums,
        "supports": lambda layer: getattr(layer, scale, None) is not None and len(getattr(layer, scale).shape) == 1,
    }
