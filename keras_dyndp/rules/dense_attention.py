"""Ghost-clipping rules of the trained weights of Keras's dot-product and additive attention layers (Keras 3's and Keras
2's), the same rule code on TensorFlow and JAX (`keras_dyndp.rules.layer_rules`' contract): ``AdditiveAttention``'s
``scale`` [dim] (``use_scale=True``, its default), ``Attention``'s scalar ``scale`` (``use_scale=True``) and, with
``score_mode="concat"``, its scalar ``concat_score_weight``. Such a weight is tiny and used at every pair of positions,
so each example's gradient is materialised (exact: no rounding bound needed) by one vector-Jacobian product of the
layer's own call, in which each example reads its own copy of the weights, broadcast over the batch (float32; the
backend's ``ops.vjp``, as ``keras.ops`` has none). The rule sees the layer's inputs and output gradient only, so it
covers the calls it can reproduce: no dropout, no Keras 2 ``causal=True``, every recorded call with the inputs alone and
without a mask on them (`supports`). A layer it does not cover keeps its other path (vectorized, or JAX's vmap)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from keras_dyndp import backend
from keras_dyndp.rules import layer_rules
from keras_dyndp.rules import registry
from keras_dyndp.rules import sublayers


def _covered(layer: Any) -> dict[str, int]:
    """The weights the layer holds (those ``use_scale`` and ``score_mode`` made), each with the rank of the tensor it
    multiplies beyond the scores' [..., Tq, Tv] (1 for the terms [..., Tq, Tv, dim] before their sum over dim)."""
    uses = {"scale": 1, "concat_score_weight": 0} if getattr(layer, "score_mode", "dot") == "concat" else {"scale": 0}
    if type(layer).__name__ == "AdditiveAttention":
        uses = {"scale": 1}
    return {name: extra for name, extra in uses.items() if getattr(layer, name, None) is not None}


def variables(layer: Any) -> list:
    """The rule's ``variables``: the built ``Attention`` or ``AdditiveAttention`` ``layer``'s trained ``scale`` and
    ``concat_score_weight`` where it has them (none for ``use_scale=False`` and ``score_mode="dot"``)."""
    return [getattr(layer, name) for name in _covered(layer)]


def _plain_call(args: Any, kwargs: Any) -> bool:
    """A call on [query, value(, key)] alone: no mask given or carried by the inputs, no causal mask, one output."""
    if len(args) != 1 or not isinstance(args[0], (list, tuple)):
        return False
    masks = kwargs.get("mask")
    masks = masks if isinstance(masks, (list, tuple)) else [masks]
    # A mask an input carries (Embedding(mask_zero=True) upstream): Keras 3 and 2 keep it in `_keras_mask` only.
    return (
        all(mask is None for mask in masks)
        and all(getattr(tensor, "_keras_mask", None) is None for tensor in args[0])
        and not kwargs.get("use_causal_mask")
        and not kwargs.get("return_attention_scores")
        and set(kwargs) <= {"mask", "training", "use_causal_mask", "return_attention_scores"}
    )


def supports(layer: Any) -> bool:
    """The rule's ``supports``: whether it covers the ``Attention`` or ``AdditiveAttention`` ``layer``'s configuration
    and calls: trained weights, no dropout, no Keras 2 ``causal``, and at least one recorded call, each on the inputs
    alone without a mask (module docstring)."""
    calls = sublayers.recorded_calls(layer)
    return (
        bool(_covered(layer))
        and not getattr(layer, "dropout", 0)
        and not getattr(layer, "causal", False)
        and bool(calls)
        and all(_plain_call(*call) for call in calls)
    )


@contextlib.contextmanager
def _reading(layer: Any, values: dict[str, Any]):
    """For the block, the layer's attributes ``values`` hold stand in for its weights (restored after)."""
    kept = {name: getattr(layer, name) for name in values}
    try:
        for name, value in values.items():
            object.__setattr__(layer, name, value)
        yield
    finally:
        for name, value in kept.items():
            object.__setattr__(layer, name, value)


def norms_and_sums(layer: Any, a: Any, g: Any) -> tuple[Any, Callable]:
    """The rule's ``norms_and_sums`` (`keras_dyndp.rules.layer_rules`' contract) for an ``Attention`` or
    ``AdditiveAttention`` ``layer`` that `supports` covers, its inputs ``a`` ([query, value] or [query, value, key],
    each [B, rows, ..., T, dim]) and output gradient ``g``: each example's gradient of every covered weight,
    materialised (module docstring)."""
    ops = layer_rules.keras_ops()
    batch = ops.shape(g)[0]
    rows = lambda x: ops.cast(ops.reshape(x, (-1, *ops.shape(x)[2:])), "float32")  # noqa: E731  [B * rows, ...]
    inputs, cotangent = [rows(x) for x in a], rows(g)
    count, rank = ops.shape(cotangent)[0], len(inputs[0].shape)  # the scores' rank: [B * rows, ..., Tq, Tv]
    covered = _covered(layer)
    copies = []
    for name, extra in covered.items():
        weight = ops.cast(getattr(layer, name), "float32")
        ones = (1,) * (rank + extra - 1 - len(weight.shape))
        copies.append(ops.broadcast_to(ops.reshape(weight, (1, *ones, *weight.shape)), (count, *ones, *weight.shape)))

    def call(weights):
        with _reading(layer, dict(zip(covered, weights))):
            return type(layer).call(layer, list(inputs))

    per_example = [
        ops.sum(ops.reshape(gradient, (batch, -1, *weight.shape)), axis=1)  # [B, *shape]: over rows and unit axes
        for gradient, weight in zip(backend.implementation("ops").vjp(call, copies, cotangent), variables(layer))
    ]
    squared = sum(ops.sum(ops.square(ops.reshape(gradient, (batch, -1))), axis=1) for gradient in per_example)
    return squared, lambda factors: [layer_rules.weighted_sum(factors, gradient) for gradient in per_example]


def register(layers: Any) -> None:
    """Registers the rule for ``Attention`` and ``AdditiveAttention``, those of the two that ``layers`` (the
    ``keras.layers`` namespace of the Keras the backend runs, Keras 2's on TensorFlow 2.15) has."""
    for name in ("Attention", "AdditiveAttention"):
        if hasattr(layers, name):
            registry.register_layer_rule(
                getattr(layers, name), variables=variables, norms_and_sums=norms_and_sums, supports=supports
            )
