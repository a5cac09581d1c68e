"""Ghost-clipping rules for KerasHub's own trainable layers, registered by class name (`registry.register_by_name`) at
the first lookup after KerasHub (an optional dependency) is imported, never importing it; the same rule code on both
backends. Checked against KerasHub 0.32's calls (tests/rules/test_keras_hub_rules.py compares each with brute-force
per-example gradients):

- ``ReversibleEmbedding`` (Keras's, which KerasHub 0.32's backbones build their token embeddings from, and KerasHub's
  subclass of it): its forward call is Embedding's lookup, by the Embedding rule; ``reverse_embeddings``
  (``tie_weights=False``), which that call does not read, has a gradient of 0. A recorded reverse call (a functional
  model's, as a CausalLM's output projection) leaves the layer without this rule (on TensorFlow, whose tapped form
  covers both calls, `keras_dyndp.tf_backend.per_example.reversible` replaces it); an unrecorded one (inside another
  layer's call, as in KerasHub's ``TokenAndPositionEmbedding``, which has no functional record) beside the forward call
  makes its one call per pass two, for which both backends keep their per-example path (JAX: ``taps``; TensorFlow:
  ``Tap.record``), and one without the forward call fails loudly (`reversible_embedding`).
- ``PositionEmbedding``: rows 0..L-1 of its table (`layer_rules.added_weight`), where every recorded call starts at
  position 0 (``start_index`` 0, no ``positions``).
- The RMS norms of Gemma, Llama, Mistral and Qwen 3 (`layer_rules.rms_normalization`).

A rule registered for one of these classes before its first lookup stays.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from keras_dyndp import backend
from keras_dyndp.rules import layer_rules
from keras_dyndp.rules import registry
from keras_dyndp.rules import sublayers


def _forward_call(args: Any, kwargs: Any) -> bool:
    """A recorded call of a ReversibleEmbedding on its ids alone, not ``reverse``."""
    return len(args) == 1 and not kwargs.get("reverse", False) and set(kwargs) <= {"reverse"}


def _embedding_class() -> type:
    return backend.keras_module().layers.Embedding


def covered_configuration(layer: Any) -> bool:
    """A built ReversibleEmbedding without LoRA, quantization or ``mask_zero`` (its call sets the output's mask
    itself, which a tap would drop), with its output table (tied, or ``reverse_embeddings``): what both backends'
    forms of its rule cover (TensorFlow's: `keras_dyndp.tf_backend.per_example.reversible`)."""
    return (
        layer.built
        and not getattr(layer, "lora_enabled", False)
        and getattr(layer, "quantization_mode", None) is None
        and not layer.mask_zero
        and (layer.tie_weights or getattr(layer, "reverse_embeddings", None) is not None)
    )


def reversible_embedding() -> dict[str, Callable]:
    """The rule of ``ReversibleEmbedding``'s forward call (Embedding's lookup), module docstring.

    Returns:
      ``register_layer_rule``'s ``variables``, ``norms_and_sums`` and ``supports``.
    """

    def variables(layer):
        return [layer.embeddings] + ([] if layer.tie_weights else [layer.reverse_embeddings])

    def norms_and_sums(layer, a, g):
        if len(g.shape) != len(a.shape) + 1:  # a reverse call: [..., d] -> [..., V], the same rank
            raise ValueError(
                f"ReversibleEmbedding {layer.name!r} was called with reverse=True alone, which its ghost rule does not "
                "cover (it covers the forward lookup): use make_private(model, method='vectorized') for this model"
            )
        ops = layer_rules.keras_ops()
        ids = a if "int" in str(a.dtype) else ops.cast(a, "int32")
        _, squared, sums = layer_rules.sublayer_norms_and_sums(layer, ids, g, _embedding_class())
        if layer.tie_weights:
            return squared, sums
        zeros = ops.zeros(layer.reverse_embeddings.shape, "float32")  # the forward call does not read it
        return squared, lambda factors: [*sums(factors), zeros]

    def supports(layer):
        return (
            covered_configuration(layer)
            and registry.rule_for(layer, _embedding_class()) is not None
            and all(_forward_call(*call) for call in sublayers.recorded_calls(layer))
        )

    return {"variables": variables, "norms_and_sums": norms_and_sums, "supports": supports}


def _from_the_start(args: Any, kwargs: Any) -> bool:
    """A recorded call of a PositionEmbedding on its input alone, at positions 0..L-1."""
    start = kwargs.get("start_index", 0)
    return (
        len(args) == 1
        and set(kwargs) <= {"start_index", "positions"}
        and isinstance(start, int)
        and start == 0
        and kwargs.get("positions") is None
    )


def position_embedding() -> dict[str, Callable]:
    """The rule of KerasHub's ``PositionEmbedding``, whose output is rows ``start_index``.. of its table
    ``position_embeddings`` broadcast to its input's shape: `layer_rules.added_weight`, where every recorded call
    starts at 0 (a call of a subclassed model is not recorded: one with another ``start_index`` would get its rows'
    gradient in rows 0..L-1, the same norm).

    Returns:
      ``register_layer_rule``'s ``variables``, ``norms_and_sums`` and ``supports``.
    """
    rule = layer_rules.added_weight("position_embeddings")
    added_supports = rule["supports"]

    def supports(layer):
        return added_supports(layer) and all(_from_the_start(*call) for call in sublayers.recorded_calls(layer))

    return {**rule, "supports": supports}


_HUB = "keras_hub.src."
RULES: dict[tuple[str, str], Callable[[], dict]] = {
    ("keras.src.layers.core.reversible_embedding", "ReversibleEmbedding"): reversible_embedding,
    (_HUB + "layers.modeling.reversible_embedding", "ReversibleEmbedding"): reversible_embedding,
    (_HUB + "layers.modeling.position_embedding", "PositionEmbedding"): position_embedding,
    (_HUB + "models.gemma.rms_normalization", "RMSNormalization"): layer_rules.rms_normalization,
    (_HUB + "models.llama.llama_layernorm", "LlamaLayerNorm"): layer_rules.rms_normalization,
    (_HUB + "models.mistral.mistral_layer_norm", "MistralLayerNormalization"): layer_rules.rms_normalization,
    (_HUB + "models.qwen3.qwen3_layernorm", "Qwen3LayerNorm"): layer_rules.rms_normalization,
}
for (_module, _qualname), _rule in RULES.items():
    registry.register_by_name(_module, _qualname, _rule)
