"""What each TensorFlow op does to the rows of the batch, for `graph_rows`'s proof. A tensor's state: None (free of the
batch: constants, variables, sizes of non-batch axes), `Rows` (slice i along ``axis`` depends on example i alone, and
on batch-free tensors), or `Sizes` (integers derived from the batch's shape, such as ``tf.shape(x)[0]``: allowed only
as the shape of a reshape, fill or broadcast, where the batch size puts the batch at one axis of a tensor of identical
rows). An op whose result could depend on two examples, or on an example's position in the batch (data laid along a
batch-sized axis, a draw shaped by the batch size), raises `NotProven`; so does any op not listed here."""

from __future__ import annotations

import math
from typing import Any
from typing import NamedTuple

import numpy as np
import tensorflow as tf


class NotProven(Exception):
    """An op of the traced forward pass could mix examples (the message names it)."""


class Rows(NamedTuple):
    """Slices i * inner to (i + 1) * inner - 1 of the tensor along ``axis`` depend on example i alone (and on
    batch-free tensors): ``inner`` > 1 where a reshape folded another axis into the batch's, example-major."""

    axis: int
    inner: int = 1


class Sizes(NamedTuple):
    """Integers derived from the batch's shape (a shape or a scalar): element k is ``dims[k]``, ``(c, 1)`` c times the
    batch size, ``(c, 0)`` the constant c (c None: not known while tracing), None: any integer; ``dims`` None: every
    element any integer."""

    dims: tuple[tuple[int | None, int] | None, ...] | None


def free(state: Any) -> bool:
    """Whether a state holds nothing of the batch: None, or sizes that do not depend on the batch size."""
    return state is None or (
        isinstance(state, Sizes) and state.dims is not None and all(d is not None and d[1] == 0 for d in state.dims)
    )


def dims_of(tensor: tf.Tensor, state: Any) -> list | None:
    """The elements of a size-like tensor (a scalar or a vector) as `Sizes` describes them; None where not known."""
    if isinstance(state, Sizes):
        return None if state.dims is None else list(state.dims)
    if state is not None or tensor.shape.rank not in (0, 1) or tensor.shape.num_elements() is None:
        return None
    value = static(tensor)
    if value is not None:
        return [(int(v), 0) for v in np.reshape(value, [-1])]
    if tensor.op.type == "Pack":  # A shape stacked from scalars, some known while tracing.
        parts = [static(part) for part in tensor.op.inputs]
        return [(None if part is None else int(part), 0) for part in parts]
    return [(None, 0)] * tensor.shape.num_elements()


def product(dims: list) -> tuple[int | None, int] | None:
    """The product of size elements (None where it is not c or c times the batch size)."""
    if any(d is None for d in dims) or sum(d[1] for d in dims) > 1:
        return None
    known = all(d[0] is not None for d in dims)
    return (math.prod(d[0] for d in dims) if known else None, sum(d[1] for d in dims))


UNSEEN = object()


def refuse(op: tf.Operation, why: str) -> NotProven:
    """The NotProven naming ``op`` and why it could mix examples."""
    return NotProven(f"operation {op.name!r} ({op.type}) {why}")


def static(tensor: tf.Tensor) -> np.ndarray | None:
    """``tensor``'s value where TensorFlow knows it while tracing; else None."""
    value = tf.get_static_value(tensor)
    return None if value is None else np.asarray(value)


def rank_of(op: tf.Operation, tensor: tf.Tensor) -> int:
    """``tensor``'s rank; NotProven where it is not known while tracing."""
    if tensor.shape.rank is None:
        raise refuse(op, "has a tensor of unknown rank")
    return tensor.shape.rank


def normal_axis(op: tf.Operation, axis: Any, rank: int) -> int:
    """``axis`` of a tensor of ``rank`` counted from 0."""
    axis = int(axis)
    return axis + rank if axis < 0 else axis


def constant_axes(op: tf.Operation, tensor: tf.Tensor, rank: int) -> list[int]:
    """The axes ``tensor`` names (a constant, scalar or vector) of a tensor of ``rank``; NotProven otherwise."""
    value = static(tensor)
    if value is None:
        raise refuse(op, "takes an axis that is not a constant")
    return [normal_axis(op, a, rank) for a in np.reshape(value, [-1])]


def size_result(op: tf.Operation, states: list) -> list:
    """An op on sizes and batch-free tensors only: sizes (a product followed: ``Mul`` of scalars, ``Prod`` of a
    whole vector), else None where no size enters."""
    if any(isinstance(s, Rows) for s in states):
        raise refuse(op, "combines the batch's data with its size")
    if not any(isinstance(s, Sizes) for s in states):
        return [None] * len(op.outputs)
    parts = [dims_of(t, s) for t, s in zip(op.inputs, states)]
    if op.type == "Mul" and all(p is not None and len(p) == 1 for p in parts) and op.outputs[0].shape.rank == 0:
        return [Sizes((product([p[0] for p in parts]),))]
    if op.type == "Prod" and parts[0] is not None and op.inputs[0].shape.rank == 1 and not op.get_attr("keep_dims"):
        return [Sizes((product(parts[0]),))]
    return [Sizes(None)] * len(op.outputs)


def unary(op: tf.Operation, states: list) -> list:
    """Elementwise on one tensor; of sizes, only a cast or identity keeps their values."""
    if isinstance(states[0], Sizes) and op.type not in ("Cast", "Identity", "StopGradient", "Snapshot"):
        return [Sizes(None)] * len(op.outputs)
    return [states[0]] * len(op.outputs)


def broadcast(op: tf.Operation, states: list, data: list[int] | None = None) -> list:
    """Elementwise with NumPy broadcasting: every batch input's axis lands on one output axis, where each batch-free
    input has size 1 or no axis (a larger one would lay its entries along the batch, by position)."""
    data = range(len(op.inputs)) if data is None else data
    if not any(isinstance(states[i], Rows) for i in data):
        return size_result(op, [states[i] for i in data])
    rank = rank_of(op, op.outputs[0])
    states = [None if free(s) else s for s in states]
    axes = set()
    for i in data:
        if isinstance(states[i], Sizes):
            raise refuse(op, "combines the batch's data with its size")
        if isinstance(states[i], Rows):
            axes.add((states[i].axis + rank - rank_of(op, op.inputs[i]), states[i].inner))
    if len(axes) != 1:
        raise refuse(op, "combines tensors whose examples lie along different axes")
    ((axis, inner),) = axes
    for i in data:
        if states[i] is None:
            shape = op.inputs[i].shape
            position = axis - (rank - rank_of(op, op.inputs[i]))
            if position >= 0 and shape[position] != 1:
                raise refuse(op, "lays a batch-free tensor along the batch axis")
    return [Rows(axis, inner)] * len(op.outputs)


def reduction(op: tf.Operation, states: list) -> list:
    """Sum, Mean, Max, ... along constant axes other than the batch axis (which keeps its place or moves left)."""
    if not isinstance(states[0], Rows):
        return size_result(op, states)
    rank = rank_of(op, op.inputs[0])
    axes = constant_axes(op, op.inputs[1], rank)
    axis = states[0].axis
    if axis in axes:
        raise refuse(op, "reduces across the batch axis")
    keep = op.get_attr("keep_dims") if "keep_dims" in op.node_def.attr else False
    return [states[0]._replace(axis=axis if keep else axis - sum(a < axis for a in set(axes)))] * len(op.outputs)


def matmul(op: tf.Operation, states: list) -> list:
    """A [m, k] x [k, n] product: one batch operand, its examples along the side that is not summed."""
    a, b = states[:2]
    if isinstance(a, Sizes) or isinstance(b, Sizes):
        raise refuse(op, "multiplies by the batch's size")
    if isinstance(a, Rows) and isinstance(b, Rows):
        raise refuse(op, "multiplies two batch tensors")
    if isinstance(a, Rows):
        return [a._replace(axis=0)] if a.axis == (1 if op.get_attr("transpose_a") else 0) else _contracted(op)
    if isinstance(b, Rows):
        return [b._replace(axis=1)] if b.axis == (0 if op.get_attr("transpose_b") else 1) else _contracted(op)
    return [None]


def _contracted(op: tf.Operation) -> list:
    """The refusal of a product that sums over the batch axis."""
    raise refuse(op, "sums over the batch axis")


def batch_matmul(op: tf.Operation, states: list) -> list:
    """A batched product: examples along a batch dimension of both operands (or of one, the other's size 1 there), or
    along one operand's side that is not summed."""
    if not any(isinstance(s, Rows) for s in states[:2]):
        return size_result(op, states)
    rank = rank_of(op, op.outputs[0])
    adjoint = [op.get_attr("adj_x"), op.get_attr("adj_y")]
    axes = set()
    for i, state in enumerate(states[:2]):
        r = rank_of(op, op.inputs[i])
        if isinstance(state, Sizes):
            raise refuse(op, "multiplies by the batch's size")
        if state is None:
            continue
        kept = (r - 1 if adjoint[0] else r - 2) if i == 0 else (r - 2 if adjoint[1] else r - 1)
        if state.axis < r - 2:
            axes.add((state.axis + rank - r, state.inner))
        elif state.axis == kept and not isinstance(states[1 - i], Rows):
            axes.add((rank - 2 + i, state.inner))
        else:
            raise refuse(op, "sums over the batch axis")
    if len(axes) != 1:
        raise refuse(op, "combines tensors whose examples lie along different axes")
    ((axis, inner),) = axes
    for i, state in enumerate(states[:2]):
        r = rank_of(op, op.inputs[i])
        position = axis - (rank - r)
        if state is None and axis < rank - 2 and position >= 0 and op.inputs[i].shape[position] != 1:
            raise refuse(op, "lays a batch-free tensor along the batch axis")
    return [Rows(axis, inner)]


def einsum(op: tf.Operation, states: list) -> list:
    """An einsum: the batch operands' examples under one label that the output keeps and no batch-free operand has."""
    equation = op.get_attr("equation").decode().replace(" ", "")
    inputs, output = equation.split("->")
    subscripts = inputs.split(",")

    def labels(subscript: str, rank: int) -> list[str]:  # The ellipsis's axes get labels numbered from the right.
        if "..." not in subscript:
            return list(subscript)
        head, tail = subscript.split("...")
        return [*head, *[f"#{k}" for k in range(rank - len(head) - len(tail), 0, -1)], *tail]

    out = labels(output, rank_of(op, op.outputs[0]))
    batch = set()
    for subscript, tensor, state in zip(subscripts, op.inputs, states):
        if isinstance(state, Sizes):
            raise refuse(op, "multiplies by the batch's size")
        names = labels(subscript, rank_of(op, tensor))
        if isinstance(state, Rows):
            if names.count(names[state.axis]) != 1:
                raise refuse(op, "takes a diagonal across the batch axis")
            batch.add((names[state.axis], state.inner))
    if not batch:
        return [None]
    if len(batch) != 1 or next(iter(batch))[0] not in out:
        raise refuse(op, "sums over the batch axis or joins two batch axes")
    ((label, inner),) = batch
    for subscript, tensor, state in zip(subscripts, op.inputs, states):
        if state is None and label in labels(subscript, rank_of(op, tensor)):
            raise refuse(op, "lays a batch-free tensor along the batch axis")
    return [Rows(out.index(label), inner)]


def last_axis(op: tf.Operation, states: list) -> list:
    """Ops acting along the last axis (softmax, top-k, band part: the last two)."""
    if isinstance(states[0], Rows):
        rank = rank_of(op, op.inputs[0])
        reach = 2 if op.type == "MatrixBandPart" else 1
        if states[0].axis >= rank - reach:
            raise refuse(op, "acts along the batch axis")
        if any(s is not None for s in states[1:]):
            raise refuse(op, "takes an argument from the batch")
    return [states[0]] * len(op.outputs)


def batch_free_only(op: tf.Operation, states: list) -> list:
    """Random draws, ranges, one-hot depths and the like: their arguments must not come from the batch."""
    if any(s is not None for s in states):
        raise refuse(op, "draws or counts by the batch (its size or data)")
    return [None] * len(op.outputs)


def assign(op: tf.Operation, states: list) -> list:
    """A variable write: only batch-free values (a seed generator's counter), never the batch's data."""
    if any(s is not None for s in states[1:]):
        raise refuse(op, "writes a value computed from the batch to a variable")
    return []


def per_output(op: tf.Operation, states: list) -> list:
    """IdentityN: each output as its input."""
    return list(states[: len(op.outputs)])


def first_only(op: tf.Operation, states: list) -> list:
    """Ops whose batch input is the first, the others batch-free (bias, paddings, filters, clip bounds)."""
    if op.type == "BiasAdd" and op.get_attr("data_format") != b"NCHW":
        return broadcast(op, states)
    if any(s is not None for s in states[1:]):
        raise refuse(op, "takes a second argument from the batch")
    if isinstance(states[0], Rows) and states[0].axis != 0:
        raise refuse(op, "acts on a tensor whose examples are not on its first axis")
    if op.type in ("Pad", "PadV2", "MirrorPad") and isinstance(states[0], Rows):
        paddings = static(op.inputs[1])
        if paddings is None or list(paddings[states[0].axis]) != [0, 0]:
            raise refuse(op, "pads the batch axis")
    return [states[0]] + [None] * (len(op.outputs) - 1)


def select(op: tf.Operation, states: list) -> list:
    """Select: TF1's ``where``, whose rank-1 condition picks whole rows (refused unless batch-free)."""
    if rank_of(op, op.inputs[0]) == rank_of(op, op.inputs[1]):
        return broadcast(op, states)
    if states[0] is not None:
        raise refuse(op, "selects rows by a condition from the batch")
    return broadcast(op, states, [1, 2])


def fused_batch_norm(op: tf.Operation, states: list) -> list:
    """FusedBatchNorm(V2, V3): statistics per channel over every other axis. In training per example only where the
    examples lie along the channel axis, as Keras 2's LayerNormalization lays its rows ([1, rows, features, 1] NCHW),
    scale and offset batch-free or laid the same way; in inference with the examples on axis 0."""
    x, parameters = states[0], states[1:]
    if not isinstance(x, Rows):
        return size_result(op, states)
    channel = 1 if op.get_attr("data_format") in (b"NCHW", b"NCDHW") else rank_of(op, op.inputs[0]) - 1
    along_channel = x.axis == channel and all(p in (None, Rows(0, x.inner)) for p in parameters)
    if op.get_attr("is_training") and not along_channel:
        raise refuse(op, "normalises with statistics across the batch")
    if not (along_channel or (x.axis == 0 and all(p is None for p in parameters))):
        raise refuse(op, "normalises with parameters from the batch, or with the batch along a channel")
    per_channel = Rows(0, x.inner) if x.axis == channel else None
    return [x] + [per_channel] * (len(op.outputs) - 1)
