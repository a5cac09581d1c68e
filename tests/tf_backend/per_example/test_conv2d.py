"""conv2d: the image patches behind the Conv2D rule, and its two forms for a 1-channel input (the rule's norms are
tested against the brute force in test_builtin_rules)."""

import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from keras_dyndp.tf_backend.keras_compat import keras
from keras_dyndp.tf_backend.per_example import conv2d
from keras_dyndp.tf_backend.per_example.taps import Rows


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


@pytest.mark.parametrize("filters,onednn,depthwise", [(15, False, True), (16, False, False), (16, True, True)])
def test_one_channel_forms_agree_and_the_rule_picks_by_output_channels(filters, onednn, depthwise, monkeypatch):
    monkeypatch.setattr(conv2d, "onednn_enabled", lambda: onednn)
    window = conv2d.Window.of(keras.layers.Conv2D(filters, 3, strides=2, padding="same"))
    rng = np.random.default_rng(4)
    inputs = tf.constant(rng.normal(size=(6, 9, 9, 1)), tf.float32)
    g = tf.constant(rng.normal(size=(6, 5, 5, filters)), tf.float32)
    factors = tf.constant(rng.uniform(size=6), tf.float32)
    rows = Rows.of_batch(inputs)
    assert conv2d.one_channel_by_depthwise_filter(window, inputs, g) == depthwise
    by_depthwise = conv2d.depthwise_filter_norms_and_sum(window, inputs, g, rows)
    by_patches = conv2d.patch_norms_and_sum(window, inputs, g, rows)
    np.testing.assert_allclose(by_depthwise[0].numpy(), by_patches[0].numpy(), rtol=1e-5)
    np.testing.assert_allclose(
        tf.reshape(by_depthwise[1](factors), [3, 3, 1, filters]).numpy(),
        tf.reshape(by_patches[1](factors), [3, 3, 1, filters]).numpy(),
        rtol=1e-5,
        atol=1e-5,
    )
    # Neither form applies to more than one input channel.
    assert not conv2d.one_channel_by_depthwise_filter(window, tf.concat([inputs, inputs], axis=-1), g)


@pytest.mark.parametrize("setting,expected", [("0", False), ("1", True)])
def test_onednn_state_follows_tf_enable_onednn_opts(setting, expected):
    """TF reads TF_ENABLE_ONEDNN_OPTS at import, so each setting needs a fresh process."""
    code = "from keras_dyndp.tf_backend.per_example import conv2d; print(conv2d.onednn_enabled())"
    env = {**os.environ, "TF_ENABLE_ONEDNN_OPTS": setting, "TF_CPP_MIN_LOG_LEVEL": "3"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert result.stdout.strip().splitlines()[-1] == str(expected)
