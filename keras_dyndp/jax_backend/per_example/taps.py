"""Taps: each example's input to a layer and the gradient of the layer's output, from which the layer's rule
(`registry`) clips the variables it covers without a per-example gradient of them. In a `Session`, a tapped layer's call
records its input and adds a zero "tap" to its output (before its activation where it has one); the step differentiates
the tap instead of the covered variables, which gives the output gradient. Tapped (`tappable`): a trainable layer of
exactly a class in the rules given, in a configuration its rule supports, not inside a layer with a rule of its own,
called once per forward pass outside any JAX transformation of the model's own (a scan, vmap, checkpoint), its covered
variables held and read by no other layer (a tied output projection would add a gradient the tap misses; the probe
traces the forward pass with stand-ins for them). The layers around it need no declaration: the forward pass runs one
example at a time. The others keep the vmap path. Outside a session the patched call is the original."""

from __future__ import annotations

import itertools
import threading
import weakref
from collections.abc import Callable
from typing import Any

import jax
import keras
from keras.src.backend.common.stateless_scope import get_stateless_scope

from keras_dyndp.rules import registry
from keras_dyndp.rules.sublayers import layers

_ACTIVE = threading.local()


class Session:
    """A context for one trace: records each tapped layer's inputs and tapped shape, adds ``taps`` (by layer id) when
    given, and lets the layers in ``stand_ins`` read stand-ins for their covered variables (`tappable`'s probe)."""

    def __init__(self, taps: dict[int, Any] | None = None):
        self.taps = taps
        self.stand_ins: dict[int, list] = {}
        self.inputs: dict[int, Any] = {}
        self.shapes: dict[int, tuple] = {}
        self.calls: dict[int, int] = {}

    def __enter__(self):
        _ACTIVE.session = self
        return self

    def __exit__(self, *exc_info):
        _ACTIVE.session = None

    def call(self, layer: keras.layers.Layer, rule: registry.LayerRule, inputs: Any, call: Callable[[], Any]) -> Any:
        key = id(layer)
        self.calls[key] = self.calls.get(key, 0) + 1
        self.inputs[key] = inputs

        def tap(outputs):
            self.shapes[key] = tuple(outputs.shape)
            if self.taps is not None and key in self.taps:
                return outputs + self.taps[key].astype(outputs.dtype)
            return outputs

        mapping = get_stateless_scope().state_mapping
        variables = [id(variable) for variable in rule.variables(layer)]
        kept = {variable: mapping[variable] for variable in variables if variable in mapping}
        mapping.update(zip(variables, self.stand_ins.get(key, ())))
        activation = getattr(layer, "activation", None)
        if activation is not None:
            object.__setattr__(layer, "activation", lambda z: activation(tap(z)))
        try:
            outputs = call()
        finally:
            for variable in variables:
                mapping.pop(variable, None)
            mapping.update(kept)
            if activation is not None:
                object.__setattr__(layer, "activation", activation)
        return tap(outputs) if activation is None else outputs


_TAPPED: weakref.WeakSet = weakref.WeakSet()  # The layers whose ``call`` `_patch` wrapped.


def _patch(layer: keras.layers.Layer, rule: registry.LayerRule) -> None:
    if layer in _TAPPED:
        return
    original = layer.call

    def call(inputs, *args, **kwargs):
        session = getattr(_ACTIVE, "session", None)
        if session is None:
            return original(inputs, *args, **kwargs)
        return session.call(layer, rule, inputs, lambda: original(inputs, *args, **kwargs))

    layer.call = call
    _TAPPED.add(layer)


def _leaves(layer: keras.layers.Layer) -> list[keras.layers.Layer]:
    """The layers below ``layer`` that a rule may tap: a sublayer without sublayers, or with a rule of its own."""
    leaves = []
    for sublayer in layers(layer, include_self=False, recursive=False):
        ruled = registry.rule_for(sublayer) is not None
        leaves += _leaves(sublayer) if _has_sublayers(sublayer) and not ruled else [sublayer]
    return leaves


def _has_sublayers(layer: keras.layers.Layer) -> bool:
    return bool(layers(layer, include_self=False, recursive=False))


def candidates(model: keras.Model, classes: tuple | None = None) -> dict[int, tuple[keras.layers.Layer, tuple]]:
    """Tappable layers of ``classes`` (None: every class with a rule; patched) by id, each with its covered
    variables' indices in ``trainable_variables``."""
    trainable = model.trainable_variables
    leaves = [layer for layer in layers(model) if not _has_sublayers(layer)]
    found = {}
    for layer in _leaves(model):
        rule = registry.rule_for(layer) if classes is None or type(layer) in classes else None
        if rule is None or not layer.trainable:
            continue
        variables = rule.variables(layer)
        owned = all(sum(any(weight is v for weight in other.weights) for other in leaves) == 1 for v in variables)
        indices = tuple(next((i for i, value in enumerate(trainable) if value is v), None) for v in variables)
        if variables and owned and None not in indices:
            _patch(layer, rule)
            found[id(layer)] = (layer, indices)
    return found


def tappable(
    model: keras.Model, trainable: list, non_trainable: list, x: Any, classes: tuple | None = None
) -> dict[int, tuple[keras.layers.Layer, tuple, tuple]]:
    """The `candidates` this step taps (module docstring), by layer id: (layer, covered variables' indices in
    ``trainable``, tapped output's shape for one example). Traces the training-mode call on one row of ``x``'s shape;
    nothing runs."""
    found = candidates(model, classes)
    if not found:
        return {}
    probe = Session()
    recorded_leaves: dict[int, int] = {}  # per candidate, how many array leaves its recorded input has

    def forward(trainable, non_trainable, x, stand_ins):
        probe.stand_ins = stand_ins
        with probe:
            outputs = model.stateless_call(trainable, non_trainable, x, training=True)
        recorded = [jax.tree_util.tree_leaves(probe.inputs.get(key)) for key in found]
        recorded_leaves.update((key, len(values)) for key, values in zip(found, recorded))
        return recorded, outputs

    stand_ins = {key: [trainable[index] for index in indices] for key, (_, indices) in found.items()}
    shaped = lambda value: jax.ShapeDtypeStruct(value.shape, value.dtype)  # noqa: E731
    row = lambda value: jax.ShapeDtypeStruct((1, *value.shape[1:]), value.dtype)  # noqa: E731
    abstract = jax.tree_util.tree_map(shaped, (trainable, non_trainable, stand_ins))
    try:
        jaxpr = jax.make_jaxpr(forward)(*abstract[:2], jax.tree_util.tree_map(row, x), abstract[2]).jaxpr
    except jax.errors.UnexpectedTracerError:  # an escaped input refused outright: every variable keeps vmap
        return {}
    read = {id(var) for equation in jaxpr.eqns for var in equation.invars} | {id(var) for var in jaxpr.outvars}
    variables = jaxpr.invars[: len(trainable)]  # ``trainable`` is a flat list: its leaves come first, in order.
    # An input recorded inside a transformation of the model's own (a layer's scan or vmap) escapes it: the trace
    # holds it as a constant.
    escaped = {id(var) for var in jaxpr.constvars}
    escaped_outputs = [id(var) in escaped for var in jaxpr.outvars]  # the recorded inputs come first, key by key
    starts = dict(zip(found, itertools.accumulate(recorded_leaves.values(), initial=0)))
    inside = {key for key in found if any(escaped_outputs[starts[key] : starts[key] + recorded_leaves[key]])}
    return {
        key: (layer, indices, probe.shapes[key])
        for key, (layer, indices) in found.items()
        if probe.calls.get(key) == 1
        and key in probe.shapes
        and key not in inside
        and all(id(variables[i]) not in read for i in indices)
    }
