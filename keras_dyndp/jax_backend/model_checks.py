"""Refuses, on the JAX backend, models whose training-mode call stores state computed from the batch.

The rule is the TensorFlow backend's (`keras_dyndp.tf_backend.model_checks`, which says why): batch normalisation that
takes part in training is refused, and so is any layer whose training-mode call writes a non-trainable variable with a
value computed from the input batch, since that value would leave the step without noise (BatchNormalization's
moving averages held the exact mean of the private batch). ``check_model`` finds such writes by tracing
``model.stateless_call(..., training=True)`` into a jaxpr (nothing runs) and following the inputs forward through
its equations to the non-trainable variables it returns; an equation with any batch-derived input counts all its
outputs as batch-derived, nested jaxprs (``jit``, ``scan``, ``cond``) included, so the check can over-refuse but not
miss a data dependence. Random-generator states (Dropout's seed, advanced by a constant) and step counters pass; a
random-generator state written from the batch is refused like any other variable (its value would leave the step).

Not detected: a value computed from the batch's SHAPE alone (its number of rows is a constant of the trace).
``make_private``'s step runs each example alone, so there the shape says nothing; a custom loop that writes the
batch size into a variable releases it.

``make_private``'s step checks its model when it is traced; call ``check_model(model, x)`` yourself before a
custom loop that calls `stateless_apply_clipped_sum`.
"""

from __future__ import annotations

from typing import Any

import jax
import keras

from keras_dyndp import refusals


def check_layers(model: keras.Model) -> None:
    """Raises ValueError on the first BatchNormalization of ``model`` that takes part in training (a frozen one,
    ``trainable = False``, runs in inference mode with fixed statistics and passes)."""
    for layer in model._flatten_layers():  # pylint: disable=protected-access
        if isinstance(layer, keras.layers.BatchNormalization) and layer.trainable:
            raise refusals.batch_statistics_error(layer)


def _abstract(values: Any) -> Any:
    return jax.tree_util.tree_map(lambda value: jax.ShapeDtypeStruct(value.shape, value.dtype), values)


def batch_dependent_writes(model: keras.Model, inputs: Any, state: tuple[list, list] | None = None) -> list[str]:
    """Paths of the non-trainable variables that ``model``'s training-mode call on ``inputs`` writes with a value
    computed from ``inputs`` (module docstring). ``state``: the (trainable, non-trainable) values to trace with when
    the variables hold none (inside ``fit``); only their shapes and dtypes are used."""
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
    """Raises ValueError if ``model`` has trainable batch normalisation or stores batch-derived state in training.

    Args:
        model: the Keras model to be trained with DP-SGD (built).
        inputs: a batch of inputs as the model takes them (arrays, or ``jax.ShapeDtypeStruct``s: only their shapes
            and dtypes are used).
        state: see `batch_dependent_writes`.

    Raises:
        ValueError: naming the first BatchNormalization layer, or the variables written from the batch, and what
            to use instead.

    ```python
    keras_dyndp.check_model(model, x_train[:2])  # Before a custom training loop.
    ```
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
    """The name of the innermost layer that holds each of ``variables`` (a SeedGenerator state's path names none)."""
    layers = list(model._flatten_layers(include_self=False))  # pylint: disable=protected-access
    names = []
    for variable in variables:
        holders = [layer for layer in layers if any(held is variable for held in layer.variables)]
        names.append(min(holders, key=lambda layer: len(layer.variables)).name if holders else model.name)
    return names
