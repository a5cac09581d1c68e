"""What keras_dyndp does differently on Keras 2 and Keras 3: the only module that may depend on the version.

Every other module imports the Keras in use (`keras`) and the version-dependent helpers from here, so that
running on a second Keras version means filling in this module, not editing every file. Only Keras 2 (TF 2.15's
``tf.keras``, or ``tf_keras`` with ``TF_USE_LEGACY_KERAS=1``) is implemented today; importing keras_dyndp's
TensorFlow modules under Keras 3 raises an ImportError that says so.

What differs, and what a Keras 3 (TF 2.16+) implementation of each name must do:

* `keras`, `KERAS_MAJOR_VERSION`: ``tf.keras`` is Keras 3 there; replace the ImportError below.
* `Optimizer`: ``keras.optimizers.Optimizer`` (same name).
* `register_serializable`: ``keras.saving.register_keras_serializable`` (same call).
* `apply_base_update`: ``base.apply(grads, variables)`` (no ``name`` or ``skip_gradients_aggregation``). Keras 3's
  ``Model.train_step`` reduces the loss and calls ``optimizer.apply(grads, variables)``, so a DP optimizer cannot
  clip per example there: `DynamicDPOptimizerMixin` must also override ``apply`` to refuse ordinary gradients
  with an error naming ``make_private``, and the per-example step is the model's (``make_private``).
* `is_per_example_loss`, `PER_EXAMPLE_REDUCTION`: ``loss.reduction in (None, "none")``; ``reduction=None``.
* `unpack_x_y_sample_weight`: ``keras.utils.unpack_x_y_sample_weight`` (same).
* `training_logs`: Keras 3's ``compute_loss(x, y, y_pred, sample_weight, training=True)`` returns the loss;
  update ``model._loss_tracker`` with it, then ``compute_metrics``.
* `reset_train_function`: ``model.train_function = None`` (check ``make_train_function``).
* `input_signature`: there is no ``save_spec``; build specs from ``model.inputs`` or the build shapes.
* `flatten_layers`: ``_flatten_layers(include_self=False, recursive=True)`` exists on Keras 3 layers too.
* `BATCH_NORM_CLASSES`, `ALWAYS_MIXING_BATCH_NORM_CLASSES`: ``keras.layers.BatchNormalization`` only (its
  ``synchronized=True`` replaces SyncBatchNormalization; no TF1 class).
* `steps_per_execution`, `set_steps_per_execution`: an int attribute ``model.steps_per_execution``; check that
  changing it during ``fit`` takes effect (BudgetStop relies on it).

Outside this module, to check on Keras 3: the ghost rules' ``supports`` predicates (LoRA-enabled Dense and
Embedding must be refused; ``time_major`` and ``sparse`` are read with getattr), the replacement of ``layer.call``
and ``compute_mask`` on instances in ``per_example.ghost.tapped``, ``variable.handle`` in
``model_checks._check_writes``, and the tests' and examples' ``tf.keras.losses.Reduction`` and legacy optimizers.
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

# TEMPORARY (rules work): on Keras 3, `keras` is the Keras 3 package and the import goes on; the core port
# replaces this.
if KERAS_MAJOR_VERSION == 3:
    import keras  # pylint: disable=g-import-not-at-top
elif KERAS_MAJOR_VERSION != 2:
    raise ImportError(
        "keras_dyndp runs on Keras 2 only so far (TensorFlow 2.15, or tf_keras with TF_USE_LEGACY_KERAS=1); "
        f"tf.keras is Keras {KERAS_MAJOR_VERSION} here. Keras 3 support is issue 10."
    )

# ----------------------------------------------------------------------------------------------------------
# Optimizers.

Optimizer = keras.optimizers.Optimizer
"""Base class of the optimizers a DP optimizer can be made from (Keras 2.11+ API; not ``optimizers.legacy``)."""


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
    """The inputs' specs of a model that has been built or called (unknown batch size), else None.

    Keras 3 records the input specs of functional and Sequential models only (``model.inputs``); a subclassed
    model keeps its build shapes but not its input dtypes, so it gives None there.
    """
    if KERAS_MAJOR_VERSION == 2:
        spec = model.save_spec(dynamic_batch=True)
        if spec is None:
            return None
        args, _ = spec
        return args[0] if len(args) == 1 else tuple(args)
    inputs = getattr(model, "inputs", None)
    if not inputs:
        return None
    specs = [tf.TensorSpec([None, *t.shape[1:]], tf.as_dtype(t.dtype)) for t in inputs]
    return specs[0] if len(specs) == 1 else tuple(specs)


def variable_name(variable: Any) -> str:
    """A variable's name for messages, with its layer's: Keras 2's ``'dense/kernel:0'``, Keras 3's path
    ``'dense/kernel'`` (a Keras 3 variable's ``name`` is only ``'kernel'``)."""
    return getattr(variable, "path", None) or variable.name


def depthwise_kernel(layer: keras.layers.Layer) -> Any:
    """A ``DepthwiseConv2D``'s (or ``DepthwiseConv1D``'s) kernel variable: ``depthwise_kernel`` on Keras 2,
    ``kernel`` on Keras 3 (SeparableConv2D's ``depthwise_kernel`` has the same name on both)."""
    return layer.depthwise_kernel if KERAS_MAJOR_VERSION == 2 else layer.kernel


def flatten_layers(layer: keras.layers.Layer) -> Iterator[keras.layers.Layer]:
    """Every layer inside ``layer`` (a model or a wrapper), nested ones included, not ``layer`` itself."""
    return layer._flatten_layers(include_self=False, recursive=True)  # pylint: disable=protected-access


# BATCH_NORM_CLASSES: layers that normalise with batch statistics in training and store moving averages.
# ALWAYS_MIXING_BATCH_NORM_CLASSES: those that use batch statistics in training even when frozen (TF1's).
if KERAS_MAJOR_VERSION == 2:
    BATCH_NORM_CLASSES: tuple[type, ...] = (
        keras.layers.BatchNormalization,
        keras.layers.experimental.SyncBatchNormalization,
        tf.compat.v1.keras.layers.BatchNormalization,
    )
    ALWAYS_MIXING_BATCH_NORM_CLASSES: tuple[type, ...] = (tf.compat.v1.keras.layers.BatchNormalization,)
else:  # Keras 3: one class; ``synchronized=True`` replaces SyncBatchNormalization, and there are no TF1 layers.
    BATCH_NORM_CLASSES = (keras.layers.BatchNormalization,)
    ALWAYS_MIXING_BATCH_NORM_CLASSES = ()


def steps_per_execution(model: keras.Model) -> int | None:
    """The compiled ``steps_per_execution`` (None before ``compile``)."""
    variable = getattr(model, "_steps_per_execution", None)
    return None if variable is None else int(variable.numpy())


def set_steps_per_execution(model: keras.Model, steps: int) -> None:
    """Changes ``steps_per_execution`` for the next call of the train function (no retracing)."""
    model._steps_per_execution.assign(steps)  # pylint: disable=protected-access
