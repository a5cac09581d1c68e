"""What keras_dyndp does differently on Keras 2 and Keras 3: the only module that may depend on the version.

Every other module imports the Keras in use (`keras`) and the version-dependent helpers from here, so that
running on a second Keras version means filling in this module, not editing every file. Only Keras 2 (TF 2.15's
``tf.keras``, or ``tf_keras`` with ``TF_USE_LEGACY_KERAS=1``) is implemented today; importing keras_dyndp's
TensorFlow modules under Keras 3 raises an ImportError that says so.

What differs, and where each difference is decided:

* Optimizers. Keras 2's ``Model.train_step`` hands the optimizer the per-example loss vector and the tape
  (``minimize(loss, var_list, tape)``), so a DP optimizer alone can clip per example (the jacobian path,
  `OPTIMIZER_GETS_PER_EXAMPLE_LOSS`). Keras 3's reduces the loss first and calls ``optimizer.apply(grads,
  vars)``: there the per-example step must be the model's (``make_private``) and the optimizer must refuse
  ordinary gradients. `apply_base_update` is how the DP optimizer hands its noised gradients to the base update
  rule; `register_serializable` registers it for ``.keras`` files.
* Losses. A per-example loss is ``reduction=tf.keras.losses.Reduction.NONE`` on Keras 2 and ``reduction=None``
  or ``"none"`` on Keras 3 (`is_per_example_loss`, `PER_EXAMPLE_REDUCTION`).
* Models. `unpack_x_y_sample_weight`, `training_logs` (``compute_loss`` differs), `reset_train_function`,
  `input_signature` (Keras 2's ``save_spec``), `flatten_layers`, the batch normalisation classes, and
  ``steps_per_execution`` (a variable on Keras 2, an int on Keras 3).
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import tensorflow as tf

keras = tf.keras
"""The Keras module in use: TF's ``tf.keras``."""


def _major_version() -> int:
    version = getattr(keras, "__version__", None)
    if version is None:  # TF 2.15's tf.keras (keras.api._v2.keras) has no __version__; its package has.
        import keras as keras_package  # pylint: disable=import-outside-toplevel

        version = keras_package.__version__
    return int(version.split(".")[0])


KERAS_MAJOR_VERSION: int = _major_version()

if KERAS_MAJOR_VERSION != 2:
    raise ImportError(
        f"keras_dyndp runs on Keras 2 only so far (TensorFlow 2.15, or tf_keras with TF_USE_LEGACY_KERAS=1); "
        f"tf.keras is Keras {KERAS_MAJOR_VERSION} here. Keras 3 support is issue 10."
    )

# ----------------------------------------------------------------------------------------------------------
# Optimizers.

Optimizer = keras.optimizers.Optimizer
"""Base class of the optimizers a DP optimizer can be made from (Keras 2.11+ API; not ``optimizers.legacy``)."""

OPTIMIZER_GETS_PER_EXAMPLE_LOSS = True
"""Whether ``Model.train_step`` gives the optimizer the per-example loss and the tape (Keras 2), so that a DP
optimizer can clip per example without ``make_private`` (the jacobian path)."""


def register_serializable(package: str, name: str) -> Callable[[type], type]:
    """Class decorator registering a class for Keras serialization as ``'<package>><name>'``."""
    return keras.saving.register_keras_serializable(package=package, name=name)


def apply_base_update(base: Any, grads_and_vars: list, **kwargs) -> tf.Variable:
    """Applies already noised gradients with the base optimizer's update rule, incrementing ``iterations``.

    Args:
        base: ``super(...)`` of the DP optimizer: its base class's methods.
        grads_and_vars: (gradient, variable) pairs.
        **kwargs: passed on to Keras 2's ``apply_gradients`` (``name``, ...).

    Returns:
        The ``iterations`` variable. A single replica is enforced, so nothing is aggregated across replicas.
    """
    kwargs["skip_gradients_aggregation"] = True
    return base.apply_gradients(grads_and_vars, **kwargs)


# ----------------------------------------------------------------------------------------------------------
# Losses.

PER_EXAMPLE_REDUCTION = "reduction=tf.keras.losses.Reduction.NONE"
"""How to ask for a per-example loss, as error messages spell it."""


def is_per_example_loss(loss: keras.losses.Loss) -> bool:
    """Whether a Keras loss object returns one loss per example (no reduction over the batch)."""
    return loss.reduction == keras.losses.Reduction.NONE


# ----------------------------------------------------------------------------------------------------------
# Models and layers.


def unpack_x_y_sample_weight(data: Any) -> tuple[Any, Any, Any]:
    """``(x, y, sample_weight)`` of one batch as ``fit`` hands it to ``train_step``."""
    return keras.utils.unpack_x_y_sample_weight(data)


def training_logs(model: keras.Model, x: Any, y: Any, y_pred: Any, sample_weight: Any) -> dict[str, tf.Tensor]:
    """Updates the compiled loss and metrics on a training batch and returns the step's logs."""
    model.compute_loss(x, y, y_pred, sample_weight)
    return model.compute_metrics(x, y, y_pred, sample_weight)


def reset_train_function(model: keras.Model) -> None:
    """Makes the next ``fit`` trace ``model.train_step`` anew (after it was replaced on the instance)."""
    model.train_function = None


def input_signature(model: keras.Model) -> Any:
    """The inputs' specs of a model that has been built or called (unknown batch size), else None."""
    spec = model.save_spec(dynamic_batch=True)
    if spec is None:
        return None
    args, _ = spec
    return args[0] if len(args) == 1 else tuple(args)


def flatten_layers(layer: keras.layers.Layer) -> Iterator[keras.layers.Layer]:
    """Every layer inside ``layer`` (a model or a wrapper), nested ones included, not ``layer`` itself."""
    return layer._flatten_layers(include_self=False, recursive=True)  # pylint: disable=protected-access


BATCH_NORM_CLASSES: tuple[type, ...] = (
    keras.layers.BatchNormalization,
    keras.layers.experimental.SyncBatchNormalization,
    tf.compat.v1.keras.layers.BatchNormalization,
)
"""Layers that normalise with batch statistics in training and store moving averages."""

ALWAYS_MIXING_BATCH_NORM_CLASSES: tuple[type, ...] = (tf.compat.v1.keras.layers.BatchNormalization,)
"""Batch normalisation classes that use batch statistics in training even when frozen (TF1's)."""


def steps_per_execution(model: keras.Model) -> int | None:
    """The compiled ``steps_per_execution`` (None before ``compile``)."""
    variable = getattr(model, "_steps_per_execution", None)
    return None if variable is None else int(variable.numpy())


def set_steps_per_execution(model: keras.Model, steps: int) -> None:
    """Changes ``steps_per_execution`` for the next call of the train function (no retracing)."""
    model._steps_per_execution.assign(steps)  # pylint: disable=protected-access
