"""Dynamic DP-SGD on the NAME task: which of 18 languages a surname comes from, with a character LSTM (Table 3).

Embedding 64, LSTM 128, a dense layer to the languages; SGD with learning rate 2, C_0 = 1.5, 50 epochs, expected
batch 250, epsilon 4, delta = 1 / (10 N). ``--names_dir`` is a folder of ``<Language>.txt`` files, one name per
line, as in the PyTorch char-RNN tutorial's data/names (https://download.pytorch.org/tutorial/data.zip); names are
folded to ASCII, encoded with a fixed alphabet and left-padded to 20 characters (public constants: nothing of the
encoding reads the private data); see `keras_dyndp.datasets.load_names`.

    python -m examples.names --names_dir=/data/names --epsilon=2

The paper's full runs (checkpoints, results CSV, sweeps): examples/README.md says where.
"""

import math
import os
import sys

from absl import flags

if __package__ in (None, ""):  # Run as `python examples/names.py`: make the repository's packages importable.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import examples  # noqa: F401,E402  (quiets TensorFlow's start-up logs: import it first)

# isort: split
import tensorflow as tf  # noqa: E402

import keras_dyndp  # noqa: E402
from examples import models  # noqa: E402
from keras_dyndp import cli  # noqa: E402
from keras_dyndp import datasets  # noqa: E402

keras = tf.keras  # Keras 3, or Keras 2 on TensorFlow 2.15 and with TF_USE_LEGACY_KERAS=1.

flags.DEFINE_string("names_dir", None, "Folder of <Language>.txt files, one name per line.")
cli.define_training_flags(epsilon=4.0, epochs=50, batch_size=250, learning_rate=2.0, unit="name")
FLAGS = flags.FLAGS


def main() -> None:
    data = datasets.load_names(FLAGS.names_dir)
    print(data.description)
    delta = 1 / (10 * data.num_train)
    optimizer = keras_dyndp.DynamicDPKerasSGD(
        target_epsilon=FLAGS.epsilon,
        target_delta=delta,
        num_examples=data.num_train,
        batch_size=FLAGS.batch_size,
        epochs=FLAGS.epochs,
        **cli.schedule_arguments(FLAGS.method),
        initial_clip=1.5,
        rho_mu=1 / 0.8,  # the paper's 1/rho_mu = 0.8 and 1/rho_c = 0.3, each used by the methods it shapes
        rho_c=1 / 0.3,
        learning_rate=FLAGS.learning_rate,
    )
    schedule = optimizer.schedule
    model = keras_dyndp.make_private(models.names_lstm(data.x_train.shape[1], data.num_classes))
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
    print(f"Test accuracy: {accuracy:.4f} ({len(data.y_test)} test names)")
    print(
        keras_dyndp.run_summary(
            schedule,
            delta,
            steps,
            method=FLAGS.method,
            overflow_probability=optimizer.overflow_probability,
            privacy_unit="training name",
        )
    )
    if FLAGS.model_dir:
        model.save_weights(os.path.join(FLAGS.model_dir, "names.weights.h5"))
        print(f"Weights and TensorBoard privacy logs in {FLAGS.model_dir}")


if __name__ == "__main__":
    cli.run(main)
