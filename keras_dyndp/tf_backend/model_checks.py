"""Refuses models whose training-mode forward pass lets examples affect each other or the stored state (why:
docs/privacy.md, "Refused, and why"): every ``BatchNormalization`` that trains (Keras 2: also
``SyncBatchNormalization``, and TF1's class even when frozen), and any other layer whose ``call`` writes a variable
with a value computed from the input batch, found by tracing ``model(x, training=True)`` into a scratch graph and
following each write back to the inputs, also into ``tf.cond`` / ``tf.while_loop`` bodies and nested ``tf.function``s.
Writes independent of the batch (random-generator states, step counters) and Keras metrics' accumulators are allowed.
Checked once per model (again after a layer is unfrozen) when the first step is traced."""

from __future__ import annotations

import warnings
import weakref
from typing import Any

import tensorflow as tf

from keras_dyndp.core import refusals
from keras_dyndp.tf_backend import keras_compat
from keras_dyndp.tf_backend.keras_compat import keras

_WRITE_OPS = frozenset(
    "AssignVariableOp AssignAddVariableOp AssignSubVariableOp ResourceStridedSliceAssign Assign AssignAdd AssignSub "
    "ScatterUpdate ScatterAdd ScatterSub".split()
)
_WRITE_OP_PREFIXES = ("ResourceScatter", "ResourceApply", "ResourceSparseApply")

# Models that passed, each with the trainable variables it had then (unfreezing a layer calls for a new check).
_checked_models: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_warned_optimizers: weakref.WeakSet = weakref.WeakSet()


# Pure graph inspection: AutoGraph need not convert these when they run inside a traced train step (it would
# take seconds at the first trace). The model itself is traced by a tf.function of its own, with AutoGraph.
@tf.autograph.experimental.do_not_convert
def check_model(model: keras.Model, inputs: Any = None) -> None:
    """Raises ValueError, naming the first offending layer and what to use instead, if ``model`` mixes examples or
    stores batch-derived state in training (module docstring).

    Args:
        model: the Keras model to be trained with DP-SGD, e.g. ``check_model(model, x_train[:1])``.
        inputs: a batch of inputs (tensors, arrays or ``tf.TensorSpec``s, nested as the model takes them) whose
            dtypes and shapes trace the model. None: the specs Keras recorded (``keras_compat.input_signature``;
            ValueError if there are none).
    """
    for layer in keras_compat.flatten_layers(model):
        if mixes_batch_statistics(layer):
            raise refusals.batch_statistics_error(layer)
    _check_writes(model, _input_signature(model, inputs))
    _checked_models.setdefault(model, set()).add(_trainable_ids(model))


@tf.autograph.experimental.do_not_convert
def check_before_training(model: keras.Model, inputs: Any = None) -> None:
    """``check_model`` once per model and set of trainable variables; for the DP training paths."""
    if _trainable_ids(model) not in _checked_models.get(model, ()):
        check_model(model, inputs)


@tf.autograph.experimental.do_not_convert
def check_training_model(optimizer: Any, model: keras.Model | None, var_list: list[tf.Variable]) -> None:
    """Checks ``model``, whose train step is calling ``optimizer``. In a custom training loop (``model`` None), warns
    once per optimizer unless a model holding every variable of ``var_list`` has passed ``check_model``."""
    if model is not None:
        check_before_training(model)
        return
    wanted = {id(v) for v in var_list}
    checked = any(wanted <= set(ids) for passed in list(_checked_models.values()) for ids in passed)
    if not checked and optimizer not in _warned_optimizers:
        _warned_optimizers.add(optimizer)
        warnings.warn(
            f"{type(optimizer).__name__} is not called from a Keras model's train step, so it cannot check the "
            "model for layers that mix examples or store batch statistics (BatchNormalization), which break the "
            "privacy guarantee. Call keras_dyndp.check_model(model, x) before training.",
            stacklevel=4,  # The caller of compute_gradients (this function is wrapped once).
        )


def _trainable_ids(model: keras.Model) -> tuple[int, ...]:
    return tuple(id(v) for v in model.trainable_variables)


def mixes_batch_statistics(layer: keras.layers.Layer) -> bool:
    """Whether ``layer`` normalises with the statistics of the training batch (a BatchNormalization that trains)."""
    if not isinstance(layer, keras_compat.BATCH_NORM_CLASSES):
        return False
    return layer.trainable or isinstance(layer, keras_compat.ALWAYS_MIXING_BATCH_NORM_CLASSES)


def _input_signature(model: keras.Model, inputs: Any) -> Any:
    """TypeSpecs of ``inputs``, or of the model's recorded inputs (with an unknown batch size) when None."""
    if inputs is None:
        inputs = keras_compat.input_signature(model)
        if inputs is None:
            raise ValueError(
                f"check_model cannot trace model {model.name!r}: it has never been built or called (on Keras 3, a "
                "subclassed model does not record its input dtypes). Pass a batch of inputs: "
                "check_model(model, inputs=x)."
            )

    def to_spec(value):
        if isinstance(value, tf.TypeSpec):
            return value
        return tf.type_spec_from_value(value if tf.is_tensor(value) else tf.convert_to_tensor(value))

    return tf.nest.map_structure(to_spec, inputs)


def _check_writes(model: keras.Model, signature: Any) -> None:
    """Traces ``model(x, training=True)`` and refuses writes to variables computed from ``x``."""
    graph = tf.function(lambda batch: model(batch, training=True)).get_concrete_function(signature).graph
    num_inputs = len(tf.nest.flatten(signature, expand_composites=True))
    written = _dependent_writes(graph, {id(t) for t in graph.inputs[:num_inputs]}, gated=False)
    external = {id(internal): handle for handle, internal in graph.captures}
    variables = {id(v.handle): v for v in model.variables}
    metric_handles = {id(v.handle) for metric in model.metrics for v in metric.variables}
    for resource, op_name in written:
        handle = external.get(id(resource))
        if handle is not None and id(handle) in metric_handles:
            continue
        variable = variables.get(id(handle))
        if variable is None:
            where = f"the variable written by op {op_name!r}"
        else:
            owners = [
                layer for layer in keras_compat.flatten_layers(model) if any(w is variable for w in layer.weights)
            ]
            owner = min(owners, key=lambda layer: len(layer.weights), default=None)
            where = f"variable {keras_compat.variable_name(variable)!r}" + (
                f" of layer {owner.name!r} ({type(owner).__name__})" if owner is not None else ""
            )
        raise refusals.batch_state_error(model.name, where)


def _nested_graphs(graph, op) -> list:
    """The function bodies an op calls (tf.cond branches, while_loop cond/body, nested tf.function)."""
    bodies = []
    for value in op.node_def.attr.values():
        for name in ([value.func.name] if value.HasField("func") else []) + [func.name for func in value.list.func]:
            function = graph._get_function(name)  # noqa: SLF001  (tf.Graph: no public lookup of a function body)
            body = getattr(function, "graph", None)
            if body is None:
                raise ValueError(f"check_model cannot inspect the function {name!r} called by op {op.name!r}.")
            bodies.append(body)
    return bodies


def _dependent_writes(graph, dependent: set, gated: bool) -> list[tuple[Any, str]]:
    """(resource tensor of ``graph``, op name) of every write whose value depends on the tensors whose ids are
    ``dependent`` (computed from the batch), every write where ``gated`` (the graph runs on a data-dependent condition
    or in a loop). Followed op by op through data inputs (every output of an op depends on all its inputs); a write in
    a nested body is reported on the outer tensor that feeds the body's resource input."""
    dependent_ops = set()
    writes = []

    def depends(tensor) -> bool:
        return id(tensor) in dependent or id(tensor.op) in dependent_ops

    for op in graph.get_operations():
        inputs_dependent = [depends(t) for t in op.inputs]
        if any(inputs_dependent):
            dependent_ops.add(id(op))
        is_write = op.type in _WRITE_OPS or op.type.startswith(_WRITE_OP_PREFIXES)
        if is_write and op.inputs and (gated or any(inputs_dependent[1:])):
            writes.append((op.inputs[0], op.name))
        for body in _nested_graphs(graph, op):
            offset = len(op.inputs) - len(body.inputs)
            # A loop or a data-dependent branch choice: every body input counts as dependent.
            body_gated = (
                gated
                or (offset > 0 and inputs_dependent[0])
                or (op.type in ("While", "StatelessWhile") and any(inputs_dependent))
            )
            body_dependent = {
                id(inner)
                for i, inner in enumerate(body.inputs)
                if offset < 0 or body_gated or inputs_dependent[offset + i]
            }
            for resource, name in _dependent_writes(body, body_dependent, body_gated):
                index = next((i for i, inner in enumerate(body.inputs) if inner is resource), None)
                if offset < 0 or index is None:
                    writes.append((None, name))
                else:
                    writes.append((op.inputs[offset + index], name))
    return writes
