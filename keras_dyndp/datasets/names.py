"""Surnames of 18 languages (the NAME task of the PyTorch char-RNN tutorial) from a folder of <Language>.txt files,
folded to ASCII and encoded with a fixed public alphabet."""

from __future__ import annotations

import glob
import os
import string
import unicodedata

import numpy as np

from keras_dyndp.datasets.core import DataNotFoundError
from keras_dyndp.datasets.core import TaskData
from keras_dyndp.datasets.core import split_train_test

ALPHABET = string.ascii_letters + " .,;'-"
_CHAR_IDS = {char: index + 1 for index, char in enumerate(ALPHABET)}  # 0 is padding.
NUM_CHAR_IDS = len(ALPHABET) + 2  # Padding, the alphabet, and one id for any other character.


def to_ascii(name: str) -> str:
    """Drops accents (NFD decomposition without combining marks), as the PyTorch tutorial does."""
    return "".join(char for char in unicodedata.normalize("NFD", name) if unicodedata.category(char) != "Mn")


def encode(names: list[str], length: int) -> np.ndarray:
    """Left-padded character ids [len(names), length]; characters outside the alphabet share one id."""
    ids = np.zeros((len(names), length), dtype=np.int32)
    for row, name in enumerate(names):
        codes = [_CHAR_IDS.get(char, NUM_CHAR_IDS - 1) for char in to_ascii(name)[:length]]
        ids[row, length - len(codes) :] = codes  # An empty name (no codes) stays all padding.
    return ids


def load_names(directory: str | None, max_name_length: int = 20) -> TaskData:
    """Names from `directory` (--names_dir), encoded (`encode`) to `max_name_length` characters, split 80/20."""
    how_to_get = (
        "Get it with: download https://download.pytorch.org/tutorial/data.zip, extract it and pass "
        "--names_dir=.../data/names (18 files such as English.txt, one name per line)."
    )
    if not directory:
        raise DataNotFoundError(f"names: no --names_dir given. {how_to_get}")
    files = sorted(glob.glob(os.path.join(directory, "*.txt")))
    if len(files) < 2:
        raise DataNotFoundError(
            f"names: --names_dir={directory} holds {len(files)} <Language>.txt files (need >= 2). {how_to_get}"
        )
    names, labels = [], []
    for label, path in enumerate(files):
        with open(path, encoding="utf-8") as handle:
            read = [line.strip() for line in handle if line.strip()]
        names, labels = names + read, labels + [label] * len(read)
    x_train, x_test, y_train, y_test = split_train_test(encode(names, max_name_length), np.array(labels, np.int64), 0.2)
    description = f"names from {directory}: {len(files)} languages, {len(y_train)} training / {len(y_test)} test names"
    return TaskData(x_train, y_train, x_test, y_test, num_classes=len(files), description=description)
