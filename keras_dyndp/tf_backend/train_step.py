"""``model = keras_dyndp.make_private(model)`` on TensorFlow (Keras 2 and 3): per-example clipping in ``model.fit``.
Keras's own ``train_step`` cannot clip per example, and the DP optimizers refuse it. make_private's computes the
per-example clipped sums (`keras_dyndp.tf_backend.per_example.clipped_gradient_sum`) and hands them to
``model.optimizer.apply_clipped_sum``; it logs only ``dp_step`` unless ``training_metrics=True``. Under mixed precision
the losses, clipping, sum and noise are float32 and the LossScaleOptimizer is bypassed (a dynamic loss scale would skip
or shrink steps depending on the private batch). The checks, and what they refuse: docs/privacy.md, "Refused, and why"
and "Which entry points are covered, and how"."""

from __future__ import annotations

import contextlib
import functools
import inspect
import types
import weakref
from collections.abc import Callable

import tensorflow as tf

from keras_dyndp import optimizer_base
from keras_dyndp.core import batch_sizes
from keras_dyndp.core import refusals
from keras_dyndp.core import step_checks
from keras_dyndp.keras_glue import entry_points
from keras_dyndp.keras_glue import epoch_logs
from keras_dyndp.keras_glue import private_model
from keras_dyndp.tf_backend import data
from keras_dyndp.tf_backend import distribution
from keras_dyndp.tf_backend import keras_compat
from keras_dyndp.tf_backend import ops
from keras_dyndp.tf_backend import sampling_check
from keras_dyndp.tf_backend.keras_compat import keras
from keras_dyndp.tf_backend.per_example import accumulation
from keras_dyndp.tf_backend.per_example import clipped_sum


def _private_train_step(self: keras.Model, data) -> dict[str, tf.Tensor]:
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    optimizer = private_model.dp_optimizer(self)
    optimizer.private_config = config = private_model.record(self).config
    loss_fn = refusals.per_example_loss_fn(self.loss, keras, keras_compat.is_per_example_loss)
    if not self.built:
        # A subclassed model (or a Sequential without Input) creates its variables at its first call, here on Keras
        # 3: call it once, in inference mode (no batch statistics are updated), so that var_list is complete.
        self(x, training=False)
    var_list = self.trainable_variables
    schedule_values = optimizer.current_schedule_values()  # (C_t, sigma_t), read once for the step
    clip = functools.partial(
        clipped_sum.clipped_gradient_sum_with_outputs,
        self,
        loss_fn,
        clip_norm=schedule_values[0],
        var_list=var_list,
        method=_clipping_method(self),
        random_source=optimizer.noise_source.generator,
        num_microbatches=optimizer.num_microbatches,
    )
    if optimizer.accumulation_steps == 1:
        sums, norms, y_pred, losses = clip(x, y, sample_weight)
    else:
        sums, norms, y_pred, losses = accumulation.clipped_sum_in_physical_batches(
            clip, var_list, x, y, sample_weight, optimizer.accumulation_steps
        )
    if self.losses:  # After the forward pass, which is where activity regularisers add theirs.
        raise refusals.regularization_error(f"{len(self.losses)} of them in model.losses")
    num_rows = tf.shape(losses)[0]
    num_examples = num_rows if sample_weight is None else sampling_check.count_nonzero_rows(sample_weight)
    count = None
    if optimizer.adaptive_clipping is not None:  # microbatches: each counts; else the rows with a weight
        weights = clipped_sum.example_weights(x, sample_weight)
        rows = None if optimizer.num_microbatches else sampling_check.nonzero_rows(weights)
        count = ops.centred_count(norms, schedule_values[0], rows)
    optimizer.apply_clipped_sum(
        sums, num_examples, num_rows, var_list, schedule_values=schedule_values, centred_count=count
    )
    if not config.training_metrics:
        # Nothing computed on the private batch leaves the step; the public step count stands in for the logs
        # (Keras 3's train function cannot return an empty structure).
        return {"dp_step": tf.identity(optimizer.dp_step)}
    return keras_compat.training_logs(self, x, y, y_pred, sample_weight)


def _clipping_method(model: keras.Model) -> str:
    """make_private's method; under mixed precision 'auto' takes the vectorized path and 'ghost' is refused (a ghost
    norm rounded down in float16/bfloat16 would let a clipped gradient exceed C)."""
    method = private_model.record(model).config.method
    dtypes = {getattr(layer, "compute_dtype", None) for layer in keras_compat.flatten_layers(model)}
    low_precision = sorted(dtypes & {"float16", "bfloat16"})
    if not low_precision:
        return method
    if method == "ghost":
        raise ValueError(
            f"make_private(method='ghost') does not support mixed precision: model {model.name!r} computes in "
            f"{', '.join(low_precision)}, and the ghost rules would clip by norms rounded in that precision. Use "
            "method='auto' or 'vectorized' (float32 per-example gradients). Received: method='ghost'."
        )
    return "vectorized" if method == "auto" else method


def _private_fit(self: keras.Model, *args, **kwargs):
    """``Model.fit`` showing its data to the checks, with `_BudgetCheck` (one `BudgetExhaustedError` past the budget);
    ``shuffle`` defaults to False, which Keras ignores for datasets anyway (it warns on True)."""
    bound = inspect.signature(type(self).fit).bind(self, *args, **kwargs)
    x = bound.arguments.get("x")
    optimizer = keras_compat.unwrap_optimizer(getattr(self, "optimizer", None))
    if not isinstance(optimizer, optimizer_base.DPOptimizerBase):
        return type(self).fit(*bound.args, **bound.kwargs)  # The step refuses it, naming what to use.
    if "shuffle" not in bound.arguments and isinstance(x, tf.data.Dataset):
        bound.arguments["shuffle"] = False
    given = list(bound.arguments.get("callbacks") or [])
    budget_stop = None if private_model.stops_at_the_budget(given) else step_checks.BUDGET_STOP
    bound.arguments["callbacks"] = [*given, _BudgetCheck(optimizer, budget_stop)]
    with (
        private_model.budget_refusal(self, given),
        private_model.record(self).data_seen.fit_call(x, data.yields_batches_of),
    ):
        return type(self).fit(*bound.args, **bound.kwargs)


def _check_data(model: keras.Model, seen: tuple[str, object] | None) -> bool:
    """Checks the data ``(caller, x)`` an entry point showed: ``fit``'s budget left and data
    (`SamplingCheck.check_fit_input`), ``train_on_batch``'s batch warned once. Returns whether the data was checked."""
    optimizer = keras_compat.unwrap_optimizer(getattr(model, "optimizer", None))
    if seen is None or not isinstance(optimizer, optimizer_base.DPOptimizerBase):
        return False
    caller, x = seen
    check = optimizer.sampling_check
    if caller == entry_points.FIT:
        optimizer.check_budget_left(None)  # spent before this fit: BudgetStop would not help
        with model.distribute_strategy.scope():  # Where the multi-worker refusal looks for the strategy.
            check.check_fit_input(x, getattr(model, "jit_compile", False))
            data.check_resume(x, optimizer)  # a seeded run resumed at another step than the optimizer's: refused
    else:
        check.warn_once(batch_sizes.not_poisson_batches(caller, x))
    return True


def _seen_data(model: keras.Model) -> tuple[str, object] | None:
    """``(caller, x)``: the data the entry point making ``model``'s train function showed (`entry_points.DataSeen`;
    Keras 2's unbound ``fit``: `keras_compat.unbound_entry_data`), or None."""
    seen = private_model.record(model).data_seen
    entry = keras_compat.unbound_entry_data(model)
    if entry is not None and entry[0] == entry_points.FIT:
        return seen.received_by_fit(entry[1])
    return seen.take() or entry


def _private_make_train_function(self: keras.Model, force: bool = False):
    """The model's ``make_train_function`` (every entry point calls it first) after `_check_data`, wrapped."""
    seen = _seen_data(self)
    checked = _check_data(self, seen)
    function = _KERAS_MAKE_TRAIN_FUNCTION[self](self, force)
    function = self.train_function if function is None else function  # Keras 3 returns None when it makes one.
    if not isinstance(function, _CheckedTrainFunction):
        function = _CheckedTrainFunction(self, function)
    function.checked = checked
    # Past the budget within a fit (which began with steps left), BudgetStop would have ended it at the last step.
    within_fit = seen is not None and seen[0] == entry_points.FIT
    stops = private_model.record(self).fit_stops_at_the_budget
    function.budget_stop = step_checks.BUDGET_STOP if within_fit and not stops else None
    self.train_function = function
    return function


class _CheckedTrainFunction:
    """Keras's train function ``iterator -> logs`` of a made-private model: within `SamplingCheck.handed_over` when
    the data was checked; in-graph refusals raised as one host refusal (``budget_stop``: the callback to suggest)."""

    def __init__(self, model: keras.Model, function: Callable):
        self._model = model
        self._function = function
        self.checked = False
        self.budget_stop: str | None = None

    def __getattr__(self, name: str):  # Keras and TensorFlow read the wrapped tf.function's attributes.
        if name.startswith("__") or name in ("_model", "_function"):
            raise AttributeError(name)
        return getattr(self._function, name)

    def __call__(self, iterator):
        optimizer = private_model.dp_optimizer(self._model)
        checked = optimizer.sampling_check.handed_over() if self.checked else contextlib.nullcontext()
        try:
            with checked:
                return self._function(iterator)
        except tf.errors.InvalidArgumentError:  # Under steps_per_execution the budget can end inside a call.
            refusal = optimizer.host_refusal(self.budget_stop)  # The same refusal, on the host, in one line.
            if refusal is None:
                raise
            raise refusal from None


class _BudgetCheck(keras.callbacks.Callback):
    """Refuses, on the host, a call of the train function that would start past the budget; checks only near the end:
    before the n-th call of a ``fit`` that started at step s, at most s + n k steps are taken (k steps per call)."""

    def __init__(self, optimizer: optimizer_base.DPOptimizerBase, budget_stop: str | None):
        super().__init__()
        self._supports_tf_logs = True  # It reads no logs; Keras 2 would otherwise convert the ones PrivacyLogger fills.
        self._optimizer = optimizer
        self._budget_stop = budget_stop  # The callback to suggest: None when it is among fit's callbacks.
        self._most_steps = 0
        self._steps_per_call = 1

    def on_train_begin(self, logs=None):
        self._most_steps = int(self._optimizer.dp_step.numpy())
        # BudgetStop may only shorten a call later: an upper bound, read once.
        self._steps_per_call = keras_compat.steps_per_execution(self.model) or 1

    def on_train_batch_begin(self, batch, logs=None):
        if self._most_steps >= self._optimizer.schedule.num_steps:
            self._optimizer.check_budget_left(self._budget_stop)
        self._most_steps += self._steps_per_call


def make_private(model: keras.Model, method: str = "auto", *, training_metrics: bool = False) -> keras.Model:
    """Gives ``model`` a train step that clips per example fast and applies through the DP optimizer.

    The same model object is returned (its ``train_step`` is replaced on the instance). Compile it, before or after,
    with a keras_dyndp DP optimizer and a per-example loss (``reduction=NONE``).

    Args:
        model: a Keras model (Sequential, functional or subclassed) without batch normalisation (refused at the
            first step; use GroupNormalization or LayerNormalization).
        method: how per-example gradients are clipped: ``'auto'`` (ghost clipping when every trainable layer
            has a rule, else vectorized; vectorized under mixed precision), ``'ghost'`` or ``'vectorized'``
            (see ``keras_dyndp.tf_backend.per_example``), or ``'jacobian'`` (the optimizer's own O(B^2) path). An
            optimizer with ``num_microbatches`` uses its own microbatch path instead.
        training_metrics: False (the default): the step logs only ``dp_step`` (public); only the noised update leaves
            it (validation metrics are computed as usual). True (Keras's behaviour, an opt-in): it also logs the
            compiled loss and metrics of the private batch, WITHOUT noise, outside the DP guarantee: one outlier
            example can move the logged epoch loss far (docs/privacy.md).

    Returns:
        ``model``.

    Raises:
        ValueError: on an unknown ``method`` or a model that is not a ``keras.Model``; at the first training
            step, on an optimizer or loss that cannot give per-example DP (docs/privacy.md, "Refused, and why").
    """
    return private_model.make_private(model, method, training_metrics, _HOOKS)


def _install(model: keras.Model) -> None:
    """make_private's entry points, train function and epoch logs on ``model`` (its train step is installed)."""
    model.fit = types.MethodType(_private_fit, model)
    model.train_on_batch = types.MethodType(private_model.private_train_on_batch, model)
    epoch_logs.from_the_step(model, not private_model.record(model).config.training_metrics)
    keras_compat.reset_train_function(model)
    if keras_compat.DIRECT_BATCHES_REACH_EVERY_REPLICA:
        distribution.split_direct_batches(model)
    # Keras's, or `distribution`'s around it; unbound, so that the weak dictionary does not keep the model alive.
    _KERAS_MAKE_TRAIN_FUNCTION.setdefault(model, model.make_train_function.__func__)
    model.make_train_function = types.MethodType(_private_make_train_function, model)


_KERAS_MAKE_TRAIN_FUNCTION: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


_HOOKS = private_model.Hooks(
    backend="TensorFlow",
    model_class=keras.Model,
    optimizer_class=optimizer_base.DPOptimizerBase,
    methods=clipped_sum.METHODS,
    train_step=_private_train_step,
    unwrap_optimizer=keras_compat.unwrap_optimizer,  # the LossScaleOptimizer bypassed (module docstring)
    install=_install,
    data_hook="_maybe_symbolic_build",  # Keras 3's: what unbound entry points show of their data.
)
