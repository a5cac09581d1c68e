"""What ``make_private`` means, once for both backends; each backend's ``train_step`` module supplies `Hooks`. The
record of each private model is kept beside it, never as attributes on it (docs/architecture.md, "The two backends,
file by file")."""

from __future__ import annotations

import contextlib
import dataclasses
import types
import weakref
from collections.abc import Callable
from collections.abc import Iterator
from typing import Any

from keras_dyndp.core import refusals
from keras_dyndp.core import validation
from keras_dyndp.keras_glue import entry_points
from keras_dyndp.keras_glue import registration


@dataclasses.dataclass(frozen=True)
class PrivateConfig:
    """``make_private``'s options for a model, which its DP optimizer records in its config (``private_train_step``)
    so that ``load_model`` restores them: ``method``, the clipping method, and ``training_metrics``, whether the step
    logs the batch's loss and metrics (outside the DP guarantee)."""

    method: str
    training_metrics: bool = False

    def __post_init__(self):
        validation.check_bool("training_metrics", self.training_metrics)

    @classmethod
    def from_config(cls, config: Any) -> PrivateConfig | None:
        """The options a saved optimizer config records (None: none)."""
        if config is None:
            return None
        if not isinstance(config, dict) or set(config) != {"method", "training_metrics"}:
            raise ValueError(
                "`private_train_step` must be None or a dict with keys 'method' and 'training_metrics' (make_private's "
                f"arguments). Received: private_train_step={config!r}."
            )
        return cls(**config)


@dataclasses.dataclass(frozen=True)
class Hooks:
    """What a backend gives ``make_private``: its name in refusals, its Keras ``Model`` class, its DP optimizers' base
    class, the clipping methods it takes, the private ``train_step``, ``unwrap_optimizer`` (the DP optimizer inside
    what ``compile`` set, or a refusal of the wrapper), ``install`` (its entry points and train function, put on the
    model after the train step) and ``data_hook``, the Keras 3 method `recording_build` replaces (None, or a name the
    class lacks, on Keras 2: none)."""

    backend: str
    model_class: type
    optimizer_class: type
    methods: tuple[str, ...]
    train_step: Callable
    unwrap_optimizer: Callable[[Any], Any]
    install: Callable[[Any], None]
    data_hook: str | None = None


@dataclasses.dataclass
class PrivateModel:
    """One private model's record: its options, the data its entry points showed, its backend's hooks, and whether
    the ``fit`` now running has a callback that ends it at the budget (`stops_at_the_budget`)."""

    config: PrivateConfig
    data_seen: entry_points.DataSeen
    hooks: Hooks
    fit_stops_at_the_budget: bool = False


_MODELS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def make_private(model: Any, method: str, training_metrics: bool, hooks: Hooks) -> Any:
    """Binds ``model`` (returned) with its options and installs ``hooks``' train step (each backend's
    ``make_private`` documents the arguments)."""
    if not isinstance(model, hooks.model_class):
        raise refusals.not_a_model_error(model)
    config = PrivateConfig(validation.check_choice("method", method, hooks.methods), training_metrics)
    _MODELS[model] = PrivateModel(config, entry_points.DataSeen(), hooks)
    model.train_step = types.MethodType(hooks.train_step, model)
    if hooks.data_hook is not None and hasattr(type(model), hooks.data_hook):
        # A private method of Keras 3's Trainer: no public hook sees the data of an unbound entry point.
        setattr(model, hooks.data_hook, types.MethodType(recording_build(hooks.data_hook), model))
    hooks.install(model)
    optimizer = hooks.unwrap_optimizer(getattr(model, "optimizer", None))
    if isinstance(optimizer, hooks.optimizer_class):  # else compiled later (a KerasHub task compiles itself with Adam)
        optimizer.private_config = config
    return model


def record(model: Any) -> PrivateModel:
    """``model``'s record; KeyError for a model ``make_private`` did not bind."""
    return _MODELS[model]


def is_private(model: Any) -> bool:
    """Whether ``model`` has make_private's train step."""
    bound = _MODELS.get(model)
    return bound is not None and getattr(getattr(model, "train_step", None), "__func__", None) is bound.hooks.train_step


def model_compiled_with(optimizer: Any, var_list: Any = None) -> Any:
    """The private model compiled with ``optimizer`` (or with a loss-scale wrapper of it), or None: found among the
    models ``make_private`` bound, so the optimizer, to which Keras hands only variables, knows its model without
    reading the call stack. Of several, the one whose trainable variables are ``var_list`` (the first without)."""
    found = [model for model in list(_MODELS) if is_private(model) and registration.compiled_with(model, optimizer)]
    if len(found) > 1 and var_list is not None:
        wanted = [id(variable) for variable in var_list]
        found = [model for model in found if [id(v) for v in model.trainable_variables] == wanted] or found
    return found[0] if found else None


def dp_optimizer(model: Any) -> Any:
    """The DP optimizer a private ``model`` trains with (in a loss-scale wrapper on TensorFlow); ValueError if none."""
    hooks = _MODELS[model].hooks
    optimizer = hooks.unwrap_optimizer(getattr(model, "optimizer", None))
    if not isinstance(optimizer, hooks.optimizer_class):
        raise refusals.not_dp_optimizer_error(optimizer, hooks.backend)
    return optimizer


@contextlib.contextmanager
def budget_refusal(model: Any, callbacks: Any) -> Iterator[None]:
    """Runs ``model``'s ``fit`` with ``callbacks``, recording whether one ends it at the budget (no refusal then
    suggests one); a `BudgetExhaustedError` raised inside comes out alone, without Keras's traceback."""
    bound = _MODELS[model]
    bound.fit_stops_at_the_budget = stops_at_the_budget(callbacks)
    try:
        yield
    except refusals.BudgetExhaustedError as error:
        raise refusals.BudgetExhaustedError(str(error)) from None
    finally:
        bound.fit_stops_at_the_budget = False


def stops_at_the_budget(callbacks: Any) -> bool:
    """Whether ``callbacks`` (``fit``'s) hold one that ends ``fit`` at the schedule's last step
    (`keras_dyndp.BudgetStop`, marked ``stops_at_the_budget``)."""
    return any(getattr(callback, "stops_at_the_budget", False) for callback in callbacks or ())


def private_train_on_batch(self: Any, x=None, *args, **kwargs):
    """``Model.train_on_batch`` showing its batch to the checks as the user gave it (Keras converts it first)."""
    _MODELS[self].data_seen.record_call(entry_points.TRAIN_ON_BATCH, x)
    return type(self).train_on_batch(self, x, *args, **kwargs)


def recording_build(keras_method: str) -> Callable:
    """A replacement of Keras 3's ``keras_method`` (`entry_points` says which), which its entry points call with their
    data, also unbound: records the data for the next ``make_train_function``, then calls Keras's."""

    def build(self: Any, iterator=None, data_batch=None):
        _MODELS[self].data_seen.record(iterator, data_batch)
        return getattr(type(self), keras_method)(self, iterator=iterator, data_batch=data_batch)

    return build
