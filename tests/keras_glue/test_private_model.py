"""Tests for keras_dyndp.keras_glue.private_model: what make_private means, once for both backends, on stand-in
classes."""

import dataclasses

import pytest

from keras_dyndp.core import refusals
from keras_dyndp.keras_glue import private_model
from keras_dyndp.keras_glue.private_model import PrivateConfig


class _Model:
    optimizer = None

    def train_step(self, data):
        return "Keras's"


class _DPOptimizer:
    private_config = None


def _private_train_step(self, data):
    return "private"


def _hooks(installed):
    return private_model.Hooks(
        backend="Stand-in",
        model_class=_Model,
        optimizer_class=_DPOptimizer,
        methods=("auto", "vectorized"),
        train_step=_private_train_step,
        unwrap_optimizer=lambda optimizer: optimizer,
        install=installed.append,
    )


def test_make_private_binds_the_options_beside_the_model_and_installs_the_train_step():
    installed, model = [], _Model()
    model.optimizer = _DPOptimizer()
    assert not private_model.is_private(model)
    assert private_model.make_private(model, "vectorized", True, _hooks(installed)) is model
    assert private_model.is_private(model) and installed == [model] and model.train_step(None) == "private"
    assert private_model.record(model).config == PrivateConfig("vectorized", training_metrics=True)
    assert model.optimizer.private_config == PrivateConfig("vectorized", training_metrics=True)
    assert not vars(model).keys() - {"optimizer", "train_step"}  # no attribute of keras_dyndp's on the model
    model.train_step = _Model.train_step.__get__(model)  # a train step of the user's own: no longer private
    assert not private_model.is_private(model)


def test_make_private_refuses_other_objects_methods_and_flags():
    with pytest.raises(ValueError, match="`model` must be a keras.Model"):
        private_model.make_private(object(), "auto", False, _hooks([]))
    with pytest.raises(ValueError, match="`method` must be one of"):
        private_model.make_private(_Model(), "ghost", False, _hooks([]))
    with pytest.raises(ValueError, match="`training_metrics` must be True or False"):
        private_model.make_private(_Model(), "auto", 1, _hooks([]))


def test_a_model_without_a_dp_optimizer_is_refused_naming_the_backend():
    model = private_model.make_private(_Model(), "auto", False, _hooks([]))
    model.optimizer = "sgd"
    with pytest.raises(ValueError, match="Stand-in"):
        private_model.dp_optimizer(model)


class _BudgetStop:
    stops_at_the_budget = True


def test_the_budget_refusal_comes_out_without_the_chain_it_was_raised_in():
    model = private_model.make_private(_Model(), "auto", False, _hooks([]))
    with pytest.raises(refusals.BudgetExhaustedError) as raised:
        with private_model.budget_refusal(model, None):
            try:
                raise KeyError("inside Keras")
            except KeyError as error:
                raise refusals.BudgetExhaustedError("DP budget exhausted: all 3 steps") from error
    assert str(raised.value) == "DP budget exhausted: all 3 steps" and raised.value.__suppress_context__


def test_a_fit_notes_while_it_runs_whether_a_callback_ends_it_at_the_budget():
    model = private_model.make_private(_Model(), "auto", False, _hooks([]))
    record = private_model.record(model)
    for callbacks, stops in [([object(), _BudgetStop()], True), ([object()], False), (None, False)]:
        with private_model.budget_refusal(model, callbacks):
            assert record.fit_stops_at_the_budget is stops
        assert record.fit_stops_at_the_budget is False


def test_a_saved_config_is_none_or_both_options():
    assert PrivateConfig.from_config(None) is None
    assert PrivateConfig.from_config({"method": "auto", "training_metrics": False}) == PrivateConfig("auto")
    with pytest.raises(ValueError, match="`private_train_step` must be None or a dict"):
        PrivateConfig.from_config({"method": "auto"})


class _LossScaleWrapper:
    def __init__(self, inner_optimizer):
        self.inner_optimizer = inner_optimizer


def test_the_model_compiled_with_an_optimizer_is_found_among_the_private_models_only():
    installed, optimizer = [], _DPOptimizer()
    plain = _Model()
    plain.optimizer = optimizer
    assert private_model.model_compiled_with(optimizer) is None  # never made private: nothing binds it
    first, second = _Model(), _Model()
    for model, variables in ((first, ["a"]), (second, ["b"])):
        model.trainable_variables = variables
        private_model.make_private(model, "auto", False, _hooks(installed)).optimizer = _LossScaleWrapper(optimizer)
    assert private_model.model_compiled_with(optimizer) is first
    assert private_model.model_compiled_with(optimizer, second.trainable_variables) is second
    assert private_model.model_compiled_with(_DPOptimizer()) is None
    first.train_step = _Model.train_step.__get__(first)  # no longer private
    assert private_model.model_compiled_with(optimizer) is second


def test_make_private_replaces_the_data_hook_of_a_class_that_has_it_to_record_the_data():
    class _Keras3Model(_Model):
        def _symbolic_build(self, iterator=None, data_batch=None):
            return "Keras's"

    hooks = dataclasses.replace(_hooks([]), data_hook="_symbolic_build")
    model = private_model.make_private(_Keras3Model(), "auto", False, hooks)
    assert model._symbolic_build(data_batch="batch") == "Keras's"  # as Keras's entry points call it, also unbound
    assert private_model.record(model).data_seen.take() == ("model.train_on_batch", "batch")
    assert "_symbolic_build" not in vars(private_model.make_private(_Model(), "auto", False, hooks))  # Keras 2


def test_a_model_compiled_with_another_optimizer_is_bound_and_its_dp_optimizer_set_when_compiled_again():
    """A KerasHub task model compiles itself (Adam) in its constructor; the user then compiles it with a DP one."""
    model = _Model()
    model.optimizer = "Adam"
    assert private_model.make_private(model, "auto", False, _hooks([])) is model
    with pytest.raises(ValueError, match="must be a keras_dyndp DP optimizer"):
        private_model.dp_optimizer(model)  # what the train step asks first
    model.optimizer = _DPOptimizer()
    assert private_model.dp_optimizer(model) is model.optimizer
