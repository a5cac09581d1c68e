"""Dynamic DP-SGD on paediatric chest radiographs (pneumonia or not) with VGG-11 without batch norm (Table 5).

VGG-11's convolution stack without batch normalisation (as in the paper and Ziller et al.: batch norm mixes
examples, so per-example clipping would not bound one image's influence), global average pooling, Dense(512) and
one logit, on grey images resized to ``--image_size`` (128 keeps CPU runs possible). SGD with learning rate 0.05,
C_0 = 1.5, expected batch 64, 10 epochs, epsilon 1 (the paper gives no optimiser settings: these are ours).
``--chest_xray_dir`` is the Kermany et al. tree train|test/NORMAL|PNEUMONIA (Mendeley Data 10.17632/rscbjbr9sj.2
or Kaggle's chest-xray-pneumonia); see `keras_dyndp.datasets.load_chest_xray`.

    python -m examples.chest_xray --chest_xray_dir=/data/chest_xray --epsilon=1

The paper's full runs (checkpoints, results CSV, sweeps): examples/README.md says where.
"""

import math
import os
import sys

from absl import flags

if __package__ in (None, ""):  # Run as `python examples/chest_xray.py`: make the repository's packages importable.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import examples  # noqa: F401,E402  (quiets TensorFlow's start-up logs: import it first)

# isort: split
import tensorflow as tf  # noqa: E402

import keras_dyndp  # noqa: E402
from examples import models  # noqa: E402
from keras_dyndp import cli  # noqa: E402
from keras_dyndp import datasets  # noqa: E402

keras = tf.keras  # Keras 3, or Keras 2 on TensorFlow 2.15 and with TF_USE_LEGACY_KERAS=1.

flags.DEFINE_string("chest_xray_dir", None, "Folder with train/{NORMAL,PNEUMONIA} and test/{NORMAL,PNEUMONIA}.")
flags.DEFINE_integer("image_size", 128, "Images are resized to image_size x image_size grey levels.")
flags.DEFINE_float("vgg_width", 1.0, "Multiplier of every VGG-11 layer width (1.0: the real VGG-11).")
cli.define_training_flags(epsilon=1.0, epochs=10, batch_size=64, learning_rate=0.05, unit="image")
FLAGS = flags.FLAGS


def main() -> None:
    data = datasets.load_chest_xray(FLAGS.chest_xray_dir, FLAGS.image_size)
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
    model = keras_dyndp.make_private(models.vgg11(data.x_train.shape[1:], FLAGS.vgg_width))
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
        model.save_weights(os.path.join(FLAGS.model_dir, "chest_xray.weights.h5"))
        print(f"Weights and TensorBoard privacy logs in {FLAGS.model_dir}")


if __name__ == "__main__":
    cli.run(main)
