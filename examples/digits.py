"""Dynamic DP-SGD on scikit-learn's bundled digits: the quick, fully offline example (well under a minute on 2 cores).

The 1797 8x8 digits of `sklearn.datasets.load_digits` ship with scikit-learn: a fixed stratified split (seed 0)
keeps 1437 for training and 360 for testing. A small CNN trains with the paper's dynamic schedule (Alg. 2;
1/rho_mu = 0.8, 1/rho_c = 0.3) calibrated to epsilon = 3 at delta = 1 / (10 N) under the PLD accountant, on
Poisson batches of expected size 128; the script prints the test accuracy and the epsilon of the steps taken.

    python -m examples.digits                         # dynamic DP-SGD, epsilon 3
    python -m examples.digits --method=vanilla        # constant clip and noise, same budget
    python examples/digits.py --epsilon=1 --model_dir=/tmp/digits   # weights and TensorBoard privacy logs

The public API in order: `DynamicDPKerasSGD` (the schedule, from the budget), `make_private` (fast per-example
clipping), `poisson_batches` (the sampling the accountant assumes), `PrivacyLogger`, `BudgetStop` and
`run_summary`. The paper's full runs (checkpoints and resume, results CSV, every flag): examples/README.md says where.
"""

import math
import os
import sys

from absl import flags

if __package__ in (None, ""):  # Run as `python examples/digits.py`: make the repository's packages importable.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import examples  # noqa: F401,E402  (quiets TensorFlow's start-up logs: import it first)

# isort: split
import tensorflow as tf  # noqa: E402

import keras_dyndp  # noqa: E402
from examples import models  # noqa: E402
from keras_dyndp import cli  # noqa: E402
from keras_dyndp import datasets  # noqa: E402

keras = tf.keras  # Keras 3, or Keras 2 on TensorFlow 2.15 and with TF_USE_LEGACY_KERAS=1.

cli.define_training_flags(epsilon=3.0, epochs=30, batch_size=128, learning_rate=1.0)
FLAGS = flags.FLAGS


def main() -> None:
    data = datasets.load_digits()
    print(data.description)
    delta = 1 / (10 * data.num_train)
    optimizer = keras_dyndp.DynamicDPKerasSGD(
        target_epsilon=FLAGS.epsilon,
        target_delta=delta,
        num_examples=data.num_train,
        batch_size=FLAGS.batch_size,
        epochs=FLAGS.epochs,
        **cli.schedule_arguments(FLAGS.method),
        initial_clip=1.0,
        rho_mu=1 / 0.8,  # the paper's 1/rho_mu = 0.8 and 1/rho_c = 0.3, each used by the methods it shapes
        rho_c=1 / 0.3,
        learning_rate=FLAGS.learning_rate,
    )
    schedule = optimizer.schedule
    model = keras_dyndp.make_private(models.digits_cnn(data.x_train.shape[1:], data.num_classes))
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
        model.save_weights(os.path.join(FLAGS.model_dir, "digits.weights.h5"))
        print(f"Weights and TensorBoard privacy logs in {FLAGS.model_dir}")


if __name__ == "__main__":
    cli.run(main)
