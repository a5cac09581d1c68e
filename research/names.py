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

    python -m research.names --names_dir=/data/names --epsilon=2
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

flags.DEFINE_string("names_dir", None, "Folder of <Language>.txt files, one name per line.")
flags.DEFINE_integer(
    "max_name_length",
    20,
    "Input length, >= 1: names are cut and left-padded to this many characters. A public constant "
    "(never the longest training name, which would publish a fact about the private data).",
    lower_bound=1,
)

FLAGS = flags.FLAGS


def load_data() -> datasets.TaskData:
    """Names from --names_dir, encoded, split 80/20."""
    return datasets.load_names(FLAGS.names_dir, FLAGS.max_name_length)


def build_model(data: datasets.TaskData) -> keras.Model:
    """The character LSTM (`examples.models.names_lstm`) for the encoded names' length and the languages."""
    return models.names_lstm(data.x_train.shape[1], data.num_classes)


def make_task() -> run_config.Task:
    """NAME with the paper's settings."""
    return run_config.Task(
        name="names",
        load_data=load_data,
        build_model=build_model,
        epsilon=4.0,
        learning_rate=2.0,
        initial_clip=1.5,
        batch_size=250,
        epochs=50,
    )


if __name__ == "__main__":
    trainer.run(make_task)
