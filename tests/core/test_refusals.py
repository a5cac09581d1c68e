"""Tests for keras_dyndp.core.refusals: the per-example loss rule and the refusal messages, with no backend."""

import types

import pytest

from keras_dyndp.core import refusals


class _Loss:
    def __init__(self, reduction):
        self.reduction = reduction

    def __call__(self, y, y_pred):
        return y_pred


class _Keras:
    """Stands in for a Keras module: ``keras.losses.Loss`` and ``keras.losses.get``."""

    losses = types.SimpleNamespace(Loss=_Loss, get=lambda name: _Loss("none" if name == "per_example" else "sum"))


def _is_per_example(loss):
    return loss.reduction == "none"


def test_a_per_example_loss_and_a_function_are_accepted():
    loss = _Loss("none")
    assert refusals.per_example_loss_fn(loss, _Keras, _is_per_example) is loss
    assert refusals.per_example_loss_fn("per_example", _Keras, _is_per_example).reduction == "none"
    assert refusals.per_example_loss_fn(abs, _Keras, _is_per_example) is abs


@pytest.mark.parametrize(
    "loss, message",
    [
        (_Loss("sum"), r'must be per-example: build it with reduction="none".*Received: reduction=\'sum\''),
        ("batch_mean", "must be per-example"),
        ([_Loss("none"), _Loss("none")], "supports a single loss"),
        (3, "must be a Keras loss or a loss function"),
    ],
)
def test_losses_that_cannot_be_clipped_per_example_are_refused(loss, message):
    with pytest.raises(ValueError, match=message):
        refusals.per_example_loss_fn(loss, _Keras, _is_per_example)


def test_messages_name_what_was_received_and_what_to_do():
    assert refusals.PER_EXAMPLE_REDUCTION == 'reduction="none"'  # valid on Keras 2 and 3
    assert "Received: 2 losses" in str(refusals.regularization_error("2 losses"))
    layer = types.SimpleNamespace(name="bn")
    message = str(refusals.batch_statistics_error(layer))
    assert "'bn' (SimpleNamespace)" in message and "GroupNormalization" in message and "trainable = False" in message
    message = str(refusals.batch_state_error("net", "the non-trainable variables ['s'] (of layers ['leaky'])"))
    assert "'net' writes the non-trainable variables ['s'] (of layers ['leaky'])" in message
    assert "computed from the input batch" in message and "LayerNormalization" in message


def test_model_and_optimizer_refusals_name_the_backend_and_what_to_use():
    assert str(refusals.not_a_model_error(3)) == "`model` must be a keras.Model. Received: model=3."
    for backend in ("TensorFlow", "JAX"):
        message = str(refusals.not_dp_optimizer_error("sgd", backend))
        assert f"must be a keras_dyndp DP optimizer of the {backend} backend" in message
        assert "DynamicDPKerasSGD" in message and "Received: optimizer='sgd'." in message
    message = str(refusals.loss_scale_error("Do X."))
    assert message.startswith("Mixed precision ('mixed_float16') wraps the optimizer in a LossScaleOptimizer")
    assert message.endswith("differential privacy does not allow. Do X.")


def test_the_first_line_of_a_common_mistake_says_what_is_wrong_and_the_fix():
    first = refusals.keras_train_step().splitlines()[0]
    assert "Keras's own train step" in first
    assert "call model = keras_dyndp.make_private(model) before model.fit" in first
    recorded = refusals.keras_train_step(types.SimpleNamespace(method="ghost")).splitlines()[0]
    assert "keras_dyndp.make_private(model, **{'method': 'ghost'}) after load_model" in recorded
    first = refusals.foreign_gradients("Opt.apply", "its own DP step noised", "do X.").splitlines()[0]
    assert first == "Opt.apply accepts only the gradients its own DP step noised: do X."
    first = str(refusals.batch_statistics_error(types.SimpleNamespace(name="bn"))).splitlines()[0]
    assert "statistics of the whole batch" in first and "GroupNormalization" in first and "trainable = False" in first
    assert "remove them" in str(refusals.regularization_error("2 losses")).splitlines()[0]


def test_refusals_reach_the_user_as_raised_not_rewrapped_by_autograph():
    errors = [
        refusals.not_a_model_error(3),
        refusals.not_dp_optimizer_error("sgd", "JAX"),
        refusals.loss_scale_error("Do X."),
        refusals.regularization_error("2 losses"),
        refusals.batch_statistics_error(types.SimpleNamespace(name="bn")),
        refusals.batch_state_error("net", "x"),
    ]
    for loss in (_Loss("sum"), 3):
        with pytest.raises(ValueError) as raised:
            refusals.per_example_loss_fn(loss, _Keras, _is_per_example)
        errors.append(raised.value)
    assert all(getattr(error, "ag_pass_through", False) for error in errors)
    assert refusals.user_error(RuntimeError("x")).ag_pass_through
