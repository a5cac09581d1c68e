"""Tests for examples/digits_cnn.py: the digits CNN both digits examples build."""

import numpy as np

from examples import digits_cnn
from keras_dyndp.keras_compat import keras


def test_the_cnn_maps_8x8_images_to_one_logit_per_class():
    model = digits_cnn.build(keras, (8, 8, 1), 10)
    assert [type(layer).__name__ for layer in model.layers] == [
        "Conv2D",
        "MaxPooling2D",
        "Flatten",
        "Dense",
        "Dense",
    ]
    logits = model(np.zeros((3, 8, 8, 1), "float32"))
    assert tuple(logits.shape) == (3, 10)
    assert model.layers[-1].get_config()["activation"] == "linear"  # logits, for from_logits=True losses
