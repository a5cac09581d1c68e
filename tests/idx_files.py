"""Tiny MNIST-format IDX folders for the tests of the loaders, the research trainers and the examples."""

import gzip as gzip_module

import numpy as np

from keras_dyndp.datasets import mnist


def write_idx(path: str, array) -> None:
    """Writes a uint8 array as an IDX file (gzip-compressed when `path` ends in '.gz')."""
    array = np.asarray(array, dtype=np.uint8)
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(n).to_bytes(4, "big") for n in array.shape)
    opener = gzip_module.open if path.endswith(".gz") else open
    with opener(path, "wb") as handle:
        handle.write(header + array.tobytes())


def write_idx_folder(directory, num_train=60, num_test=20, gzip=True):
    """The four IDX files of random 28x28 images and labels (seed 0) in `directory` (a pathlib.Path), gzipped unless
    `gzip` is False; returns the arrays by `mnist.IDX_FILES` key."""
    rng = np.random.default_rng(0)
    suffix = ".gz" if gzip else ""
    arrays = {
        "x_train": rng.integers(0, 256, (num_train, 28, 28)),
        "y_train": rng.integers(0, 10, num_train),
        "x_test": rng.integers(0, 256, (num_test, 28, 28)),
        "y_test": rng.integers(0, 10, num_test),
    }
    for key, stem in mnist.IDX_FILES.items():
        write_idx(str(directory / (stem + suffix)), arrays[key])
    return arrays
