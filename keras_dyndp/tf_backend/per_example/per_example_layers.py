"""Which models may take the batched (ghost) path: those whose every layer and op is KNOWN to act per example. A layer
that reads across the batch (a ``Lambda`` subtracting the batch mean) breaks per-example clipping silently and looks
like an honest one in a traced graph. Known (exact classes): `_known_classes` (with conditions on ``axis``, dropout,
frozen BatchNormalization), the layers the registry (`keras_dyndp.rules.registry`) has a rule for (in their
configuration: `_einsum_keeps_batch`) or declares per example; plain Sequential and functional models; `_ELEMENTWISE`
ops on tensors of one rank with lower-rank constants; slices that keep the whole batch axis (``h[:, 0]``, a [CLS] token,
`_known_slice`)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from keras_dyndp.rules import registry
from keras_dyndp.rules import sublayers
from keras_dyndp.tf_backend import keras_compat
from keras_dyndp.tf_backend import model_checks
from keras_dyndp.tf_backend.keras_compat import keras


def first_unknown(model: keras.Model) -> str | None:
    """The first layer or op of ``model`` not known to act per example, described for a message; else None."""
    for layer in [model, *keras_compat.flatten_layers(model)]:
        if not _known_layer(layer):
            return f"layer {layer.name!r} ({type(layer).__name__})"
        for operation in keras_compat.functional_operations(layer):
            name = type(operation).__name__
            if not (_known_slice(name, operation) or _known_operation(name, *_arguments(operation))):
                return f"operation {operation.name!r} ({type(operation).__name__})"
    return None


def _known_layer(layer: keras.layers.Layer) -> bool:
    if registry.rule_for(layer) is not None or registry.acts_per_example(layer):  # unsupported by a rule: as without it
        return True
    if isinstance(layer, keras_compat.OP_LAYER_CLASSES):
        return _known_slice(layer.symbol, layer) or _known_operation(layer.symbol, *_arguments(layer))
    return type(layer).call in (keras_compat.FUNCTIONAL_CLASS.call, keras.Sequential.call)  # A plain container.


def _input_ranks(layer: keras.layers.Layer) -> set[int]:
    """The ranks of the tensors the layer was called on; empty when Keras recorded no call or a rank is unknown."""
    ranks = set()
    for node in getattr(layer, "_inbound_nodes", ()):  # Layer._inbound_nodes: no public API lists a layer's calls
        for tensor in tf.nest.flatten(node.input_tensors):
            try:
                ranks.add(len(tensor.shape))
            except (TypeError, ValueError):
                return set()
    return ranks


def _avoids_batch_axis(layer: keras.layers.Layer, attention: bool = False) -> bool:
    """Whether ``layer.axis`` (with ``attention``, its ``attention_axes``; an int, a sequence or None: all but the
    batch axis) never names axis 0 of the inputs."""
    axes = layer.get_config().get("attention_axes") if attention else layer.axis
    if axes is None:
        return True
    axes = [int(axes)] if isinstance(axes, (int, np.integer)) else [int(a) for a in axes]
    if 0 in axes:
        return False
    if all(a > 0 for a in axes):
        return True
    ranks = _input_ranks(layer)  # A negative axis names the batch axis where it is minus the rank.
    return bool(ranks) and all(a + rank != 0 for a in axes if a < 0 for rank in ranks)


def _einsum_keeps_batch(layer: keras.layers.Layer) -> bool:
    """An EinsumDense equation such as ``ab,bc->ac``: the input's first index is the output's first and not the
    kernel's (or both start with ``...``)."""
    inputs, rest = layer.equation.replace(" ", "").split(",")
    kernel, outputs = rest.split("->")
    if inputs.startswith("...") or outputs.startswith("..."):
        return inputs.startswith("...") and outputs.startswith("...") and "..." not in kernel
    return bool(inputs) and bool(outputs) and inputs[0] == outputs[0] and inputs[0] not in kernel


def _no_dropout(layer: keras.layers.Layer) -> bool:
    """A recurrent layer or cell (or dot-product attention) without (recurrent) dropout, whose masks differ by row."""
    return not getattr(layer, "dropout", 0) and not getattr(layer, "recurrent_dropout", 0)


def _known_classes() -> dict[type, Callable[[keras.layers.Layer], bool] | None]:
    """Known layer classes (those this Keras has) and their condition (None: always): declared in the registry."""
    unconditional = """InputLayer Dense Conv1D Conv2D Conv3D Conv1DTranspose Conv2DTranspose Conv3DTranspose
        DepthwiseConv1D DepthwiseConv2D SeparableConv1D SeparableConv2D Embedding RNN StackedRNNCells Bidirectional
        TimeDistributed Activation ReLU LeakyReLU ELU PReLU
        ThresholdedReLU Flatten Reshape Permute RepeatVector MaxPooling1D MaxPooling2D MaxPooling3D AveragePooling1D
        AveragePooling2D AveragePooling3D GlobalMaxPooling1D GlobalMaxPooling2D GlobalMaxPooling3D
        GlobalAveragePooling1D GlobalAveragePooling2D GlobalAveragePooling3D UpSampling1D UpSampling2D UpSampling3D
        ZeroPadding1D ZeroPadding2D ZeroPadding3D Cropping1D Cropping2D Cropping3D Rescaling Identity Masking Add
        Subtract Multiply Average Maximum Minimum Dropout""".split()
    axis = "Softmax LayerNormalization GroupNormalization UnitNormalization Normalization Concatenate".split()
    conditional = {
        **dict.fromkeys(axis, _avoids_batch_axis),
        "EinsumDense": _einsum_keeps_batch,
        # Attention axes (None: all but the batch, heads and features) never naming the batch axis mix positions of
        # one example only; the projections, softmax and dropout are sublayers, checked each.
        "MultiHeadAttention": functools.partial(_avoids_batch_axis, attention=True),
        **dict.fromkeys("LSTM GRU SimpleRNN LSTMCell GRUCell SimpleRNNCell".split(), _no_dropout),
        # Scores of one example's queries against its own keys; dropout on them draws row by row.
        **dict.fromkeys("Attention AdditiveAttention".split(), _no_dropout),
    }
    known = {getattr(keras.layers, name): None for name in unconditional if hasattr(keras.layers, name)}
    known.update({getattr(keras.layers, n): test for n, test in conditional.items() if hasattr(keras.layers, n)})
    frozen = lambda layer: not model_checks.mixes_batch_statistics(layer)  # noqa: E731
    known.update(dict.fromkeys(keras_compat.BATCH_NORM_CLASSES, frozen))
    return known


for _class, _condition in _known_classes().items():
    registry.register_layer_rule(_class, per_example=True, supports=_condition)

# Elementwise operations, by Keras 3 op class name and Keras 2 TFOpLambda symbol.
_ELEMENTWISE = frozenset(
    """Add Subtract Multiply Divide TrueDivide Power Maximum Minimum Negative Abs Absolute Exp Expm1 Log Log1p Sqrt
    Square Reciprocal Sign Floor Ceil Sin Cos Tanh Sigmoid Relu Relu6 Elu Selu Gelu Silu Swish Softplus Softsign
    LeakyRelu HardSigmoid Cast Equal NotEqual Greater GreaterEqual Less LessEqual LogicalAnd LogicalOr LogicalNot
    __operators__.add math.add math.add_n math.subtract math.multiply math.truediv math.divide math.pow
    math.maximum math.minimum math.negative math.abs math.exp math.expm1 math.log math.log1p math.sqrt math.square
    math.reciprocal math.sign math.floor math.ceil math.sin math.cos math.tanh math.sigmoid math.softplus nn.relu
    nn.relu6 nn.elu nn.selu nn.gelu nn.silu nn.swish nn.softplus nn.leaky_relu cast math.equal
    math.not_equal math.greater math.greater_equal math.less math.less_equal math.logical_and math.logical_or
    math.logical_not""".split()
)
_SLICES = frozenset(["GetItem", "__operators__.getitem"])  # Keras 3 op class, Keras 2 SlicingOpLambda symbol


def _known_slice(name: str | None, node_owner: Any) -> bool:
    """``h[key]`` whose every call keeps the batch axis whole: a static key tuple starting with ``:`` (``h[:, 0]``,
    ``h[:, 1:, ::2]``); a key of tensors (a gather across rows) or one indexing the batch axis is not known."""
    if name not in _SLICES:
        return False
    calls = sublayers.recorded_calls(node_owner)
    return bool(calls) and all(len(args) == 2 and _keeps_batch_axis(args[1]) for args, _ in calls)


def _keeps_batch_axis(key: Any) -> bool:
    """A key tuple whose first part is ``:`` and every other an int, None, ``...`` or a slice of ints (Keras 2
    records a slice as a dict of start, stop and step)."""

    def bounds(part):
        return list(part.values()) if isinstance(part, dict) else [part.start, part.stop, part.step]

    if not isinstance(key, tuple) or not key or not isinstance(key[0], (slice, dict)) or bounds(key[0]) != [None] * 3:
        return False
    scalar = lambda value: value is None or isinstance(value, (int, np.integer))  # noqa: E731
    return all(
        part is Ellipsis or (all(map(scalar, bounds(part))) if isinstance(part, (slice, dict)) else scalar(part))
        for part in key[1:]
    )


def _arguments(node_owner: Any) -> tuple[list, list]:
    """(symbolic tensors, other array-like arguments) of every call of an operation or op layer."""
    symbolic, constants = [], []
    for arguments in sublayers.recorded_calls(node_owner):
        for value in tf.nest.flatten(arguments):
            if isinstance(value, keras_compat.SYMBOLIC_TENSOR):
                symbolic.append(value)
            elif hasattr(value, "shape"):
                constants.append(value)
    return symbolic, constants


def _known_operation(name: str | None, symbolic: list, constants: list) -> bool:
    """Elementwise, with tensors of one rank (row i meets row i) and constants that broadcast over other axes."""
    if name not in _ELEMENTWISE:
        return False
    ranks = {len(t.shape) for t in symbolic}
    return len(ranks) == 1 and all(len(np.shape(c)) < min(ranks) for c in constants)
