"""What keras_dyndp does differently on Keras 2 and Keras 3: the only module that may depend on the version. Every other
module imports the Keras in use (`keras`) and the version-dependent helpers from here. Keras 2 is TF 2.15's ``tf.keras``
or ``tf_keras`` (``TF_USE_LEGACY_KERAS=1`` on newer TF); Keras 3 is the ``keras`` package on the TensorFlow backend (TF
2.16+). `KERAS_MAJOR_VERSION` says which; each helper's docstring says what differs."""

from __future__ import annotations

import contextlib
import importlib
import inspect
import types
import weakref
from collections.abc import Callable
from collections.abc import Iterator
from typing import Any

import tensorflow as tf

from keras_dyndp import optimizer_base
from keras_dyndp.keras_glue import entry_points
from keras_dyndp.keras_glue import registration
from keras_dyndp.rules import sublayers

keras = tf.keras
"""The Keras in use: ``tf.keras`` on Keras 2, the ``keras`` package on Keras 3 (``tf.keras`` lacks ``keras.saving``)."""


# Of its package: TF 2.15's tf.keras (keras.api._v2.keras) and tf_keras' have no version of their own.
KERAS_MAJOR_VERSION: int = int(importlib.import_module(keras.__name__.split(".")[0]).__version__.split(".")[0])

if KERAS_MAJOR_VERSION not in (2, 3):
    raise ImportError(f"keras_dyndp runs on Keras 2 and Keras 3; tf.keras is Keras {KERAS_MAJOR_VERSION} here.")
if KERAS_MAJOR_VERSION == 3 and tf.keras.backend.backend() != "tensorflow":
    raise ImportError(
        "keras_dyndp runs on Keras 3 with the TensorFlow backend only; KERAS_BACKEND is "
        f"{keras.backend.backend()!r} here. Set KERAS_BACKEND=tensorflow."
    )

_KERAS_3 = KERAS_MAJOR_VERSION == 3
if _KERAS_3:
    import keras  # pylint: disable=import-outside-toplevel,redefined-outer-name,wrong-import-position  # noqa: E402,F811

# Optimizers.


def apply_base_update(base: Any, grads_and_vars: list, **kwargs) -> tf.Variable:
    """Applies noised ``grads_and_vars`` with the update rule of ``base`` (``super()`` of the DP optimizer): Keras 2's
    ``apply_gradients(grads_and_vars, **kwargs)`` | Keras 3's ``apply(grads, variables)``. Both sum the replicas'
    parts (all-reduce SUM, `keras_dyndp.tf_backend.distribution`) and return ``iterations``, incremented."""
    if _KERAS_3:
        grads, variables = zip(*grads_and_vars) if grads_and_vars else ((), ())
        base.apply(list(grads), list(variables))
        return base.iterations
    kwargs["skip_gradients_aggregation"] = False
    return base.apply_gradients(grads_and_vars, **kwargs)


def add_int32_optimizer_variable(optimizer: Any, name: str, shape: tuple[int, ...]) -> Any:
    """A non-trainable int32 variable of zeros in ``optimizer.variables`` (so saved with it), written from the first
    replica only, as ``iterations`` is. Keras 2's ``add_variable`` takes no aggregation."""
    if _KERAS_3:
        return optimizer.add_variable(
            shape=shape, initializer="zeros", dtype="int32", aggregation="only_first_replica", name=name
        )
    with tf.init_scope():
        aggregation = tf.VariableAggregation.ONLY_FIRST_REPLICA
        variable = tf.Variable(tf.zeros(shape, tf.int32), name=name, trainable=False, aggregation=aggregation)
    optimizer._variables.append(variable)  # noqa: SLF001  (Keras 2 optimizer: no public add_variable for int32)
    return variable


UNSUPPORTED_OPTIMIZER_ARGUMENTS = optimizer_base.KERAS_3_UNSUPPORTED_OPTIMIZER_ARGUMENTS if _KERAS_3 else {}
"""Base-optimizer arguments a DP optimizer refuses (when not None), with the reason: none on Keras 2."""

LOSS_SCALE_OPTIMIZER_CLASSES = ((keras.optimizers if _KERAS_3 else keras.mixed_precision).LossScaleOptimizer,)
"""The wrappers ``compile`` puts around the optimizer (its ``inner_optimizer``) under the 'mixed_float16' policy."""


def unwrap_optimizer(optimizer: Any) -> Any:
    """The optimizer inside a LossScaleOptimizer (mixed precision), else ``optimizer`` itself."""
    return optimizer.inner_optimizer if isinstance(optimizer, LOSS_SCALE_OPTIMIZER_CLASSES) else optimizer


# Losses.


def is_per_example_loss(loss: keras.losses.Loss) -> bool:
    """Whether a Keras loss object returns one loss per example: ``reduction="none"`` (Keras 3: also None)."""
    return loss.reduction in ((None, "none") if _KERAS_3 else (keras.losses.Reduction.NONE,))


# Models and layers.


def is_keras_train_step(model: keras.Model) -> bool:
    """Whether ``model`` trains with Keras's own ``Model.train_step`` (not overridden by its class or instance),
    which the DP optimizers refuse (Keras 2's in ``compute_gradients``, Keras 3's in ``apply_gradients``)."""
    return getattr(getattr(model, "train_step", None), "__func__", None) is keras.Model.train_step


def training_logs(model: keras.Model, x: Any, y: Any, y_pred: Any, sample_weight: Any) -> dict[str, tf.Tensor]:
    """Updates the compiled loss and metrics on a training batch and returns the step's logs: Keras 2's
    ``compute_loss`` updates the loss tracker | Keras 3's returns the loss, whose batch mean feeds it."""
    if _KERAS_3:
        loss = model._compute_loss(  # noqa: SLF001  (Keras 3 Trainer: also calls an old-style compute_loss)
            x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True
        )
        loss = tf.convert_to_tensor(loss)
        if loss.shape.rank:  # Per-example losses: log their mean (0, with weight 0, on a replica without rows).
            loss = tf.math.divide_no_nan(tf.reduce_sum(loss), tf.cast(tf.size(loss), loss.dtype))
        batch_size = tf.shape(next(t for t in tf.nest.flatten(x) if t is not None))[0]
        model._loss_tracker.update_state(loss, sample_weight=batch_size)  # noqa: SLF001  (Keras 3 Trainer's loss metric)
        return model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)
    model.compute_loss(x, y, y_pred, sample_weight)
    return model.compute_metrics(x, y, y_pred, sample_weight)


DIRECT_BATCHES_REACH_EVERY_REPLICA: bool = _KERAS_3
"""Whether ``train_on_batch`` under several replicas gives each the whole batch (Keras 3) instead of a share
(`keras_dyndp.tf_backend.distribution.split_direct_batches` splits it for private models)."""


def reset_train_function(model: keras.Model) -> None:
    """Makes the next ``fit`` trace ``model.train_step`` anew (after it was replaced on the instance)."""
    model.train_function = None
    _steps_overrides.pop(model, None)


def input_signature(model: keras.Model) -> Any:
    """The inputs' specs of a model that has been built or called (unknown batch size), else None: Keras 2's
    ``save_spec`` | Keras 3's ``model.inputs``, of functional and Sequential models only (None for subclassed ones)."""
    if KERAS_MAJOR_VERSION == 2:
        spec = model.save_spec(dynamic_batch=True)
        specs = None if spec is None else spec[0]  # (args, kwargs)
    else:
        inputs = getattr(model, "inputs", None)
        specs = [tf.TensorSpec([None, *t.shape[1:]], tf.as_dtype(t.dtype)) for t in inputs] if inputs else None
    if specs is None:
        return None
    return specs[0] if len(specs) == 1 else tuple(specs)


def variable_name(variable: Any) -> str:
    """A variable's name with its layer's, for messages: ``'dense/kernel:0'`` (Keras 2) | ``'dense/kernel'``."""
    return getattr(variable, "path", None) or variable.name


def depthwise_kernel(layer: keras.layers.Layer) -> Any:
    """A ``DepthwiseConv1D/2D``'s or ``SeparableConv1D/2D``'s depthwise kernel: ``depthwise_kernel`` | ``kernel`` on
    Keras 3's DepthwiseConv."""
    return layer.depthwise_kernel if hasattr(layer, "depthwise_kernel") else layer.kernel


def flatten_layers(layer: keras.layers.Layer) -> list[keras.layers.Layer]:
    """Every layer inside ``layer`` (a model or a wrapper), nested ones included, not ``layer`` itself."""
    return sublayers.layers(layer, include_self=False)


def _keras_module(name: str) -> Any:
    """A module of the Keras in use by its path below ``src`` (``keras.src...`` or ``tf_keras.src...``)."""
    return importlib.import_module(f"{keras.Model.__module__.split('.src.')[0]}.src.{name}")


print_msg: Callable[[str], None] = _keras_module("utils.io_utils").print_msg
"""Keras's way to print a line: to stdout, or to absl logging when interactive logging is off."""

FUNCTIONAL_CLASS: type = _keras_module("models.functional" if _KERAS_3 else "engine.functional").Functional
"""Keras's functional model class (``keras.Model(inputs, outputs)`` makes one)."""

# SYMBOLIC_TENSOR: the class of a functional model's symbolic tensors (``KerasTensor``). OP_LAYER_CLASSES: Keras 2's
# layers wrapping a TF function applied to symbolic tensors (``TFOpLambda`` and subclasses), whose ``symbol`` is its TF
# API name (``'math.add'``, ``'__operators__.getitem'``); none on Keras 3.
if _KERAS_3:
    SYMBOLIC_TENSOR: type = keras.KerasTensor
    OP_LAYER_CLASSES: tuple[type, ...] = ()
else:
    SYMBOLIC_TENSOR = _keras_module("engine.keras_tensor").KerasTensor
    OP_LAYER_CLASSES = (_keras_module("layers.core.tf_op_layer").TFOpLambda,)


def functional_operations(layer: keras.layers.Layer) -> list[Any]:
    """A functional model's operations that are not layers: ``keras.ops`` | none on Keras 2 (`OP_LAYER_CLASSES`)."""
    if not _KERAS_3 or not isinstance(layer, FUNCTIONAL_CLASS):
        return []
    return [op for op in layer.operations if not isinstance(op, keras.layers.Layer)]


@contextlib.contextmanager
def layer_randomness_from(model: keras.Model, draw_seed: Callable[[], tf.Tensor]) -> Iterator[None]:
    """While the block traces (or runs) the forward pass, the k-th random draw of the model's layers uses
    ``stateless_fold_in(seed, k)``, ``seed = draw_seed()`` (int64 [2]) drawn once on entry if any layer is random, so
    every example draws the same seeds, whatever its position. Keras 3: through each layer ``SeedGenerator``'s ``next``
    (ops with ``seed=None`` use Keras's global generator, not covered) | Keras 2: each layer's ``_random_generator``."""
    counter = iter(range(1 << 30))
    seed: list[tf.Tensor] = []

    def next_seed(*args, **kwargs) -> tf.Tensor:
        del args, kwargs
        return tf.random.experimental.stateless_fold_in(seed[0], next(counter))

    layers = [model, *flatten_layers(model)]
    # A layer's random generators are held only in private attributes (Keras 3 `_seed_generators`, Keras 2
    # `_random_generator`): no public API lists them.
    if _KERAS_3:
        targets = list({id(g): g for layer in layers for g in getattr(layer, "_seed_generators", ())}.values())
        name, replacement = "next", next_seed
    else:
        name, random_generator_class = "_random_generator", _keras_module("backend").RandomGenerator
        targets = [layer for layer in layers if isinstance(vars(layer).get(name), random_generator_class)]
        replacement = random_generator_class(rng_type=random_generator_class.RNG_STATELESS)
        replacement._built = True  # noqa: SLF001  (Keras 2 RandomGenerator: no public way to skip its build)
        replacement.make_seed_for_stateless_op = next_seed
    if targets:
        seed.append(draw_seed())
    with patched_attributes([(target, name, replacement) for target in targets]):
        yield


@contextlib.contextmanager
def patched_attributes(patches: list[tuple[Any, str, Any]]) -> Iterator[None]:
    """Within the block, each ``(owner, name, value)`` of ``patches`` sets ``owner.name = value`` (untracked: no
    checkpoint dependency); then each owner gets back its own attribute, or none if it had none (its class's)."""
    originals = [vars(owner).get(name, _ABSENT) for owner, name, _ in patches]
    for owner, name, value in patches:
        object.__setattr__(owner, name, value)
    try:
        yield
    finally:
        for (owner, name, _), original in zip(patches, originals):
            if original is _ABSENT:
                object.__delattr__(owner, name)
            else:
                object.__setattr__(owner, name, original)


_ABSENT = object()


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


# Training loop (fit) and callbacks.


# Keras 3: what `set_steps_per_execution` replaced (``steps``, ``train_function``) and the function it ``installed``.
_steps_overrides: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def steps_per_execution(model: keras.Model) -> int | None:
    """The compiled ``steps_per_execution`` (None before ``compile``)."""
    if _KERAS_3:
        return int(model.steps_per_execution) if getattr(model, "compiled", False) else None
    variable = getattr(model, "_steps_per_execution", None)  # Keras 2 exposes it only privately
    return None if variable is None else int(variable.numpy())


def set_steps_per_execution(model: keras.Model, steps: int) -> None:
    """Changes ``steps_per_execution`` for the next call of the train function, also in the middle of ``fit``. Keras 2
    reads a variable at every call. Keras 3 traces the value into its train function: the first change keeps the current
    one and traces one for the new value; setting the original value back restores the original."""
    if not _KERAS_3:
        model._steps_per_execution.assign(steps)  # noqa: SLF001  (Keras 2 Model: the variable its train function reads)
        return
    steps = int(steps)
    if steps == model.steps_per_execution:
        return
    override = _steps_overrides.get(model)
    if override is not None and model.train_function is not override.installed:
        override = None  # The model was recompiled or made private since: its train function is not ours.
    if override is not None and steps == override.steps:
        model.steps_per_execution = steps
        model.train_function = override.train_function
        del _steps_overrides[model]
        return
    if override is None:
        override = types.SimpleNamespace(steps=model.steps_per_execution, train_function=model.train_function)
    current = model.train_function
    model.steps_per_execution = steps
    model.make_train_function(force=True)
    if hasattr(current, "checked"):  # make_private's: the new function goes on with the data fit checked.
        model.train_function.checked = current.checked
    override.installed = model.train_function
    _steps_overrides[model] = override


class RunProgressBar(keras.callbacks.ProgbarLogger):
    """Keras's step-counting progress bar showing "Epoch k/total_epochs" across ``fit`` calls, not each's ``epochs``."""

    def __init__(self, total_epochs: int):
        super().__init__(**({} if _KERAS_3 else {"count_mode": "steps"}))
        self.total_epochs = total_epochs

    def set_params(self, params: dict) -> None:
        super().set_params({**params, "epochs": self.total_epochs})


# Entry points.


# Keras 2's ``Model.fit`` and ``train_on_batch`` (their code objects, under Keras's traceback filter) -> the entry names
# of `keras_dyndp.keras_glue.entry_points`; none on Keras 3, whose entry points show their data to the model.
_KERAS2_ENTRY_POINTS = {
    inspect.unwrap(getattr(keras.Model, name)).__code__: entry
    for name, entry in [("fit", entry_points.FIT), ("train_on_batch", entry_points.TRAIN_ON_BATCH)]
    if not _KERAS_3
}


def unbound_entry_data(model: keras.Model) -> tuple[str, Any] | None:
    """Keras 2: ``(entry, x)`` of the ``keras.Model.fit(model, x, ...)`` or ``train_on_batch`` called unbound that
    is making ``model``'s train function (called from its ``make_train_function``), read from that call's frame, as
    Keras 2 shows it to no call on the model (`registration.keras_entry_data`); None otherwise, and on Keras 3."""
    return registration.keras_entry_data(model, _KERAS2_ENTRY_POINTS) if _KERAS2_ENTRY_POINTS else None
