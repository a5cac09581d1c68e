"""Per-example clipping by ``tf.vectorized_map`` over single-example passes: any model, B gradients materialised (under
``method='auto'``, the models the ghost path cannot take). Where ``pfor`` fails while tracing, or builds a graph that
fails only when run (`_pfor_fails_at_run_time`), ``tf.map_fn`` runs the passes one by one (never the batch gradient)."""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from keras_dyndp.tf_backend import keras_compat
from keras_dyndp.tf_backend import ops
from keras_dyndp.tf_backend.keras_compat import keras
from keras_dyndp.tf_backend.per_example.losses import per_example_loss


def clipped_sum(
    model: keras.Model,
    loss_fn: Callable,
    x: Any,
    y: Any,
    sample_weight: tf.Tensor,
    clip_norm: tf.Tensor,
    var_list: Sequence[tf.Variable],
) -> tuple[list[tf.Tensor], tf.Tensor, Any, tf.Tensor]:
    """``(sums, norms, y_pred, losses)`` from single-example passes (see ``clipped_gradient_sum``)."""

    def one_example(example):
        x_i, y_i, w_i = tf.nest.map_structure(lambda t: tf.expand_dims(t, 0), example)
        with tf.GradientTape() as tape:
            y_pred = model(x_i, training=True)
            loss = per_example_loss(loss_fn, y_i, y_pred, w_i)
        grads = ops.zeros_where_unconnected(tape.gradient(loss, var_list), var_list)
        return grads, tf.nest.map_structure(lambda t: t[0], y_pred), loss[0]

    elems, grads = (x, y, sample_weight), None
    if not _pfor_fails_at_run_time(model):
        try:
            grads, y_pred, losses = tf.vectorized_map(one_example, elems, fallback_to_while_loop=True)
        except (TypeError, ValueError, NotImplementedError) as error:
            # pfor failed even with its while-loop fallback: still per example, only slower.
            tf.get_logger().warning(
                "tf.vectorized_map could not vectorise the per-example gradient (%s); using tf.map_fn.",
                str(error).strip().splitlines()[-1],
            )
    if grads is None:
        output_signature = (
            [tf.TensorSpec(v.shape, v.dtype) for v in var_list],
            tf.nest.map_structure(
                lambda t: tf.TensorSpec(t.shape[1:], t.dtype), model(tf.nest.map_structure(lambda t: t[:1], x))
            ),
            tf.TensorSpec([], tf.float32),
        )
        scope = tf.compat.v1.get_variable_scope()
        caching_device = scope.caching_device
        try:
            grads, y_pred, losses = tf.map_fn(
                one_example, elems, fn_output_signature=output_signature, parallel_iterations=16
            )
        finally:
            # tf.map_fn sets the variable scope's caching device and unsets it only when it returns: a refusal raised
            # in one example's pass would leave it set for the process, and every later strategy scope would fail.
            scope.set_caching_device(caching_device)
    sums, norms = ops.clip_by_global_norm_per_example(grads, clip_norm)
    return sums, norms, y_pred, losses


def _pfor_fails_at_run_time(model: keras.Model) -> bool:
    """Whether ``model`` has a layer whose ``pfor`` graph fails only when run: a recurrent cell (RNN, LSTM, GRU,
    ConvLSTM, also inside wrappers: "Tried to append a tensor with incompatible shape to a list"), or, on Keras 3, an
    EinsumDense or MultiHeadAttention, whose vectorized step can kill the process (docs/performance.md)."""
    crashing = (
        (keras.layers.EinsumDense, keras.layers.MultiHeadAttention) if keras_compat.KERAS_MAJOR_VERSION == 3 else ()
    )
    return any(
        isinstance(getattr(layer, "cell", None), keras.layers.Layer) or isinstance(layer, crashing)
        for layer in keras_compat.flatten_layers(model)
    )
