"""A proof, from the traced graph of the model's forward pass, that it keeps each example in its own row: the ghost
path's condition for a model with a layer not known to act per example as a whole (a subclassed block such as
KerasHub's ``TransformerEncoder``), where `per_example_layers` knows only layer classes. The pass is traced with an
unknown batch size (the other axes as the batch has them) and every op of the graph is followed from the inputs
(`graph_row_ops`): each tensor is free of the batch, holds example i at index i of one axis, or is a size derived from
the batch's (allowed only where a shape is expected). An op without a rule, or one that could bring two examples
together (a reduction, product, concatenation or reshape across the batch axis, a gather by batch position, a random
draw or range shaped by the batch size, a batch-derived write to a variable, control flow) ends the proof: the model
then takes the vectorized path, as before."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from keras_dyndp.tf_backend.keras_compat import keras
from keras_dyndp.tf_backend.per_example import graph_row_layout as layout
from keras_dyndp.tf_backend.per_example import graph_row_ops as ops
from keras_dyndp.tf_backend.per_example import randomness
from keras_dyndp.tf_backend.per_example.graph_row_ops import NotProven
from keras_dyndp.tf_backend.per_example.graph_row_ops import Rows

_UNARY = """Abs Acos Acosh Asin Asinh Atan Atanh BesselI0e BesselI1e Bitcast Cast Ceil CheckNumerics ComplexAbs Conj Cos
    Cosh Digamma DebugIdentity DebugIdentityV2 Elu EnsureShape Erf Erfc Erfinv Exp Expm1 Floor Identity Imag Inv Invert
    IsFinite IsInf IsNan LeakyRelu Lgamma Log Log1p LogicalNot Ndtri Neg OnesLike PreventGradient Real Reciprocal Relu
    Relu6 Rint Round Rsqrt Selu Sigmoid Sign Sin Sinh Snapshot Softplus Softsign Sqrt Square StopGradient Tan Tanh
    ZerosLike""".split()
_BINARY = """Add AddN AddV2 ApproximateEqual Atan2 BitwiseAnd BitwiseOr BitwiseXor ClipByValue Div DivNoNan Equal
    FloorDiv FloorMod Greater GreaterEqual LeftShift Less LessEqual LogicalAnd LogicalOr Maximum Minimum Mod Mul
    MulNoNan NextAfter NotEqual Pow RealDiv RightShift SelectV2 SquaredDifference Sub TruncateDiv TruncateMod Xdivy
    Xlog1py Xlogy Zeta""".split()
_REDUCTIONS = "All Any ArgMax ArgMin EuclideanNorm Max Mean Min Prod Sum".split()
_BATCH_FREE = """Range RandomUniform RandomUniformInt RandomStandardNormal TruncatedNormal StatelessRandomUniformV2
    StatelessRandomNormalV2 StatelessTruncatedNormalV2 StatelessRandomUniformIntV2 StatelessRandomUniformFullIntV2
    StatelessRandomGetKeyCounter StatelessRandomGetAlg StatelessRandomGetKeyCounterAlg StatelessRandomUniform
    StatelessRandomNormal StatelessTruncatedNormal RngReadAndSkip VarHandleOp LinSpace""".split()
_FIRST_ONLY = """BiasAdd Pad PadV2 MirrorPad Conv2D Conv3D DepthwiseConv2dNative MaxPool MaxPoolV2 MaxPool3D
    AvgPool AvgPool3D""".split()

RULES: dict[str, Callable[[tf.Operation, list], list]] = {
    **dict.fromkeys(_UNARY, ops.unary),
    **dict.fromkeys(_BINARY, ops.broadcast),
    **dict.fromkeys(_REDUCTIONS, ops.reduction),
    **dict.fromkeys(_BATCH_FREE, ops.batch_free_only),
    **dict.fromkeys(_FIRST_ONLY, ops.first_only),
    **dict.fromkeys("AssignVariableOp AssignAddVariableOp AssignSubVariableOp".split(), ops.assign),
    **dict.fromkeys("Softmax LogSoftmax TopKV2 MatrixBandPart".split(), ops.last_axis),
    **dict.fromkeys("Shape ShapeN Size Rank".split(), layout.shape),
    **dict.fromkeys("Split SplitV Unpack".split(), layout.split),
    **dict.fromkeys("Fill BroadcastTo".split(), layout.fill),
    **dict.fromkeys("GatherV2 ResourceGather".split(), layout.gather),
    "IdentityN": ops.per_output,
    "ReadVariableOp": ops.unary,
    "Const": lambda op, states: [None],
    "NoOp": lambda op, states: [],
    "MatMul": ops.matmul,
    "BatchMatMulV2": ops.batch_matmul,
    "BatchMatMulV3": ops.batch_matmul,
    "Einsum": ops.einsum,
    "Transpose": layout.transpose,
    "ExpandDims": layout.expand_dims,
    "Squeeze": layout.squeeze,
    "Reshape": layout.reshape,
    "ConcatV2": layout.concat,
    "Pack": layout.pack,
    "StridedSlice": layout.strided_slice,
    "Slice": layout.begin_size_slice,
    "Tile": layout.tile,
    "Select": ops.select,
    **dict.fromkeys("FusedBatchNorm FusedBatchNormV2 FusedBatchNormV3".split(), ops.fused_batch_norm),
}


_SAME_SHAPE = frozenset(_UNARY + "FusedBatchNorm FusedBatchNormV2 FusedBatchNormV3".split()) - {"Bitcast"}

# The ops that follow sizes element by element; the others see sizes free of the batch size as batch-free.
_SIZE_AWARE = frozenset(
    """Shape ShapeN Size Rank StridedSlice GatherV2 ConcatV2 Pack Prod Mul Cast Identity Reshape Fill BroadcastTo
    Tile""".split()
)


def _follow_op(op: tf.Operation, states: list) -> list:
    """The states of ``op``'s outputs from its inputs'; NotProven where it could mix examples or has no rule."""
    rule = RULES.get(op.type)
    if rule is None:
        raise ops.refuse(op, "is not known to keep examples apart")
    if op.type not in _SIZE_AWARE:
        states = [None if ops.free(s) else s for s in states]
    results = rule(op, states)
    if len(results) != len(op.outputs):
        raise ops.refuse(op, "has outputs no rule describes")
    return results


# The probes' traces (this proof's and `ghost`'s) give every unknown axis but the batch's this length.
_PROBE_LENGTH = 97

_results: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@tf.autograph.experimental.do_not_convert
def first_mixing_op(model: keras.Model, x: Any) -> str | None:
    """None where the forward pass ``model(x, training=True)`` provably keeps each example in its own row (axis 0 of
    every output); else the first op that could mix examples, described for a message. Cached per input signature
    and set of trainable variables."""
    key = probe_key(model, x)
    if key is None:
        return "an input that is not a tensor with a batch axis"
    results = _results.setdefault(model, {})
    if key not in results:
        results[key] = _trace_and_follow(model, x)
    return results[key]


def probe_key(model: keras.Model, x: Any) -> tuple | None:
    """The key a probe trace of ``model`` on batches like ``x`` is cached under (its inputs' dtypes and shapes after
    the batch axis, and the trainable variables, which decide the tapped layers); None where an input is not a tensor
    with a batch axis."""
    flat = tf.nest.flatten(x)
    if not all(isinstance(t, (tf.Tensor, np.ndarray)) and len(t.shape) for t in flat):
        return None
    return (
        tuple((tf.as_dtype(t.dtype), tuple(t.shape[1:])) for t in flat),
        tuple(id(v) for v in model.trainable_variables),
    )


def probe_specs(x: Any, batch_size: int | None) -> Any:
    """``x``'s structure as the specs of a probe trace: ``batch_size`` examples (None: unknown), every other unknown
    axis ``_PROBE_LENGTH`` long."""

    def spec(tensor: tf.Tensor | np.ndarray) -> tf.TensorSpec:
        shape = [batch_size] + [_PROBE_LENGTH if d is None else d for d in tensor.shape[1:]]
        return tf.TensorSpec(shape, tf.as_dtype(tensor.dtype))

    return tf.nest.map_structure(spec, x)


def _trace_and_follow(model: keras.Model, x: Any) -> str | None:
    """`first_mixing_op` uncached: the trace, then `follow`."""
    try:
        function = tf.function(lambda batch: _forward(model, batch), autograph=False)
        concrete = function.get_concrete_function(probe_specs(x, None))
    except (ValueError, TypeError, NotImplementedError, tf.errors.OpError) as error:
        return f"a forward pass with an unknown batch size, which could not be traced ({type(error).__name__})"
    try:
        follow(concrete)
    except NotProven as reason:
        return str(reason)
    except ValueError as error:  # A static shape the proof inferred contradicts TensorFlow's: no proof.
        return f"a shape that could not be followed ({error})"
    return None


def _forward(model: keras.Model, batch: Any) -> Any:
    """The forward pass as the DP step runs it: random layers seeded once, Dropout one mask for all rows."""
    with randomness.secret_randomness(model, seed=tf.zeros([2], tf.int64)):
        return model(batch, training=True)


def follow(concrete: Any) -> None:
    """Follows every op of ``concrete``'s graph from its batch inputs (rows on axis 0); NotProven where an op could
    mix examples or an output does not hold one example per row of axis 0."""
    graph = concrete.graph
    states: dict[int, Any] = {}
    arguments = graph.inputs[: len(graph.inputs) - len(graph.internal_captures)]
    for tensor in arguments:
        states[id(tensor)] = Rows(0)
    for external, internal in graph.captures:
        if internal.dtype != tf.resource and tf.is_symbolic_tensor(external):
            raise NotProven(f"a tensor {internal.name!r} captured from outside the forward pass")
        states[id(internal)] = None
    for op in graph.get_operations():
        if op.type == "Placeholder" and all(id(t) in states for t in op.outputs):
            continue
        inputs = [states.get(id(t), ops.UNSEEN) for t in op.inputs]
        if ops.UNSEEN in inputs:
            raise NotProven(f"operation {op.name!r} ({op.type}) reads a tensor from outside the traced order")
        for tensor, state in zip(op.outputs, _follow_op(op, inputs)):
            states[id(tensor)] = state
        if op.type in _SAME_SHAPE:  # Static shapes the proof learnt (`graph_row_layout.reshape`) carried on.
            op.outputs[0].set_shape(op.inputs[0].shape)
    for tensor in graph.outputs:
        state = states.get(id(tensor))
        if state not in (None, Rows(0)):
            raise NotProven(f"the output {tensor.name!r}, which does not hold one example per row")
