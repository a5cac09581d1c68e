"""The one registry of ghost-clipping rules: for each layer class, how to tap its call and clip per example.

A `LayerRule` has three parts:

* ``call(tap)`` returns the function that replaces the layer's ``call`` during the tapped forward pass. It
  computes the same output from ``tap.guard(inputs)`` and ``tap.weight(variable)`` (the variable's value
  without a gradient path) and calls ``tap.record(inputs, preactivation)`` once (see `Tap`).
* ``norms_and_sums(tap, g)``, with ``g`` the gradient of the summed loss with respect to the recorded
  pre-activation (rows first, like it), returns one `GhostGradient` per variable of the layer: its per-example
  squared norms [B] and a function from the clipping factors [B] to the clipped sum.
  `keras_dyndp.tf_backend.per_example.norms`
  has the building blocks (``flatten_positions`` groups an example's rows, ``bilinear_gradient`` for a weight
  applied at every position, ``bias_gradient``, ``materialised_gradient``).
* ``supports(layer)`` says whether this layer's configuration is covered (default: every configuration).

Built in: ``Dense``, ``Conv1D`` (channels_last, groups 1; causal too), ``Conv2D`` (channels_last, groups 1),
``DepthwiseConv2D`` and ``SeparableConv2D`` (channels_last), ``Embedding`` (dense ids), ``LSTM`` and ``GRU`` (either
``reset_after``; no mask, dropout, state or reversal). On Keras 3 none of them covers a layer with LoRA enabled or a
quantized one (``lora_enabled``, ``quantization_mode``): their trainable variables are then not the ones the rules
differentiate. Rules are looked up by exact class: a subclass may compute something else in its ``call``, so it
needs a rule of its own. A model whose trainable variables are not all covered by rules is clipped
on the vectorized path instead (``method='auto'``).

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

Check a new rule against ``method='vectorized'`` (``clipped_gradient_sum`` with both methods must agree): a
wrong rule breaks the privacy guarantee silently.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import tensorflow as tf

from keras_dyndp.tf_backend.keras_compat import keras
from keras_dyndp.tf_backend.per_example import conv1d
from keras_dyndp.tf_backend.per_example import conv2d
from keras_dyndp.tf_backend.per_example import dense
from keras_dyndp.tf_backend.per_example import depthwise
from keras_dyndp.tf_backend.per_example import embedding
from keras_dyndp.tf_backend.per_example import gru
from keras_dyndp.tf_backend.per_example import lstm
from keras_dyndp.tf_backend.per_example.taps import GhostGradient
from keras_dyndp.tf_backend.per_example.taps import Tap


@dataclasses.dataclass(frozen=True)
class LayerRule:
    """How ghost clipping handles one layer class (see the module docstring)."""

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
    """Registers (or replaces) the ghost-clipping rule of ``layer_class`` (see the module docstring).

    Args:
        layer_class: a Keras layer class; the rule applies to layers of exactly this class.
        call: ``call(tap)`` returns the layer's call for the tapped pass, which records through ``tap``.
        norms_and_sums: ``norms_and_sums(tap, g)`` returns one `GhostGradient` per variable of the layer. It
            runs without AutoGraph: control flow on tensors needs ``tf.cond`` / ``tf.while_loop``.
        supports: ``supports(layer)``: whether the rule covers this layer's configuration (None: always).

    Raises:
        TypeError: if ``layer_class`` is not a Keras layer class or a rule part is not callable.
    """
    if not (isinstance(layer_class, type) and issubclass(layer_class, keras.layers.Layer)):
        raise TypeError(f"`layer_class` must be a Keras layer class. Received: layer_class={layer_class!r}.")
    parts = {"call": call, "norms_and_sums": norms_and_sums}
    if supports is not None:
        parts["supports"] = supports
    for name, part in parts.items():
        if not callable(part):
            raise TypeError(f"`{name}` must be callable. Received: {name}={part!r}.")
    # Graph code without Python control flow on tensors: AutoGraph would convert it at each first trace.
    _RULES[layer_class] = LayerRule(call, tf.autograph.experimental.do_not_convert(norms_and_sums), supports)


def plain_weights(layer: keras.layers.Layer) -> bool:
    """Whether the layer computes with its own trainable variables as such: not Keras 3's LoRA (a frozen kernel
    plus trainable low-rank factors) or quantization (integer kernels), which the built-in rules do not cover."""
    return not getattr(layer, "lora_enabled", False) and getattr(layer, "quantization_mode", None) is None


def _built_in(supports: Callable[[keras.layers.Layer], bool] | None = None) -> Callable[[keras.layers.Layer], bool]:
    """A built-in rule's ``supports``: ``plain_weights`` and the rule's own condition."""
    return lambda layer: plain_weights(layer) and (supports is None or supports(layer))


def has_rule(layer_class: type) -> bool:
    """Whether a rule is registered for exactly ``layer_class`` (whatever configurations it supports)."""
    return layer_class in _RULES


def rule_for(layer: keras.layers.Layer) -> LayerRule | None:
    """The rule that covers ``layer`` (its exact class and configuration), or None."""
    rule = _RULES.get(type(layer))
    if rule is None or (rule.supports is not None and not rule.supports(layer)):
        return None
    return rule


register_layer_rule(keras.layers.Dense, call=dense.call, norms_and_sums=dense.norms_and_sums, supports=_built_in())
register_layer_rule(
    keras.layers.Conv1D, call=conv1d.call, norms_and_sums=conv1d.norms_and_sums, supports=_built_in(conv1d.supports)
)
register_layer_rule(
    keras.layers.Conv2D, call=conv2d.call, norms_and_sums=conv2d.norms_and_sums, supports=_built_in(conv2d.supports)
)
register_layer_rule(
    keras.layers.DepthwiseConv2D,
    call=depthwise.depthwise_call,
    norms_and_sums=depthwise.depthwise_norms_and_sums,
    supports=_built_in(depthwise.supports),
)
register_layer_rule(
    keras.layers.SeparableConv2D,
    call=depthwise.separable_call,
    norms_and_sums=depthwise.separable_norms_and_sums,
    supports=_built_in(depthwise.supports),
)
register_layer_rule(
    keras.layers.Embedding,
    call=embedding.call,
    norms_and_sums=embedding.norms_and_sums,
    supports=_built_in(embedding.supports),
)
register_layer_rule(
    keras.layers.LSTM, call=lstm.call, norms_and_sums=lstm.norms_and_sums, supports=_built_in(lstm.supports)
)
register_layer_rule(
    keras.layers.GRU, call=gru.call, norms_and_sums=gru.norms_and_sums, supports=_built_in(gru.supports)
)
