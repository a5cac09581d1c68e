"""The digits demo's small CNN, for either backend's example (`examples.digits`, `examples.jax_digits`)."""

from typing import Any


def build(keras: Any, input_shape: tuple, num_classes: int) -> Any:
    """conv 16@3x3 (ReLU), max-pool 2x2, dense 32 (ReLU), dense ``num_classes``; logits. ``keras`` is the Keras
    module of the caller's backend (tf.keras on Keras 2)."""
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
