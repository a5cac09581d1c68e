"""Dynamic DP-SGD on the NAME task: which of 18 languages a surname comes from, with a character LSTM (Table 3).

Model (appendix "NAME"): embedding 64, one LSTM layer of 128 units, a dense layer to the languages. SGD with
learning rate 2, C_0 = 1.5, 50 epochs, delta = 1 / (10 N). The expected batch of 250 is ours. Default epsilon 4
(the paper reports 1, 2, 4, 8).

Data: ``--names_dir``, a folder of ``<Language>.txt`` files with one name per line (UTF-8), as in the PyTorch
char-RNN tutorial's data/names (https://download.pytorch.org/tutorial/data.zip). A fixed stratified 80/20 split
(seed 0) gives the training and test sets. Names are folded to ASCII (accents dropped), encoded with a fixed
alphabet (letters and " .,;'-"), cut to ``--max_name_length`` characters and left-padded with 0 to that length (so
that the LSTM's last state follows the last character). The alphabet and the length are public constants: the
encoding, and the model's input shape, read nothing from the private data.

    python -m examples.names --names_dir=/data/names --epsilon=2
"""

from __future__ import annotations

import glob
import os
import string
import sys
import unicodedata

import numpy as np
from absl import flags

if __package__ in (None, ""):  # Run as `python examples/NAME.py`: make the package `examples` importable.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from examples import datasets
from examples import training
from keras_dyndp.keras_compat import keras

flags.adopt_module_key_flags(training)  # --helpshort lists the shared training flags too.

flags.DEFINE_string("names_dir", None, "Folder of <Language>.txt files, one name per line.")
flags.DEFINE_integer(
    "max_name_length",
    20,
    "Input length, >= 1: names are cut and left-padded to this many characters. A public constant "
    "(never the longest training name, which would publish a fact about the private data).",
    lower_bound=1,
)

FLAGS = flags.FLAGS

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
        if codes:
            ids[row, length - len(codes) :] = codes
    return ids


def load_data() -> datasets.TaskData:
    """Names from --names_dir, encoded, split 80/20."""
    directory = FLAGS.names_dir
    how_to_get = (
        "Get it with: download https://download.pytorch.org/tutorial/data.zip, extract it and pass "
        "--names_dir=.../data/names (18 files such as English.txt, one name per line)."
    )
    if not directory:
        raise datasets.DataNotFoundError(f"names: no --names_dir given. {how_to_get}")
    files = sorted(glob.glob(os.path.join(directory, "*.txt")))
    if len(files) < 2:
        raise datasets.DataNotFoundError(
            f"names: --names_dir={directory} holds {len(files)} <Language>.txt files (need >= 2). {how_to_get}"
        )
    names, labels, languages = [], [], []
    for label, path in enumerate(files):
        languages.append(os.path.splitext(os.path.basename(path))[0])
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                if line.strip():
                    names.append(line.strip())
                    labels.append(label)
    x_train, x_test, y_train, y_test = datasets.split_train_test(
        encode(names, FLAGS.max_name_length), np.array(labels, dtype=np.int64), 0.2
    )
    return datasets.TaskData(
        x_train=x_train,
        y_train=y_train,
        x_test=x_test,
        y_test=y_test,
        num_classes=len(languages),
        description=f"names from {directory}: {len(languages)} languages, {len(y_train)} training / "
        f"{len(y_test)} test names",
    )


def build_model(data: datasets.TaskData) -> keras.Model:
    """Character embedding 64, LSTM 128, dense to the languages (logits)."""
    return keras.Sequential(
        [
            keras.layers.Input(data.x_train.shape[1:], dtype="int32"),
            keras.layers.Embedding(NUM_CHAR_IDS, 64),
            keras.layers.LSTM(128),
            keras.layers.Dense(data.num_classes),
        ]
    )


def make_task() -> training.Task:
    """NAME with the paper's settings."""
    return training.Task(
        name="names",
        load_data=load_data,
        build_model=build_model,
        epsilon=4.0,
        learning_rate=2.0,
        initial_clip=1.5,
        batch_size=250,
        epochs=50,
        rho_mu=1 / 0.8,
        rho_c=1 / 0.3,
    )


if __name__ == "__main__":
    training.run(make_task)
