"""Small models around Keras's Attention and AdditiveAttention layers, for the tests of
`keras_dyndp.rules.dense_attention` on each backend (``keras`` given: Keras 3, Keras 2 or tf_keras)."""

import numpy as np


def layers(keras) -> dict:
    """The covered configurations by name: ``(make_layer, whether the layer is given a key of its own)``."""
    attention = keras.layers
    return {
        "additive": (lambda: attention.AdditiveAttention(), False),
        "additive_with_key": (lambda: attention.AdditiveAttention(), True),
        "dot_scaled": (lambda: attention.Attention(use_scale=True), True),
        "concat": (lambda: attention.Attention(score_mode="concat"), False),
        "concat_scaled": (lambda: attention.Attention(use_scale=True, score_mode="concat"), True),
    }


def attention_model(keras, layer, own_key: bool, **call_kwargs):
    """Queries [B, 4, 3] from the input; values (and keys) of another length, 3, from a convolution; the layer's
    weights set to values of both signs (a rule must not assume its initial ones)."""
    keras.utils.set_random_seed(0)
    inputs = keras.layers.Input((4, 3))
    query = keras.layers.Dense(3, activation="tanh")(inputs)
    value = keras.layers.Conv1D(3, 2)(inputs)
    attended = layer([query, value, keras.layers.Dense(3)(value)] if own_key else [query, value], **call_kwargs)
    model = keras.Model(inputs, keras.layers.Dense(3)(keras.layers.Flatten()(attended)))
    rng = np.random.default_rng(1)
    for weight in layer.trainable_weights:
        weight.assign(rng.normal(size=weight.shape).astype(np.float32) * 2)
    return model


def model_with(keras, name: str) -> tuple:
    """``(model, layer)``: `attention_model` around a new layer of `layers`' configuration ``name``."""
    make_layer, own_key = layers(keras)[name]
    layer = make_layer()
    return attention_model(keras, layer, own_key), layer


def masked_model(keras):
    """The padding mask of ``Embedding(mask_zero=True)`` reaches an AdditiveAttention through its inputs, not its
    call's arguments (ids in [0, 6), [B, 4])."""
    keras.utils.set_random_seed(0)
    ids = keras.layers.Input((4,), dtype="int32")
    embedded = keras.layers.Embedding(6, 3, mask_zero=True)(ids)
    attended = keras.layers.AdditiveAttention()([keras.layers.Dense(3)(embedded), embedded])
    return keras.Model(ids, keras.layers.Dense(3)(keras.layers.GlobalAveragePooling1D()(attended)))


def uncovered(keras) -> dict:
    """Models whose attention call the rule cannot reproduce, by name: dropout, a causal mask, a padding mask."""
    attention = keras.layers
    return {
        "dropout": lambda: attention_model(keras, attention.AdditiveAttention(dropout=0.5), own_key=False),
        "causal_mask": lambda: attention_model(
            keras, attention.Attention(use_scale=True), own_key=False, use_causal_mask=True
        ),
        "padding_mask": lambda: masked_model(keras),
    }


def data(rows: int, padding_mask: bool = False):
    """``(x, y)`` numpy arrays of ``rows`` examples for `attention_model` (ids for `masked_model`), 3 classes."""
    rng = np.random.default_rng(3)
    x = rng.integers(0, 6, size=(rows, 4)).astype("int32") if padding_mask else rng.normal(size=(rows, 4, 3))
    return x.astype("int32" if padding_mask else "float32"), rng.integers(0, 3, size=rows).astype("int32")
