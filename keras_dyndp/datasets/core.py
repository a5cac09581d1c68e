"""What every loader shares: the in-memory `TaskData`, `DataNotFoundError`, data files inside installed packages,
prepared TensorFlow Datasets (never downloaded) and the fixed train/test split."""

from __future__ import annotations

import dataclasses
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


def package_file(package: str, *parts: str) -> str | None:
    """Path of the data file ``parts`` (path components) inside the installed top-level ``package`` (e.g. 'mlxtend'), or
    None; the package is located, not imported."""
    spec = importlib.util.find_spec(package)
    paths = (os.path.join(folder, *parts) for folder in (spec and spec.submodule_search_locations) or ())
    return next((path for path in paths if os.path.isfile(path)), None)


def load_tfds_arrays(name: str, data_dir: str | None) -> list[tuple[np.ndarray, np.ndarray]]:
    """(features, labels) numpy arrays of the 'train' and 'test' splits of the tfds dataset ``name`` (e.g. 'mnist')
    prepared in ``data_dir`` (None: tfds's default), never downloaded; else DataNotFoundError (also without tfds)."""
    where = data_dir or os.path.join(os.path.expanduser("~"), "tensorflow_datasets")  # tfds's default
    try:
        import tensorflow_datasets as tfds
    except ImportError as error:
        raise DataNotFoundError(f"tensorflow_datasets cannot be imported ({error})") from error
    verbosity = logging.get_verbosity()
    logging.set_verbosity(logging.ERROR)  # tfds warns about empty version folders while it looks.
    try:
        loaded = tfds.load(name, split=["train", "test"], data_dir=data_dir, download=False, as_supervised=True)
    except AssertionError as error:  # tfds's way of saying "not prepared in data_dir".
        raise DataNotFoundError(f"tfds dataset {name!r} is not prepared in {where}") from error
    finally:
        logging.set_verbosity(verbosity)
    batches = [tfds.as_numpy(split.batch(4096)) for split in loaded]
    return [tuple(map(np.concatenate, zip(*split_batches))) for split_batches in batches]


def missing_folders(root: str, classes: Sequence[str]) -> list[str]:
    """The folders ``root/{train,test}/<class>`` of a class-per-folder tree that do not exist."""
    folders = [os.path.join(root, split, name) for split in ("train", "test") for name in classes]
    return [folder for folder in folders if not os.path.isdir(folder)]


def split_train_test(x: np.ndarray, y: np.ndarray, test_fraction: float, seed: int = 0):
    """A fixed stratified split (seed 0 by default, independent of the training seed) of arrays x, y."""
    from sklearn import model_selection

    return model_selection.train_test_split(x, y, test_size=test_fraction, random_state=seed, stratify=y)
