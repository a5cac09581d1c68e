"""The models and synthetic batches the step-time benchmarks time, for any Keras module (``tf.keras`` or Keras 3 on
TensorFlow or JAX): each builder takes the ``keras`` module and returns the layers of a ``keras.Sequential``.

cnn: TF-Privacy's MNIST tutorial CNN (the paper's). lstm: a small sequence classifier (names-like). text: embedding
+ average pooling + dense (IMDB-like). wrn: a WideResNet-16-4 on CIFAR-10-shaped inputs (Zagoruyko & Komodakis
2016) with GroupNormalization instead of batch normalisation (which DP-SGD refuses), as in De et al. 2022; built as
a functional model (``wide_resnet``), so it is not in `LAYERS`. transformer: a small text transformer (token
embedding, learned positions, two post-norm blocks of MultiHeadAttention and a ReLU feed-forward, average pooling,
Dense). vit: the same blocks over the 64 4x4 patches of a 32x32x3 image (a small ViT, Dosovitskiy et al. 2021, with
average pooling instead of a class token). Both are functional (`FUNCTIONAL`); `build` makes any model by name.

Learned positions are the bias of an EinsumDense over the position and feature axes (``bias_axes`` ``"te"``): ``x W +
P`` with P one learned vector per position, a layer the ghost rules already cover (a custom position layer would send
the whole model to the vectorized path on TensorFlow). In the ViT the same layer is the patch embedding (a Dense over
each flattened patch) plus the positions.
"""

from __future__ import annotations

from typing import Any

import numpy as np

LSTM_VOCAB, LSTM_LENGTH = 1000, 40
TEXT_VOCAB, TEXT_LENGTH = 10000, 256
TRANSFORMER_LENGTH, TRANSFORMER_WIDTH, TRANSFORMER_HEADS = 64, 64, 4
IMAGE_SIZE, PATCH_SIZE = 32, 4


def cnn_layers(keras: Any) -> list:
    return [
        keras.layers.InputLayer((28, 28, 1)),  # Positional: `input_shape` on Keras 2, `shape` on 3.
        keras.layers.Conv2D(16, 8, strides=2, padding="same", activation="relu"),
        keras.layers.MaxPool2D(2, 1),
        keras.layers.Conv2D(32, 4, strides=2, padding="valid", activation="relu"),
        keras.layers.MaxPool2D(2, 1),
        keras.layers.Flatten(),
        keras.layers.Dense(32, activation="relu"),
        keras.layers.Dense(10),
    ]


def lstm_layers(keras: Any) -> list:
    return [
        keras.layers.InputLayer((LSTM_LENGTH,)),
        keras.layers.Embedding(LSTM_VOCAB, 32),
        keras.layers.LSTM(32),
        keras.layers.Dense(10),
    ]


def text_layers(keras: Any) -> list:
    return [
        keras.layers.InputLayer((TEXT_LENGTH,)),
        keras.layers.Embedding(TEXT_VOCAB, 16),
        keras.layers.GlobalAveragePooling1D(),
        keras.layers.Dense(16, activation="relu"),
        keras.layers.Dense(2),
    ]


LAYERS = {"cnn": cnn_layers, "lstm": lstm_layers, "text": text_layers}


def wide_resnet(keras: Any, depth: int = 16, width: int = 4, groups: int = 16) -> Any:
    """WRN-depth-width for 32x32x3 inputs and 10 classes, GroupNormalization(groups) before each convolution."""
    blocks_per_stage = (depth - 4) // 6

    def norm_relu(h):
        return keras.layers.Activation("relu")(keras.layers.GroupNormalization(groups)(h))

    inputs = keras.Input((32, 32, 3))
    h = keras.layers.Conv2D(16, 3, padding="same")(inputs)
    for stage, filters in enumerate((16 * width, 32 * width, 64 * width)):
        for block in range(blocks_per_stage):
            strides = 2 if stage > 0 and block == 0 else 1
            shortcut = h
            h = norm_relu(h)
            if block == 0:
                shortcut = keras.layers.Conv2D(filters, 1, strides=strides)(h)
            h = keras.layers.Conv2D(filters, 3, strides=strides, padding="same")(h)
            h = keras.layers.Conv2D(filters, 3, padding="same")(norm_relu(h))
            h = keras.layers.Add()([h, shortcut])
    h = keras.layers.GlobalAveragePooling2D()(norm_relu(h))
    return keras.Model(inputs, keras.layers.Dense(10)(h), name=f"wrn_{depth}_{width}")


def positions(keras: Any, h: Any, length: int, width: int) -> Any:
    """``h W + P`` for ``h`` [B, length, features]: W [features, width], P [length, width] learned (EinsumDense's
    bias over the position and feature axes)."""
    return keras.layers.EinsumDense("btf,fe->bte", output_shape=(length, width), bias_axes="te")(h)


def transformer_block(keras: Any, h: Any, width: int, heads: int) -> Any:
    """Post-norm: LayerNorm(h + MHA(h, h)), then LayerNorm(h + Dense(width)(Dense(2 width, relu)(h)))."""
    layers = keras.layers
    attention = layers.MultiHeadAttention(heads, width // heads)(h, h)
    h = layers.LayerNormalization()(layers.Add()([h, attention]))
    feed_forward = layers.Dense(width)(layers.Dense(2 * width, activation="relu")(h))
    return layers.LayerNormalization()(layers.Add()([h, feed_forward]))


def transformer(
    keras: Any,
    vocabulary: int = TEXT_VOCAB,
    length: int = TRANSFORMER_LENGTH,
    width: int = TRANSFORMER_WIDTH,
    heads: int = TRANSFORMER_HEADS,
    blocks: int = 2,
    outputs: int = 2,
) -> Any:
    """Token ids [B, length] -> logits [B, outputs]: Embedding, learned positions, `blocks` blocks, average pooling."""
    inputs = keras.Input((length,), dtype="int32")
    h = positions(keras, keras.layers.Embedding(vocabulary, width)(inputs), length, width)
    for _ in range(blocks):
        h = transformer_block(keras, h, width, heads)
    h = keras.layers.GlobalAveragePooling1D()(h)
    return keras.Model(inputs, keras.layers.Dense(outputs)(h), name="transformer")


def vit(keras: Any, width: int = TRANSFORMER_WIDTH, heads: int = TRANSFORMER_HEADS, blocks: int = 2) -> Any:
    """Images [B, 32, 32, 3] -> 10 logits: 64 patches of 4x4x3, each embedded by one Dense plus its learned
    position, `blocks` blocks, average pooling."""
    side = IMAGE_SIZE // PATCH_SIZE
    inputs = keras.Input((IMAGE_SIZE, IMAGE_SIZE, 3))
    h = keras.layers.Reshape((side, PATCH_SIZE, side, PATCH_SIZE, 3))(inputs)
    h = keras.layers.Permute((1, 3, 2, 4, 5))(h)  # [B, row, column, patch row, patch column, channel]
    h = keras.layers.Reshape((side * side, PATCH_SIZE * PATCH_SIZE * 3))(h)
    h = positions(keras, h, side * side, width)
    for _ in range(blocks):
        h = transformer_block(keras, h, width, heads)
    h = keras.layers.GlobalAveragePooling1D()(h)
    return keras.Model(inputs, keras.layers.Dense(10)(h), name="vit")


FUNCTIONAL = {"wrn": wide_resnet, "transformer": transformer, "vit": vit}
NAMES = (*LAYERS, *FUNCTIONAL)


def build(keras: Any, name: str) -> Any:
    """Model ``name`` (among `NAMES`): a ``keras.Sequential`` of `LAYERS`, or a functional model of `FUNCTIONAL`."""
    if name in FUNCTIONAL:
        return FUNCTIONAL[name](keras)
    return keras.Sequential(LAYERS[name](keras))


def make_data(name: str, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """A fixed synthetic batch (numpy inputs, int32 labels) for model ``name``."""
    rng = np.random.default_rng(0)
    if name == "cnn":
        x = rng.normal(size=(batch_size, 28, 28, 1)).astype(np.float32)
        y = rng.integers(0, 10, size=batch_size)
    elif name == "transformer":
        x = rng.integers(0, TEXT_VOCAB, size=(batch_size, TRANSFORMER_LENGTH)).astype(np.int32)
        y = rng.integers(0, 2, size=batch_size)
    elif name in ("wrn", "vit"):
        x = rng.normal(size=(batch_size, 32, 32, 3)).astype(np.float32)
        y = rng.integers(0, 10, size=batch_size)
    elif name == "lstm":
        x = rng.integers(0, LSTM_VOCAB, size=(batch_size, LSTM_LENGTH))
        y = rng.integers(0, 10, size=batch_size)
    else:
        x = rng.integers(0, TEXT_VOCAB, size=(batch_size, TEXT_LENGTH))
        y = rng.integers(0, 2, size=batch_size)
    return x, y.astype(np.int32)


def compile_private(keras: Any, model: Any, batch_size: int, num_examples: int, learning_rate: float = 0.05) -> Any:
    """``model`` (made private by the caller, with its method) compiled with `keras_dyndp.DynamicDPKerasSGD` on a
    constant schedule (C = 1, sigma = 1, p = batch_size / num_examples, 100,000 steps: never spent in a benchmark)
    and a per-example loss."""
    import keras_dyndp  # pylint: disable=import-outside-toplevel
    from keras_dyndp import schedules  # pylint: disable=import-outside-toplevel

    num_steps = 100_000
    schedule = schedules.DPSchedule(np.ones(num_steps), np.ones(num_steps), batch_size / num_examples)
    model.compile(
        optimizer=keras_dyndp.DynamicDPKerasSGD(
            schedule=schedule, expected_batch_size=batch_size, learning_rate=learning_rate
        ),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none"),
    )
    return model


def ghost_coverage(model: Any, x: Any) -> str:
    """Which layers keras_dyndp's DP step clips by a ghost rule, on the backend Keras runs on: on TensorFlow all or
    none (the ghost path, else per-example gradients), on JAX each tapped layer (the others by vmap)."""
    import keras_dyndp  # pylint: disable=import-outside-toplevel

    if keras_dyndp.keras_backend() != "jax":
        from keras_dyndp.tf_backend.per_example import clipped_sum  # pylint: disable=import-outside-toplevel
        from keras_dyndp.tf_backend.per_example import graph_rows  # pylint: disable=import-outside-toplevel
        from keras_dyndp.tf_backend.per_example import per_example_layers  # pylint: disable=import-outside-toplevel

        if clipped_sum._ghost_applies(model, x, model.trainable_variables, "auto"):  # pylint: disable=protected-access
            unknown = per_example_layers.first_unknown(model)  # make_private's own decision, not a copy of it
            return f"ghost path ({unknown} proven per example from the traced graph)" if unknown else "ghost path"
        unknown = per_example_layers.first_unknown(model)
        if unknown and (mixing := graph_rows.first_mixing_op(model, x)):
            return f"per-example path ({unknown} is not known to act per example: {mixing})"
        return "per-example path (a trainable layer without a rule)"
    from keras_dyndp.jax_backend.per_example import taps  # pylint: disable=import-outside-toplevel

    values = [[v.value for v in variables] for variables in (model.trainable_variables, model.non_trainable_variables)]
    tapped = taps.tappable(model, *values, x)
    trained = [layer for layer in model._flatten_layers() if layer.trainable_weights and not layer._layers]  # pylint: disable=protected-access
    return f"layers clipped by ghost rules: {len(tapped)} of {len(trained)} trained"
