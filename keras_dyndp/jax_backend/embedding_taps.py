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
belongs to no other layer, that runs once per forward pass, and that sits in Sequential / functional models only (a
subclassed model or layer could read the table in its own call, e.g. tied to an output projection, and that read's
gradient would be missed). The others keep the vmap path. The
patched ``call`` is the original one whenever no private step is tracing.
"""

from __future__ import annotations

import threading
from typing import Any

import jax
import jax.numpy as jnp
import keras

_ACTIVE = threading.local()


class _Session:
    """One trace of the model: records each tapped layer's ids and output, adds the taps when given."""

    def __init__(self, taps: dict[int, Any] | None = None):
        self.taps = taps
        self.ids: dict[int, Any] = {}
        self.shapes: dict[int, tuple] = {}
        self.calls: dict[int, int] = {}

    def __enter__(self):
        _ACTIVE.session = self
        return self

    def __exit__(self, *exc_info):
        _ACTIVE.session = None

    def tap(self, layer: keras.layers.Layer, inputs: Any, outputs: Any) -> Any:
        key = id(layer)
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
        outputs = original(inputs, *args, **kwargs)
        session = getattr(_ACTIVE, "session", None)
        return outputs if session is None else session.tap(layer, inputs, outputs)

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
