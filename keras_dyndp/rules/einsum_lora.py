"""An EinsumDense's LoRA adapters as two Dense-like steps: the one reduction the LoRA ghost rules of both backends use
(`keras_dyndp.tf_backend.per_example.lora`, `keras_dyndp.jax_backend.per_example.lora`), beside what they read of any
LoRA layer (`enabled`, `scale`). Keras 3's LoRA EinsumDense computes ``einsum(equation, x, W + s A @ B)`` with A of the
kernel's shape but its last axis (letter e) replaced by the rank r, and B [r, e]. Where e is one of the kernel's output
letters (in the output, not in the input: every MultiHeadAttention projection and Dense-like equation),
``einsum(equation, x, A @ B)`` is ``u = einsum(rank_equation, x, A)`` (e replaced by r in the kernel and the output),
then u's axis ``axis`` (where e stands in the output) times B: A's per-example gradient is the EinsumDense rule of
``rank_equation`` for the output gradient s g B^T (along ``axis``), B's the Dense rule over u's positions, axis last."""

from __future__ import annotations

import string
from typing import Any
from typing import NamedTuple


def enabled(layer: Any) -> bool:
    """Whether ``layer`` runs with LoRA adapters (Keras 3's ``enable_lora``)."""
    return bool(getattr(layer, "lora_enabled", False))


def scale(layer: Any) -> float:
    """The factor s = ``lora_alpha / lora_rank`` of a LoRA layer's adapters (its output adds s x A B)."""
    return layer.lora_alpha / layer.lora_rank


class LoraPlan(NamedTuple):
    """A LoRA EinsumDense's adapters as applied (module docstring): ``x, A -> u``; u's rank axis, ``...`` expanded."""

    rank_equation: str
    axis: int


def lora_plan(equation: str, input_rank: int) -> LoraPlan | None:
    """The `LoraPlan` of the layer's einsum ``equation`` (``...`` allowed in the input and output) for an input of
    ``input_rank`` axes (batch included), or None where the kernel's last letter is not an output letter."""
    equation = equation.replace(" ", "")
    operands, output = equation.split("->")
    inputs, kernel = operands.split(",")
    if not kernel or "..." in kernel:
        return None
    letter = kernel[-1]
    if letter in inputs or output.count(letter) != 1 or kernel.count(letter) != 1:
        return None
    rank_letter = next(c for c in string.ascii_letters if c not in equation)
    axis = output.index(letter)
    if "..." in output and output.index("...") < axis:
        axis += input_rank - (len(inputs) - 3) - 3  # the elided axes instead of the three dots
    rank_equation = f"{inputs},{kernel[:-1]}{rank_letter}->{output.replace(letter, rank_letter)}"
    return LoraPlan(rank_equation, axis)
