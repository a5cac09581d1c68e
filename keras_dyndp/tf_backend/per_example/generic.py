"""Generic tapping on TensorFlow for the rules of the contract both backends share (`keras_dyndp.rules.layer_rules`),
after JAX's `keras_dyndp.jax_backend.per_example.taps.Session`: the layer's own call, wrapped, records its input
(rows checked, `taps.Tapping.guard`) and its pre-activation (watched), and reads the covered variables through
``tf.stop_gradient`` (as attributes, not Keras 3's stateless scope, which would also swallow the call's state
updates); `ghost` refuses the ghost path where a gradient still reaches one. The rule then sees the input and
gradient as [B, rows, ...] (`per_example_rows`)."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable

import tensorflow as tf

from keras_dyndp.rules import registry
from keras_dyndp.tf_backend import keras_compat
from keras_dyndp.tf_backend.keras_compat import keras
from keras_dyndp.tf_backend.per_example.taps import GhostGradient
from keras_dyndp.tf_backend.per_example.taps import Rows
from keras_dyndp.tf_backend.per_example.taps import Tap
from keras_dyndp.tf_backend.per_example.taps import UnsupportedModel

Variables = Callable[[keras.layers.Layer], list]


def tapped(rule: registry.LayerRule) -> registry.LayerRule:
    """``rule`` in TensorFlow's tapped form (`registry.LayerRule.call`): as registered where it has a ``call``, else
    the layer's own call tapped (`call_for`) and its norms and sums as `GhostGradient` (`norms_and_sums_for`)."""
    if rule.call is not None:
        return rule
    norms_and_sums = norms_and_sums_for(rule.variables, rule.norms_and_sums)
    return dataclasses.replace(rule, call=call_for(rule.variables), norms_and_sums=norms_and_sums)


def call_for(variables: Variables) -> Callable[[Tap], Callable]:
    """``call(tap)`` of a `registry.LayerRule` for a rule covering ``variables(layer)``: the layer's call, tapped."""

    def tapped_call(tap: Tap) -> Callable:
        layer = tap.layer
        original = layer.call

        def call(inputs, *args, **kwargs):
            if not all(isinstance(t, tf.Tensor) for t in tf.nest.flatten(inputs)):
                raise UnsupportedModel(f"{type(layer).__name__} {layer.name!r} received a sparse or ragged input")
            inputs = tf.nest.map_structure(tap.guard, inputs)

            def record(preactivation):
                if not isinstance(preactivation, tf.Tensor):
                    raise UnsupportedModel(f"{type(layer).__name__} {layer.name!r} has more than one output")
                tap.record(inputs, preactivation)
                return preactivation

            with _without_gradient_paths(layer, variables(layer)), _activation_recorded(layer, record) as hooked:
                outputs = original(inputs, *args, **kwargs)
            return outputs if hooked else record(outputs)

        return call

    return tapped_call


@contextlib.contextmanager
def _without_gradient_paths(layer: keras.layers.Layer, variables: list):
    """For the call: each attribute of ``layer`` or its sublayers that holds one of ``variables``, their value
    through ``tf.stop_gradient``; UnsupportedModel where a variable is held by none."""
    stopped = {id(variable): tf.stop_gradient(tf.convert_to_tensor(variable)) for variable in variables}
    swapped = [
        (owner, name, value)
        for owner in [layer, *keras_compat.flatten_layers(layer)]
        for name, value in list(vars(owner).items())
        if id(value) in stopped and any(value is variable for variable in variables)
    ]
    if len({id(value) for _, _, value in swapped}) != len(stopped):
        raise UnsupportedModel(f"layer {layer.name!r} does not hold every variable its rule covers as an attribute")
    with keras_compat.patched_attributes([(owner, name, stopped[id(value)]) for owner, name, value in swapped]):
        yield


@contextlib.contextmanager
def _activation_recorded(layer: keras.layers.Layer, record: Callable):
    """Yields whether ``layer`` has its own ``activation`` (an instance attribute), then applied to ``record(z)``."""
    activation = vars(layer).get("activation")
    if not callable(activation):
        yield False
        return
    with keras_compat.patched_attributes([(layer, "activation", lambda z: activation(record(z)))]):
        yield True


def per_example_rows(tensor: tf.Tensor, rows: Rows) -> tf.Tensor:
    """A tapped tensor [rows, ...] as a rule sees it: [B, rows per example, ...] (TimeDistributed's: example-major)."""
    shaped = tf.reshape(tensor, tf.concat([[rows.batch, -1], tf.shape(tensor)[1:]], axis=0))
    batch = None if rows.static is None or rows.fold is None else rows.static // rows.fold
    shaped.set_shape(tf.TensorShape([batch, rows.fold]).concatenate(tensor.shape[1:]))
    return shaped


def from_rows(tensor: tf.Tensor) -> tuple[tf.Tensor, Rows]:
    """A tensor [B, rows, ...] as a tapped tensor [B * rows, ...] and its `Rows` (`per_example_rows` undone)."""
    batch, fold = tf.shape(tensor)[0], tensor.shape[1]
    folded = tf.reshape(tensor, tf.concat([[-1], tf.shape(tensor)[2:]], axis=0))
    static = None if tensor.shape[0] is None or fold is None else tensor.shape[0] * fold
    folded.set_shape(tf.TensorShape([static]).concatenate(tensor.shape[2:]))
    return folded, Rows(tf.shape(folded)[0], static, fold, batch)


def norms_and_sums_for(variables: Variables, norms_and_sums: Callable) -> Callable[[Tap, tf.Tensor], list]:
    """``norms_and_sums(tap, g)`` of a `registry.LayerRule` from a rule of the one contract: the covered variables'
    squared norms in a `GhostGradient` without a variable (`ghost` adds them), then one per variable, its sums."""

    def ghost_norms_and_sums(tap: Tap, g: tf.Tensor) -> list[GhostGradient]:
        a = tf.nest.map_structure(lambda t: per_example_rows(t, tap.rows), tap.inputs)
        squared, sums = norms_and_sums(tap.layer, a, per_example_rows(g, tap.rows))
        squared, sums = tf.cast(squared, tf.float32), tf.autograph.experimental.do_not_convert(sums)
        cached = {}

        def share(index: int) -> Callable[[tf.Tensor], tf.Tensor]:
            def clipped_sum(factors):
                if cached.get("factors") is not factors:
                    cached.update(factors=factors, sums=list(sums(factors)))
                return cached["sums"][index]

            return clipped_sum

        covered = variables(tap.layer)
        zeros = tf.zeros_like(squared)
        return [GhostGradient(None, squared, None), *(GhostGradient(v, zeros, share(i)) for i, v in enumerate(covered))]

    return ghost_norms_and_sums


def sublayer_norms_and_sums(
    rule, layer: keras.layers.Layer, a: tf.Tensor, g: tf.Tensor
) -> tuple[list, tf.Tensor, Callable]:
    """`keras_dyndp.rules.layer_rules.sublayer_norms_and_sums` by a `registry.LayerRule` of TensorFlow's tapped form
    (one computed from the tap's input and rows alone; one that reads what its call saved is refused)."""
    tap = Tap(layer, None)
    tap.inputs, tap.rows = from_rows(a)
    try:
        gradients = [gr for gr in rule.norms_and_sums(tap, from_rows(g)[0]) if gr.variable is not None]
    except KeyError as error:
        raise ValueError(f"the rule of layer {layer.name!r} needs its own tapped call: {error}") from None
    squared = tf.add_n([tf.cast(gradient.squared_norms, tf.float32) for gradient in gradients])
    return [gradient.variable for gradient in gradients], squared, lambda f: [gr.clipped_sum(f) for gr in gradients]
