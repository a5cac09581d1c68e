"""TensorFlow's built-in ghost-clipping rules, registered into the one registry (`keras_dyndp.rules.registry`) on
import, with TensorFlow's `registry.Hooks`: TensorFlow's overrides, ``call=`` (`registry.LayerRule.call`), built from
the blocks in `norms`: `dense`, `conv2d`, `recurrent`, `einsum_dense` (also inside MultiHeadAttention), `normalization`,
Keras 3's LoRA Dense, EinsumDense and Embedding (`lora`: the adapters, not the frozen kernel); not quantized layers. The
known Keras layers that act per example are declared in `per_example_layers`; a rule of the shared contract (example:
docs/usage.md's ``ScaleShift``) is tapped by `generic` (docs/architecture.md, "The ghost-rule registry")."""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf

from keras_dyndp.rules import dense_attention
from keras_dyndp.rules import registry
from keras_dyndp.tf_backend.keras_compat import keras
from keras_dyndp.tf_backend.per_example import conv2d
from keras_dyndp.tf_backend.per_example import dense
from keras_dyndp.tf_backend.per_example import einsum_dense
from keras_dyndp.tf_backend.per_example import generic
from keras_dyndp.tf_backend.per_example import lora
from keras_dyndp.tf_backend.per_example import normalization
from keras_dyndp.tf_backend.per_example import recurrent
from keras_dyndp.tf_backend.per_example import reversible

registry.install(
    registry.Hooks(
        "TensorFlow",
        keras.layers.Layer,
        # Graph code without Python control flow on tensors: AutoGraph would convert it at each first trace.
        keep=tf.autograph.experimental.do_not_convert,
        tapped_sublayer=generic.sublayer_norms_and_sums,
        overrides={
            "keras_dyndp.rules.keras_hub_rules.reversible_embedding": lambda: {
                "call": reversible.call,
                "norms_and_sums": reversible.norms_and_sums,
                "supports": reversible.supports,
            }
        },
    )
)


def _built_in(supports: Callable[[keras.layers.Layer], bool] | None) -> Callable[[keras.layers.Layer], bool]:
    """A built-in rule's ``supports``: the rule's own condition, and not Keras 3's quantization (integer kernels),
    whose variables the rules do not differentiate (Keras 3's LoRA: `lora.with_lora`)."""
    return lambda layer: getattr(layer, "quantization_mode", None) is None and (supports is None or supports(layer))


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
    registry.register_layer_rule(_class, **lora.with_lora(_class, _call, _norms_and_sums, _built_in(_supports)))
if hasattr(keras.layers, "RMSNormalization"):  # Keras 3.9 and later
    registry.register_layer_rule(
        keras.layers.RMSNormalization,
        call=normalization.rms_norm_call,
        norms_and_sums=normalization.norms_and_sums,
        supports=_built_in(normalization.layer_norm_supports),
    )
dense_attention.register(keras.layers)  # Attention, AdditiveAttention: their scales
