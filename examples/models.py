"""The two CNNs that several examples train, written once, in the Keras that keras_dyndp trains with (``keras`` on
JAX, the TensorFlow stack's otherwise). Both end in logits: the softmax is in the loss."""

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
