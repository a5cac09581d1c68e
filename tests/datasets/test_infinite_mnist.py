"""Tests for keras_dyndp.datasets.infinite_mnist: seeded deformations and the clients' generated images."""

import numpy as np
import pytest

from keras_dyndp.datasets import infinite_mnist


def test_deform_keeps_shape_range_and_is_seeded():
    images = np.zeros((5, 28, 28))
    images[:, 10:18, 12:16] = 1.0
    first = infinite_mnist.deform(images, np.random.default_rng(3))
    again = infinite_mnist.deform(images, np.random.default_rng(3))
    other = infinite_mnist.deform(images, np.random.default_rng(4))
    assert first.shape == images.shape and first.min() >= 0.0 and first.max() <= 1.0
    np.testing.assert_array_equal(first, again)
    assert not np.allclose(first, other)
    assert not np.allclose(first[0], first[1])  # Every image gets its own transformation.
    # A moderate deformation moves ink around but keeps most of it.
    assert np.all(np.abs(first.sum(axis=(1, 2)) / images[0].sum() - 1) < 0.5)


def test_identity_deformation_returns_the_image():
    image = np.random.default_rng(0).random((2, 28, 28))
    out = infinite_mnist.deform(
        image,
        np.random.default_rng(0),
        max_rotation_deg=0,
        max_shear=0,
        scale_range=(1, 1),
        max_shift=0,
        elastic_alpha=0,
    )
    np.testing.assert_allclose(out, image, atol=1e-12)


@pytest.mark.parametrize("images_per_client", [1, 3])
def test_generate_clients_shapes_and_labels(images_per_client):
    base = np.random.default_rng(0).random((7, 28, 28, 1))
    labels = np.arange(7)
    x, y = infinite_mnist.generate_clients(base, labels, 10, images_per_client, seed=0)
    if images_per_client == 1:
        assert x.shape == (10, 28, 28, 1) and y.shape == (10,)
    else:
        assert x.shape == (10, 3, 28, 28, 1) and y.shape == (10, 3)
    assert x.dtype == np.uint8 and set(y.ravel()) <= set(labels)
    x_again, y_again = infinite_mnist.generate_clients(base, labels, 10, images_per_client, seed=0)
    np.testing.assert_array_equal(x, x_again)
    np.testing.assert_array_equal(y, y_again)
