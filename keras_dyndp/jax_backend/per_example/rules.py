"""Ghost-clipping rules on JAX: the per-example gradient norms and clipped sums of a layer's kernel (or scale and
offset) from each example's layer input ``a`` and output gradient ``g`` as `taps` records them, [B, 1, ...] (each
example's batch of one, vmapped), in the form `keras_dyndp.rules.ghost_cost` finds cheapest; registered on import
(docs/architecture.md, "The ghost-rule registry"; how: docs/jax.md, "What JAX does its own way")."""

from __future__ import annotations

import functools
import itertools
import types
from collections.abc import Callable
from typing import Any
from typing import NamedTuple

import jax
import jax.numpy as jnp
import keras
from keras.src.models.functional import Functional

from keras_dyndp.rules import dense_attention
from keras_dyndp.rules import einsum_equation
from keras_dyndp.rules import ghost_cost
from keras_dyndp.rules import layer_rules
from keras_dyndp.rules import registry


def _positions(value: jax.Array) -> jax.Array:
    return value.reshape(value.shape[0], -1, value.shape[-1])


class _Pieces(NamedTuple):
    """A kernel's position inputs [B, T, width], float32, in ``count`` pieces ``piece(index)`` [B, T, width / count]
    whose concatenation is in the kernel's order (one piece per kernel offset where the whole would be large)."""

    count: int
    width: int
    piece: Callable[[jax.Array | int], jax.Array]


def _one_piece(rows: jax.Array) -> _Pieces:
    rows = rows.astype(jnp.float32)
    return _Pieces(1, rows.shape[-1], lambda index: rows)


def _shifts(layer: keras.layers.Layer, a: jax.Array) -> _Pieces:
    """A channels_last convolution's input at each kernel offset [B, T, c_in], in the kernel's order: the layer's
    output at position t is sum_o shift_o[t] @ kernel[o] (strided slices of the padded input, exact copies)."""
    x = a.reshape(-1, *a.shape[2:]).astype(jnp.float32)
    spatial, strides, dilations = x.shape[1:-1], tuple(layer.strides), tuple(layer.dilation_rate)
    spans = [(size - 1) * dilation + 1 for size, dilation in zip(layer.kernel_size, dilations)]
    pads = jax.lax.padtype_to_pads(spatial, spans, strides, layer.padding.upper())
    x = jnp.pad(x, [(0, 0), *pads, (0, 0)])
    windows = [(size - span) // stride * stride + 1 for size, span, stride in zip(x.shape[1:-1], spans, strides)]
    starts = jnp.asarray(list(itertools.product(*(range(size) for size in layer.kernel_size)))) * jnp.asarray(dilations)

    def shift(index):
        window = jax.lax.dynamic_slice(x, (0, *starts[index], 0), (x.shape[0], *windows, x.shape[-1]))
        strided = jax.lax.slice(window, (0,) * x.ndim, window.shape, (1, *strides, 1))
        return strided.reshape(a.shape[0], -1, x.shape[-1])

    return _Pieces(len(starts), len(starts) * x.shape[-1], shift)


def _conv_inputs(layer: keras.layers.Layer, a: jax.Array) -> _Pieces:
    """A convolution's input patches [B, T, kernel positions * c_in] (the kernel's order): whole while no larger per
    example than `ghost_cost.MAX_MATERIALISED`, else one kernel offset at a time, one batched matmul per offset, never
    held whole (for large convolutions cheaper than vmapping the convolution's vjp: docs/performance.md)."""
    shifts = _shifts(layer, a)
    positions = shifts.piece(0).shape[1]  # its shape only: XLA drops the slice
    if positions * shifts.width <= ghost_cost.MAX_MATERIALISED:
        return _one_piece(jnp.concatenate([shifts.piece(index) for index in range(shifts.count)], axis=-1))
    return shifts


def _over_pieces(pieces: _Pieces, function: Callable[[jax.Array], Any]) -> Any:
    """sum_j function(piece j), one piece at a time (``function`` may return a tuple of arrays: summed each)."""
    first = function(pieces.piece(0))
    if pieces.count == 1:
        return first
    add = functools.partial(jax.tree_util.tree_map, jnp.add)
    step = lambda total, index: (add(total, function(pieces.piece(index))), None)  # noqa: E731
    return jax.lax.scan(step, first, jnp.arange(1, pieces.count))[0]


def _with_position_squares(function: Callable[[jax.Array], jax.Array]) -> Callable:
    """``piece -> (function(piece), ||piece_t||^2 [B, T])``: the positions' squared norms in the same pass over the
    pieces (the rounding bound's ||a_t||, `_bounded`)."""
    return lambda piece: (function(piece), jnp.sum(piece**2, axis=-1))


_HIGHEST = jax.lax.Precision.HIGHEST  # norms in float32 on every device (a GPU's default is TensorFloat-32)


def _bounded(squared: jax.Array, position_norms: jax.Array, g_t: jax.Array, form: str, fan_in: int, pieces: int = 1):
    """``squared`` [B] computed in ``form`` raised to the float32 rounding bound (`ghost_cost.bounded_squared_norms`),
    from ||a_t|| (``position_norms`` [B, T]; ``fan_in`` floats each) and g_t [B, T, c]."""
    second, first = ghost_cost.rounding_coefficients(form, g_t.shape[1], fan_in, g_t.shape[2], pieces=pieces)
    magnitude = jnp.sum(position_norms * jnp.sqrt(jnp.sum(g_t**2, axis=-1)), axis=1)
    return ghost_cost.bounded_squared_norms(jnp, squared, magnitude, second, first)


def _weight_gradient(op: Callable, layer, a: jax.Array, g: jax.Array, factors: jax.Array) -> jax.Array:
    """sum_i factors_i G_i of a kernel used as ``op(layer, a, kernel)`` (linear in it: zeros stand in for its
    value): the op's weight gradient on the batch for the output gradients f_i g_i (book-keeping), at float32
    precision on every device; a factor-0 example's rows are selected out."""
    a = layer_rules.kept_rows(a.astype(jnp.float32), factors).reshape(-1, *a.shape[2:])
    g = layer_rules.scaled_rows(g, factors).reshape(-1, *g.shape[2:])
    kernel = jnp.zeros(layer.kernel.shape, jnp.float32)
    with jax.default_matmul_precision("highest"):  # ghost_cost.rounding_coefficients: float32 rounding only
        return jax.vjp(lambda k: op(layer, a, k), kernel)[1](g)[0]


def _bilinear(op: Callable, inputs: Callable, whole_by_vjp: bool = False) -> Callable:
    """``norms_and_sums`` of a kernel applied at T positions, ``op(layer, a, kernel)`` (linear in it: zeros stand in
    for its value), whose position inputs are ``inputs(layer, a)`` (`_Pieces`), in `ghost_cost`'s form: the Gram norms,
    or each example's G_i (a batched matmul per piece, or with ``whole_by_vjp`` each example's vjp of its own op:
    docs/performance.md); the sum from the G_i kept, or by book-keeping."""

    def norms_and_sums(layer, a, g):
        pieces, g_t = inputs(layer, a), _positions(g).astype(jnp.float32)
        book_keeping = lambda f: [_weight_gradient(op, layer, a, g, f)]  # noqa: E731
        if g_t.shape[1] == 1:  # ||a^T g||^2 = ||a||^2 ||g||^2: no cancellation
            rows = _over_pieces(pieces, lambda piece: jnp.sum(piece[:, 0] ** 2, axis=1))
            return rows * jnp.sum(g_t[:, 0] ** 2, axis=1), book_keeping
        form = ghost_cost.form(g_t.shape[1], pieces.width, g_t.shape[2])

        def bounded(squared, position_squares):
            return _bounded(squared, jnp.sqrt(position_squares), g_t, form, pieces.width, pieces.count)

        if form == ghost_cost.GRAM:
            gram = lambda piece: jnp.einsum("btp,bsp->bts", piece, piece, precision=_HIGHEST)  # noqa: E731
            gram_a, position_squares = _over_pieces(pieces, _with_position_squares(gram))
            gram_g = jnp.einsum("btd,bsd->bts", g_t, g_t, precision=_HIGHEST)
            return bounded(jnp.sum(jnp.sum(gram_a * gram_g, axis=2), axis=1), position_squares), book_keeping
        per_example = lambda piece, precision=None: jnp.einsum("btp,btd->bpd", piece, g_t, precision=precision)  # noqa: E731
        if whole_by_vjp and pieces.count == 1:
            kernel = jnp.zeros(layer.kernel.shape, jnp.float32)
            vjp = lambda a_i, g_i: jax.vjp(lambda k: op(layer, a_i, k), kernel)[1](g_i)[0]  # noqa: E731
            kept = jax.vmap(vjp)(a.astype(jnp.float32), g.astype(jnp.float32))[None]  # [1, B, *kernel]
        elif form == ghost_cost.PER_EXAMPLE_NORMS:
            norm = lambda piece: jnp.sum(per_example(piece, _HIGHEST) ** 2, axis=(1, 2))  # noqa: E731
            return bounded(*_over_pieces(pieces, _with_position_squares(norm))), book_keeping
        else:  # [pieces, B, p_j, d]
            kept = jax.lax.map(lambda index: per_example(pieces.piece(index)), jnp.arange(pieces.count))
        squared = jnp.sum(kept**2, axis=(0, *range(2, kept.ndim)))
        if form == ghost_cost.PER_EXAMPLE_NORMS:  # one piece: its positions' norms directly
            return bounded(squared, jnp.sum(pieces.piece(0) ** 2, axis=-1)), book_keeping
        return squared, lambda f: [layer_rules.weighted_sum(f, jnp.moveaxis(kept, 1, 0)).reshape(layer.kernel.shape)]

    return norms_and_sums


def _depthwise_norms_and_sums(layer, a, g):
    """G_i [c, kernel positions, m] materialised (a depthwise kernel is small); the sum by book-keeping."""
    channels = a.shape[-1]
    shifts = _shifts(layer, a)
    patches = jnp.stack([shifts.piece(index) for index in range(shifts.count)], axis=2)  # [B, T, positions, c]
    g_t = _positions(g).reshape(g.shape[0], -1, channels, g.shape[-1] // channels).astype(jnp.float32)
    squared = jnp.sum(jnp.einsum("btkc,btcm->bckm", patches, g_t, precision=_HIGHEST) ** 2, axis=(1, 2, 3))
    position_norms = jnp.sqrt(jnp.sum(patches**2, axis=(2, 3)))
    g_rows = _positions(g).astype(jnp.float32)
    squared = _bounded(squared, position_norms, g_rows, ghost_cost.PER_EXAMPLE_NORMS, shifts.width)
    return squared, lambda f: [_weight_gradient(_depthwise, layer, a, g, f)]


def _depthwise(layer, a: jax.Array, kernel: jax.Array) -> jax.Array:
    return keras.ops.depthwise_conv(a, kernel, layer.strides, layer.padding, layer.data_format, layer.dilation_rate)


def _separable_norms_and_sums(layer, a, g):
    """A SeparableConv2D is a depthwise convolution u = depthwise(a, D) then a 1 x 1 pointwise kernel P [c_in m, f]
    (TensorFlow's rule's math, `keras_dyndp.tf_backend.per_example.conv2d`): P's per-example gradient
    sum_t u_t^T g_t by the Dense rule, D's by the DepthwiseConv2D rule for u's gradient g P^T; u and g P^T are
    computed once, in float32 at full precision, from the step's values of D and P."""
    view = {
        name: getattr(layer, name) for name in ("kernel_size", "strides", "padding", "data_format", "dilation_rate")
    }
    # The depthwise step in a DepthwiseConv2D's place: its geometry, and D as its ``kernel`` (its shape only).
    depthwise = types.SimpleNamespace(kernel=layer.depthwise_kernel, **view)
    pointwise = jnp.asarray(layer.pointwise_kernel.value, jnp.float32)
    pointwise = pointwise.reshape(pointwise.shape[-2:])
    x, kernel = a.reshape(-1, *a.shape[2:]).astype(jnp.float32), jnp.asarray(layer.depthwise_kernel.value, jnp.float32)
    with jax.default_matmul_precision("highest"):
        u = _depthwise(layer, x, kernel).reshape(*g.shape[:-1], -1)  # [B, rows, ..., c_in m]
    g_u = jnp.einsum("...f,cf->...c", g.astype(jnp.float32), pointwise, precision=_HIGHEST)
    point_squared, point_sums = DENSE_NORMS_AND_SUMS(KernelView(pointwise), u, g)
    depth_squared, depth_sums = _depthwise_norms_and_sums(depthwise, a, g_u)
    shape = tuple(layer.pointwise_kernel.shape)
    return point_squared + depth_squared, lambda f: [*depth_sums(f), *(s.reshape(shape) for s in point_sums(f))]


def embedding_norms_and_sums(layer, ids, deltas):
    """Example b's gradient has one row per distinct id in it, the sum of its rows of delta (ids [B, ...], deltas
    [B, ..., D]): each position's delta added into its group's row (`_groups`), the squared norm taken of those rows,
    and the clipped sum a scatter-add of the very same rows f_b S by id, so no rounding bound is needed
    (`ghost_cost.PER_EXAMPLE`). An id -n is row N - n, as Keras's lookup (``jnp.take``) reads it: grouped with
    N - n, else one example's row would count twice; an id outside the table (no gradient) is its own group, in the
    norm (never below the exact one) but not in the sum."""
    vocabulary = layer.embeddings.shape[0]
    ids = ids.reshape(ids.shape[0], -1).astype(jnp.int32)
    ids = jnp.where(ids < 0, ids + vocabulary, ids)
    batch, rows = ids.shape
    deltas = deltas.reshape(batch, rows, -1).astype(jnp.float32)
    if rows > 1:
        deltas, group, ids = _groups(ids, deltas, vocabulary)
        deltas = jnp.zeros_like(deltas).at[jnp.arange(batch)[:, None], group].add(deltas)
    squared = jnp.sum(deltas**2, axis=(1, 2))
    table = jnp.zeros(layer.embeddings.shape, jnp.float32)
    scatter = lambda f: table.at[ids.reshape(-1)].add(  # noqa: E731
        layer_rules.scaled_rows(deltas, f).reshape(-1, deltas.shape[-1]), mode="drop"
    )
    return squared, lambda f: [scatter(f)]


def _groups(ids: jax.Array, deltas: jax.Array, vocabulary: int) -> tuple:
    """``(deltas, group, ids)``: the deltas [B, T, D] in some order per example, each one's group [B, T] (a position
    in that order where its group's sum goes) and the id [B, T] of the group whose sum goes to each position (N where
    none). By a [B, N] table of first positions where `ghost_cost.embedding_by_table`, else by sorting the ids."""
    batch, rows = ids.shape
    in_table = (ids >= 0) & (ids < vocabulary)
    positions = jnp.broadcast_to(jnp.arange(rows, dtype=jnp.int32), ids.shape)
    if ghost_cost.embedding_by_table(rows, vocabulary):
        dtype = next(dtype for dtype in (jnp.uint8, jnp.int16, jnp.int32) if rows <= jnp.iinfo(dtype).max + 1)
        inside = jnp.where(in_table, ids, 0)  # T - 1 for none: never below a position present
        first = (
            jnp.full((batch, vocabulary), rows - 1, dtype)
            .at[jnp.arange(batch)[:, None], inside]
            .min(jnp.where(in_table, positions, rows - 1).astype(dtype))
        )
        group = jnp.where(in_table, jnp.take_along_axis(first, inside, axis=1).astype(jnp.int32), positions)
        return deltas, group, jnp.where(in_table, ids, vocabulary)
    keys = jnp.where(in_table, ids, vocabulary)
    if (vocabulary + 1) * rows < 2**31:  # one sorted operand: id and position packed
        packed = jnp.sort(keys * rows + positions, axis=1)
        keys, order = packed // rows, packed % rows
    else:
        keys, order = jax.lax.sort((keys, positions), dimension=1, num_keys=1)
    starts = jnp.concatenate([jnp.ones((batch, 1), bool), keys[:, 1:] != keys[:, :-1]], axis=1) | (keys == vocabulary)
    group = jax.lax.cummax(jnp.where(starts, positions, 0), axis=1)
    return jnp.take_along_axis(deltas, order[..., None], axis=1), group, jnp.where(starts, keys, vocabulary)


class KernelView(NamedTuple):
    """A weight in a Dense kernel's place for `DENSE_NORMS_AND_SUMS` (an EinsumDense seen as a Dense over positions,
    a LoRA adapter): ``kernel`` [k, m] (its shape only, `_weight_gradient`)."""

    kernel: jax.ShapeDtypeStruct


def _einsum_supports(layer) -> bool:
    rank = einsum_equation.equation_input_rank(layer.equation)
    return _plain(layer) and einsum_equation.plan(layer.equation, tuple(layer.kernel.shape), rank) is not None


def einsum_norms_and_sums(layer, a, g):
    """An EinsumDense's kernel as a Dense over positions (`keras_dyndp.rules.einsum_equation`): a and g transposed to
    [B, T, k] and [B, T, m] (each example's batch of one folded into its positions), the Dense rule's norms and
    sums, the [k, m] sum put back in the kernel's order."""
    rows = a.shape[0]
    a, g = a.reshape(-1, *a.shape[2:]), g.reshape(-1, *g.shape[2:])  # [B, 1, ...] -> [B, ...]
    plan = einsum_equation.plan(layer.equation, tuple(layer.kernel.shape), a.ndim)
    a = jnp.transpose(a, plan.input_order).reshape(rows, -1, plan.fan_in)
    g = jnp.transpose(g, plan.output_order).reshape(rows, -1, plan.fan_out)
    view = KernelView(jax.ShapeDtypeStruct((plan.fan_in, plan.fan_out), jnp.float32))
    squared, sums = DENSE_NORMS_AND_SUMS(view, a, g)
    back = lambda total: jnp.transpose(total.reshape(plan.gradient_shape), plan.kernel_order)  # noqa: E731
    return squared, lambda f: [back(total) for total in sums(f)]


def _norm_variables(layer) -> list:
    return [variable for variable in (layer.gamma, layer.beta) if variable is not None]


def _affine_norms_and_sums(variables: Callable[[keras.layers.Layer], list]) -> Callable:
    """The rule of a normalisation layer whose call is affine in ``variables(layer)`` (its only trainable ones): the
    small per-example gradients of its scale and offset (x_hat g and g summed over positions), materialised from the
    vjp of its own call on each example (zeros for their values): exact for any axis, epsilon and groups."""

    def norms_and_sums(layer, a, g):
        values = [jnp.zeros(variable.shape, variable.dtype) for variable in variables(layer)]

        def example(a_i, g_i):
            outputs, vjp = jax.vjp(lambda values: layer.stateless_call(values, [], a_i)[0], values)
            return [grad.astype(jnp.float32) for grad in vjp(g_i.astype(outputs.dtype))[0]]

        grads = jax.vmap(example)(a, g)
        squared = sum(jnp.sum(grad.reshape(a.shape[0], -1) ** 2, axis=1) for grad in grads)
        return squared, lambda f: [layer_rules.weighted_sum(f, grad) for grad in grads]

    return norms_and_sums


def _plain(layer) -> bool:
    return not getattr(layer, "lora_enabled", False) and getattr(layer, "quantization_mode", None) is None


def _channels_last(layer) -> bool:
    return _plain(layer) and layer.data_format == "channels_last" and layer.padding != "causal"


DENSE_NORMS_AND_SUMS = _bilinear(lambda layer, a, k: jnp.matmul(a, k), lambda layer, a: _one_piece(_positions(a)))
_CONV_NORMS_AND_SUMS = _bilinear(lambda layer, a, k: layer.convolution_op(a, k), _conv_inputs, whole_by_vjp=True)
_kernel = lambda layer: [layer.kernel]  # noqa: E731
_separable_kernels = lambda layer: [layer.depthwise_kernel, layer.pointwise_kernel]  # noqa: E731
_conv_supports = lambda layer: _channels_last(layer) and layer.groups == 1  # noqa: E731

registry.install(registry.Hooks("JAX", keras.layers.Layer))
for _class, _variables, _norms_and_sums, _supports in (
    (keras.layers.Dense, _kernel, DENSE_NORMS_AND_SUMS, _plain),
    (keras.layers.EinsumDense, _kernel, einsum_norms_and_sums, _einsum_supports),
    (keras.layers.Conv1D, _kernel, _CONV_NORMS_AND_SUMS, _conv_supports),
    (keras.layers.Conv2D, _kernel, _CONV_NORMS_AND_SUMS, _conv_supports),
    (keras.layers.DepthwiseConv2D, _kernel, _depthwise_norms_and_sums, _channels_last),
    (keras.layers.SeparableConv2D, _separable_kernels, _separable_norms_and_sums, _channels_last),
    (keras.layers.Embedding, lambda layer: [layer.embeddings], embedding_norms_and_sums, _plain),
    (keras.layers.LayerNormalization, _norm_variables, _affine_norms_and_sums(_norm_variables), None),
    (keras.layers.GroupNormalization, _norm_variables, _affine_norms_and_sums(_norm_variables), None),
):
    registry.register_layer_rule(_class, variables=_variables, norms_and_sums=_norms_and_sums, supports=_supports)
if hasattr(keras.layers, "RMSNormalization"):  # Keras 3.9 and later: x / rms(x) times its scale, no offset
    _scale = lambda layer: [layer.scale]  # noqa: E731
    registry.register_layer_rule(
        keras.layers.RMSNormalization, variables=_scale, norms_and_sums=_affine_norms_and_sums(_scale)
    )
# Layers whose own call acts on each example alone and only wires its sublayers' calls together, as on TensorFlow
# (`taps` needs no declaration: the forward pass runs per example). Functional: keras.Model(inputs, outputs).
for _class in (keras.Sequential, Functional, keras.layers.MultiHeadAttention):
    registry.register_layer_rule(_class, per_example=True)
dense_attention.register(keras.layers)  # Attention, AdditiveAttention: their scales
