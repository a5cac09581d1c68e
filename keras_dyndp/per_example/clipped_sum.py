"""Per-example clipped gradient sums: the entry point that picks ghost clipping or the vectorized path.

``'ghost'`` (`keras_dyndp.per_example.ghost`) needs every trainable variable to belong to a layer with a rule
(`keras_dyndp.per_example.rules`) and rows that are examples; ``'vectorized'``
(`keras_dyndp.per_example.vectorized`) works for any model whose examples are independent. ``'auto'`` (the
default) takes the ghost path where it applies, else the vectorized one, for the whole model. Before either runs,
``keras_dyndp.model_checks`` refuses models that mix examples or store batch statistics (BatchNormalization): on
such models neither method bounds one example's influence.

Sample weights multiply each example's loss before differentiation, so an example with weight 0 (a Poisson
padding row) has a zero gradient and adds nothing to the sum. The sums returned are dense tensors (embedding
``IndexedSlices`` are densified) and carry NO noise: the caller (``DynamicDPKeras*.apply_clipped_gradient_sum``)
adds N(0, sigma_t^2) to each sum and then normalises.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from keras_dyndp import model_checks
from keras_dyndp.keras_compat import keras
from keras_dyndp.per_example import ghost
from keras_dyndp.per_example import vectorized
from keras_dyndp.per_example.taps import UnsupportedModel

METHODS = ("auto", "ghost", "vectorized")


def example_weights(x: Any, sample_weight: Any) -> tf.Tensor:
    """float32 [B] weight of each row of the batch ``x`` (1 where ``sample_weight`` is None; 0 on padding rows)."""
    if sample_weight is None:
        return tf.ones([tf.shape(tf.nest.flatten(x)[0])[0]], tf.float32)
    return tf.reshape(tf.cast(sample_weight, tf.float32), [-1])


def clipped_gradient_sum_with_outputs(
    model: keras.Model,
    loss_fn: Callable[[Any, Any], tf.Tensor],
    x: Any,
    y: Any,
    sample_weight: tf.Tensor | None,
    clip_norm: tf.Tensor | float,
    var_list: Sequence[tf.Variable],
    method: str = "auto",
) -> tuple[list[tf.Tensor], tf.Tensor, Any, tf.Tensor]:
    """Like ``clipped_gradient_sum`` but also returns the predictions and per-example losses (for metrics).

    Returns:
        ``(sums, norms, y_pred, losses)``: ``losses`` [B] already multiplied by the sample weights.
    """
    if method not in METHODS:
        raise ValueError(f"`method` must be one of {METHODS}. Received: method={method!r}.")
    model_checks.check_before_training(model, x)
    var_list = list(var_list)
    sample_weight = example_weights(x, sample_weight)
    clip_norm = tf.cast(clip_norm, tf.float32)
    if method in ("auto", "ghost"):
        if ghost.supported(model, var_list):
            try:
                return ghost.clipped_sum(model, loss_fn, x, y, sample_weight, clip_norm, var_list)
            except UnsupportedModel as reason:
                if method == "ghost":
                    raise ValueError(
                        f"`method='ghost'` cannot clip this model per example: {reason}. Use method='auto' (which "
                        f"falls back to the vectorized path) or 'vectorized'. Received: method={method!r}."
                    ) from reason
        elif method == "ghost":
            raise ValueError(
                "`method='ghost'` needs every variable of `var_list` to belong to a layer with a ghost-clipping "
                "rule (Dense, Conv1D, Conv2D, DepthwiseConv2D, SeparableConv2D, Embedding, LSTM, GRU or one registered "
                "with register_layer_rule). Received a "
                f"model with other trainable layers: method={method!r}."
            )
    return vectorized.clipped_sum(model, loss_fn, x, y, sample_weight, clip_norm, var_list)


def clipped_gradient_sum(
    model: keras.Model,
    loss_fn: Callable[[Any, Any], tf.Tensor],
    x: Any,
    y: Any,
    sample_weight: tf.Tensor | None,
    clip_norm: tf.Tensor | float,
    var_list: Sequence[tf.Variable],
    method: str = "auto",
) -> tuple[list[tf.Tensor], tf.Tensor]:
    """Sum over the batch of per-example gradients, each clipped to L2 norm ``clip_norm``. No noise added.

    Example i's gradient is that of ``sample_weight[i] * loss_i`` with respect to ``var_list`` (all variables
    together; one norm per example), and it enters the sum as ``min(1, clip_norm / ||g_i||) g_i``.

    Args:
        model: a Keras model whose examples do not interact (no batch normalisation: refused, see
            ``keras_dyndp.model_checks``).
        loss_fn: per-example loss ``loss_fn(y, y_pred) -> [B]`` (or [B, ...], averaged over non-batch axes).
        x: batch of inputs (a tensor or a nest of tensors with leading axis B).
        y: batch of targets.
        sample_weight: float [B] or None; rows with weight 0 contribute nothing.
        clip_norm: scalar C > 0.
        var_list: variables to differentiate, typically ``model.trainable_variables``.
        method: ``'auto'`` (ghost when supported, else vectorized), ``'ghost'`` or ``'vectorized'``.

    Returns:
        ``(sums, norms)``: a list of dense tensors shaped like ``var_list`` and the unclipped per-example
        gradient norms [B].

    Raises:
        ValueError: on an unknown ``method``, a scalar loss, ``method='ghost'`` on an unsupported model, or a
            model that mixes examples or stores batch statistics (``keras_dyndp.model_checks.check_model``).
    """
    sums, norms, _, _ = clipped_gradient_sum_with_outputs(
        model, loss_fn, x, y, sample_weight, clip_norm, var_list, method
    )
    return sums, norms
