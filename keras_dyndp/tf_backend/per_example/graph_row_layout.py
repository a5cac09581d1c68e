"""What TensorFlow's layout ops (reshapes, transposes, slices, joins, gathers, shapes, fills) do to the rows of the
batch, for `graph_rows`'s proof; the states and the other ops: `graph_row_ops`."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import tensorflow as tf

from keras_dyndp.tf_backend.per_example import graph_row_ops as ops


def transpose(op: tf.Operation, states: list) -> list:
    """A transpose by a constant permutation: the batch axis goes where the permutation puts it."""
    if not isinstance(states[0], ops.Rows):
        return ops.size_result(op, states)
    perm = ops.constant_axes(op, op.inputs[1], ops.rank_of(op, op.inputs[0]))
    return [states[0]._replace(axis=perm.index(states[0].axis))]


def expand_dims(op: tf.Operation, states: list) -> list:
    """A new axis at a constant position: the batch axis moves right where the new one comes before it."""
    if not isinstance(states[0], ops.Rows):
        return ops.size_result(op, states)
    (axis,) = ops.constant_axes(op, op.inputs[1], ops.rank_of(op, op.outputs[0]))
    return [states[0]._replace(axis=states[0].axis + (axis <= states[0].axis))]


def squeeze(op: tf.Operation, states: list) -> list:
    """Named size-1 axes removed (never the batch axis; a squeeze of every size-1 axis could take it)."""
    if not isinstance(states[0], ops.Rows):
        return ops.size_result(op, states)
    rank = ops.rank_of(op, op.inputs[0])
    axes = [ops.normal_axis(op, a, rank) for a in op.get_attr("squeeze_dims")]
    if not axes or states[0].axis in axes:
        raise ops.refuse(op, "may squeeze the batch axis")
    return [states[0]._replace(axis=states[0].axis - sum(a < states[0].axis for a in axes))]


def reshape(op: tf.Operation, states: list) -> list:
    """Row-major, element f of a batch tensor belongs to example (f // Q) % B, Q the elements below one example's
    slice (``inner`` times the sizes after its axis), whatever the shape: so a reshape keeps the examples apart
    where the sizes before the batch axis multiply to the same on both sides and the sizes after the output's one
    unknown axis divide Q (which gives the output's ``inner``). Every other size must be known while tracing."""
    state = states[0]
    if not isinstance(state, ops.Rows):
        if state is None and not ops.free(states[1]):
            raise ops.refuse(op, "reshapes a batch-free tensor to a batch-sized shape")
        return ops.size_result(op, states)
    before, after = op.inputs[0].shape.as_list(), op.outputs[0].shape.as_list()
    requested = ops.dims_of(op.inputs[1], states[1]) or [None] * len(after)
    batch_sized = [k for k, d in enumerate(requested) if d is not None and d[1] == 1]
    after = [
        d if d is not None or r is None or r[1] or r[0] is None or r[0] < 0 else r[0] for d, r in zip(after, requested)
    ]
    unknown = [k for k, d in enumerate(after) if d is None]
    if [k for k, d in enumerate(before) if d is None] != [state.axis] or len(unknown) != 1:
        raise ops.refuse(op, "reshapes a tensor whose shape is not known apart from the batch axis")
    (axis,) = unknown
    below, after_axis = state.inner * math.prod(before[state.axis + 1 :]), math.prod(after[axis + 1 :])
    if math.prod(before[: state.axis]) != math.prod(after[:axis]) or below % after_axis:
        raise ops.refuse(op, "reshapes across the batch axis")
    if batch_sized and (batch_sized != [axis] or requested[axis][0] != below // after_axis):
        raise ops.refuse(op, "reshapes to a batch-sized shape that does not match its input's")
    op.outputs[0].set_shape(after)  # What the proof knows, for the ops after it (this trace is never run).
    return [ops.Rows(axis, below // after_axis)]


def concat(op: tf.Operation, states: list) -> list:
    """ConcatV2 along a constant axis other than the batch axis, of batch tensors alike; of sizes, their elements."""
    values, axis_state = states[:-1], states[-1]
    if axis_state is not None:
        raise ops.refuse(op, "takes an axis from the batch")
    if not any(isinstance(s, ops.Rows) for s in values):
        return _joined_sizes(op, op.inputs[:-1], values)
    return _along_rows(op, values, ops.constant_axes(op, op.inputs[-1], ops.rank_of(op, op.inputs[0]))[0])


def _along_rows(op: tf.Operation, values: list, axis: int) -> list:
    """The one state of joined batch tensors, all alike, joined along an axis other than theirs."""
    if any(s != values[0] or not isinstance(s, ops.Rows) for s in values):
        raise ops.refuse(op, "joins tensors whose examples lie along different axes (or batch-free ones along them)")
    if axis == values[0].axis:
        raise ops.refuse(op, "joins along the batch axis")
    return [values[0]]


def _joined_sizes(op: tf.Operation, tensors: list, states: list) -> list:
    """Concatenated or stacked sizes, element by element where every part's are known."""
    if not any(isinstance(s, ops.Sizes) for s in states):
        return [None]
    dims: list = []
    for tensor, state in zip(tensors, states):
        part = ops.dims_of(tensor, state)
        if part is None:
            return [ops.Sizes(None)]
        dims += part
    return [ops.Sizes(tuple(dims))]


def pack(op: tf.Operation, states: list) -> list:
    """A stack: of batch tensors alike (the batch axis moves right where the new one comes before it), or of sizes."""
    if not any(isinstance(s, ops.Rows) for s in states):
        return (
            _joined_sizes(op, op.inputs, states) if ops.rank_of(op, op.inputs[0]) == 0 else ops.size_result(op, states)
        )
    rank = ops.rank_of(op, op.inputs[0])
    axis = ops.normal_axis(op, op.get_attr("axis"), rank + 1)
    (rows,) = _along_rows(op, states, -1)
    return [rows._replace(axis=rows.axis + (axis <= rows.axis))]


def split(op: tf.Operation, states: list) -> list:
    """Split (axis first), SplitV (axis last), Unpack (an attribute; the axis goes)."""
    value = states[0] if op.type != "Split" else states[1]
    if not isinstance(value, ops.Rows):
        return ops.size_result(op, states)
    if any(s is not None for s in (states[0], *states[2:]) if s is not value):
        raise ops.refuse(op, "splits by sizes from the batch")
    tensor = op.inputs[1] if op.type == "Split" else op.inputs[0]
    rank = ops.rank_of(op, tensor)
    if op.type == "Unpack":
        axis = ops.normal_axis(op, op.get_attr("axis"), rank)
    else:
        axis = ops.constant_axes(op, op.inputs[0] if op.type == "Split" else op.inputs[2], rank)[0]
    if axis == value.axis:
        raise ops.refuse(op, "splits along the batch axis")
    return [value._replace(axis=value.axis - (op.type == "Unpack" and axis < value.axis))] * len(op.outputs)


def strided_slice(op: tf.Operation, states: list) -> list:
    """A slice with constant bounds that keeps the whole batch axis, with its masks (ellipsis, new and shrunk axes); of
    sizes, their elements."""
    if any(s is not None for s in states[1:]):
        raise ops.refuse(op, "slices with bounds from the batch")
    begin, end, strides = (ops.static(t) for t in op.inputs[1:4])
    if begin is None or end is None or strides is None:
        raise ops.refuse(op, "slices with bounds that are not constants")
    masks = {name: op.get_attr(name) for name in ("begin_mask", "end_mask", "ellipsis_mask", "new_axis_mask")}
    shrink = op.get_attr("shrink_axis_mask")
    if isinstance(states[0], ops.Sizes):
        return [_sliced_sizes(op, states[0], begin, end, strides, masks, shrink)]
    if not isinstance(states[0], ops.Rows):
        return [None]
    rank, axis = ops.rank_of(op, op.inputs[0]), states[0].axis
    dim, out = 0, 0  # The input axis and output axis the k-th part of the slice specification stands for.
    for k in range(len(begin)):
        bit = 1 << k
        if masks["ellipsis_mask"] & bit:
            covered = rank - (len(begin) - k - 1 - bin(masks["new_axis_mask"] >> (k + 1)).count("1"))
            if dim <= axis < covered:
                return [states[0]._replace(axis=out + axis - dim)]
            out, dim = out + covered - dim, covered
        elif masks["new_axis_mask"] & bit:
            out += 1
        else:
            if dim == axis:
                whole = (masks["begin_mask"] & bit or begin[k] == 0) and masks["end_mask"] & bit and strides[k] == 1
                if shrink & bit or not whole:
                    raise ops.refuse(op, "slices the batch axis")
                return [states[0]._replace(axis=out)]
            out, dim = out + (not shrink & bit), dim + 1
    return [states[0]._replace(axis=out + axis - dim)]


def _sliced_sizes(op, sizes: ops.Sizes, begin, end, strides, masks, shrink) -> ops.Sizes:
    """A slice of a vector of sizes (a shape) with constant bounds."""
    if sizes.dims is None or len(begin) != 1 or masks["ellipsis_mask"] or masks["new_axis_mask"]:
        return ops.Sizes(None)
    start = None if masks["begin_mask"] & 1 else int(begin[0])
    if shrink & 1:
        return ops.Sizes((sizes.dims[start or 0],))
    stop = None if masks["end_mask"] & 1 else int(end[0])
    return ops.Sizes(sizes.dims[slice(start, stop, int(strides[0]))])


def begin_size_slice(op: tf.Operation, states: list) -> list:
    """Slice (begin, size): constant bounds that keep the whole batch axis."""
    if not isinstance(states[0], ops.Rows):
        return ops.size_result(op, states)
    begin, size = ops.static(op.inputs[1]), ops.static(op.inputs[2])
    axis = states[0].axis
    if begin is None or size is None or states[1] is not None or states[2] is not None:
        raise ops.refuse(op, "slices with bounds that are not constants")
    if begin[axis] != 0 or size[axis] != -1:
        raise ops.refuse(op, "slices the batch axis")
    return [states[0]]


def gather(op: tf.Operation, states: list) -> list:
    """GatherV2 (params, indices, axis), ResourceGather (resource, indices): ``take``."""
    params, indices = states[:2]
    if op.type == "ResourceGather":
        axis, batch_dims = 0, op.get_attr("batch_dims")
    else:
        if states[2] is not None:
            raise ops.refuse(op, "takes an axis from the batch")
        axis, batch_dims = (
            ops.constant_axes(op, op.inputs[2], ops.rank_of(op, op.inputs[0]))[0],
            op.get_attr("batch_dims"),
        )
    if isinstance(params, ops.Sizes) and ops.free(indices):
        value = ops.static(op.inputs[1])
        if params.dims is None or value is None or axis != 0 or op.inputs[1].shape.rank > 1:
            return [ops.Sizes(None)]
        return [ops.Sizes(tuple(params.dims[int(k)] for k in np.reshape(value, [-1])))]
    if isinstance(params, ops.Sizes) or isinstance(indices, ops.Sizes):
        raise ops.refuse(op, "gathers by the batch's size")
    if batch_dims:
        if params == indices == ops.Rows(0):
            return [ops.Rows(0)]
        raise ops.refuse(op, "gathers with batch dimensions that are not the examples'")
    if params is None and isinstance(indices, ops.Rows):
        return [indices._replace(axis=axis + indices.axis)]
    if isinstance(params, ops.Rows) and indices is None and params.axis != axis:
        moved = params.axis if params.axis < axis else params.axis + ops.rank_of(op, op.inputs[1]) - 1
        return [params._replace(axis=moved)]
    if params is None and indices is None:
        return [None]
    raise ops.refuse(op, "gathers along the batch axis")


def shape(op: tf.Operation, states: list) -> list:
    """Shape, ShapeN, Size, Rank: only a batch tensor's shape depends on the batch (its size)."""
    results = []
    for tensor, state in zip(op.inputs, states):
        if not isinstance(state, ops.Rows) or op.type == "Rank":
            results.append(None)
        elif op.type == "Size":
            results.append(ops.Sizes(None))
        else:
            sizes = [(state.inner, 1) if k == state.axis else (d, 0) for k, d in enumerate(tensor.shape.as_list())]
            results.append(ops.Sizes(tuple(sizes)))
    return results


def _batch_sized(op: tf.Operation, shape: Any, tensor: tf.Tensor, rank: int) -> ops.Rows | None:
    """Where the batch size enters a shape of identical rows (``Rows``, its ``inner`` the factor); None where no
    element depends on it."""
    dims = ops.dims_of(tensor, shape)
    if shape is None or ops.free(shape):
        return None
    if dims is None or len(dims) != rank or any(d is None for d in dims) or sum(d[1] for d in dims) != 1:
        raise ops.refuse(op, "makes a tensor shaped by the batch size in a way not followed")
    axis = [d[1] for d in dims].index(1)
    if dims[axis][0] is None:
        raise ops.refuse(op, "makes a tensor shaped by the batch size in a way not followed")
    return ops.Rows(axis, dims[axis][0])


def fill(op: tf.Operation, states: list) -> list:
    """Fill (dims, value) and BroadcastTo (input, shape): identical rows along a batch-sized axis hold no example."""
    shape, value = (0, 1) if op.type == "Fill" else (1, 0)
    rank = ops.rank_of(op, op.outputs[0])
    rows = _batch_sized(op, states[shape], op.inputs[shape], rank)
    if not ops.free(states[value]) and not isinstance(states[value], ops.Rows):
        raise ops.refuse(op, "fills a tensor with the batch's size")
    if isinstance(states[value], ops.Rows):
        moved = states[value]._replace(axis=states[value].axis + rank - ops.rank_of(op, op.inputs[value]))
        if rows != moved:
            raise ops.refuse(op, "broadcasts the batch axis to a size that is not the batch's")
        return [moved]
    return [rows]


def tile(op: tf.Operation, states: list) -> list:
    """A tile by constant counts, 1 along the batch axis."""
    if not ops.free(states[1]):
        raise ops.refuse(op, "tiles by a count from the batch")
    if not isinstance(states[0], ops.Rows):
        return ops.size_result(op, states[:1])
    if (ops.dims_of(op.inputs[1], states[1]) or [None] * (states[0].axis + 1))[states[0].axis] != (1, 0):
        raise ops.refuse(op, "tiles along the batch axis (or by a count not known while tracing)")
    return [states[0]]
