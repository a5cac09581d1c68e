"""The one registry of ghost-clipping rules on TensorFlow: for each layer class, how to tap its call and clip per
example (`LayerRule`), or that it acts per example without a rule of its own (`register_layer_rule` says how).

A rule of the contract both backends share (`keras_dyndp.rules.layer_rules`; docs/usage.md's ``ScaleShift``) is tapped
by `generic`; the built-in rules keep TensorFlow's specialised form, ``call=``, from the building blocks in `norms`:
`dense`, `conv2d`, `recurrent`, `einsum_dense` (also inside MultiHeadAttention), `normalization` (RMSNormalization
too), Keras 3's LoRA Dense, EinsumDense and Embedding (`lora`: the adapters, not the frozen kernel); not quantized
layers. The known Keras layers that act per example are declared in `per_example_layers`. Rules apply to exactly
their class; a model with a trainable variable no rule covers takes the vectorized path.

A new rule must meet `keras_dyndp.rules.layer_rules`' conditions (norms never below the exact ones, nothing added from a
factor-0 example; the `norms` building blocks do both); check it against ``method='vectorized'``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import tensorflow as tf

from keras_dyndp.core import validation
from keras_dyndp.rules import dense_attention
from keras_dyndp.rules import layer_rules
from keras_dyndp.tf_backend.keras_compat import keras
from keras_dyndp.tf_backend.per_example import conv2d
from keras_dyndp.tf_backend.per_example import dense
from keras_dyndp.tf_backend.per_example import einsum_dense
from keras_dyndp.tf_backend.per_example import generic
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
      variables: for a rule of the shared contract, its ``variables(layer)`` (None for the specialised form).
      shared: for a rule of the shared contract, its ``norms_and_sums(layer, a, g)`` (None for the specialised form).
    """

    call: Callable[[Tap], Callable]
    norms_and_sums: Callable[[Tap, tf.Tensor], list[GhostGradient]]
    supports: Callable[[keras.layers.Layer], bool] | None = None
    variables: Callable[[keras.layers.Layer], list] | None = None
    shared: Callable | None = None


_RULES: dict[type, LayerRule] = {}
_PER_EXAMPLE: dict[type, Callable[[keras.layers.Layer], bool] | None] = {}


def register_layer_rule(
    layer_class: type,
    *,
    variables: Callable[[keras.layers.Layer], list] | None = None,
    norms_and_sums: Callable | None = None,
    supports: Callable[[keras.layers.Layer], bool] | None = None,
    per_example: bool = False,
    call: Callable[[Tap], Callable] | None = None,
) -> None:
    """Registers (or replaces) the ghost-clipping rule of exactly ``layer_class`` (`keras_dyndp.rules.layer_rules`, the
    contract both backends share; docs/usage.md), or declares that it acts per example.

    A wrong rule breaks privacy silently: check it against ``make_private(model, method='vectorized')``.

    Args:
      layer_class: the Keras layer class the rule covers (not its subclasses).
      variables: ``variables(layer)``: the trainable variables the rule covers (its sublayers' too).
      norms_and_sums: ``norms_and_sums(layer, a, g)`` (a the layer's input, g the loss's gradient at its
        pre-activation, [B, rows, ...]): the per-example squared norms [B] of the covered variables' gradients
        together and a function ``factors -> [clipped weighted sum per variable]``. With ``call``, the specialised
        form ``norms_and_sums(tap, g)``: one `GhostGradient` per trainable variable (`LayerRule.norms_and_sums`).
        Runs without AutoGraph (control flow on tensors needs ``tf.cond`` / ``tf.while_loop``).
      supports: ``supports(layer)``: whether the rule (or declaration) covers this layer's configuration; None
        (default): always.
      per_example: instead of a rule, declares that the class's own call acts on each example alone (row i of its
        output depends on row i of its inputs alone: no batch statistics, mixing of rows, use of a row's position
        or random draws) and reads no variable of its sublayers, which need rules of their own.
      call: TensorFlow's specialised form (the built-in rules'): ``call(tap)`` returns the layer's tapped ``call``
        (`LayerRule.call`), instead of ``variables``.

    Raises:
      TypeError: if ``layer_class`` is not a Keras layer class, a part is not callable, or a rule's parts come with
        ``per_example=True``.
    """
    if call is not None:
        parts = {"call": call, "norms_and_sums": norms_and_sums, "supports": supports, "variables": variables}
        validation.check_layer_rule(layer_class, keras.layers.Layer, parts, optional=("supports", "variables"))
        if variables is not None or per_example:
            raise TypeError("`call` (the specialised form) takes neither `variables` nor `per_example=True`.")
        # Graph code without Python control flow on tensors: AutoGraph would convert it at each first trace.
        _RULES[layer_class] = LayerRule(call, tf.autograph.experimental.do_not_convert(norms_and_sums), supports)
        return
    layer_rules.check_registration(layer_class, keras.layers.Layer, variables, norms_and_sums, supports, per_example)
    if per_example:
        _PER_EXAMPLE[layer_class] = supports
        return
    shared = tf.autograph.experimental.do_not_convert(norms_and_sums)
    norms = generic.norms_and_sums_for(variables, shared)
    _RULES[layer_class] = LayerRule(generic.call_for(variables), norms, supports, variables, shared)


def acts_per_example(layer: keras.layers.Layer) -> bool:
    """Whether ``layer``'s exact class is declared to act per example, in a configuration its condition covers."""
    return layer_rules.declared(_PER_EXAMPLE, layer)


def _built_in(supports: Callable[[keras.layers.Layer], bool] | None) -> Callable[[keras.layers.Layer], bool]:
    """A built-in rule's ``supports``: the rule's own condition, and not Keras 3's quantization (integer kernels),
    whose variables the rules do not differentiate (Keras 3's LoRA: `lora.with_lora`)."""
    return lambda layer: getattr(layer, "quantization_mode", None) is None and (supports is None or supports(layer))


def rule_for(layer: keras.layers.Layer) -> LayerRule | None:
    """The rule that covers ``layer`` (its exact class and configuration), or None."""
    rule = _RULES.get(type(layer))
    if rule is None or (rule.supports is not None and not rule.supports(layer)):
        return None
    return rule


def sublayer_norms_and_sums(layer: keras.layers.Layer, a: tf.Tensor, g: tf.Tensor) -> tuple[list, tf.Tensor, Callable]:
    """`keras_dyndp.rules.layer_rules.sublayer_norms_and_sums` on TensorFlow: ``(variables, squared norms, sums)`` by
    the rule of ``layer``'s class; ValueError where none supports it (or it needs its own tapped call)."""
    rule = rule_for(layer)
    if rule is None:
        raise ValueError(f"no ghost rule supports layer {layer.name!r} ({type(layer).__name__})")
    if rule.shared is not None:
        return (rule.variables(layer), *rule.shared(layer, a, g))
    return generic.sublayer_norms_and_sums(rule, layer, a, g)


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
if hasattr(keras.layers, "RMSNormalization"):  # Keras 3.9 and later
    register_layer_rule(
        keras.layers.RMSNormalization,
        call=normalization.rms_norm_call,
        norms_and_sums=normalization.norms_and_sums,
        supports=_built_in(normalization.layer_norm_supports),
    )
dense_attention.register(register_layer_rule, keras.layers)  # Attention, AdditiveAttention: their scales
