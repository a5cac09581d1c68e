"""Dynamic DP-SGD on scikit-learn's bundled digits: the quick, fully offline example (well under a minute on 2 cores).

The 1797 8x8 grey-level digits of `sklearn.datasets.load_digits` ship with scikit-learn, so this runs anywhere.
A fixed stratified split (seed 0) keeps 1437 images for training and 360 for testing. The model is a small CNN
(conv 16@3x3, max-pool 2x2, dense 32, dense 10). By default it trains with the paper's dynamic schedule
(Alg. 2; 1/rho_mu = 0.8, 1/rho_c = 0.3) at epsilon = 3 and delta = 1 / (10 N), Poisson batches of expected size
128, and prints the test accuracy and the privacy report (GDP-CLT and rigorous PLD epsilon; RDP with
--report_accountant=rdp).

    python -m research.digits                         # dynamic DP-SGD, epsilon 3
    python -m research.digits --method=vanilla        # constant clip and noise, same budget
    python -m research.digits --method=nonprivate --learning_rate=0.3   # lr 1.0 is unstable without clipping
    python -m research.digits --epsilon=1 --model_dir=/tmp/digits   # rerun to resume from the checkpoint

With only 1437 training examples a small epsilon costs more accuracy than on MNIST's 60000: the noise on the
clipped sum is the same while the signal (the expected batch) is 40 times smaller at the same sampling rate.
"""

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


load_data = datasets.load_digits


def build_model(data: datasets.TaskData) -> keras.Model:
    """The digits CNN (`examples.models.digits_cnn`) for the data's images and classes."""
    return models.digits_cnn(data.x_train.shape[1:], data.num_classes)


def make_task() -> run_config.Task:
    """The digits task and its default hyperparameters."""
    return run_config.Task(
        name="digits",
        load_data=load_data,
        build_model=build_model,
        epsilon=3.0,
        learning_rate=1.0,
        initial_clip=1.0,
        batch_size=128,
        epochs=30,
    )


if __name__ == "__main__":
    trainer.run(make_task)
