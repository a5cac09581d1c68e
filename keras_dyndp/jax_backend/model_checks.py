"""Refuses, on the JAX backend, models whose training-mode call stores state computed from the batch: the rule of
`keras_dyndp.tf_backend.model_checks`. ``check_model`` traces ``model.stateless_call(..., training=True)`` into a jaxpr
(nothing runs) and follows the inputs forward to the non-trainable variables it returns; an equation with any
batch-derived input makes all its outputs batch-derived, nested jaxprs included, so the check can over-refuse but not
miss a data dependence. Not detected: a value computed from the batch's SHAPE alone (``make_private``'s step runs each
example alone, where the shape says nothing; a custom loop that writes the batch size into a variable releases it)."""

from __future__ import annotations

from typing import Any

import jax
import keras

from keras_dyndp.core import refusals
from keras_dyndp.rules.sublayers import layers


def check_layers(model: keras.Model) -> None:
    """Raises ValueError on the first trainable BatchNormalization of ``model`` (a frozen one uses fixed statistics)."""
    for layer in layers(model):
        if isinstance(layer, keras.layers.BatchNormalization) and layer.trainable:
            raise refusals.batch_statistics_error(layer)


def _abstract(values: Any) -> Any:
    return jax.tree_util.tree_map(lambda value: jax.ShapeDtypeStruct(value.shape, value.dtype), values)


def batch_dependent_writes(model: keras.Model, inputs: Any, state: tuple[list, list] | None = None) -> list[str]:
    """Paths of the non-trainable variables ``model``'s training-mode call writes from ``inputs``. ``state``: the
    (trainable, non-trainable) values to trace with when the variables hold none (inside ``fit``); shapes only."""
    return [variable.path for variable in _batch_dependent_variables(model, inputs, state)]


def _batch_dependent_variables(model: keras.Model, inputs: Any, state: tuple[list, list] | None) -> list:
    if state is None:
        state = ([v.value for v in model.trainable_variables], [v.value for v in model.non_trainable_variables])

    def written(x, trainable, non_trainable):
        return model.stateless_call(trainable, non_trainable, x, training=True)[1]

    jaxpr = jax.make_jaxpr(written)(_abstract(inputs), *_abstract(state)).jaxpr
    num_inputs = len(jax.tree_util.tree_leaves(inputs))
    dependent = {id(var) for var in jaxpr.invars[:num_inputs]}  # By identity: literals never enter the set.
    for equation in jaxpr.eqns:
        if any(id(var) in dependent for var in equation.invars):
            dependent.update(id(var) for var in equation.outvars)
    return [variable for variable, out in zip(model.non_trainable_variables, jaxpr.outvars) if id(out) in dependent]


def check_model(model: keras.Model, inputs: Any, state: tuple[list, list] | None = None) -> None:
    """Raises ValueError if ``model`` (built) has trainable batch normalisation or stores batch-derived state in
    training, naming the layer or the variables and what to use instead. ``make_private``'s step calls it; call it
    before a custom loop: ``keras_dyndp.check_model(model, x_train[:2])``.

    Args:
        model: the built Keras model to be trained with DP-SGD.
        inputs: a batch as the model takes it (arrays or ``jax.ShapeDtypeStruct``s: shapes and dtypes only).
        state: the (trainable, non-trainable) variable values to trace with when the variables hold none (inside
            ``fit``); None (default): the model's own (`batch_dependent_writes`).
    """
    if not isinstance(model, keras.Model):
        raise refusals.not_a_model_error(model)
    check_layers(model)
    written = _batch_dependent_variables(model, inputs, state)
    if written:
        paths = [variable.path for variable in written]
        raise refusals.batch_state_error(
            model.name, f"the non-trainable variables {paths} (of layers {_owners(model, written)})"
        )


def _owners(model: keras.Model, variables: list) -> list[str]:
    """The innermost layer holding each of ``variables`` (a SeedGenerator state's path names none)."""
    sublayers = layers(model, include_self=False)
    names = []
    for variable in variables:
        holders = [layer for layer in sublayers if any(held is variable for held in layer.variables)]
        names.append(min(holders, key=lambda layer: len(layer.variables)).name if holders else model.name)
    return names
