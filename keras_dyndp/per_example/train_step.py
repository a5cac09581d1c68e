"""One-line opt-in to fast per-example clipping: ``model = keras_dyndp.make_private(model)``.

A bare optimizer only sees ``minimize(loss_vector, var_list, tape)``, so the DP optimizers' generic path must
take the jacobian of the per-example loss, which back-propagates every row through the batched graph (O(B^2),
~160x a non-private step on the tutorial CNN). ``make_private`` gives the model a ``train_step`` that has the
model and the inputs in hand: it computes the per-example clipped gradient sums with
``keras_dyndp.per_example.clipped_gradient_sum`` (ghost clipping where every trainable layer has a rule, else
``tf.vectorized_map`` over single-example passes) and hands them to
``model.optimizer.apply_clipped_gradient_sum``, which adds the schedule's noise N(0, sigma_t^2) to each SUM,
normalises, applies the base update and advances ``dp_step``. The privacy mechanism is the optimizer's; only the
way the clipped sum is computed changes.

Example:

```python
model = keras_dyndp.make_private(model)
model.compile(optimizer=keras_dyndp.optimizers.DynamicDPKerasSGD(schedule=schedule, learning_rate=0.1),
              loss=tf.keras.losses.SparseCategoricalCrossentropy(
                  from_logits=True, reduction=tf.keras.losses.Reduction.NONE),
              metrics=['accuracy'])
model.fit(x, y, batch_size=256, epochs=20)
```

Loss and metrics of the training batch are computed without noise; ``make_private(model,
training_metrics=False)`` computes none, so nothing but the noised update is derived from the private batch.

Works for Sequential, functional and subclassed models, compiled before or after the call. Refused (ValueError,
when the first step is traced): an optimizer that is not a keras_dyndp DP optimizer, a loss reduced over the
batch, several losses (multi-output models), regularisation losses (``model.losses``), which are not
per-example terms, and layers that mix examples or store batch statistics such as BatchNormalization
(``keras_dyndp.model_checks``).
"""

from __future__ import annotations

import types
from typing import Any, Callable

import tensorflow as tf

from keras_dyndp import keras_compat
from keras_dyndp.keras_compat import keras
from keras_dyndp.optimizers.dp_optimizer import DynamicDPOptimizerMixin
from keras_dyndp.per_example import clipped_sum


def _dp_optimizer(model: keras.Model) -> DynamicDPOptimizerMixin:
    optimizer = getattr(model, "optimizer", None)
    if not isinstance(optimizer, DynamicDPOptimizerMixin):
        raise ValueError(
            "`model.optimizer` must be a keras_dyndp DP optimizer (DynamicDPKerasSGD, DynamicDPKerasAdam, "
            "DynamicDPKerasAdagrad, DynamicDPKerasRMSprop or one made by make_dynamic_dp_optimizer_class) for a "
            f"model made private with make_private. Received: optimizer={optimizer!r}."
        )
    if optimizer.num_microbatches is not None:
        raise ValueError(
            "make_private clips every example; it cannot honour `num_microbatches`. Received: "
            f"num_microbatches={optimizer.num_microbatches}."
        )
    return optimizer


def _per_example_loss_fn(model: keras.Model) -> Callable[[Any, Any], tf.Tensor]:
    loss = model.loss
    if isinstance(loss, (dict, list, tuple)):
        raise ValueError(
            "make_private supports a single loss (one output). Received: loss="
            f"{loss!r}."
        )
    if isinstance(loss, str):
        loss = keras.losses.get(loss)
    if isinstance(loss, keras.losses.Loss):
        if not keras_compat.is_per_example_loss(loss):
            raise ValueError(
                f"The compiled loss must be per-example: build it with {keras_compat.PER_EXAMPLE_REDUCTION} "
                "(averaging before clipping destroys the privacy guarantee). Received: "
                f"reduction={loss.reduction!r}."
            )
        return loss
    if callable(loss):
        return loss
    raise ValueError(f"`model.loss` must be a Keras loss or a loss function. Received: loss={loss!r}.")


def _check_no_regularization(model: keras.Model) -> None:
    if model.losses:
        raise ValueError(
            "make_private does not support regularisation losses (kernel/activity regularizers, add_loss): "
            f"they are not per-example terms. Received {len(model.losses)} of them in model.losses."
        )


def _private_train_step(self: keras.Model, data) -> dict[str, tf.Tensor]:
    x, y, sample_weight = keras_compat.unpack_x_y_sample_weight(data)
    optimizer = _dp_optimizer(self)
    loss_fn = _per_example_loss_fn(self)
    var_list = self.trainable_variables
    clip_norm = optimizer.current_clip_norm()
    sums, _, y_pred, losses = clipped_sum.clipped_gradient_sum_with_outputs(
        self, loss_fn, x, y, sample_weight, clip_norm, var_list, method=self._keras_dyndp_method
    )
    _check_no_regularization(self)  # After the forward pass, which is where activity regularisers add theirs.
    optimizer.apply_clipped_gradient_sum(sums, tf.shape(losses)[0], var_list, sample_weight=sample_weight)
    if not self._keras_dyndp_training_metrics:
        return {}  # Nothing computed on the private batch leaves the step.
    return keras_compat.training_logs(self, x, y, y_pred, sample_weight)


def make_private(model: keras.Model, method: str = "auto", *, training_metrics: bool = True) -> keras.Model:
    """Gives ``model`` a train step that clips per example fast and applies through the DP optimizer.

    The same model object is returned (its ``train_step`` is replaced on the instance), so
    ``model = make_private(model)`` and ``make_private(model)`` are equivalent. Compile it, before or after,
    with a keras_dyndp DP optimizer and a per-example loss (``reduction=NONE``).

    Args:
        model: a Keras model (Sequential, functional or subclassed) without batch normalisation (refused at the
            first step; use GroupNormalization or LayerNormalization).
        method: how per-example gradients are clipped: ``'auto'`` (ghost clipping when every trainable layer
            has a rule, else vectorized), ``'ghost'`` or ``'vectorized'``
            (see ``keras_dyndp.per_example``).
        training_metrics: True (Keras's default behaviour): the step also computes the compiled loss and metrics
            on the training batch and returns them as logs (progress bar, ``History``, TensorBoard). They are
            computed on the private batch WITHOUT noise, so they are outside the DP guarantee: one outlier
            example can move the logged loss visibly. False: the step computes no loss or metric on the batch
            and returns no logs; only the noised update leaves it.

    Returns:
        ``model``.

    Raises:
        ValueError: on an unknown ``method`` or a model that is not a ``keras.Model``; at the first training
            step, on an optimizer or loss that cannot give per-example DP (see the module docstring).
    """
    if not isinstance(model, keras.Model):
        raise ValueError(f"`model` must be a keras.Model. Received: model={model!r}.")
    if method not in clipped_sum.METHODS:
        raise ValueError(f"`method` must be one of {clipped_sum.METHODS}. Received: method={method!r}.")
    if not isinstance(training_metrics, bool):
        raise ValueError(f"`training_metrics` must be True or False. Received: training_metrics={training_metrics!r}.")
    model._keras_dyndp_method = method  # pylint: disable=protected-access
    model._keras_dyndp_training_metrics = training_metrics  # pylint: disable=protected-access
    model.train_step = types.MethodType(_private_train_step, model)
    keras_compat.reset_train_function(model)
    if getattr(model, "optimizer", None) is not None:
        _dp_optimizer(model)
    return model
