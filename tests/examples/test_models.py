"""Tests for examples/models.py: each model is the one its docstring names (layers, parameter counts from the
architecture, logits out), on whichever Keras the stack trains with."""

import numpy as np
import pytest

from examples import models
from keras_dyndp import datasets


def _parameters(model) -> int:
    return int(sum(np.prod(weight.shape) for weight in model.trainable_weights))


def _conv(kernel: int, channels_in: int, channels_out: int) -> int:
    return kernel * kernel * channels_in * channels_out + channels_out


@pytest.mark.parametrize("uint8", [False, True])
def test_the_paper_mnist_cnn_has_tf_privacy_tutorials_parameters(uint8):
    model = models.mnist_cnn(10, uint8=uint8)
    # conv 16@8x8 s2 (28 -> 14), pool s1 (13), conv 32@4x4 s2 valid (5), pool s1 (4): 4 * 4 * 32 into dense 32.
    expected = _conv(8, 1, 16) + _conv(4, 16, 32) + (4 * 4 * 32 * 32 + 32) + (32 * 10 + 10)
    assert _parameters(model) == expected == 26_010
    assert model.output_shape == (None, 10)
    assert ("uint8" in str(model.inputs[0].dtype)) == uint8
    images = np.zeros((2, 28, 28, 1), "uint8" if uint8 else "float32")
    assert model.predict(images, verbose=0).shape == (2, 10)


def test_the_digits_cnn():
    model = models.digits_cnn((8, 8, 1), 10)
    assert _parameters(model) == _conv(3, 1, 16) + (4 * 4 * 16 * 32 + 32) + (32 * 10 + 10)
    assert model.output_shape == (None, 10)


def test_the_names_lstm():
    model = models.names_lstm(20, 18)
    lstm = 4 * (128 * (64 + 128) + 128)
    assert _parameters(model) == datasets.NUM_CHAR_IDS * 64 + lstm + (128 * 18 + 18)
    assert model.input_shape == (None, 20) and model.output_shape == (None, 18)


def test_the_imdb_network():
    model = models.imdb_mlp(256, 10_000)
    assert _parameters(model) == 10_000 * 16 + (16 * 16 + 16) + (16 + 1)
    assert model.input_shape == (None, 256) and model.output_shape == (None, 1)


@pytest.mark.parametrize("width", [1.0, 1 / 16])
def test_vgg11_has_no_batch_statistic_and_scales_its_widths(width):
    model = models.vgg11((32, 32, 3), width)
    convolutions = [layer for layer in model.layers if "Conv2D" in type(layer).__name__]
    widths = [max(1, round(item * width)) for item in models.VGG11 if item != "M"]
    assert [layer.filters for layer in convolutions] == widths
    assert not any("Normalization" in type(layer).__name__ for layer in model.layers)  # none mixes examples
    assert model.output_shape == (None, 1)
