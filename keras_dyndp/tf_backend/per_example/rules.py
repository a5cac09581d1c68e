"""The one registry of ghost-clipping rules: for each layer class, how to tap its call and clip per example.

A `LayerRule`: ``call(tap)`` returns the layer's ``call`` for the tapped pass (the same output from
``tap.guard(inputs)`` and ``tap.weight(variable)``, with one ``tap.record(inputs, preactivation)``);
``norms_and_sums(tap, g)`` (g: the loss's gradient at the pre-activation) returns one `GhostGradient` per variable,
from the building blocks in `norms`; ``supports(layer)`` (default: always). Built in: `dense`, `conv2d`, `recurrent`,
`einsum_dense` (also inside MultiHeadAttention), `normalization`; Keras 3's LoRA Dense, EinsumDense and Embedding
(`lora`: the adapters, not the frozen kernel); not quantized layers. Rules
apply to exactly their class; a model with a trainable variable no rule covers takes the vectorized path.
A rule for a custom layer, ``y = x * scale + shift`` over the last axis:

```python
import tensorflow as tf
from keras_dyndp.tf_backend import per_example
from keras_dyndp.tf_backend.keras_compat import keras  # tf.keras on Keras 2, keras on Keras 3
from keras_dyndp.tf_backend.per_example import norms

class ScaleShift(keras.layers.Layer):
    def build(self, input_shape):
        self.scale = self.add_weight(name="scale", shape=[input_shape[-1]], initializer="ones")
        self.shift = self.add_weight(name="shift", shape=[input_shape[-1]], initializer="zeros")

    def call(self, inputs):
        return inputs * self.scale + self.shift

def scale_shift_call(tap):
    def call(inputs, *args, **kwargs):
        inputs = tap.guard(inputs)
        outputs = inputs * tap.weight(tap.layer.scale) + tap.weight(tap.layer.shift)
        tap.record(inputs, outputs)
        return outputs
    return call

def scale_shift_norms_and_sums(tap, g):
    x = norms.flatten_positions(tap.inputs, tap.rows)  # [B, T, d]: each example's positions.
    g = norms.flatten_positions(g, tap.rows)
    return [norms.materialised_gradient(tap.layer.scale, tf.reduce_sum(x * g, axis=1)),
            norms.bias_gradient(tap.layer.shift, g)]

per_example.register_layer_rule(ScaleShift, call=scale_shift_call, norms_and_sums=scale_shift_norms_and_sums)
```

Check a new rule against ``method='vectorized'`` (both must agree): a wrong rule breaks privacy silently. Its squared
norms must never be below the exact ones (float32 rounding included: `norms.bilinear_gradient` adds the bound where
positions can cancel, `keras_dyndp.ghost_cost.bounded_squared_norms`), and its sums must add exactly nothing from
an example whose factor is 0 (`ops.weighted_sum`, ``scaled_rows``: a select, as 0 x inf is NaN); the
`norms` building blocks do both.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import tensorflow as tf

from keras_dyndp import validation
from keras_dyndp.tf_backend.keras_compat import keras
from keras_dyndp.tf_backend.per_example import conv2d
from keras_dyndp.tf_backend.per_example import dense
from keras_dyndp.tf_backend.per_example import einsum_dense
from keras_dyndp.tf_backend.per_example import lora
from keras_dyndp.tf_backend.per_example import normalization
from keras_dyndp.tf_backend.per_example import recurrent
from keras_dyndp.tf_backend.per_example.taps import GhostGradient
from keras_dyndp.tf_backend.per_example.taps import Tap


@dataclasses.dataclass(frozen=True)
class LayerRule:
    """How ghost clipping handles one layer class (see the module docstring): `register_layer_rule`'s parts.

    Attributes:
      call: ``call(tap)`` returns the layer's ``call`` for the tapped pass: the layer's output, computed from
        ``tap.guard(inputs)`` and ``tap.weight(variable)``, with one ``tap.record(inputs, preactivation)``.
      norms_and_sums: ``norms_and_sums(tap, g)``, g the loss's gradient at the recorded pre-activation [B, ...],
        returns one `GhostGradient` per trainable variable (its per-example squared norms and weighted sum).
      supports: ``supports(layer)`` says whether the rule covers this layer's configuration; None: always.
    """

    call: Callable[[Tap], Callable]
    norms_and_sums: Callable[[Tap, tf.Tensor], list[GhostGradient]]
    supports: Callable[[keras.layers.Layer], bool] | None = None


_RULES: dict[type, LayerRule] = {}


def register_layer_rule(
    layer_class: type,
    *,
    call: Callable[[Tap], Callable],
    norms_and_sums: Callable[[Tap, tf.Tensor], list[GhostGradient]],
    supports: Callable[[keras.layers.Layer], bool] | None = None,
) -> None:
    """Registers (or replaces) the ghost-clipping rule of exactly ``layer_class`` (module docstring's example).

    A wrong rule breaks privacy silently: check it against ``make_private(model, method='vectorized')``.

    Args:
      layer_class: the Keras layer class the rule covers (not its subclasses).
      call: ``call(tap)`` returns the layer's ``call`` for the tapped pass (`LayerRule.call`).
      norms_and_sums: ``norms_and_sums(tap, g)`` returns one `GhostGradient` per trainable variable
        (`LayerRule.norms_and_sums`); runs without AutoGraph (control flow on tensors needs ``tf.cond`` /
        ``tf.while_loop``).
      supports: ``supports(layer)``: whether the rule covers this layer's configuration; None (default): always.

    Raises:
      TypeError: if ``layer_class`` is not a Keras layer class or a part is not callable.
    """
    parts = {"call": call, "norms_and_sums": norms_and_sums, "supports": supports}
    validation.check_layer_rule(layer_class, keras.layers.Layer, parts, optional=("supports",))
    # Graph code without Python control flow on tensors: AutoGraph would convert it at each first trace.
    _RULES[layer_class] = LayerRule(call, tf.autograph.experimental.do_not_convert(norms_and_sums), supports)


def _built_in(supports: Callable[[keras.layers.Layer], bool] | None) -> Callable[[keras.layers.Layer], bool]:
    """A built-in rule's ``supports``: the rule's own condition, and not Keras 3's quantization (integer kernels),
    whose variables the rules do not differentiate (Keras 3's LoRA: `lora.with_lora`)."""
    return lambda layer: getattr(layer, "quantization_mode", None) is None and (supports is None or supports(layer))


def has_rule(layer_class: type) -> bool:
    """Whether a rule is registered for exactly ``layer_class`` (whatever configurations it supports)."""
    return layer_class in _RULES


def rule_for(layer: keras.layers.Layer) -> LayerRule | None:
    """The rule that covers ``layer`` (its exact class and configuration), or None."""
    rule = _RULES.get(type(layer))
    if rule is None or (rule.supports is not None and not rule.supports(layer)):
        return None
    return rule


for _class, _call, _norms_and_sums, _supports in (
    (keras.layers.Dense, dense.call, dense.norms_and_sums, None),
    (keras.layers.Conv1D, conv2d.call, conv2d.norms_and_sums, conv2d.supports),
    (keras.layers.Conv2D, conv2d.call, conv2d.norms_and_sums, conv2d.supports),
    (keras.layers.DepthwiseConv2D, conv2d.depthwise_call, conv2d.depthwise_norms_and_sums, conv2d.channels_last),
    (keras.layers.SeparableConv2D, conv2d.depthwise_call, conv2d.depthwise_norms_and_sums, conv2d.channels_last),
    (keras.layers.Embedding, dense.embedding_call, dense.embedding_norms_and_sums, dense.embedding_supports),
    (keras.layers.LSTM, recurrent.lstm_call, recurrent.lstm_norms_and_sums, recurrent.supports),
    (keras.layers.GRU, recurrent.gru_call, recurrent.gru_norms_and_sums, recurrent.supports),
    (keras.layers.EinsumDense, einsum_dense.call, einsum_dense.norms_and_sums, einsum_dense.supports),
    (
        keras.layers.LayerNormalization,
        normalization.layer_norm_call,
        normalization.norms_and_sums,
        normalization.layer_norm_supports,
    ),
    (
        keras.layers.GroupNormalization,
        normalization.group_norm_call,
        normalization.norms_and_sums,
        normalization.group_norm_supports,
    ),
):
    register_layer_rule(_class, **lora.with_lora(_class, _call, _norms_and_sums, _built_in(_supports)))
