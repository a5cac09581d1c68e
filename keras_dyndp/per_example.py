"""Per-example clipped gradient sums for DP-SGD, computed without the O(B^2) jacobian.

DP-SGD needs, at every step, the sum over the batch of each example's gradient clipped to L2 norm C_t:
``sum_i min(1, C_t / ||g_i||) g_i``. Taking ``tape.jacobian`` of the per-example loss vector back-propagates
each of the B rows through the whole batched graph (O(B^2) work). This module offers two O(B) ways:

* ``'vectorized'``: ``tf.vectorized_map`` over a single-example forward and backward pass (``x[i:i+1]``).
  Works for any model whose examples are independent; ops that ``pfor`` cannot vectorise (some LSTM and
  embedding graphs) run in a ``tf.while_loop`` instead (``fallback_to_while_loop=True``), never through the
  batch gradient. Materialises the B per-example gradients.
* ``'ghost'``: one batched forward pass records every supported layer's input ``a`` and the gradient ``g`` of
  the loss with respect to its pre-activation output (the backward pass asks for nothing else, so the batch's
  weight gradients are never computed); per-example squared norms follow from them (Dense without a sequence
  axis: ``|a_i|^2 |g_i|^2 + |g_i|^2``; with one, and Conv2D through image patches, whichever of the Gram-matrix
  ("ghost", Li et al. 2021) or the materialised per-example gradient ``a_i^T g_i`` costs fewer flops, norms
  and clipped sum together (see ``_use_gram``); a 1-channel Conv2D through a depthwise filter gradient;
  Embedding by grouping the output gradients by (example, id)). The clipped sum is then either the weighted
  sum of the materialised per-example gradients (no second contraction) or the layer's own weight-gradient
  formula applied to ``min(1, C / n_i) g_i``: no second backward pass and no per-example gradient of the full
  model. Supported layers: ``Dense``, ``Conv2D`` (channels_last, groups=1;
  a 1-channel input uses a depthwise filter gradient with the batch as channels), ``Embedding`` (dense integer
  ids) and ``LSTM`` (no mask, dropout, state or reversal; its recurrence is re-run with ``tf.scan`` so that the
  gate pre-activation gradients and previous hidden states are available: kernel, recurrent kernel and bias are
  then sequence Dense rules). A model with any other layer that owns a variable in ``var_list``, or a
  supported layer called more than once per forward pass, falls back to ``'vectorized'`` as a whole.

Ghost clipping assumes that row i of every tapped tensor belongs to example i; three things are checked for it,
all while tracing (nothing at run time but a reshape):

* Folds. ``TimeDistributed`` folds [B, T, ...] into [B * T, ...] example-major; in the tapped pass this module
  does that fold itself (Keras loops over the steps instead when the batch size is known), so the rules know
  that example b owns T consecutive rows and group them (per-example norms of the whole client or sequence).
* Rows. Every tapped input (and every TimeDistributed input) must have exactly the rows expected there: one per
  example, or per (example, step) inside TimeDistributed. Keras batches have an unknown batch size while the
  train step is traced, so this is proven on a probe trace with an unusual static batch size (``_PROBE_BATCH``),
  and enforced in the graph by a reshape to exactly that many rows, which fails at run time (also under XLA)
  rather than clip a folded tensor row by row. A layer fed rows that are not examples (a fold made by hand with
  ``tf.reshape``, a fixed-size table broadcast onto the batch) sends the model to ``'vectorized'``.
* Tied weights. The tapped calls read their variables through ``tf.stop_gradient``; a variable that still gets
  a gradient is used outside its layer's call (an embedding reused as the output layer, whose output-layer part
  the rules would miss) and sends the model to ``'vectorized'``.

Before either method runs, ``keras_dyndp.model_checks`` refuses models that mix examples or store batch
statistics (BatchNormalization): on such models neither method bounds one example's influence.

``'auto'`` (the default) picks ``'ghost'`` when every trainable variable is covered, else ``'vectorized'``.

Sample weights multiply each example's loss before differentiation, so an example with weight 0 (a Poisson
padding row) has a zero gradient and adds nothing to the sum. The sums returned are dense tensors (embedding
``IndexedSlices`` are densified) and carry NO noise: the caller (``DynamicDPKeras*.apply_clipped_gradient_sum``)
adds N(0, sigma_t^2) to each sum and then normalises.
"""

from __future__ import annotations

import contextlib
import inspect
import weakref
from typing import Any, Callable, Sequence

import numpy as np
import tensorflow as tf
from tensorflow.python.ops import control_flow_util  # pylint: disable=g-direct-tensorflow-import

from keras_dyndp import model_checks
from keras_dyndp.optimizers import clip_and_noise

METHODS = ("auto", "ghost", "vectorized")


# For library functions that hold no Python control flow on tensors and call no user code: AutoGraph would
# convert them at the first trace in each process (seconds for this module), for nothing.
_not_autographed = tf.autograph.experimental.do_not_convert


class _UnsupportedModel(Exception):
    """Raised while tracing the ghost path when the model needs the vectorized path instead."""


def per_example_loss(
    loss_fn: Callable[[Any, Any], tf.Tensor], y: Any, y_pred: Any, sample_weight: tf.Tensor | None
) -> tf.Tensor:
    """Per-example loss vector [B]: ``loss_fn(y, y_pred)`` averaged over non-batch axes, times the weight.

    Args:
        loss_fn: a per-example loss, e.g. a ``tf.keras.losses.Loss`` with ``reduction=NONE`` or a function
            such as ``tf.keras.losses.sparse_categorical_crossentropy``.
        y: targets.
        y_pred: model outputs.
        sample_weight: float tensor [B] or None (all ones).

    Returns:
        float tensor [B].

    Raises:
        ValueError: if ``loss_fn`` returns a scalar (an already reduced loss cannot be clipped per example).
    """
    losses = loss_fn(y, y_pred)
    if losses.shape.rank == 0:
        raise ValueError(
            "`loss_fn` must return one loss per example (use reduction=tf.keras.losses.Reduction.NONE). "
            f"Received a scalar loss from loss_fn={loss_fn!r}."
        )
    losses = tf.cast(losses, tf.float32)
    if losses.shape.rank > 1:
        losses = tf.reduce_mean(losses, axis=list(range(1, losses.shape.rank)))
    if sample_weight is not None:
        losses = losses * tf.reshape(tf.cast(sample_weight, losses.dtype), [-1])
    return losses


def _dense_gradient(gradient: tf.Tensor | tf.IndexedSlices | None, variable: tf.Variable) -> tf.Tensor:
    if gradient is None:
        return tf.zeros_like(variable)
    if isinstance(gradient, tf.IndexedSlices):
        return tf.convert_to_tensor(gradient)
    return gradient


def _batch_size(x: Any) -> tf.Tensor:
    first = tf.nest.flatten(x)[0]
    return tf.shape(first)[0]


# ----------------------------------------------------------------------------------------------------------
# Implementation A: vectorized_map over single-example forward + backward.


def _vectorized(
    model: tf.keras.Model,
    loss_fn: Callable,
    x: Any,
    y: Any,
    sample_weight: tf.Tensor,
    clip_norm: tf.Tensor,
    var_list: Sequence[tf.Variable],
) -> tuple[list[tf.Tensor], tf.Tensor, Any, tf.Tensor]:
    def one_example(example):
        x_i, y_i, w_i = tf.nest.map_structure(lambda t: tf.expand_dims(t, 0), example)
        with tf.GradientTape() as tape:
            y_pred = model(x_i, training=True)
            loss = per_example_loss(loss_fn, y_i, y_pred, w_i)
        grads = tape.gradient(loss, var_list, unconnected_gradients=tf.UnconnectedGradients.ZERO)
        grads = [_dense_gradient(g, v) for g, v in zip(grads, var_list)]
        return grads, tf.nest.map_structure(lambda t: t[0], y_pred), loss[0]

    elems = (x, y, sample_weight)
    try:
        grads, y_pred, losses = tf.vectorized_map(one_example, elems, fallback_to_while_loop=True)
    except (TypeError, ValueError, NotImplementedError) as error:
        # pfor failed even with its while-loop fallback (e.g. the TensorList gradients of Keras's LSTM):
        # run the single-example passes one after the other instead. Still per example, only slower.
        tf.get_logger().warning(
            "tf.vectorized_map could not vectorise the per-example gradient (%s); using tf.map_fn.",
            str(error).strip().splitlines()[-1],
        )
        output_signature = (
            [tf.TensorSpec(v.shape, v.dtype) for v in var_list],
            tf.nest.map_structure(
                lambda t: tf.TensorSpec(t.shape[1:], t.dtype), model(tf.nest.map_structure(lambda t: t[:1], x))
            ),
            tf.TensorSpec([], tf.float32),
        )
        grads, y_pred, losses = tf.map_fn(
            one_example, elems, fn_output_signature=output_signature, parallel_iterations=16
        )
    sums, norms = clip_and_noise.clip_by_global_norm_per_example(grads, clip_norm)
    return sums, norms, y_pred, losses


# ----------------------------------------------------------------------------------------------------------
# Implementation B: ghost clipping from recorded layer inputs and output gradients.


class _Rows:
    """The rows a tapped tensor must have: one per example, or per (example, time step) inside TimeDistributed.

    ``count`` (int32 scalar tensor) and ``static`` (its value when known while tracing) are the number of rows;
    ``fold`` is the number of consecutive rows per example (1 outside TimeDistributed; None when the time axis
    is not known while tracing) and ``batch`` (int32 scalar tensor) the number of examples.
    """

    def __init__(self, count: tf.Tensor, static: int | None, fold: int | None, batch: tf.Tensor):
        self.count = count
        self.static = static
        self.fold = fold
        self.batch = batch

    @classmethod
    def of_batch(cls, x: Any) -> _Rows:
        first = tf.nest.flatten(x)[0]
        batch = tf.shape(first)[0]
        return cls(batch, first.shape[0], 1, batch)

    def times(self, steps: tf.Tensor, steps_static: int | None) -> _Rows:
        """The rows after folding a time axis of ``steps`` into these rows, example-major (as TimeDistributed)."""

        def product(a, b):
            return None if a is None or b is None else a * b

        return _Rows(self.count * steps, product(self.static, steps_static), product(self.fold, steps_static),
                     self.batch)


class _Tapping:
    """One tapped forward pass: its taps, the rows expected where it is now, and whether each check was static.

    Every supported layer's input (and every TimeDistributed input) goes through ``guard``, which makes sure its
    leading dimension is the expected rows: compared while tracing when both are known (a mismatch means the
    layer does not see one row per example: ``_UnsupportedModel``), else by a reshape to exactly that many rows,
    which raises at run time (also under XLA) instead of letting a folded tensor be clipped row by row.
    ``proven`` stays True while every check was static. ``tape`` (if any) watches each recorded pre-activation:
    the layers' variables are read through ``tf.stop_gradient``, so nothing else would make the tape record the
    rest of the forward pass.
    """

    def __init__(self, rows: _Rows, tape: tf.GradientTape | None):
        self.taps: list[_Tap] = []
        self.rows = [rows]
        self.proven = True
        self.tape = tape

    def guard(self, tensor: tf.Tensor, what: str) -> tf.Tensor:
        rows = self.rows[-1]
        actual = tensor.shape[0]
        if actual is not None and rows.static is not None:
            if actual != rows.static:
                raise _UnsupportedModel(
                    f"{what} does not have one row per example (or per example and step): {actual} rows, "
                    f"{rows.static} expected")
            return tensor
        self.proven = False
        checked = tf.reshape(tensor, tf.concat([[rows.count], tf.shape(tensor)[1:]], axis=0))
        checked.set_shape(tf.TensorShape([rows.static]).concatenate(tensor.shape[1:]))
        return checked


class _Tap:
    """A supported layer's recorded input and pre-activation output during one forward pass."""

    def __init__(self, layer: tf.keras.layers.Layer, tapping: _Tapping):
        self.layer = layer
        self.tapping = tapping
        self.rows: _Rows | None = None
        self.inputs: tf.Tensor | None = None
        self.preactivation: tf.Tensor | None = None
        self.recurrent_inputs: tf.Tensor | None = None

    def guard(self, inputs: tf.Tensor) -> tf.Tensor:
        """``inputs`` with their leading dimension checked against the rows expected here (see ``_Tapping``)."""
        return self.tapping.guard(inputs, f"the input of {type(self.layer).__name__} {self.layer.name!r}")

    def weight(self, variable: tf.Variable) -> tf.Tensor:
        """The variable's value without a gradient path: a gradient that still reaches the variable then comes
        from a use outside this tapped call (tied weights), which ``_ghost`` detects."""
        return tf.stop_gradient(variable)

    def record(self, inputs: tf.Tensor, preactivation: tf.Tensor) -> None:
        if self.inputs is not None:
            raise _UnsupportedModel(f"layer {self.layer.name!r} is called more than once per forward pass")
        self.rows = self.tapping.rows[-1]
        self.inputs = inputs
        self.preactivation = preactivation
        if self.tapping.tape is not None:
            self.tapping.tape.watch(preactivation)


def _dense_call(tap: _Tap) -> Callable:
    layer = tap.layer

    def call(inputs, *args, **kwargs):
        if not isinstance(inputs, tf.Tensor):
            raise _UnsupportedModel(f"Dense {layer.name!r} received a non-dense input")
        inputs = tap.guard(tf.cast(inputs, layer.kernel.dtype))
        z = tf.tensordot(inputs, tap.weight(layer.kernel), axes=[[inputs.shape.rank - 1], [0]])
        return _record_and_activate(tap, inputs, z)

    return call


def _record_and_activate(tap: _Tap, inputs: tf.Tensor, kernel_output: tf.Tensor) -> tf.Tensor:
    """Adds the bias, records (inputs, pre-activation) for the norms, and applies the activation."""
    layer = tap.layer
    z = kernel_output + tap.weight(layer.bias) if layer.use_bias else kernel_output
    tap.record(inputs, z)
    return layer.activation(z) if layer.activation is not None else z


def _conv2d_call(tap: _Tap) -> Callable:
    layer = tap.layer

    def call(inputs, *args, **kwargs):
        inputs = tap.guard(tf.cast(inputs, layer.kernel.dtype))
        z = tf.nn.conv2d(
            inputs,
            tap.weight(layer.kernel),
            strides=(1,) + tuple(layer.strides) + (1,),
            padding=layer.padding.upper(),
            dilations=(1,) + tuple(layer.dilation_rate) + (1,),
        )
        return _record_and_activate(tap, inputs, z)

    return call


def _embedding_call(tap: _Tap) -> Callable:
    layer = tap.layer

    def call(inputs, *args, **kwargs):
        if not isinstance(inputs, tf.Tensor):
            raise _UnsupportedModel(f"Embedding {layer.name!r} received a non-dense input")
        if inputs.dtype not in (tf.int32, tf.int64):
            inputs = tf.cast(inputs, tf.int32)
        inputs = tap.guard(inputs)
        z = tf.gather(tap.weight(layer.embeddings), inputs)
        tap.record(inputs, z)
        return z

    return call


def _lstm_call(tap: _Tap) -> Callable:
    layer = tap.layer
    cell = layer.cell

    def call(inputs, mask=None, training=None, initial_state=None, **kwargs):
        del training
        if mask is not None or initial_state is not None or kwargs:
            raise _UnsupportedModel(f"LSTM {layer.name!r} called with a mask or an initial state")
        inputs = tap.guard(tf.cast(inputs, cell.kernel.dtype))
        input_projection = tf.tensordot(inputs, tap.weight(cell.kernel), axes=[[2], [0]])
        if cell.use_bias:
            input_projection = input_projection + tap.weight(cell.bias)
        recurrent_kernel = tap.weight(cell.recurrent_kernel)
        tap.record(inputs, input_projection)  # Before the recurrence, so that the tape records it.
        batch = tf.shape(inputs)[0]
        zeros = tf.zeros(tf.stack([batch, cell.units]), inputs.dtype)

        def step(carry, projection_t):
            h_prev, c_prev, _ = carry
            z = projection_t + tf.matmul(h_prev, recurrent_kernel)
            z_i, z_f, z_c, z_o = tf.split(z, 4, axis=1)
            c = cell.recurrent_activation(z_f) * c_prev + cell.recurrent_activation(z_i) * cell.activation(z_c)
            h = cell.recurrent_activation(z_o) * cell.activation(c)
            return h, c, h_prev

        hs, cs, h_prevs = tf.scan(
            step, tf.transpose(input_projection, [1, 0, 2]), initializer=(zeros, zeros, zeros)
        )
        tap.recurrent_inputs = tf.transpose(h_prevs, [1, 0, 2])
        output = tf.transpose(hs, [1, 0, 2]) if layer.return_sequences else hs[-1]
        if layer.return_state:
            return [output, hs[-1], cs[-1]]
        return output

    return call


def _is_supported(layer: tf.keras.layers.Layer) -> bool:
    if type(layer) is tf.keras.layers.Dense:
        return True
    if type(layer) is tf.keras.layers.Conv2D:
        return layer.data_format == "channels_last" and layer.groups == 1 and layer.padding != "causal"
    if type(layer) is tf.keras.layers.Embedding:
        return not layer.sparse and not getattr(layer, "_use_one_hot_matmul", False)
    if type(layer) is tf.keras.layers.LSTM:
        return not (
            layer.stateful or layer.go_backwards or layer.time_major or layer.dropout or layer.recurrent_dropout
        )
    return False


_CALL_FACTORIES = {
    tf.keras.layers.Dense: _dense_call,
    tf.keras.layers.Conv2D: _conv2d_call,
    tf.keras.layers.Embedding: _embedding_call,
    tf.keras.layers.LSTM: _lstm_call,
}


def ghost_supported(model: tf.keras.Model, var_list: Sequence[tf.Variable]) -> bool:
    """Whether every variable in ``var_list`` belongs to a layer with a ghost-clipping rule."""
    covered = set()
    for layer in model._flatten_layers(include_self=False, recursive=True):  # pylint: disable=protected-access
        if _is_supported(layer):
            covered.update(id(v) for v in layer.trainable_weights)
    return all(id(v) in covered for v in var_list)


def _time_distributed_call(tapping: _Tapping, layer: tf.keras.layers.TimeDistributed) -> Callable:
    """TimeDistributed's fold done here, so that the taps inside know their rows are (example, step) pairs.

    Keras folds [B, T, ...] into [B * T, ...] example-major only when the batch size is unknown (else it loops
    over the steps); this call always folds, records the fold, and unfolds the outputs.
    """
    inner = layer.layer
    inner_takes_mask = "mask" in inspect.signature(type(inner).call).parameters

    def call(inputs, training=None, mask=None):
        if not isinstance(inputs, tf.Tensor) or (mask is not None and inner_takes_mask):
            raise _UnsupportedModel(f"TimeDistributed {layer.name!r} received a nested, ragged or masked input")
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


def _time_distributed_mask(layer: tf.keras.layers.TimeDistributed) -> Callable:
    """TimeDistributed's output mask: None, as no mask enters (see above) and none is made inside.

    Keras's own ``compute_mask`` re-runs a functional inner model, which would record every tap twice.
    """
    inner = layer.layer
    sublayers = [inner, *inner._flatten_layers(include_self=False, recursive=True)]  # pylint: disable=protected-access
    makes_masks = any(isinstance(sub, tf.keras.layers.Masking) or getattr(sub, "mask_zero", False)
                      for sub in sublayers)

    def compute_mask(inputs, mask=None):
        del inputs
        if mask is not None or makes_masks:
            raise _UnsupportedModel(f"TimeDistributed {layer.name!r} carries a mask")
        return None

    return compute_mask


@contextlib.contextmanager
def _tapped(model: tf.keras.Model, rows: _Rows, tape: tf.GradientTape | None = None):
    """Replaces the calls of the model's supported layers (and TimeDistributed wrappers) for one forward pass."""
    tapping = _Tapping(rows, tape)
    calls = []
    masks = []
    for layer in model._flatten_layers(include_self=False, recursive=True):  # pylint: disable=protected-access
        if _is_supported(layer) and layer.trainable_weights:
            tap = _Tap(layer, tapping)
            tapping.taps.append(tap)
            calls.append((layer, _not_autographed(_CALL_FACTORIES[type(layer)](tap))))
        elif isinstance(layer, tf.keras.layers.TimeDistributed):
            calls.append((layer, _time_distributed_call(tapping, layer)))
            masks.append((layer, _time_distributed_mask(layer)))
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


def _squared_norms(tensor: tf.Tensor, axis: int | list[int]) -> tf.Tensor:
    """Sum of squares over ``axis``.

    One fused kernel (``reduce_euclidean_norm``, then squared) is ~2.5x faster on CPU than
    ``reduce_sum(square(.))``, which writes the squares out first; XLA has no kernel for it but fuses the latter.
    """
    if control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()):
        return tf.reduce_sum(tf.square(tensor), axis=axis)
    return tf.square(tf.math.reduce_euclidean_norm(tensor, axis=axis))


def _flatten_positions(tensor: tf.Tensor, rows: _Rows) -> tf.Tensor:
    """A tapped tensor [rows, ..., d] as [B, T, d]: each example's positions, its folded time steps included.

    Rows folded by TimeDistributed are example-major (example b owns ``fold`` consecutive rows), so a reshape to
    B rows groups each example's rows; T = 1 for a rank-2 tensor with one row per example.
    """
    if rows.fold == 1 and tensor.shape.rank == 2:
        return tensor[:, None, :]
    per_row = tensor.shape[1:-1].num_elements()
    positions = None if rows.fold is None or per_row is None else rows.fold * per_row
    flat = tf.reshape(tensor, [rows.batch, -1, tensor.shape[-1]])
    flat.set_shape([None, positions, tensor.shape[-1]])
    return flat


# Largest per-example gradient (in floats) that may be materialised for a whole batch: 2^16 floats is 256 KiB
# per example, 64 MiB at batch 256.
_MAX_MATERIALISED = 2**16


def _use_gram(positions: int | None, fan_in: int, fan_out: int) -> bool:
    """Whether the Gram ("ghost") form beats materialising the per-example gradients a_i^T g_i.

    Per example, the Gram norms cost T^2 (d_in + d_out) and the clipped sum then needs the layer's own
    weight-gradient contraction of the scaled g (T d_in d_out); materialising costs T d_in d_out once, after
    which the norms and the weighted sum cost d_in d_out each. So materialise when T^2 (d_in + d_out) >=
    d_in d_out, unless the B x d_in x d_out tensor would be too large (``_MAX_MATERIALISED`` per example).
    """
    if positions is None or fan_in * fan_out > _MAX_MATERIALISED:
        return True
    return positions * positions * (fan_in + fan_out) < fan_in * fan_out


def _bilinear_norms_and_sum(
    a: tf.Tensor, g: tf.Tensor
) -> tuple[tf.Tensor, Callable[[tf.Tensor], tf.Tensor]]:
    """Squared norms of G_i = a_i^T g_i (a: [B, T, k], g: [B, T, c]) and a function factors -> sum f_i G_i."""
    positions, fan_in, fan_out = a.shape[1], a.shape[-1], g.shape[-1]
    if positions == 1:
        a2, g2 = a[:, 0, :], g[:, 0, :]
        squared = _squared_norms(a2, 1) * _squared_norms(g2, 1)
        return squared, lambda f: tf.matmul(a2, g2 * f[:, None], transpose_a=True)
    if _use_gram(positions, fan_in, fan_out):
        gram_a = tf.matmul(a, a, transpose_b=True)
        gram_g = tf.matmul(g, g, transpose_b=True)
        squared = tf.reduce_sum(gram_a * gram_g, axis=[1, 2])
        return squared, lambda f: tf.einsum("btk,btc->kc", a, g * f[:, None, None])
    # G_i^T = g_i^T a_i, [B, c, k]: the batched matmul is faster on CPU this way round than a_i^T g_i.
    per_example = tf.matmul(g, a, transpose_a=True)
    squared = _squared_norms(per_example, [1, 2])
    return squared, lambda f: tf.transpose(tf.tensordot(f, per_example, axes=1))


@_not_autographed
def _dense_rule(tap: _Tap, g: tf.Tensor, wanted: set[int]):
    layer = tap.layer
    a = _flatten_positions(tap.inputs, tap.rows)
    g = _flatten_positions(g, tap.rows)
    squared = tf.zeros([tap.rows.batch], g.dtype)
    makers = {}
    if id(layer.kernel) in wanted:
        kernel_squared, kernel_sum = _bilinear_norms_and_sum(a, g)
        squared += kernel_squared
        makers[id(layer.kernel)] = kernel_sum
    if layer.use_bias and id(layer.bias) in wanted:
        bias_per_example = tf.reduce_sum(g, axis=1)
        squared += _squared_norms(bias_per_example, 1)
        makers[id(layer.bias)] = lambda f: tf.tensordot(f, bias_per_example, axes=1)
    return squared, makers


# Groups of examples whose 1-channel Conv2D kernel gradients are separate ops (see below).
_DEPTHWISE_PARTS = 4


def _depthwise_kernel_gradients(layer, inputs: tf.Tensor, g: tf.Tensor) -> tf.Tensor:
    """[kh * kw, B, c_out]: example b's kernel gradient of a 1-input-channel Conv2D in slice b.

    Treating the batch as the channels of a single image, ``DepthwiseConv2dNativeBackpropFilter`` returns
    [kh, kw, B, c_out] (several times faster on CPU than image patches and a batched matmul).
    """
    kernel_h, kernel_w = layer.kernel_size
    height, width = inputs.shape[1], inputs.shape[2]
    out_height, out_width, out_channels = g.shape[1], g.shape[2], g.shape[3]
    batch = tf.shape(inputs)[0]
    images = tf.reshape(tf.transpose(inputs, [3, 1, 2, 0]), [1, height, width, batch])
    out_backprop = tf.reshape(tf.transpose(g, [1, 2, 0, 3]), [1, out_height, out_width, batch * out_channels])
    per_example = tf.raw_ops.DepthwiseConv2dNativeBackpropFilter(
        input=images,
        filter_sizes=tf.stack([kernel_h, kernel_w, batch, out_channels]),
        out_backprop=out_backprop,
        strides=[1, *layer.strides, 1],
        padding=layer.padding.upper(),
    )
    return tf.reshape(per_example, [kernel_h * kernel_w, batch, out_channels])


def _single_channel_conv2d_norms_and_sum(layer, inputs: tf.Tensor, g: tf.Tensor, rows: _Rows):
    """Per-example kernel-gradient norms of a 1-input-channel Conv2D from depthwise filter gradients.

    The depthwise filter-gradient CPU kernel uses one thread for a single image, so the batch is cut into
    ``_DEPTHWISE_PARTS`` groups of examples, independent ops that TF's inter-op threads run in parallel (about
    8% off the whole tutorial-CNN step on 2 cores). Images folded in by TimeDistributed (``rows.fold`` per
    example) get one gradient each, summed per example.
    """
    kernel_h, kernel_w = layer.kernel_size
    batch = rows.batch
    images_per_example = 1 if rows.fold == 1 else rows.count // tf.maximum(rows.batch, 1)  # 0 // 1: empty batch.
    static_batch = None if rows.static is None or rows.fold is None else rows.static // rows.fold
    # Balanced groups, none empty when the batch has at least `parts` examples (XLA refuses empty ones).
    parts = min(_DEPTHWISE_PARTS, static_batch or _DEPTHWISE_PARTS)
    bounds = [i * batch // parts for i in range(parts + 1)]
    groups = list(zip(bounds[:-1], bounds[1:]))

    def gradients_of(start, end):
        images = slice(start * images_per_example, end * images_per_example)
        per_image = _depthwise_kernel_gradients(layer, inputs[images], g[images])
        if rows.fold == 1:
            return per_image
        return tf.reduce_sum(tf.reshape(per_image, [kernel_h * kernel_w, end - start, -1, g.shape[-1]]), axis=2)

    per_example = [gradients_of(start, end) for start, end in groups]
    squared = tf.concat([_squared_norms(gradients, [0, 2]) for gradients in per_example], axis=0)

    def kernel_sum(f):
        # sum_b f_b G_b as kh*kw row-vector-matrix products: twice as fast on CPU as the einsum "hwbc,b->hwc".
        total = tf.add_n([
            tf.matmul(tf.broadcast_to(f[None, None, start:end], [kernel_h * kernel_w, 1, end - start]), gradients)
            for (start, end), gradients in zip(groups, per_example)
        ])
        return tf.reshape(total, layer.kernel.shape)

    return squared, kernel_sum


def _window_starts(
    size: int, kernel: int, stride: int, dilation: int, padding: str
) -> tuple[np.ndarray, int, int]:
    """TF's conv windows along one axis: [out, kernel] input positions (padded coordinates) and the padding."""
    span = (kernel - 1) * dilation + 1
    if padding == "same":
        out = -(-size // stride)
        pad_total = max((out - 1) * stride + span - size, 0)
    else:
        out = (size - span) // stride + 1
        pad_total = 0
    positions = np.arange(out)[:, None] * stride + np.arange(kernel)[None, :] * dilation
    return positions, pad_total // 2, pad_total - pad_total // 2


def _image_patches(layer, inputs: tf.Tensor) -> tf.Tensor:
    """A Conv2D input's patches [B, T, kh * kw * c_in], in the kernel's (kh, kw, c_in) order.

    With a static image size: one ``tf.gather`` of the padded input's pixel rows (c_in floats each) at positions
    computed once when tracing, several times faster on CPU than ``tf.image.extract_patches`` (which is used for
    an unknown image size).
    """
    kernel_h, kernel_w = layer.kernel_size
    height, width, channels = inputs.shape[1], inputs.shape[2], inputs.shape[3]
    if height is None or width is None:
        patches = tf.image.extract_patches(
            inputs,
            sizes=[1, kernel_h, kernel_w, 1],
            strides=[1, *layer.strides, 1],
            rates=[1, *layer.dilation_rate, 1],
            padding=layer.padding.upper(),
        )
        return tf.reshape(patches, [tf.shape(patches)[0], -1, patches.shape[-1]])
    rows, top, bottom = _window_starts(height, kernel_h, layer.strides[0], layer.dilation_rate[0], layer.padding)
    cols, left, right = _window_starts(width, kernel_w, layer.strides[1], layer.dilation_rate[1], layer.padding)
    padded_width = width + left + right
    # [out_h, out_w, kh, kw] flat pixel positions in the padded image.
    pixels = rows[:, None, :, None] * padded_width + cols[None, :, None, :]
    inputs = tf.pad(inputs, [[0, 0], [top, bottom], [left, right], [0, 0]])
    inputs = tf.reshape(inputs, [tf.shape(inputs)[0], (height + top + bottom) * padded_width, channels])
    patches = tf.gather(inputs, tf.constant(pixels.reshape(-1), tf.int32), axis=1)
    positions = rows.shape[0] * cols.shape[0]
    return tf.reshape(patches, [tf.shape(inputs)[0], positions, kernel_h * kernel_w * channels])


def _patch_conv2d_norms_and_sum(layer, inputs: tf.Tensor, g: tf.Tensor, rows: _Rows):
    """Per-example kernel-gradient norms of a Conv2D from image patches (Gram or materialised form)."""
    patches = _flatten_positions(_image_patches(layer, inputs), rows)
    squared, kernel_sum = _bilinear_norms_and_sum(patches, _flatten_positions(g, rows))
    kernel_shape = layer.kernel.shape
    return squared, lambda f: tf.reshape(kernel_sum(f), kernel_shape)


@_not_autographed
def _conv2d_rule(tap: _Tap, g: tf.Tensor, wanted: set[int]):
    layer = tap.layer
    squared = tf.zeros([tap.rows.batch], g.dtype)
    makers = {}
    if id(layer.kernel) in wanted:
        if tap.inputs.shape[-1] == 1 and tuple(layer.dilation_rate) == (1, 1):
            kernel_squared, kernel_sum = _single_channel_conv2d_norms_and_sum(layer, tap.inputs, g, tap.rows)
        else:
            kernel_squared, kernel_sum = _patch_conv2d_norms_and_sum(layer, tap.inputs, g, tap.rows)
        squared += kernel_squared
        makers[id(layer.kernel)] = kernel_sum
    if layer.use_bias and id(layer.bias) in wanted:
        bias_per_example = tf.reduce_sum(_flatten_positions(g, tap.rows), axis=1)
        squared += _squared_norms(bias_per_example, 1)
        makers[id(layer.bias)] = lambda f: tf.tensordot(f, bias_per_example, axes=1)
    return squared, makers


@_not_autographed
def _embedding_rule(tap: _Tap, g: tf.Tensor, wanted: set[int]):
    layer = tap.layer
    batch = tap.rows.batch
    if id(layer.embeddings) not in wanted:
        return tf.zeros([batch], g.dtype), {}
    ids = tf.reshape(tap.inputs, [batch, -1])
    g = _flatten_positions(g, tap.rows)
    if ids.shape[1] == 1:
        squared = _squared_norms(g, [1, 2])
    else:
        # Example b's gradient has one row per distinct id in it, the sum of g over that id's positions: group
        # the B*T rows by the pair (b, id) (tf.unique, O(B T)) instead of a [B, T, T] Gram matrix.
        pairs = tf.cast(tf.range(batch), tf.int64)[:, None] * layer.input_dim + tf.cast(ids, tf.int64)
        unique_pairs, pair_index = tf.unique(tf.reshape(pairs, [-1]))
        num_pairs = tf.shape(unique_pairs)[0]
        pair_rows = tf.math.unsorted_segment_sum(tf.reshape(g, [-1, g.shape[-1]]), pair_index, num_pairs)
        squared = tf.math.unsorted_segment_sum(
            _squared_norms(pair_rows, 1), unique_pairs // layer.input_dim, batch
        )

    def clipped_sum(f):
        # tensor_scatter_nd_add is faster on CPU than unsorted_segment_sum. The B*T rows of g (not the (b, id)
        # pair rows above) keep a static shape for XLA.
        rows = tf.reshape(g * f[:, None, None], [-1, g.shape[-1]])
        return tf.tensor_scatter_nd_add(tf.zeros_like(layer.embeddings), tf.reshape(ids, [-1, 1]), rows)

    return squared, {id(layer.embeddings): clipped_sum}


@_not_autographed
def _lstm_rule(tap: _Tap, g: tf.Tensor, wanted: set[int]):
    """g is the gradient of the input projection x_t W + b, equal to that of the gate pre-activations z_t."""
    cell = tap.layer.cell
    g = _flatten_positions(g, tap.rows)
    squared = tf.zeros([tap.rows.batch], g.dtype)
    makers = {}
    for variable, activations in ((cell.kernel, tap.inputs), (cell.recurrent_kernel, tap.recurrent_inputs)):
        if id(variable) in wanted:
            variable_squared, variable_sum = _bilinear_norms_and_sum(_flatten_positions(activations, tap.rows), g)
            squared += variable_squared
            makers[id(variable)] = variable_sum
    if cell.use_bias and id(cell.bias) in wanted:
        bias_per_example = tf.reduce_sum(g, axis=1)
        squared += _squared_norms(bias_per_example, 1)
        makers[id(cell.bias)] = lambda f: tf.tensordot(f, bias_per_example, axes=1)
    return squared, makers


_RULES = {
    tf.keras.layers.Dense: _dense_rule,
    tf.keras.layers.Conv2D: _conv2d_rule,
    tf.keras.layers.Embedding: _embedding_rule,
    tf.keras.layers.LSTM: _lstm_rule,
}


# The probe traces the model with this many examples (and this length for every other unknown input axis):
# unusual sizes, so that a tensor whose leading dimension is not the batch is unlikely to match it by chance.
_PROBE_BATCH = 1009
_PROBE_LENGTH = 97


_probe_results: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@_not_autographed
def _rows_proven_by_probe(model: tf.keras.Model, x: Any) -> bool:
    """Whether, with a batch of an unusual static size, every tapped tensor has the rows expected of it.

    Keras batches usually have an unknown batch size, so while tracing the train step nothing tells a tensor
    of B rows from one of B * T rows folded by hand (``tf.reshape``); and a known batch size can match a tensor
    of fixed size (a table of B rows broadcast onto the batch) by chance. This traces (never runs) one more
    forward pass into a scratch graph with ``_PROBE_BATCH`` examples, where ``_Tapping.guard`` compares the
    leading dimensions. Any failure counts as no proof (the caller falls back to the vectorized path), e.g. a
    model built for one fixed batch size. Cached per model and input signature.
    """
    flat = tf.nest.flatten(x)
    if not all(isinstance(t, (tf.Tensor, np.ndarray)) and len(t.shape) for t in flat):
        return False
    # Which layers are tapped depends on which are trainable.
    key = (tuple((tf.as_dtype(t.dtype), tuple(t.shape[1:])) for t in flat),
           tuple(id(v) for v in model.trainable_variables))
    results = _probe_results.setdefault(model, {})
    if key not in results:
        results[key] = _probe(model, x)
    return results[key]


def _probe(model: tf.keras.Model, x: Any) -> bool:
    """Traces the tapped forward pass on ``_PROBE_BATCH`` examples (other unknown axes ``_PROBE_LENGTH``)."""

    def spec(tensor: tf.Tensor | np.ndarray) -> tf.TensorSpec:
        return tf.TensorSpec([_PROBE_BATCH] + [_PROBE_LENGTH if d is None else d for d in tensor.shape[1:]],
                             tf.as_dtype(tensor.dtype))

    proofs = []

    def forward(batch):
        with _tapped(model, _Rows.of_batch(batch)) as tapping:
            model(batch, training=True)
        proofs.append(tapping.proven)

    try:
        tf.function(forward).get_concrete_function(tf.nest.map_structure(spec, x))
    except (_UnsupportedModel, ValueError, TypeError, NotImplementedError, tf.errors.OpError):
        return False
    return proofs == [True]


def _ghost(
    model: tf.keras.Model,
    loss_fn: Callable,
    x: Any,
    y: Any,
    sample_weight: tf.Tensor,
    clip_norm: tf.Tensor,
    var_list: Sequence[tf.Variable],
) -> tuple[list[tf.Tensor], tf.Tensor, Any, tf.Tensor]:
    tape = tf.GradientTape()
    with _tapped(model, _Rows.of_batch(x), tape) as tapping:
        with tape:
            y_pred = model(x, training=True)
            losses = per_example_loss(loss_fn, y, y_pred, sample_weight)
            total = tf.reduce_sum(losses)
    if not _rows_proven_by_probe(model, x):
        raise _UnsupportedModel("a tapped layer does not have one row per example (or per example and step)")
    used = [tap for tap in tapping.taps if tap.inputs is not None]
    grads = tape.gradient(total, [tap.preactivation for tap in used] + var_list)
    tied = [v.name for v, g in zip(var_list, grads[len(used):]) if g is not None]
    if tied:
        raise _UnsupportedModel(f"variables used outside their own layer's call (tied weights): {tied}")
    wanted = {id(v) for v in var_list}
    squared = tf.zeros_like(losses)
    makers = {}
    for tap, g in zip(used, grads):
        g = tf.zeros_like(tap.preactivation) if g is None else g
        layer_squared, layer_makers = _RULES[type(tap.layer)](tap, g, wanted)
        shared = set(makers) & set(layer_makers)
        if shared:
            raise _UnsupportedModel(f"layer {tap.layer.name!r} shares a variable with another layer")
        squared += layer_squared
        makers.update(layer_makers)
    missing = [v.name for v in var_list if id(v) not in makers]
    if missing:
        raise _UnsupportedModel(f"variables not reached by a ghost rule: {missing}")
    norms = tf.sqrt(tf.maximum(squared, 0.0))
    factors = clip_and_noise.clip_factors(norms, clip_norm)
    sums = [makers[id(v)](factors) for v in var_list]
    return sums, norms, y_pred, losses


# ----------------------------------------------------------------------------------------------------------


def clipped_gradient_sum_with_outputs(
    model: tf.keras.Model,
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
    if sample_weight is None:
        sample_weight = tf.ones([_batch_size(x)], tf.float32)
    sample_weight = tf.reshape(tf.cast(sample_weight, tf.float32), [-1])
    clip_norm = tf.cast(clip_norm, tf.float32)
    if method in ("auto", "ghost"):
        if ghost_supported(model, var_list):
            try:
                return _ghost(model, loss_fn, x, y, sample_weight, clip_norm, var_list)
            except _UnsupportedModel as reason:
                if method == "ghost":
                    raise ValueError(
                        f"`method='ghost'` cannot clip this model per example: {reason}. Use method='auto' (which "
                        f"falls back to the vectorized path) or 'vectorized'. Received: method={method!r}."
                    ) from reason
        elif method == "ghost":
            raise ValueError(
                "`method='ghost'` needs every variable of `var_list` to belong to a Dense, Conv2D, "
                f"Embedding or LSTM layer. Received a model with other trainable layers: method={method!r}."
            )
    return _vectorized(model, loss_fn, x, y, sample_weight, clip_norm, var_list)


def clipped_gradient_sum(
    model: tf.keras.Model,
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
