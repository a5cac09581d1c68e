"""Tests for keras_dyndp.datasets.mnist's IDX files (the loaders' sources and fallbacks are exercised through the
research trainers in tests/research/test_mnist.py)."""

import numpy as np
import pytest
from idx_files import write_idx_folder

from keras_dyndp.datasets import mnist


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
