"""Ghost-clipping rules on JAX for Keras 3's LoRA layers (``layer.enable_lora(rank)``): Dense, EinsumDense and Embedding
with only the adapters A [in, r] and B [r, out] trained, the effective kernel W + s A B. The TensorFlow rules' math
(`keras_dyndp.tf_backend.per_example.lora`); the bias, where it trains, keeps the vmap path as the plain Dense's does.
Registered on import over the plain rules of the same classes: a layer without LoRA keeps the plain rule. A and B are
read as the step's values (the step runs the rules in a ``StatelessScope`` of its trainable values). The transformed
inputs and gradients are computed once, so each example's share of the sum stays within the norm the rule reports."""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import keras

from keras_dyndp.jax_backend.per_example import rules
from keras_dyndp.rules import einsum_equation
from keras_dyndp.rules import einsum_lora
from keras_dyndp.rules import registry

_HIGHEST = jax.lax.Precision.HIGHEST


def _value(variable) -> jax.Array:
    """The adapter's value in the step (its ``StatelessScope``), float32."""
    return jnp.asarray(variable.value, jnp.float32)


def _shape(variable) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(tuple(variable.shape), jnp.float32)


def _both(first: tuple, second: tuple) -> tuple[jax.Array, Callable]:
    """Two rules' (squared norms, sums) as one: the norms added, the sums in order."""
    return first[0] + second[0], lambda factors: [*first[1](factors), *second[1](factors)]


def _dense_rule(adapter, x_rows: jax.Array, g_rows: jax.Array) -> tuple[jax.Array, Callable]:
    """An adapter's per-example gradients sum_t x_t^T g_t (x, g: [B, T, ...]; for B, x = u = s a A) by the Dense
    rule."""
    return rules.DENSE_NORMS_AND_SUMS(rules.KernelView(_shape(adapter)), x_rows, g_rows)


def _times_b_transposed(layer, b, g: jax.Array, axis: int = -1) -> jax.Array:
    """s g B^T along g's ``axis`` (B's output axis there, the rank there after)."""
    moved = jnp.moveaxis(g.astype(jnp.float32), axis, -1)
    return jnp.moveaxis(einsum_lora.scale(layer) * jnp.matmul(moved, _value(b).T, precision=_HIGHEST), -1, axis)


def _dense_norms_and_sums(layer, a, g):
    """A LoRA Dense's adapters (module docstring)."""
    positions = lambda value: value.reshape(value.shape[0], -1, value.shape[-1]).astype(jnp.float32)  # noqa: E731
    a_rows, g_rows = positions(a), positions(g)
    a_adapter, b_adapter = layer.lora_kernel_a, layer.lora_kernel_b
    h = _times_b_transposed(layer, b_adapter, g_rows)
    u = einsum_lora.scale(layer) * jnp.matmul(a_rows, _value(a_adapter), precision=_HIGHEST)
    return _both(_dense_rule(a_adapter, a_rows, h), _dense_rule(b_adapter, u, g_rows))


def _einsum_norms_and_sums(layer, a, g):
    """A LoRA EinsumDense's adapters: A by the EinsumDense rule of the rank equation, B over u's positions."""
    rows = a.shape[0]
    x, g_flat = a.reshape(-1, *a.shape[2:]).astype(jnp.float32), g.reshape(-1, *g.shape[2:]).astype(jnp.float32)
    plan = einsum_lora.lora_plan(layer.equation, x.ndim)
    a_adapter, b_adapter = layer.lora_kernel_a, layer.lora_kernel_b
    h = _times_b_transposed(layer, b_adapter, g_flat, plan.axis)
    view = types.SimpleNamespace(equation=plan.rank_equation, kernel=_shape(a_adapter))  # A in the kernel's place
    a_rule = rules.einsum_norms_and_sums(view, a, h.reshape(*a.shape[:2], *h.shape[1:]))
    u = einsum_lora.scale(layer) * jnp.einsum(plan.rank_equation, x, _value(a_adapter), precision=_HIGHEST)
    last = lambda value: jnp.moveaxis(value, plan.axis, -1).reshape(rows, -1, value.shape[plan.axis])  # noqa: E731
    return _both(a_rule, _dense_rule(b_adapter, last(u), last(g_flat)))


def _embedding_norms_and_sums(layer, ids, g):
    """A LoRA Embedding's adapters: A by the Embedding rule for the rows s g B^T, B for the inputs s A[ids]."""
    a_adapter, b_adapter = layer.lora_embeddings_a, layer.lora_embeddings_b
    h = _times_b_transposed(layer, b_adapter, g)
    a_rule = rules.embedding_norms_and_sums(types.SimpleNamespace(embeddings=_shape(a_adapter)), ids, h)
    u = einsum_lora.scale(layer) * keras.ops.take(_value(a_adapter), ids.astype(jnp.int32), axis=0)
    positions = lambda value: value.reshape(ids.shape[0], -1, value.shape[-1]).astype(jnp.float32)  # noqa: E731
    return _both(a_rule, _dense_rule(b_adapter, positions(u), positions(g)))


def _unquantized(layer) -> bool:
    return getattr(layer, "quantization_mode", None) is None


def _einsum_supports(layer) -> bool:
    rank = einsum_equation.equation_input_rank(layer.equation)
    kernel_shape = (*layer.lora_kernel_a.shape[:-1], layer.lora_kernel_b.shape[-1])  # not ``kernel``: it merges them
    return (
        _unquantized(layer)
        and einsum_equation.plan(layer.equation, kernel_shape, rank) is not None
        and einsum_lora.lora_plan(layer.equation, rank) is not None
    )


def _adapters(weight: str) -> Callable:
    return lambda layer: [getattr(layer, f"lora_{weight}_a"), getattr(layer, f"lora_{weight}_b")]


_LORA_RULES: dict[type, tuple[Callable, Callable, Callable]] = {  # variables, norms_and_sums, supports
    keras.layers.Dense: (_adapters("kernel"), _dense_norms_and_sums, _unquantized),
    keras.layers.EinsumDense: (_adapters("kernel"), _einsum_norms_and_sums, _einsum_supports),
    keras.layers.Embedding: (_adapters("embeddings"), _embedding_norms_and_sums, _unquantized),
}


def with_lora(plain: registry.LayerRule, lora_rule: tuple[Callable, Callable, Callable]) -> dict[str, Any]:
    """`registry.register_layer_rule`'s arguments: ``lora_rule``'s parts for a LoRA layer, ``plain``'s for others."""
    variables, norms_and_sums, supports = lora_rule

    def choose(lora_part: Callable, plain_part: Callable) -> Callable:
        return lambda layer, *args: (lora_part if einsum_lora.enabled(layer) else plain_part)(layer, *args)

    return {
        "variables": choose(variables, plain.variables),
        "norms_and_sums": choose(norms_and_sums, plain.norms_and_sums),
        "supports": choose(supports, plain.supports or (lambda layer: True)),
    }


for _class, _lora_rule in _LORA_RULES.items():
    registry.register_layer_rule(_class, **with_lora(registry.registered()[_class], _lora_rule))
