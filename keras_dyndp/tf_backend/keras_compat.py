"""What keras_dyndp does differently on Keras 2 and Keras 3: the only module that may depend on the version.

Every other module imports the Keras in use (`keras`) and the version-dependent helpers from here. Both are
implemented: Keras 2 (TF 2.15's ``tf.keras``, or ``tf_keras`` with ``TF_USE_LEGACY_KERAS=1`` on newer TF) and
Keras 3 on the TensorFlow backend (TF 2.16+, whose ``tf.keras`` is Keras 3). `KERAS_MAJOR_VERSION` says which.

What differs, name by name (Keras 2 | Keras 3):

* `keras`: ``tf.keras`` | the ``keras`` package, on the TensorFlow backend only (``tf.keras`` is a namespace of
  the same classes without ``keras.saving``).
* `Optimizer`, `register_serializable`: same names on both.
* `apply_base_update`: ``apply_gradients(grads_and_vars)`` | ``apply(grads, variables)``; both all-reduce (SUM)
  across replicas.
* `add_int32_optimizer_variable`: a ``tf.Variable`` appended to ``optimizer._variables`` | ``add_variable``.
  Keras 3's ``Model.train_step`` reduces the loss and calls ``optimizer.apply_gradients`` (which calls
  ``apply``) with the batch-averaged gradient, so the DP optimizers refuse both with an error naming
  ``make_private``, and the per-example step is the model's (``keras_dyndp.make_private``).
* `UNSUPPORTED_OPTIMIZER_ARGUMENTS`: none | ``gradient_accumulation_steps`` (would count micro-steps as DP steps
  and add noise per micro-step; ``accumulation_steps`` is the DP one) and ``loss_scale_factor`` (would rescale the
  noised update).
* `LOSS_SCALE_OPTIMIZER_CLASSES`, `unwrap_optimizer`: ``keras.mixed_precision.LossScaleOptimizer`` |
  ``keras.optimizers.LossScaleOptimizer``; both wrap the optimizer ``compile`` was given under the
  'mixed_float16' policy, as ``inner_optimizer``.
* `PER_EXAMPLE_REDUCTION`, `is_per_example_loss`: ``reduction="none"`` on both; Keras 3 also ``None``.
* `unpack_x_y_sample_weight`: ``keras.utils.unpack_x_y_sample_weight`` on both.
* `training_logs`: ``compute_loss`` updates the loss tracker | ``compute_loss`` returns the (per-example) loss,
  which is averaged and fed to ``model._loss_tracker``; then ``compute_metrics`` on both.
* `is_keras_train_step`: Keras's own ``Model.train_step`` calls the DP optimizer's ``minimize`` with the
  per-example losses, then returns the loss and metrics of the training batch (refused in ``compute_gradients``) |
  it hands the optimizer the averaged gradient (refused in ``apply_gradients``).
* `reset_train_function`: ``model.train_function = None`` on both (``make_train_function`` rebuilds it).
* `DIRECT_BATCHES_REACH_EVERY_REPLICA`: ``train_on_batch`` distributes its batch across a strategy's replicas |
  hands it whole to every replica (`keras_dyndp.tf_backend.replicas.split_direct_batches` splits it for private models).
* `steps_per_execution`, `set_steps_per_execution`: a variable ``model._steps_per_execution`` read by the traced
  loop at every call | a Python int ``model.steps_per_execution`` read when the train function is traced, so
  changing it swaps in a train function traced for the new value (and swaps the old one back when restored).
* `RunProgressBar`: ``ProgbarLogger(count_mode="steps")`` | ``ProgbarLogger()`` (Keras 3 counts steps).
* `add_to_epoch_logs`, `remove_epoch_logs_hook`: how a callback adds keys that EVERY callback's ``on_epoch_end``
  sees, whatever the order of the list: Keras 2 copies the last batch's logs (the very dict a callback with
  ``_supports_tf_logs`` receives) into the epoch logs | Keras 3 gives callbacks copies of the batch logs and
  builds the epoch logs with ``model._get_metrics_result_or_logs``, which is wrapped on the instance.
* `input_signature`: ``model.save_spec`` | specs of a functional model's ``inputs`` (else None).
* `flatten_layers`: ``_flatten_layers(include_self=False, recursive=True)`` on both.
* `BATCH_NORM_CLASSES`, `ALWAYS_MIXING_BATCH_NORM_CLASSES`: Keras 2's three classes |
  ``keras.layers.BatchNormalization`` only (``synchronized=True`` replaces SyncBatchNormalization).
"""

from __future__ import annotations

import contextlib
import importlib
import weakref
from collections.abc import Callable
from collections.abc import Iterator
from typing import Any

import tensorflow as tf

from keras_dyndp import epoch_logs
from keras_dyndp import optimizer_base
from keras_dyndp import refusals

keras = tf.keras
"""The Keras module in use: TF's ``tf.keras`` on Keras 2, the ``keras`` package on Keras 3 (whose ``tf.keras``
namespace lacks ``keras.saving``; its classes are the same)."""


def _major_version() -> int:
    version = getattr(keras, "__version__", None)
    if version is None:  # TF 2.15's tf.keras (keras.api._v2.keras) and tf_keras' have none; their package has.
        version = importlib.import_module(keras.__name__.split(".")[0]).__version__
    return int(version.split(".")[0])


KERAS_MAJOR_VERSION: int = _major_version()

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
        **kwargs: passed on to Keras 2's ``apply_gradients`` (``name``, ...); ignored on Keras 3.

    Returns:
        The ``iterations`` variable. Under a multi-replica strategy both sum the replicas' gradients (all-reduce
        SUM) before the update rule: each replica passes its part of the DP update (`keras_dyndp.tf_backend.replicas`).
    """
    if _KERAS_3:
        grads, variables = zip(*grads_and_vars) if grads_and_vars else ((), ())
        base.apply(list(grads), list(variables))
        return base.iterations
    kwargs["skip_gradients_aggregation"] = False
    return base.apply_gradients(grads_and_vars, **kwargs)


def add_int32_optimizer_variable(optimizer: Any, name: str, shape: tuple[int, ...]) -> Any:
    """A non-trainable int32 variable of zeros in ``optimizer.variables``, saved with the optimizer (checkpoints,
    ``.keras``, Keras 3's ``.weights.h5``) and written from the first replica only (it may be assigned in a replica's
    step, as ``iterations`` is)."""
    if _KERAS_3:
        return optimizer.add_variable(
            shape=shape, initializer="zeros", dtype="int32", aggregation="only_first_replica", name=name
        )
    with tf.init_scope():
        variable = tf.Variable(
            tf.zeros(shape, tf.int32),
            name=name,
            trainable=False,
            aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
        )
    optimizer._variables.append(variable)  # pylint: disable=protected-access  (Keras 2's add_variable has no aggregation)
    return variable


UNSUPPORTED_OPTIMIZER_ARGUMENTS: dict[str, str] = (
    optimizer_base.KERAS_3_UNSUPPORTED_OPTIMIZER_ARGUMENTS if _KERAS_3 else {}
)
"""Base-optimizer arguments a DP optimizer refuses (when not None), with the reason."""

if _KERAS_3:
    LOSS_SCALE_OPTIMIZER_CLASSES: tuple[type, ...] = (keras.optimizers.LossScaleOptimizer,)
else:
    LOSS_SCALE_OPTIMIZER_CLASSES = (keras.mixed_precision.LossScaleOptimizer,)
"""The wrappers ``compile`` puts around the optimizer under the 'mixed_float16' policy."""


def unwrap_optimizer(optimizer: Any) -> Any:
    """The optimizer inside a LossScaleOptimizer (mixed precision), else ``optimizer`` itself."""
    if isinstance(optimizer, LOSS_SCALE_OPTIMIZER_CLASSES):
        return optimizer.inner_optimizer
    return optimizer


# ----------------------------------------------------------------------------------------------------------
# Losses.

PER_EXAMPLE_REDUCTION = refusals.PER_EXAMPLE_REDUCTION


def is_per_example_loss(loss: keras.losses.Loss) -> bool:
    """Whether a Keras loss object returns one loss per example (no reduction over the batch)."""
    if _KERAS_3:
        return loss.reduction in (None, "none")
    return loss.reduction == keras.losses.Reduction.NONE


# ----------------------------------------------------------------------------------------------------------
# Models and layers.


def unpack_x_y_sample_weight(data: Any) -> tuple[Any, Any, Any]:
    """``(x, y, sample_weight)`` of one batch as ``fit`` hands it to ``train_step``."""
    return keras.utils.unpack_x_y_sample_weight(data)


def is_keras_train_step(model: keras.Model) -> bool:
    """Whether ``model`` trains with Keras's own ``Model.train_step`` (not overridden by its class or instance)."""
    return getattr(getattr(model, "train_step", None), "__func__", None) is keras.Model.train_step


def training_logs(model: keras.Model, x: Any, y: Any, y_pred: Any, sample_weight: Any) -> dict[str, tf.Tensor]:
    """Updates the compiled loss and metrics on a training batch and returns the step's logs."""
    if _KERAS_3:
        loss = model._compute_loss(  # pylint: disable=protected-access  (also calls an old-style compute_loss)
            x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True
        )
        loss = tf.convert_to_tensor(loss)
        if loss.shape.rank:  # The per-example losses of a reduction="none" loss: log their batch mean (a replica
            # of a tf.distribute strategy may hold no row: its mean is 0, with weight 0).
            loss = tf.math.divide_no_nan(tf.reduce_sum(loss), tf.cast(tf.size(loss), loss.dtype))
        batch_size = tf.shape(next(t for t in tf.nest.flatten(x) if t is not None))[0]
        model._loss_tracker.update_state(loss, sample_weight=batch_size)  # pylint: disable=protected-access
        return model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)
    model.compute_loss(x, y, y_pred, sample_weight)
    return model.compute_metrics(x, y, y_pred, sample_weight)


DIRECT_BATCHES_REACH_EVERY_REPLICA: bool = _KERAS_3
"""Whether ``train_on_batch`` under a strategy of several replicas gives each replica the whole batch."""


def reset_train_function(model: keras.Model) -> None:
    """Makes the next ``fit`` trace ``model.train_step`` anew (after it was replaced on the instance)."""
    model.train_function = None
    _steps_overrides.pop(model, None)


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


def _keras_module(name: str) -> Any:
    """A module of the Keras in use by its path below ``src`` (``keras.src...`` or ``tf_keras.src...``)."""
    return importlib.import_module(f"{keras.Model.__module__.split('.src.')[0]}.src.{name}")


print_msg: Callable[[str], None] = _keras_module("utils.io_utils").print_msg
"""Keras's way to print a line: to stdout, or to absl logging when interactive logging is off."""

FUNCTIONAL_CLASS: type = _keras_module("models.functional" if _KERAS_3 else "engine.functional").Functional
"""Keras's functional model class (``keras.Model(inputs, outputs)`` makes one)."""

if _KERAS_3:
    _SYMBOLIC_TENSOR: type = keras.KerasTensor
    _OP_LAYER_CLASSES: tuple[type, ...] = ()
else:
    _SYMBOLIC_TENSOR = _keras_module("engine.keras_tensor").KerasTensor
    _OP_LAYER_CLASSES = (_keras_module("layers.core.tf_op_layer").TFOpLambda,)


def functional_operations(layer: keras.layers.Layer) -> list[Any]:
    """The operations of a functional model that are not layers: Keras 3's ``keras.ops`` nodes | none (Keras 2
    wraps TF ops applied to symbolic tensors in ``TFOpLambda`` layers, see `is_op_layer`)."""
    if not _KERAS_3 or not isinstance(layer, FUNCTIONAL_CLASS):
        return []
    return [op for op in layer.operations if not isinstance(op, keras.layers.Layer)]


def is_op_layer(layer: keras.layers.Layer) -> bool:
    """Keras 2: whether ``layer`` wraps a TF function applied to symbolic tensors (``TFOpLambda``, its slicing
    subclass); its ``symbol`` (`op_layer_symbol`) names the function. Keras 3: never."""
    return isinstance(layer, _OP_LAYER_CLASSES)


def op_layer_symbol(layer: keras.layers.Layer) -> str:
    """The TF API name of a Keras 2 op layer's function, such as ``'math.add'`` or ``'__operators__.getitem'``."""
    return layer.symbol


def is_symbolic_tensor(value: Any) -> bool:
    """Whether ``value`` is a symbolic tensor of a functional model (a ``KerasTensor``)."""
    return isinstance(value, _SYMBOLIC_TENSOR)


def call_arguments(operation: Any) -> list[tuple[Any, Any]]:
    """``(args, kwargs)`` of each recorded call of an operation or layer in a functional model: Keras 3's
    ``node.arguments`` | Keras 2's ``node.call_args`` and ``call_kwargs``."""
    nodes = getattr(operation, "_inbound_nodes", ())
    if _KERAS_3:
        return [(node.arguments.args, node.arguments.kwargs) for node in nodes]
    return [(node.call_args, node.call_kwargs) for node in nodes]


@contextlib.contextmanager
def layer_randomness_from(model: keras.Model, draw_seed: Callable[[], tf.Tensor]) -> Iterator[None]:
    """Makes every random draw of the model's layers a function of one seed alone while the block traces (or runs)
    the forward pass: the k-th draw traced uses ``stateless_fold_in(seed, k)``, with ``seed = draw_seed()`` (int64
    [2]) drawn once on entry if the model has random layers.

    Keras 3: every ``SeedGenerator`` of the model's layers returns those seeds from ``next`` and leaves its state
    alone (ops with ``seed=None`` use Keras's global generator, not covered) | Keras 2: every layer's
    ``_random_generator`` (Dropout, GaussianNoise, RNN cells' dropout, ...) is replaced by a stateless one drawing
    those seeds (Keras's legacy random ops would follow the global seed). The draws no longer depend on how often
    the forward pass ran: inside ``tf.vectorized_map`` and ``tf.map_fn`` every example draws with the same seeds,
    whatever its position.
    """
    counter = iter(range(1 << 30))
    seed: list[tf.Tensor] = []

    def next_seed(*args, **kwargs) -> tf.Tensor:
        del args, kwargs
        return tf.random.experimental.stateless_fold_in(seed[0], next(counter))

    layers = [model, *flatten_layers(model)]
    if _KERAS_3:
        generators = {id(g): g for layer in layers for g in getattr(layer, "_seed_generators", ())}
        if generators:
            seed.append(draw_seed())
        for generator in generators.values():
            generator.next = next_seed
        try:
            yield
        finally:
            for generator in generators.values():
                del generator.next
        return
    random_generator_class = _keras_module("backend").RandomGenerator
    swapped = [layer for layer in layers if isinstance(vars(layer).get("_random_generator"), random_generator_class)]
    originals = [vars(layer)["_random_generator"] for layer in swapped]
    if swapped:
        seed.append(draw_seed())
    replacement = random_generator_class(rng_type=random_generator_class.RNG_STATELESS)
    replacement._built = True  # pylint: disable=protected-access
    replacement.make_seed_for_stateless_op = next_seed
    for layer in swapped:
        object.__setattr__(layer, "_random_generator", replacement)  # Not tracked: no checkpoint dependency.
    try:
        yield
    finally:
        for layer, original in zip(swapped, originals):
            object.__setattr__(layer, "_random_generator", original)


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


# ----------------------------------------------------------------------------------------------------------
# Training loop (fit) and callbacks.


class _StepsOverride:
    """Keras 3: the train function and ``steps_per_execution`` that `set_steps_per_execution` replaced."""

    def __init__(self, steps: int, train_function: Any):
        self.steps = steps
        self.train_function = train_function
        self.installed: Any = None


_steps_overrides: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def steps_per_execution(model: keras.Model) -> int | None:
    """The compiled ``steps_per_execution`` (None before ``compile``)."""
    if _KERAS_3:
        return int(model.steps_per_execution) if getattr(model, "compiled", False) else None
    variable = getattr(model, "_steps_per_execution", None)
    return None if variable is None else int(variable.numpy())


def set_steps_per_execution(model: keras.Model, steps: int) -> None:
    """Changes ``steps_per_execution`` for the next call of the train function, also in the middle of ``fit``.

    Keras 2 reads a variable at every call (no retracing). Keras 3 traces the value into its train function:
    the first change keeps the current train function and builds one for the new value (one trace); setting
    the original value back restores the original function, untouched.
    """
    if not _KERAS_3:
        model._steps_per_execution.assign(steps)  # pylint: disable=protected-access
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
        override = _StepsOverride(model.steps_per_execution, model.train_function)
    model.steps_per_execution = steps
    model.make_train_function(force=True)
    override.installed = model.train_function
    _steps_overrides[model] = override


class RunProgressBar(keras.callbacks.ProgbarLogger):
    """Keras's step-counting progress bar that numbers epochs out of a run's total across several ``fit`` calls.

    ``fit`` shows its own ``epochs`` argument ("Epoch 1/7", then "Epoch 8/30" from a second call); this bar shows
    "Epoch k/total_epochs" throughout. Keras 2's bar counts samples unless told ``count_mode='steps'``; Keras 3's
    counts steps.
    """

    def __init__(self, total_epochs: int):
        super().__init__(**({} if _KERAS_3 else {"count_mode": "steps"}))
        self.total_epochs = total_epochs

    def set_params(self, params: dict) -> None:
        super().set_params({**params, "epochs": self.total_epochs})


def add_to_epoch_logs(model: keras.Model, batch_logs: dict | None, values: dict[str, float]) -> None:
    """Makes ``values`` part of the logs that every callback's ``on_epoch_end`` receives for this epoch.

    Call it from ``on_train_batch_end`` of the epoch's last batch, in a callback with ``_supports_tf_logs = True``
    (Keras 2 then passes the very dict it copies into the epoch logs). On Keras 3, `keras_dyndp.epoch_logs`.
    """
    if not _KERAS_3 or not hasattr(model, "_get_metrics_result_or_logs"):  # Keras 2, or not a Keras 3 model.
        if batch_logs is not None:
            batch_logs.update(values)
        return
    epoch_logs.add(model, values)


def remove_epoch_logs_hook(model: keras.Model) -> None:
    """Removes what `add_to_epoch_logs` installed on ``model`` (at the end of training)."""
    epoch_logs.remove_hook(model)


def epoch_logs_from_the_step(model: keras.Model, from_the_step: bool) -> None:
    """Keras 3: whether ``fit``'s epoch logs are the train step's own logs instead of ``model.metrics``' results.

    A private train step with ``training_metrics=False`` never updates (so never builds) the compiled metrics,
    whose ``result()`` then fails in ``fit``'s epoch end; its logs (the public step count) are the epoch's logs.
    Keras 2 builds its epoch logs from the step's logs already.
    """
    if not _KERAS_3:
        return
    current = vars(model).get("_get_metrics_result_or_logs")
    if from_the_step and current is None:
        model._get_metrics_result_or_logs = _logs_of_the_step  # pylint: disable=protected-access
    elif not from_the_step and current is _logs_of_the_step:
        del model._get_metrics_result_or_logs  # pylint: disable=protected-access


def _logs_of_the_step(logs: dict) -> dict:
    return logs
