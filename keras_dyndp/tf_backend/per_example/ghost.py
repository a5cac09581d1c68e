"""Ghost clipping (Li et al. 2021, after Goodfellow 2015): per-example gradient norms and the clipped sum from one
batched pass that records each covered layer's input and the gradient of the summed loss with respect to its
pre-activation (variables read through ``tf.stop_gradient``), which its rule (`registry`) turns into per-example squared
norms and the clipped sum. Row i of every tapped tensor must belong to example i (TimeDistributed folds example-major):
proven on a probe trace with an unusual batch size and enforced by a reshape that fails at run time. Tied or shared
variables, or a layer called twice, send the model to the vectorized path."""

from __future__ import annotations

import contextlib
import inspect
import weakref
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from keras_dyndp.core import mechanism
from keras_dyndp.rules import layer_rules
from keras_dyndp.rules import registry
from keras_dyndp.tf_backend import keras_compat
from keras_dyndp.tf_backend import ops
from keras_dyndp.tf_backend.keras_compat import keras
from keras_dyndp.tf_backend.per_example import generic
from keras_dyndp.tf_backend.per_example import graph_rows
from keras_dyndp.tf_backend.per_example.losses import per_example_loss
from keras_dyndp.tf_backend.per_example.taps import GhostGradient
from keras_dyndp.tf_backend.per_example.taps import Rows
from keras_dyndp.tf_backend.per_example.taps import Tap
from keras_dyndp.tf_backend.per_example.taps import Tapping
from keras_dyndp.tf_backend.per_example.taps import UnsupportedModel


def tensor_float_32_on_gpu() -> bool:
    """Whether TensorFlow's float32 matrix products may round to TensorFloat-32 (its default on a GPU): then the
    ghost sums' rounding, 2^-10 of terms that can be far larger than an example's gradient, is not bounded by the
    clip norm (`keras_dyndp.rules.ghost_cost.rounding_coefficients`), and the vectorized path clips instead."""
    return bool(tf.config.experimental.tensor_float_32_execution_enabled() and tf.config.list_physical_devices("GPU"))


def supported(model: keras.Model, var_list: Sequence[tf.Variable]) -> bool:
    """Whether every variable in ``var_list`` belongs to a layer with a ghost-clipping rule."""
    layers = [layer for layer in keras_compat.flatten_layers(model) if registry.rule_for(layer) is not None]
    covered = {id(v) for layer in layers for v in layer.trainable_weights}
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
    """``(sums, norms, y_pred, losses)`` by ghost clipping; UnsupportedModel where the vectorized path is needed."""
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
    squared = tf.zeros_like(losses)
    for tap, g in zip(used, grads):
        tap.gradient = tf.zeros_like(tap.preactivation) if g is None else g
    for tap in used:
        for gradient in generic.tapped(registry.rule_for(tap.layer)).norms_and_sums(tap, tap.gradient):
            if gradient.variable is None:  # the norms of all the variables a shared-contract rule covers, together
                squared += gradient.squared_norms
            elif id(gradient.variable) in wanted:
                if id(gradient.variable) in gradients:
                    raise UnsupportedModel(f"layer {tap.layer.name!r} shares a variable with another layer")
                gradients[id(gradient.variable)] = gradient
    missing = [keras_compat.variable_name(v) for v in var_list if id(v) not in gradients]
    if missing:
        raise UnsupportedModel(f"variables not reached by a ghost rule: {missing}")
    for gradient in gradients.values():
        squared += gradient.squared_norms
    norms = mechanism.norms_from_squares(ops.OPS, squared)
    factors = ops.clip_factors(norms, clip_norm)
    return _clipped_sums([gradients[id(v)] for v in var_list], factors), norms, y_pred, losses


def _clipped_sums(gradients: Sequence[GhostGradient], factors: tf.Tensor) -> list[tf.Tensor]:
    """Each gradient's sum over the examples weighted by ``factors``, a factor-0 example adding exactly nothing:
    first without the costly per-row selects (`layer_rules.rows_without_select`), exact when every sum is finite;
    else again with them (`layer_rules.kept_rows`), dropping the rows that are not finite."""
    with layer_rules.rows_without_select():
        fast = [gradient.clipped_sum(factors) for gradient in gradients]
    finite = tf.math.is_finite(tf.add_n([tf.reduce_sum(tf.cast(s, tf.float32)) for s in fast]))
    return tf.cond(finite, lambda: fast, lambda: [gradient.clipped_sum(factors) for gradient in gradients])


@contextlib.contextmanager
def tapped(model: keras.Model, rows: Rows, tape: tf.GradientTape | None = None):
    """Replaces the calls of the model's covered layers (and TimeDistributed wrappers) for one forward pass."""
    tapping = Tapping(rows, tape)
    patches = []
    layers = list(keras_compat.flatten_layers(model))
    ruled = [layer for layer in layers if registry.rule_for(layer) is not None and layer.trainable_weights]
    inside = {id(sublayer) for layer in ruled for sublayer in keras_compat.flatten_layers(layer)}  # its rule's
    for layer in layers:
        rule = registry.rule_for(layer)
        if id(layer) in inside:
            continue
        if rule is not None and layer.trainable_weights:
            tap = Tap(layer, tapping)
            tapping.taps.append(tap)
            patches.append((layer, "call", tf.autograph.experimental.do_not_convert(generic.tapped(rule).call(tap))))
        elif isinstance(layer, keras.layers.TimeDistributed):
            patches.append((layer, "call", _time_distributed_call(tapping, layer)))
            patches.append((layer, "compute_mask", _time_distributed_mask(layer)))
    with keras_compat.patched_attributes(patches):
        yield tapping


# The probe traces the model with this many examples (`graph_rows.probe_specs`: every other unknown input axis 97
# long): unusual sizes, so that a tensor whose leading dimension is not the batch is unlikely to match it by chance.
_PROBE_BATCH = 1009


_probe_results: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@tf.autograph.experimental.do_not_convert
def _rows_proven_by_probe(model: keras.Model, x: Any) -> bool:
    """Whether every tapped tensor has its expected rows in a pass traced (never run) with ``_PROBE_BATCH``
    examples, where ``Tapping.guard`` compares statically. Any failure counts as no proof. Cached per signature."""
    key = graph_rows.probe_key(model, x)
    if key is None:
        return False
    results = _probe_results.setdefault(model, {})
    if key in results:
        return results[key]
    proofs = []

    def forward(batch):
        with tapped(model, Rows.of_batch(batch)) as tapping:
            model(batch, training=True)
        proofs.append(tapping.proven)

    try:
        tf.function(forward).get_concrete_function(graph_rows.probe_specs(x, _PROBE_BATCH))
    except (UnsupportedModel, ValueError, TypeError, NotImplementedError, tf.errors.OpError):
        proofs = []
    results[key] = proofs == [True]
    return results[key]


def _time_distributed_call(tapping: Tapping, layer: keras.layers.TimeDistributed) -> Callable:
    """TimeDistributed's call for the tapped pass: folds, pushes the fold onto the rows, and unfolds the outputs."""
    inner = layer.layer
    inner_takes_mask = "mask" in inspect.signature(type(inner).call).parameters

    def call(inputs, training=None, mask=None):
        if not isinstance(inputs, tf.Tensor) or (mask is not None and inner_takes_mask):
            raise UnsupportedModel(f"TimeDistributed {layer.name!r} received a nested, ragged or masked input")
        inputs = tapping.guard(inputs, f"the input of TimeDistributed {layer.name!r}")
        folded = tf.reshape(inputs, tf.concat([[-1], tf.shape(inputs)[2:]], axis=0))
        folded.set_shape(tf.TensorShape([None]).concatenate(inputs.shape[2:]))
        tapping.rows.append(tapping.rows[-1].times(tf.shape(inputs)[1], inputs.shape[1]))
        try:
            outputs = inner(folded, training=training)
        finally:
            tapping.rows.pop()

        def unfold(output):
            unfolded = tf.reshape(output, tf.concat([tf.shape(inputs)[:2], tf.shape(output)[1:]], axis=0))
            unfolded.set_shape(inputs.shape[:2].concatenate(output.shape[1:]))
            return unfolded

        return tf.nest.map_structure(unfold, outputs)

    return call


def _time_distributed_mask(layer: keras.layers.TimeDistributed) -> Callable:
    """TimeDistributed's output mask: None, as none enters or is made inside (Keras's own ``compute_mask`` re-runs a
    functional inner model, which would record every tap twice)."""
    sublayers = [layer.layer, *keras_compat.flatten_layers(layer.layer)]
    makes_masks = any(isinstance(sub, keras.layers.Masking) or getattr(sub, "mask_zero", False) for sub in sublayers)

    def compute_mask(inputs, mask=None):
        del inputs
        if mask is not None or makes_masks:
            raise UnsupportedModel(f"TimeDistributed {layer.name!r} carries a mask")
        return None

    return compute_mask
