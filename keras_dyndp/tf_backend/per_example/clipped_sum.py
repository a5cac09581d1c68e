"""Per-example clipped gradient sums, without noise (the optimizer adds it). ``'auto'`` takes ``'ghost'`` (`ghost`)
where every layer and op is known to act per example (`per_example_layers`) or the traced pass keeps examples apart
(proven, `graph_rows`), every trainable variable has a rule (`rules`) and rows are examples, else ``'vectorized'``.
``'jacobian'`` differentiates the batch's losses together, O(B^2), as ``num_microbatches`` does (`microbatches`).
`model_checks` refuses batch statistics first; random layers draw from a secret generator (`randomness`)."""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from keras_dyndp.tf_backend import microbatches
from keras_dyndp.tf_backend import model_checks
from keras_dyndp.tf_backend.keras_compat import keras
from keras_dyndp.tf_backend.per_example import ghost
from keras_dyndp.tf_backend.per_example import graph_rows
from keras_dyndp.tf_backend.per_example import per_example_layers
from keras_dyndp.tf_backend.per_example import randomness
from keras_dyndp.tf_backend.per_example import vectorized
from keras_dyndp.tf_backend.per_example.losses import per_example_loss
from keras_dyndp.tf_backend.per_example.taps import UnsupportedModel

METHODS = ("auto", "ghost", "vectorized", "jacobian")


def example_weights(x: Any, sample_weight: Any) -> tf.Tensor:
    """float32 weights of the batch ``x``'s rows: [B] ones where ``sample_weight`` is None, else ``sample_weight``
    (per row, 0 on padding rows, or per loss entry such as a [B, L] padding mask: `per_example_loss`)."""
    if sample_weight is None:
        return tf.ones([tf.shape(tf.nest.flatten(x)[0])[0]], tf.float32)
    return tf.cast(sample_weight, tf.float32)


def clipped_gradient_sum_with_outputs(
    model: keras.Model,
    loss_fn: Callable[[Any, Any], tf.Tensor],
    x: Any,
    y: Any,
    sample_weight: tf.Tensor | None,
    clip_norm: tf.Tensor | float,
    var_list: Sequence[tf.Variable],
    method: str = "auto",
    random_source: tf.random.Generator | None = None,
    num_microbatches: int | None = None,
) -> tuple[list[tf.Tensor], tf.Tensor, Any, tf.Tensor]:
    """``clipped_gradient_sum``'s ``(sums, norms)``, the predictions and the weighted per-example losses [B]."""
    if method not in METHODS:
        raise ValueError(f"`method` must be one of {METHODS}. Received: method={method!r}.")
    if num_microbatches is not None and random_source is None:
        raise ValueError("`num_microbatches` needs `random_source`, the secret generator that draws the microbatches.")
    model_checks.check_before_training(model, x)
    var_list = list(var_list)
    sample_weight = example_weights(x, sample_weight)
    clip_norm = tf.cast(clip_norm, tf.float32)
    with randomness.secret_randomness(model, random_source):
        if method == "jacobian" or num_microbatches is not None:
            with tf.GradientTape() as tape:
                y_pred = model(x, training=True)
                losses = per_example_loss(loss_fn, y, y_pred, sample_weight)
            sums, norms = microbatches.clipped_sum(tape, losses, var_list, clip_norm, num_microbatches, random_source)
            return sums, norms, y_pred, losses
        if method != "vectorized" and _ghost_applies(model, x, var_list, method):
            try:
                return ghost.clipped_sum(model, loss_fn, x, y, sample_weight, clip_norm, var_list)
            except UnsupportedModel as reason:
                if method == "ghost":
                    raise ValueError(
                        f"`method='ghost'` cannot clip this model per example: {reason}. Use method='auto' (which "
                        f"falls back to the vectorized path) or 'vectorized'. Received: method={method!r}."
                    ) from reason
        return vectorized.clipped_sum(model, loss_fn, x, y, sample_weight, clip_norm, var_list)


@tf.autograph.experimental.do_not_convert
def _ghost_applies(model: keras.Model, x: Any, var_list: list[tf.Variable], method: str) -> bool:
    """Whether the model may take the ghost path; for ``method='ghost'``, a ValueError saying why not."""
    if ghost.tensor_float_32_on_gpu():
        why_not = (
            "`method='ghost'` needs float32 matrix products, and TensorFloat-32 is on (TensorFlow's default on a "
            "GPU): its rounding of the ghost path's sums is not bounded by the clip norm. Turn it off with "
            "tf.config.experimental.enable_tensor_float_32_execution(False), or use method='auto' (which then "
            f"takes the vectorized path) or 'vectorized'. Received: method={method!r}."
        )
    elif (unknown := per_example_layers.first_unknown(model)) is not None and (
        mixing := graph_rows.first_mixing_op(model, x)
    ):
        why_not = (
            f"`method='ghost'` runs the batch through the model at once, which is per-example clipping only if "
            f"every layer acts on each example alone, and {unknown} of model {model.name!r} is not known to, nor "
            f"its traced forward pass proven to: its {mixing} (a layer that reads across the batch, such as a Lambda "
            "subtracting the batch mean, would let one example move the others' gradients). If its class does act "
            "per example, declare it with "
            "keras_dyndp.tf_backend.per_example.register_per_example_layer(cls) (or give it a ghost rule with "
            "register_layer_rule); otherwise use method='auto' (which takes the vectorized path, where each "
            f"example runs alone) or 'vectorized'. Received: method={method!r}."
        )
    elif not ghost.supported(model, var_list):
        why_not = (
            "`method='ghost'` needs every variable of `var_list` to belong to a layer with a ghost-clipping "
            "rule (Dense, EinsumDense, Conv1D, Conv2D, DepthwiseConv2D, SeparableConv2D, Embedding, LSTM, GRU, "
            "LayerNormalization, GroupNormalization or one registered with register_layer_rule). Received a model "
            f"with other trainable layers: method={method!r}."
        )
    else:
        return True
    if method == "ghost":
        raise ValueError(why_not)
    return False


def clipped_gradient_sum(
    model: keras.Model,
    loss_fn: Callable[[Any, Any], tf.Tensor],
    x: Any,
    y: Any,
    sample_weight: tf.Tensor | None,
    clip_norm: tf.Tensor | float,
    var_list: Sequence[tf.Variable],
    method: str = "auto",
    random_source: tf.random.Generator | None = None,
    num_microbatches: int | None = None,
) -> tuple[list[tf.Tensor], tf.Tensor]:
    """Sum over the batch of per-example gradients, each clipped to L2 norm ``clip_norm``; no noise added. Example i's
    gradient g_i is that of its loss (`keras_dyndp.core.mechanism.per_example_losses` of ``loss_fn(y, y_pred)`` and
    ``sample_weight``) with respect to all of ``var_list``; it enters as ``min(1, clip_norm / ||g_i||) g_i``.
    ``method``: 'auto', 'ghost', 'vectorized' or 'jacobian' (module docstring); ``random_source``: the secret
    generator random layers (and microbatches) draw from (None: this process's); ``num_microbatches``: M, the gradients
    of M random microbatches are clipped instead. Returns ``(sums, norms)``: dense sums shaped like ``var_list``,
    unclipped norms [B] ([M]). ValueError on an unknown method, a scalar loss, 'ghost' on a model it cannot clip or
    batch statistics."""
    return clipped_gradient_sum_with_outputs(
        model, loss_fn, x, y, sample_weight, clip_norm, var_list, method, random_source, num_microbatches
    )[:2]
