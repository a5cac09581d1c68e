"""Ghost clipping: per-example gradient norms and the clipped sum from one batched forward and backward pass.

One forward pass records every covered layer's input ``a`` and the gradient ``g`` of the summed loss with
respect to its pre-activation output (the layers read their variables through ``tf.stop_gradient``, so the
batch's weight gradients are never computed); each layer's rule (`keras_dyndp.tf_backend.per_example.rules`) turns them
into per-example squared norms and a function from clipping factors to the clipped sum: no second backward pass
and no per-example gradient of the full model. Li et al. 2021 ("ghost clipping"), after Goodfellow 2015.

It assumes that row i of every tapped tensor belongs to example i; three things are checked for it, all while
tracing (nothing at run time but a reshape):

* Folds. ``TimeDistributed`` folds [B, T, ...] into [B * T, ...] example-major; in the tapped pass this module
  does that fold itself (`keras_dyndp.tf_backend.per_example.time_distributed`), so the rules know that example b owns T
  consecutive rows and group them (per-example norms of the whole client or sequence).
* Rows. Every tapped input (and every TimeDistributed input) must have exactly the rows expected there: one per
  example, or per (example, step) inside TimeDistributed. Keras batches have an unknown batch size while the
  train step is traced, so this is proven on a probe trace with an unusual static batch size (``_PROBE_BATCH``),
  and enforced in the graph by a reshape to exactly that many rows, which fails at run time (also under XLA)
  rather than clip a folded tensor row by row. A layer fed rows that are not examples (a fold made by hand with
  ``tf.reshape``, a fixed-size table broadcast onto the batch) sends the model to the vectorized path.
* Tied weights. The tapped calls read their variables through ``tf.stop_gradient``; a variable that still gets
  a gradient is used outside its layer's call (an embedding reused as the output layer, whose output-layer part
  the rules would miss) and sends the model to the vectorized path, as does a variable shared by two layers
  or a covered layer called more than once per forward pass.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from keras_dyndp.tf_backend import clip_and_noise
from keras_dyndp.tf_backend import keras_compat
from keras_dyndp.tf_backend.keras_compat import keras
from keras_dyndp.tf_backend.per_example import rules
from keras_dyndp.tf_backend.per_example import time_distributed
from keras_dyndp.tf_backend.per_example.losses import per_example_loss
from keras_dyndp.tf_backend.per_example.taps import GhostGradient
from keras_dyndp.tf_backend.per_example.taps import Rows
from keras_dyndp.tf_backend.per_example.taps import Tap
from keras_dyndp.tf_backend.per_example.taps import Tapping
from keras_dyndp.tf_backend.per_example.taps import UnsupportedModel


def supported(model: keras.Model, var_list: Sequence[tf.Variable]) -> bool:
    """Whether every variable in ``var_list`` belongs to a layer with a ghost-clipping rule."""
    covered = set()
    for layer in keras_compat.flatten_layers(model):
        if rules.rule_for(layer) is not None:
            covered.update(id(v) for v in layer.trainable_weights)
    return all(id(v) in covered for v in var_list)


def clipped_sum(
    model: keras.Model,
    loss_fn: Callable,
    x: Any,
    y: Any,
    sample_weight: tf.Tensor,
    clip_norm: tf.Tensor,
    var_list: Sequence[tf.Variable],
) -> tuple[list[tf.Tensor], tf.Tensor, Any, tf.Tensor]:
    """``(sums, norms, y_pred, losses)`` by ghost clipping (see `clipped_sum.clipped_gradient_sum`).

    Raises:
        UnsupportedModel: if the model needs the vectorized path (module docstring).
    """
    tape = tf.GradientTape()
    with tapped(model, Rows.of_batch(x), tape) as tapping:
        with tape:
            y_pred = model(x, training=True)
            losses = per_example_loss(loss_fn, y, y_pred, sample_weight)
            total = tf.reduce_sum(losses)
    if not _rows_proven_by_probe(model, x):
        raise UnsupportedModel("a tapped layer does not have one row per example (or per example and step)")
    used = [tap for tap in tapping.taps if tap.inputs is not None]
    grads = tape.gradient(total, [tap.preactivation for tap in used] + var_list)
    tied = [keras_compat.variable_name(v) for v, g in zip(var_list, grads[len(used) :]) if g is not None]
    if tied:
        raise UnsupportedModel(f"variables used outside their own layer's call (tied weights): {tied}")
    wanted = {id(v) for v in var_list}
    gradients: dict[int, GhostGradient] = {}
    for tap, g in zip(used, grads):
        g = tf.zeros_like(tap.preactivation) if g is None else g
        for gradient in rules.rule_for(tap.layer).norms_and_sums(tap, g):
            if id(gradient.variable) not in wanted:
                continue
            if id(gradient.variable) in gradients:
                raise UnsupportedModel(f"layer {tap.layer.name!r} shares a variable with another layer")
            gradients[id(gradient.variable)] = gradient
    missing = [keras_compat.variable_name(v) for v in var_list if id(v) not in gradients]
    if missing:
        raise UnsupportedModel(f"variables not reached by a ghost rule: {missing}")
    squared = tf.zeros_like(losses)
    for gradient in gradients.values():
        squared += gradient.squared_norms
    norms = tf.sqrt(tf.maximum(squared, 0.0))
    factors = clip_and_noise.clip_factors(norms, clip_norm)
    sums = [gradients[id(v)].clipped_sum(factors) for v in var_list]
    return sums, norms, y_pred, losses


@contextlib.contextmanager
def tapped(model: keras.Model, rows: Rows, tape: tf.GradientTape | None = None):
    """Replaces the calls of the model's covered layers (and TimeDistributed wrappers) for one forward pass."""
    tapping = Tapping(rows, tape)
    calls = []
    masks = []
    for layer in keras_compat.flatten_layers(model):
        rule = rules.rule_for(layer)
        if rule is not None and layer.trainable_weights:
            tap = Tap(layer, tapping)
            tapping.taps.append(tap)
            calls.append((layer, tf.autograph.experimental.do_not_convert(rule.call(tap))))
        elif isinstance(layer, keras.layers.TimeDistributed):
            calls.append((layer, time_distributed.call(tapping, layer)))
            masks.append((layer, time_distributed.compute_mask(layer)))
    try:
        for layer, call in calls:
            layer.call = call
        for layer, compute_mask in masks:
            layer.compute_mask = compute_mask
        yield tapping
    finally:
        for layer, _ in calls:
            del layer.call
        for layer, _ in masks:
            del layer.compute_mask


# The probe traces the model with this many examples (and this length for every other unknown input axis):
# unusual sizes, so that a tensor whose leading dimension is not the batch is unlikely to match it by chance.
_PROBE_BATCH = 1009
_PROBE_LENGTH = 97


_probe_results: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@tf.autograph.experimental.do_not_convert
def _rows_proven_by_probe(model: keras.Model, x: Any) -> bool:
    """Whether, with a batch of an unusual static size, every tapped tensor has the rows expected of it.

    Keras batches usually have an unknown batch size, so while tracing the train step nothing tells a tensor
    of B rows from one of B * T rows folded by hand (``tf.reshape``); and a known batch size can match a tensor
    of fixed size (a table of B rows broadcast onto the batch) by chance. This traces (never runs) one more
    forward pass into a scratch graph with ``_PROBE_BATCH`` examples, where ``Tapping.guard`` compares the
    leading dimensions. Any failure counts as no proof (the caller falls back to the vectorized path), e.g. a
    model built for one fixed batch size. Cached per model and input signature.
    """
    flat = tf.nest.flatten(x)
    if not all(isinstance(t, (tf.Tensor, np.ndarray)) and len(t.shape) for t in flat):
        return False
    # Which layers are tapped depends on which are trainable.
    key = (
        tuple((tf.as_dtype(t.dtype), tuple(t.shape[1:])) for t in flat),
        tuple(id(v) for v in model.trainable_variables),
    )
    results = _probe_results.setdefault(model, {})
    if key not in results:
        results[key] = _probe(model, x)
    return results[key]


def _probe(model: keras.Model, x: Any) -> bool:
    """Traces the tapped forward pass on ``_PROBE_BATCH`` examples (other unknown axes ``_PROBE_LENGTH``)."""

    def spec(tensor: tf.Tensor | np.ndarray) -> tf.TensorSpec:
        return tf.TensorSpec(
            [_PROBE_BATCH] + [_PROBE_LENGTH if d is None else d for d in tensor.shape[1:]], tf.as_dtype(tensor.dtype)
        )

    proofs = []

    def forward(batch):
        with tapped(model, Rows.of_batch(batch)) as tapping:
            model(batch, training=True)
        proofs.append(tapping.proven)

    try:
        tf.function(forward).get_concrete_function(tf.nest.map_structure(spec, x))
    except (UnsupportedModel, ValueError, TypeError, NotImplementedError, tf.errors.OpError):
        return False
    return proofs == [True]
