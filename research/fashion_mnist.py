"""Dynamic DP-SGD on Fashion-MNIST: the MNIST setup of the paper with C_0 = 4 (Table 1, epsilon 0.4 / 1.2 / 2.0).

Same CNN, learning rate 0.15, p = 250 / 60000, 20 epochs, delta = 1 / (10 N), 1/rho_mu = 0.8, 1/rho_c = 0.3.

Data, first found wins (nothing is downloaded):
  1. ``--idx_dir``: a folder with the four IDX files;
  2. TensorFlow Datasets 'fashion_mnist' already prepared under ``--data_dir``;
  3. /usr/share/datasets/fashion-mnist, where Debian's ``apt-get install dataset-fashion-mnist`` puts the real
     files, then ~/.keras/datasets/fashion-mnist (``keras.datasets.fashion_mnist`` cache).

    python -m research.fashion_mnist --epsilon=1.2 --method=dynamic --seed=0
"""

import dataclasses
import os
import sys

from absl import flags

if __package__ in (None, ""):  # Run as `python research/NAME.py`: make the package `research` importable.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from keras_dyndp import datasets
from research import mnist
from research import run_config
from research import run_flags
from research import trainer

flags.adopt_module_key_flags(run_flags)  # --helpshort lists the shared training flags too.

FLAGS = flags.FLAGS


def load_data() -> datasets.TaskData:
    """Fashion-MNIST, from the first source found (see the module docstring)."""
    return datasets.load_fashion_mnist(FLAGS.idx_dir, FLAGS.data_dir)


def make_task() -> run_config.Task:
    """Fashion-MNIST with the paper's hyperparameters: MNIST's with C_0 = 4."""
    return dataclasses.replace(mnist.make_task(), name="fashion_mnist", load_data=load_data, initial_clip=4.0)


if __name__ == "__main__":
    trainer.run(make_task)
