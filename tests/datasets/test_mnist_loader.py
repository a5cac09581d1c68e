"""Tests for keras_dyndp.datasets.mnist's IDX files (the loaders' sources and fallbacks are exercised through the
research trainers in tests/research/test_mnist.py)."""

import numpy as np
import pytest

from keras_dyndp.datasets import mnist


def write_idx_folder(directory, num_train=60, num_test=20, gzip=True):
    """The four IDX files of random images and labels in `directory`; returns the arrays."""
    rng = np.random.default_rng(0)
    suffix = ".gz" if gzip else ""
    arrays = {
        "x_train": rng.integers(0, 256, (num_train, 28, 28)),
        "y_train": rng.integers(0, 10, num_train),
        "x_test": rng.integers(0, 256, (num_test, 28, 28)),
        "y_test": rng.integers(0, 10, num_test),
    }
    for key, stem in mnist.IDX_FILES.items():
        mnist.write_idx(str(directory / (stem + suffix)), arrays[key])
    return arrays


@pytest.mark.parametrize("gzip", [True, False])
def test_idx_round_trip(tmp_path, gzip):
    arrays = write_idx_folder(tmp_path, gzip=gzip)
    loaded = mnist.load_idx_directory(str(tmp_path))
    for key, array in arrays.items():
        np.testing.assert_array_equal(loaded[key], array)
        assert loaded[key].dtype == np.uint8


def test_read_idx_rejects_other_files(tmp_path):
    path = tmp_path / "bad"
    path.write_bytes(b"\x01\x02\x03\x04rest")
    with pytest.raises(ValueError, match="not an IDX file"):
        mnist.read_idx(str(path))


def test_an_explicit_idx_dir_without_the_files_names_it_and_the_remedy(tmp_path):
    with pytest.raises(mnist.DataNotFoundError) as error:
        mnist.load_mnist(idx_dir=str(tmp_path))
    message = str(error.value)
    assert f"--idx_dir={tmp_path}" in message and "Get it with:" in message and len(message.splitlines()) == 1
