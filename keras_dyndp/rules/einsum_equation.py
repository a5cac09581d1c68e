"""An EinsumDense equation as a Dense over positions: the one reduction the ghost rules of both backends use. ``z[b, P,
M] = sum_C x[b, P, C] K[C, M]``: the batch letter b leads the input and the output and is not the kernel's; the position
letters P (input and output, not the kernel) index the positions at which the kernel is applied; the contracted letters
C (input and kernel) make the fan-in k, the kernel's output letters M (kernel and output) the fan-out m. With the input
transposed to [B, P, C] -> [B, T, k] and the output gradient to [B, P, M] -> [B, T, m], example i's kernel gradient is
a_i^T g_i [k, m], in the kernel's letter order after a reshape and a transpose. Every equation Keras's
MultiHeadAttention builds ('abc,cde->abde', 'abcd,cde->abe', 'aecd,abcd->acbe' is not an EinsumDense) and a Dense
written as an equation ('ab,bc->ac', 'abc,cd->abd') reduce so. An equation that mixes the batch axis (contracts it, or
gives it to the kernel), repeats a letter in one operand (a diagonal), sums an axis away without the kernel, broadcasts
one in, or shares a letter among all three operands (block-diagonal kernels) does not: `plan` returns None and the layer
keeps its per-example path."""

from __future__ import annotations

import math
import string
from typing import NamedTuple


class Plan(NamedTuple):
    """How to read an EinsumDense call as a Dense over positions (module docstring): the transposes of the input to
    [batch, P..., C...] and of the output to [batch, P..., M...], k and m (the sizes of C and M), the kernel's sizes in
    the order [C..., M...] (a [k, m] gradient reshaped) and the permutation from there to the kernel's own order."""

    input_order: tuple[int, ...]
    output_order: tuple[int, ...]
    fan_in: int
    fan_out: int
    gradient_shape: tuple[int, ...]
    kernel_order: tuple[int, ...]


def _expanded(equation: str, input_rank: int) -> tuple[str, str, str] | None:
    """(input, kernel, output) letters with ``...`` replaced by fresh letters for the input's elided axes."""
    equation = equation.replace(" ", "")
    if equation.count("->") != 1 or equation.split("->")[0].count(",") != 1:
        return None
    operands, output = equation.split("->")
    inputs, kernel = operands.split(",")
    if "..." in kernel or inputs.count("...") != output.count("...") or inputs.count("...") > 1:
        return None
    if "..." in inputs:
        elided = input_rank - (len(inputs) - 3)
        if elided < 0:
            return None
        fresh = "".join([c for c in string.ascii_letters if c not in equation][:elided])
        inputs, output = inputs.replace("...", fresh), output.replace("...", fresh)
    return inputs, kernel, output


def plan(equation: str, kernel_shape: tuple[int, ...], input_rank: int) -> Plan | None:
    """The `Plan` of the layer's einsum ``equation`` (e.g. ``'abc,cde->abde'``, ``...`` allowed in the input and output)
    for a kernel of static shape ``kernel_shape`` (one size per kernel letter) and an input of ``input_rank`` axes
    (batch included), or None where the equation is not a Dense over positions that keeps examples apart (module
    docstring)."""
    letters = _expanded(equation, input_rank)
    if letters is None:
        return None
    inputs, kernel, output = letters
    if len(inputs) != input_rank or len(kernel) != len(kernel_shape) or not inputs or not output:
        return None
    if any(len(set(term)) != len(term) for term in letters) or not all(c.isalpha() for c in inputs + kernel + output):
        return None
    batch = inputs[0]
    if output[0] != batch or batch in kernel:
        return None
    positions = [c for c in inputs[1:] if c in output and c not in kernel]
    contracted = [c for c in inputs if c in kernel and c not in output]
    produced = [c for c in output if c in kernel and c not in inputs]
    if len(inputs) != 1 + len(positions) + len(contracted) or len(output) != 1 + len(positions) + len(produced):
        return None  # a letter summed away, broadcast in, or in all three operands
    if len(kernel) != len(contracted) + len(produced):
        return None  # a kernel axis summed away
    size = dict(zip(kernel, kernel_shape))
    gradient_letters = contracted + produced
    return Plan(
        input_order=tuple(inputs.index(c) for c in [batch, *positions, *contracted]),
        output_order=tuple(output.index(c) for c in [batch, *positions, *produced]),
        fan_in=math.prod(size[c] for c in contracted),
        fan_out=math.prod(size[c] for c in produced),
        gradient_shape=tuple(size[c] for c in gradient_letters),
        kernel_order=tuple(gradient_letters.index(c) for c in kernel),
    )


def equation_input_rank(equation: str) -> int:
    """The input rank an equation names (with ``...`` standing for one axis): `plan`'s check before a call."""
    inputs = equation.replace(" ", "").split(",")[0]
    return len(inputs) - 2 if "..." in inputs else len(inputs)


def bias_axes(bias_shape: tuple[int, ...], output_shape: tuple) -> list[int]:
    """The output axes (never the batch's) over which each example's gradient of a bias of ``bias_shape``, broadcast
    onto an output of ``output_shape``, sums the output gradient (keep their dimensions, then [B, *bias_shape])."""
    padded = (1,) * (len(output_shape) - len(bias_shape)) + tuple(bias_shape)
    return [axis for axis in range(1, len(output_shape)) if padded[axis] == 1 and output_shape[axis] != 1]
