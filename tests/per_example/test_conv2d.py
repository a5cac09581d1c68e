"""conv2d: the image patches behind the Conv2D rule (its norms are tested against the brute force in
test_clipped_sum)."""

import numpy as np
import pytest
import tensorflow as tf

from keras_dyndp.keras_compat import keras
from keras_dyndp.per_example import conv2d


@pytest.mark.parametrize(
    "shape,kernel,strides,dilation,padding",
    [
        ((2, 9, 8, 3), (3, 2), (2, 2), (1, 1), "same"),
        ((1, 10, 7, 2), (3, 3), (1, 1), (2, 2), "valid"),
        ((2, 11, 11, 1), (4, 4), (3, 2), (1, 1), "same"),
    ],
)
def test_image_patches_match_extract_patches(shape, kernel, strides, dilation, padding):
    window = conv2d.Window.of(keras.layers.Conv2D(2, kernel, strides=strides, dilation_rate=dilation, padding=padding))
    inputs = tf.constant(np.random.default_rng(3).normal(size=shape), tf.float32)
    expected = tf.image.extract_patches(inputs, [1, *kernel, 1], [1, *strides, 1], [1, *dilation, 1], padding.upper())
    actual = conv2d.image_patches(window, inputs)
    np.testing.assert_array_equal(actual.numpy(), tf.reshape(expected, actual.shape).numpy())
    # An unknown image size takes tf.image.extract_patches.
    unknown_size = tf.function(
        lambda t: conv2d.image_patches(window, t),
        input_signature=[tf.TensorSpec([None, None, None, shape[-1]], tf.float32)],
    )
    np.testing.assert_array_equal(unknown_size(inputs).numpy(), actual.numpy())
