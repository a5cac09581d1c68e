"""Tiny MNIST-format IDX folders for the tests of the loaders, the research trainers and the examples."""

import numpy as np

from keras_dyndp.datasets import mnist


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
        mnist.write_idx(str(directory / (stem + suffix)), arrays[key])
    return arrays
