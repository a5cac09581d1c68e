"""What ``make_private`` refuses on every backend, and the messages that say what to do instead.

The TensorFlow step (`keras_dyndp.per_example.train_step`, `keras_dyndp.model_checks`) and the JAX step
(`keras_dyndp.jax_backend.train_step`) find these cases in their own ways; the rule and its wording live here.
Imports no TensorFlow and no JAX: the caller passes its Keras module.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

PER_EXAMPLE_REDUCTION = 'reduction="none"'
"""How to ask for a per-example loss, as error messages spell it (valid on Keras 2 and 3)."""


def per_example_loss_fn(loss: Any, keras: Any, is_per_example: Callable[[Any], bool]) -> Callable[[Any, Any], Any]:
    """The compiled ``loss`` as a per-example loss function.

    Args:
        loss: ``model.loss``: a Keras loss object, its name, or a loss function.
        keras: the Keras module in use (for ``keras.losses``).
        is_per_example: whether a Keras loss object returns one loss per example.

    Raises:
        ValueError: for several losses (multi-output), a loss reduced over the batch, or anything else.
    """
    if isinstance(loss, (dict, list, tuple)):
        raise ValueError(f"make_private supports a single loss (one output). Received: loss={loss!r}.")
    if isinstance(loss, str):
        loss = keras.losses.get(loss)
    if isinstance(loss, keras.losses.Loss):
        if not is_per_example(loss):
            raise ValueError(
                f"The compiled loss must be per-example: build it with {PER_EXAMPLE_REDUCTION} (averaging before "
                f"clipping destroys the privacy guarantee). Received: reduction={loss.reduction!r}."
            )
        return loss
    if callable(loss):
        return loss
    raise ValueError(f"`model.loss` must be a Keras loss or a loss function. Received: loss={loss!r}.")


def regularization_error(received: str) -> ValueError:
    """Regularisation losses are sums over the batch's examples (activity) or none of theirs (weights)."""
    return ValueError(
        "make_private does not support regularisation losses (kernel/activity regularizers, add_loss): they are "
        f"not per-example terms. Received: {received}."
    )


def batch_statistics_error(layer: Any) -> ValueError:
    """A layer (BatchNormalization) that normalises with, and stores, the statistics of the whole batch."""
    return ValueError(
        f"Layer {layer.name!r} ({type(layer).__name__}) normalises each example with the mean and variance of the "
        "whole batch and stores them in its moving averages without noise: one example changes the others' "
        "gradients and the released model, which DP-SGD's clipping does not bound. Replace it with "
        "keras.layers.GroupNormalization or keras.layers.LayerNormalization (per-example), or freeze it "
        "(layer.trainable = False runs it in inference mode with fixed statistics)."
    )


def batch_state_error(model_name: str, written: str, source: str = "the input batch") -> ValueError:
    """A training-mode call that writes state computed from the private batch (or, on JAX, from the step's secret
    per-example randomness): the stored value leaves the step without noise. ``written`` names what is written."""
    return ValueError(
        f"Model {model_name!r} writes {written} in its training-mode call with a value computed from {source}: "
        "that state leaves the step without noise, and what is computed from it can carry one example into the "
        "others' gradients. Compute such statistics outside DP training (or on public data and freeze them); for "
        "normalisation use keras.layers.GroupNormalization or LayerNormalization."
    )
