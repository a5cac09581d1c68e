"""Per-example gradients of Embedding tables without a dense table-sized array per example.

``jax.vmap`` of ``jax.grad`` gives every example its own gradient of every variable: for an Embedding table of V x D
floats that is a V x D array per example (10000 x 16 on the IMDB model, 59x a non-private step here), although an
example touches only the rows of its own tokens. Where it is safe, ``make_private``'s step takes those tables out of
the differentiated variables and taps the layer's output instead: the patched ``call`` adds a zero "tap" of the
output's shape, and the gradient with respect to the tap is each example's gradient with respect to its looked-up
rows, delta (L x D for L tokens). Then, per example, with the rows of equal token ids summed (sort, segment sum):

* squared norm of the table's gradient = sum over distinct ids of ||sum of its rows of delta||^2, exact;
* clipped sum over the batch = one scatter-add of factor_i * delta_i into the table's shape.

Tapped: a trainable ``keras.layers.Embedding`` (the class itself; LoRA and quantized ones excluded) whose table
belongs to no other layer, that sits in Sequential / functional models only, that runs once per forward pass, and
whose table nothing else in the forward pass reads (`tappable`): a table also read elsewhere (tied to an output
projection, ``ops.matmul(h, ops.transpose(embedding.embeddings))`` in a custom layer or Lambda) gets a gradient from
that read too, which the taps would miss. The probe finds such reads as the ghost path does on TensorFlow: it
traces the forward pass with the tapped call reading a stand-in for its table, and any equation that still reads
the table is another use. The others keep the vmap path. The patched ``call`` is the original one whenever no
private step is tracing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import keras

_ACTIVE = threading.local()


class _Session:
    """One trace of the model: records each tapped layer's ids and output, adds the taps when given, and lets the
    layers in ``stand_ins`` (by layer id, set by `tappable`'s probe) read their stand-in instead of their table."""

    def __init__(self, taps: dict[int, Any] | None = None):
        self.taps = taps
        self.stand_ins: dict[int, Any] = {}
        self.ids: dict[int, Any] = {}
        self.shapes: dict[int, tuple] = {}
        self.calls: dict[int, int] = {}

    def __enter__(self):
        _ACTIVE.session = self
        return self

    def __exit__(self, *exc_info):
        _ACTIVE.session = None

    def tap(self, layer: keras.layers.Embedding, inputs: Any, call: Callable[[], Any]) -> Any:
        key = id(layer)
        if key in self.stand_ins:
            with keras.StatelessScope(state_mapping=[(layer.embeddings, self.stand_ins[key])]):
                outputs = call()
        else:
            outputs = call()
        self.calls[key] = self.calls.get(key, 0) + 1
        self.ids[key] = jnp.asarray(inputs).astype(jnp.int32)
        self.shapes[key] = tuple(outputs.shape)
        if self.taps is not None and key in self.taps:
            return outputs + self.taps[key].astype(outputs.dtype)
        return outputs


def _patch(layer: keras.layers.Embedding) -> None:
    if getattr(layer, "_keras_dyndp_tapped", False):
        return
    original = layer.call

    def call(inputs, *args, **kwargs):
        session = getattr(_ACTIVE, "session", None)
        if session is None:
            return original(inputs, *args, **kwargs)
        return session.tap(layer, inputs, lambda: original(inputs, *args, **kwargs))

    layer.call = call
    layer._keras_dyndp_tapped = True  # pylint: disable=protected-access


def _wiring_only(layer: keras.layers.Layer) -> bool:
    """Whether ``layer`` is a Sequential or functional model: its call only wires its sublayers' calls together."""
    return type(layer).__module__.startswith("keras.") and type(layer).__name__ in ("Sequential", "Functional")


def _leaves_under_wiring(layer: keras.layers.Layer) -> list[keras.layers.Layer]:
    """The leaf layers below ``layer`` reached through Sequential / functional models only. A subclassed model or
    layer could read a sublayer's table in its own call (tied weights): that read's gradient would be lost."""
    if not _wiring_only(layer):
        return []
    leaves = []
    for sublayer in layer._layers:  # pylint: disable=protected-access
        leaves += _leaves_under_wiring(sublayer) if sublayer._layers else [sublayer]  # pylint: disable=protected-access
    return leaves


def candidates(model: keras.Model) -> dict[int, tuple[keras.layers.Embedding, int]]:
    """Tappable Embedding layers by id, each with its table's index in ``model.trainable_variables`` (patched)."""
    trainable = model.trainable_variables
    leaves = [layer for layer in model._flatten_layers() if not layer._layers]  # pylint: disable=protected-access
    found = {}
    for layer in _leaves_under_wiring(model):
        if type(layer) is not keras.layers.Embedding or not layer.trainable:  # pylint: disable=unidiomatic-typecheck
            continue
        if getattr(layer, "lora_enabled", False) or getattr(layer, "quantization_mode", None) is not None:
            continue
        table = layer.embeddings
        owners = sum(any(weight is table for weight in other.weights) for other in leaves)
        index = next((i for i, variable in enumerate(trainable) if variable is table), None)
        if owners == 1 and index is not None:
            _patch(layer)
            found[id(layer)] = (layer, index)
    return found


def tappable(model: keras.Model, trainable: list, non_trainable: list, x: Any) -> dict[int, tuple[int, tuple]]:
    """The `candidates` this step taps, by layer id: (the table's index in ``trainable``, the layer's output shape
    for the batch ``x``). A candidate is left out when it runs other than once in the forward pass, or when the
    forward pass reads its table outside its call (module docstring). Traces ``model``'s training-mode call on the
    values' shapes; nothing runs."""
    found = candidates(model)
    if not found:
        return {}
    probe = _Session()

    def forward(trainable, non_trainable, x, stand_ins):
        probe.stand_ins = stand_ins
        with probe:
            return model.stateless_call(trainable, non_trainable, x, training=True)

    stand_ins = {key: trainable[index] for key, (_, index) in found.items()}
    abstract = jax.tree_util.tree_map(
        lambda value: jax.ShapeDtypeStruct(value.shape, value.dtype), (trainable, non_trainable, x, stand_ins)
    )
    jaxpr = jax.make_jaxpr(forward)(*abstract).jaxpr
    read = {id(var) for equation in jaxpr.eqns for var in equation.invars} | {id(var) for var in jaxpr.outvars}
    table_vars = jaxpr.invars[: len(trainable)]  # ``trainable`` is a flat list: its leaves come first, in order.
    return {
        key: (index, probe.shapes[key])
        for key, (_, index) in found.items()
        if probe.calls.get(key) == 1 and id(table_vars[index]) not in read
    }


def session(taps: dict[int, Any] | None = None) -> _Session:
    """A context in which the patched layers record their ids and outputs (and add ``taps``, by layer id)."""
    return _Session(taps)


def squared_norms(ids: jax.Array, deltas: jax.Array) -> jax.Array:
    """[B] squared norms of the per-example table gradients, from ids [B, M] and row gradients [B, M, D]."""
    batch, rows = ids.shape
    order = jnp.argsort(ids, axis=1)
    sorted_ids = jnp.take_along_axis(ids, order, axis=1)
    sorted_deltas = jnp.take_along_axis(deltas, order[..., None], axis=1)
    starts = jnp.concatenate([jnp.ones((batch, 1), bool), sorted_ids[:, 1:] != sorted_ids[:, :-1]], axis=1)
    segments = (jnp.arange(batch)[:, None] * rows + jnp.cumsum(starts, axis=1) - 1).reshape(-1)
    sums = jax.ops.segment_sum(sorted_deltas.reshape(batch * rows, -1), segments, num_segments=batch * rows)
    return jnp.sum(sums.reshape(batch, rows, -1) ** 2, axis=(1, 2))


def clipped_sum(table_shape: tuple, ids: jax.Array, deltas: jax.Array, factors: jax.Array) -> jax.Array:
    """sum_i factor_i G_i, the per-example table gradients G_i given by ids [B, M] and row gradients [B, M, D]."""
    weighted = (factors[:, None, None] * deltas).reshape(-1, deltas.shape[-1])
    return jnp.zeros(table_shape, jnp.float32).at[ids.reshape(-1)].add(weighted)
