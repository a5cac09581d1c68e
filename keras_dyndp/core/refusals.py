"""What ``make_private`` refuses on every backend, and the messages that say what to do instead. Each backend's step
finds these cases in its own way; the rule and its wording live here (no TensorFlow or JAX import: the caller passes its
Keras module). Elsewhere: argument checks (`validation`, `optimizer_base`), sampling refusals (`batch_sizes`), the
budget's and the restored schedule's (`optimizer_base`), the noise multiplier range (`accounting.noise_range`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

PER_EXAMPLE_REDUCTION = 'reduction="none"'
"""How to ask for a per-example loss, as error messages spell it (valid on Keras 2 and 3)."""


def user_error(error: Exception) -> Exception:
    """``error`` marked to reach the user as raised (harmless elsewhere): TensorFlow's autograph re-raises an error
    from traced code as one starting "in user code:" with the traced frames, burying what is wrong and the fix."""
    error.ag_pass_through = True  # Autograph's marker for errors it must not rewrap (tensorflow/python/autograph).
    return error


def _value_error(message: str) -> ValueError:
    """A ValueError saying ``message``, marked to reach the user as raised (`user_error`)."""
    return user_error(ValueError(message))


class BudgetExhaustedError(RuntimeError):
    """A DP step past the schedule's T steps was refused: the accounted epsilon covers only T (nothing applied)."""


def not_a_model_error(model: Any) -> ValueError:
    return _value_error(f"`model` must be a keras.Model. Received: model={model!r}.")


def not_dp_optimizer_error(optimizer: Any, backend: str) -> ValueError:
    """``model.optimizer`` of a model made private is not a DP optimizer of ``backend`` ('TensorFlow' or 'JAX')."""
    return _value_error(
        f"`model.optimizer` must be a keras_dyndp DP optimizer of the {backend} backend "
        "(keras_dyndp.DynamicDPKerasSGD, DynamicDPKerasAdam, DynamicDPKerasAdagrad, DynamicDPKerasRMSprop or "
        "one made by make_dynamic_dp_optimizer_class) for a model made private with make_private. "
        f"Received: optimizer={optimizer!r}."
    )


def loss_scale_error(remedy: str) -> ValueError:
    """A LossScaleOptimizer ('mixed_float16') around the DP optimizer; ``remedy``: what trains instead."""
    return _value_error(
        "Mixed precision ('mixed_float16') wraps the optimizer in a LossScaleOptimizer, whose dynamic loss scale "
        "skips or shrinks updates depending on the private batch (a step with an overflow is not applied), which "
        f"differential privacy does not allow. {remedy}"
    )


def per_example_loss_fn(loss: Any, keras: Any, is_per_example: Callable[[Any], bool]) -> Callable[[Any, Any], Any]:
    """The compiled ``loss`` (a Keras loss object, its name or a function; ``keras``: the Keras module) as a per-example
    loss; ValueError for several (multi-output), one reduced over the batch (``is_per_example`` false), or another."""
    if isinstance(loss, (dict, list, tuple)):
        raise _value_error(f"make_private supports a single loss (one output). Received: loss={loss!r}.")
    if isinstance(loss, str):
        loss = keras.losses.get(loss)
    if isinstance(loss, keras.losses.Loss):
        if not is_per_example(loss):
            raise _value_error(
                f"The compiled loss must be per-example: build it with {PER_EXAMPLE_REDUCTION} (averaging before "
                f"clipping destroys the privacy guarantee). Received: reduction={loss.reduction!r}."
            )
        return loss
    if callable(loss):
        return loss
    raise _value_error(f"`model.loss` must be a Keras loss or a loss function. Received: loss={loss!r}.")


def regularization_error(received: str) -> ValueError:
    """Regularisation losses are sums over the batch's examples (activity) or none of theirs (weights)."""
    return _value_error(
        "make_private does not support regularisation losses (kernel/activity regularizers, add_loss): remove "
        "them (the optimizer's weight_decay argument decays the weights without reading the data). They are not "
        f"per-example terms. Received: {received}."
    )


def batch_statistics_error(layer: Any) -> ValueError:
    """A layer (BatchNormalization) that normalises with, and stores, the statistics of the whole batch."""
    return _value_error(
        f"Layer {layer.name!r} ({type(layer).__name__}) normalises with the statistics of the whole batch: replace "
        "it with keras.layers.GroupNormalization or keras.layers.LayerNormalization (per-example), or freeze it "
        "(layer.trainable = False runs it in inference mode with fixed statistics).\n"
        "It normalises each example with the mean and variance of the whole batch and stores them in its moving "
        "averages without noise: one example changes the others' gradients and the released model, which DP-SGD's "
        "clipping does not bound."
    )


def batch_state_error(model_name: str, written: str, source: str = "the input batch") -> ValueError:
    """A training-mode call that writes state computed from the private batch (or, on JAX, from the step's secret
    per-example randomness): the stored value leaves the step without noise. ``written`` names what is written."""
    return _value_error(
        f"Model {model_name!r} writes {written} in its training-mode call with a value computed from {source}: "
        "that state leaves the step without noise, and what is computed from it can carry one example into the "
        "others' gradients. Compute such statistics outside DP training (or on public data and freeze them); for "
        "normalisation use keras.layers.GroupNormalization or LayerNormalization."
    )


def embedding_ids(layer_name: str, input_dim: int) -> str:
    """An Embedding (``layer_name``, ``input_dim`` rows) looked up an id outside its table on TensorFlow's ghost path
    (tapped itself, or the token table of another layer's rule): the refusal, raised at run time."""
    return (
        f"Embedding {layer_name!r} received an id outside [0, {input_dim}) (its input_dim): map the ids into "
        f"0..{input_dim - 1} before the model, or build the Embedding with a larger input_dim. Keras reads such an "
        f"id differently by backend and device (a negative id -k as row {input_dim} - k or as an error, an id of "
        f"{input_dim} or more as zeros on a GPU), so the Embedding's ghost-clipping rule refuses it rather than "
        "drop part of the gradient."
    )


def foreign_gradients(entry: str, accepted: str, fix: str) -> str:
    """A DP optimizer's ``entry`` (``'DynamicDPKerasSGD.apply'``) handed gradients its DP step did not produce
    (``accepted`` says which it takes): the problem and ``fix`` on the first line, why on the next."""
    return (
        f"{entry} accepts only the gradients {accepted}: {fix}\n"
        "Applying other gradients (unclipped, without noise) would train without differential privacy."
    )


def keras_train_step(private_config: Any = None) -> str:
    """Why Keras's own train step cannot train with a DP optimizer: the fix (``make_private``, with the arguments a
    reloaded optimizer recorded in its `PrivateConfig` ``private_config``) on the first line, why on the next."""
    if private_config is None:
        fix = "call model = keras_dyndp.make_private(model) before model.fit"
    else:  # A model reloaded without make_private: the optimizer's config recorded how it trained.
        fix = (
            f"call model = keras_dyndp.make_private(model, **{vars(private_config)!r}) after load_model, as "
            "this optimizer trained before"
        )
    return (
        f"Keras's own train step cannot train with a DP optimizer: {fix}.\n"
        "Keras 3's differentiates the batch's mean loss and hands the optimizer only the averaged gradient, so no "
        "example can be clipped there; Keras 2's would log the loss and metrics of the private batch without noise "
        "and cannot see how its batches were sampled. make_private gives the model a train step that clips per "
        "example and applies through the DP optimizer, and a fit that checks the data it is handed."
    )


BATCHED_NON_FINITE_REFUSAL = (
    "keras_dyndp: a gradient in this batch is not finite (a NaN or inf input, loss or gradient, or a value that "
    "overflowed). The optimizer's jacobian and microbatch paths differentiate the batch together, where one such "
    "example makes every other example's gradient NaN too (0 x NaN), so the step is refused rather than released "
    "without them. make_private's per-example paths (method='auto', 'ghost' or 'vectorized', no num_microbatches) "
    "drop such an example and train on; or remove the values that are not finite from the data."
)
"""TensorFlow's refusal of a step whose batch-differentiated gradients are not all finite (docs/privacy.md)."""
