"""The models the examples (and research's tasks) train, written once, in the Keras that keras_dyndp trains with
(``keras`` on JAX, the TensorFlow stack's otherwise). All end in logits: the softmax (or sigmoid) is in the loss."""

from keras_dyndp import datasets
from keras_dyndp.backend import keras_module

keras = keras_module()


def mnist_cnn(num_classes: int = 10, uint8: bool = False) -> keras.Model:
    """The paper's MNIST CNN, TF-Privacy's and Opacus's: conv 16@8x8 stride 2, max-pool 2x2 stride 1, conv 32@4x4
    stride 2, max-pool 2x2 stride 1, dense 32, dense to the classes; on [28, 28, 1] float images in [0, 1], or on
    uint8 ones rescaled by the model (``uint8``)."""
    head = [keras.layers.Input((28, 28, 1), dtype="uint8" if uint8 else None)]
    head += [keras.layers.Rescaling(1 / 255.0)] if uint8 else []
    return keras.Sequential(
        [
            *head,
            keras.layers.Conv2D(16, 8, strides=2, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(2, strides=1),
            keras.layers.Conv2D(32, 4, strides=2, padding="valid", activation="relu"),
            keras.layers.MaxPooling2D(2, strides=1),
            keras.layers.Flatten(),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dense(num_classes),
        ]
    )


def digits_cnn(input_shape: tuple = (8, 8, 1), num_classes: int = 10) -> keras.Model:
    """The small CNN of scikit-learn's 8x8 digits: conv 16@3x3, max-pool 2x2, dense 32, dense to the classes."""
    return keras.Sequential(
        [
            keras.layers.Input(input_shape),
            keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(2),
            keras.layers.Flatten(),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dense(num_classes),
        ]
    )


def names_lstm(name_length: int, num_languages: int) -> keras.Model:
    """The NAME task's character LSTM: embedding 64 of the `datasets.NUM_CHAR_IDS` character ids, LSTM 128, dense to
    the languages; on int32 names of ``name_length`` character ids."""
    return keras.Sequential(
        [
            keras.layers.Input((name_length,), dtype="int32"),
            keras.layers.Embedding(datasets.NUM_CHAR_IDS, 64),
            keras.layers.LSTM(128),
            keras.layers.Dense(num_languages),
        ]
    )


def imdb_mlp(sequence_length: int, max_tokens: int) -> keras.Model:
    """The paper's IMDB network, an embedding and two dense layers: Embedding(max_tokens, 16), global average
    pooling, Dense(16, ReLU), one logit; on int32 reviews of ``sequence_length`` token ids below ``max_tokens``."""
    return keras.Sequential(
        [
            keras.layers.Input((sequence_length,), dtype="int32"),
            keras.layers.Embedding(max_tokens, 16),
            keras.layers.GlobalAveragePooling1D(),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dense(1),
        ]
    )


VGG11 = (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")
"""VGG-11's convolution stack: 3x3 convolutions of these widths, "M" a 2x2 max-pool."""


def vgg11(input_shape: tuple, width: float = 1.0) -> keras.Model:
    """VGG-11 without batch normalisation (it mixes examples, so per-example clipping would not bound one example's
    influence), global average pooling, Dense(512, ReLU), one logit; on uint8 images of ``input_shape`` rescaled to
    [0, 1] by the model. ``width`` (> 0) scales every layer's width (1.0: the real VGG-11; tests use a tiny one)."""
    layers = [keras.layers.Input(input_shape, dtype="uint8"), keras.layers.Rescaling(1 / 255.0)]
    for item in VGG11:
        if item == "M":
            layers.append(keras.layers.MaxPooling2D(2))
        else:
            layers.append(keras.layers.Conv2D(max(1, round(item * width)), 3, padding="same", activation="relu"))
    layers.append(keras.layers.GlobalAveragePooling2D())
    layers.append(keras.layers.Dense(max(1, round(512 * width)), activation="relu"))
    return keras.Sequential(layers + [keras.layers.Dense(1)])
