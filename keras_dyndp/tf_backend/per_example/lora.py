"""Ghost-clipping rules of Keras 3's LoRA layers (``layer.enable_lora(rank)``): Dense, EinsumDense and Embedding with
the kernel (embeddings) frozen and the adapters A [in, r], B [r, out] trained, the effective kernel W + s A B with
s = lora_alpha / lora_rank. The tapped call is the built-in one (Keras's ``kernel`` already merges the adapters); an
EinsumDense's adapters by `keras_dyndp.rules.einsum_lora`. From the layer input a_t and the output gradient g_t: A is
the Dense rule for the output gradient s g B^T (Embedding: the Embedding rule for the rows s g B^T), B the Dense rule
for the inputs s a A (Embedding: s A[ids]), a bias the built-in rule's. Each rule's norms and sum read the same tensors,
computed once, so each example's contribution stays within the norm the rule reports (rounding bound included)."""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import tensorflow as tf
import tensorflow.experimental.numpy as tnp

from keras_dyndp.rules import einsum_equation
from keras_dyndp.rules import einsum_lora
from keras_dyndp.tf_backend.keras_compat import keras
from keras_dyndp.tf_backend.per_example import dense
from keras_dyndp.tf_backend.per_example import einsum_dense
from keras_dyndp.tf_backend.per_example import norms
from keras_dyndp.tf_backend.per_example.taps import GhostGradient
from keras_dyndp.tf_backend.per_example.taps import Tap


def dense_norms_and_sums(tap: Tap, g: tf.Tensor) -> list[GhostGradient]:
    """A LoRA Dense: A for the output gradients s g B^T, B for the inputs s a A, the bias as Dense's."""
    layer = tap.layer
    a = tf.cast(norms.flatten_positions(tap.inputs, tap.rows), tf.float32)
    g = norms.flatten_positions(g, tap.rows)
    g32 = tf.cast(g, tf.float32)
    h = einsum_lora.scale(layer) * tf.tensordot(g32, layer.lora_kernel_b, [[2], [1]])  # s g B^T [B, T, r]
    u = einsum_lora.scale(layer) * tf.tensordot(a, layer.lora_kernel_a, 1)  # s a A [B, T, r]
    adapters = [
        norms.bilinear_gradient(layer.lora_kernel_a, a, h),
        norms.bilinear_gradient(layer.lora_kernel_b, u, g32),
    ]
    return norms.with_bias(layer, g, adapters)


def _view(tap: Tap, inputs: tf.Tensor, **layer: Any) -> Any:
    """``tap`` as another rule reads it: the adapter A in the kernel's or the embeddings' place (attributes
    ``layer`` of the layer), the rows of ``tap``, and ``inputs``."""
    return types.SimpleNamespace(layer=types.SimpleNamespace(**layer), rows=tap.rows, inputs=inputs)


def einsum_supports(layer: keras.layers.Layer) -> bool:
    """The built-in EinsumDense rule's equations whose kernel's last letter is an output letter (`einsum_lora`)."""
    return einsum_lora.lora_plan(layer.equation, einsum_equation.equation_input_rank(layer.equation)) is not None


def einsum_norms_and_sums(tap: Tap, g: tf.Tensor) -> list[GhostGradient]:
    """A LoRA EinsumDense: A by the EinsumDense rule of the rank equation for the output gradients s g B^T, B by
    the Dense rule over u = s einsum(x, A)'s positions (`einsum_lora`), the bias as EinsumDense's."""
    layer = tap.layer
    plan = einsum_lora.lora_plan(layer.equation, tap.inputs.shape.rank)
    x = tf.cast(tap.inputs, tf.float32)
    g_last = tnp.moveaxis(tf.cast(g, tf.float32), plan.axis, -1)
    h = einsum_lora.scale(layer) * tf.tensordot(g_last, layer.lora_kernel_b, [[g.shape.rank - 1], [1]])
    h = tnp.moveaxis(h, -1, plan.axis)
    view = _view(tap, x, equation=plan.rank_equation, kernel=layer.lora_kernel_a, bias=None)
    u = einsum_lora.scale(layer) * tf.einsum(plan.rank_equation, x, layer.lora_kernel_a)
    u_rows = norms.flatten_positions(tnp.moveaxis(u, plan.axis, -1), tap.rows)
    g_rows = norms.flatten_positions(g_last, tap.rows)
    adapters = [*einsum_dense.norms_and_sums(view, h), norms.bilinear_gradient(layer.lora_kernel_b, u_rows, g_rows)]
    return adapters + einsum_dense.with_bias(tap, g)


def embedding_norms_and_sums(tap: Tap, g: tf.Tensor) -> list[GhostGradient]:
    """A LoRA Embedding: A by the Embedding rule for the rows s g B^T, B by the Dense rule for the inputs s A[ids]."""
    layer = tap.layer
    a_table = layer.lora_embeddings_a
    g32 = tf.cast(g, tf.float32)
    h = einsum_lora.scale(layer) * tf.tensordot(g32, layer.lora_embeddings_b, [[g.shape.rank - 1], [1]])
    table = _view(tap, tap.inputs, embeddings=a_table, input_dim=a_table.shape[0], name=layer.name)
    u = norms.flatten_positions(einsum_lora.scale(layer) * tf.gather(a_table, tap.inputs), tap.rows)
    b = norms.bilinear_gradient(layer.lora_embeddings_b, u, norms.flatten_positions(g32, tap.rows))
    return [*dense.embedding_norms_and_sums(table, h), b]


_LORA_RULES: dict[type, tuple[Callable, Callable | None]] = {
    keras.layers.Dense: (dense_norms_and_sums, None),
    keras.layers.EinsumDense: (einsum_norms_and_sums, einsum_supports),
    keras.layers.Embedding: (embedding_norms_and_sums, None),
}


def with_lora(
    layer_class: type, call: Callable, norms_and_sums: Callable, supports: Callable[[keras.layers.Layer], bool]
) -> dict[str, Callable]:
    """A built-in rule's parts (`rules.register_layer_rule`'s arguments) extended to the class's LoRA layers where
    this module has one (norms and sums here, the call and other conditions the rule's; a Conv's are not covered)."""
    lora_rule = _LORA_RULES.get(layer_class)
    if lora_rule is None:
        plain = lambda layer: not einsum_lora.enabled(layer) and supports(layer)  # noqa: E731
        return {"call": call, "norms_and_sums": norms_and_sums, "supports": plain}
    lora_norms_and_sums, lora_supports = lora_rule

    def dispatched(tap: Tap, g: tf.Tensor) -> list[GhostGradient]:
        return (lora_norms_and_sums if einsum_lora.enabled(tap.layer) else norms_and_sums)(tap, g)

    def supported(layer: keras.layers.Layer) -> bool:
        return supports(layer) and (not einsum_lora.enabled(layer) or lora_supports is None or lora_supports(layer))

    return {"call": call, "norms_and_sums": dispatched, "supports": supported}
