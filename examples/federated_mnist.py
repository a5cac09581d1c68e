"""Federated dynamic DP-SGD (the paper's Alg. 4, Table 4): client-level DP with Poisson client sampling.

Every client holds one InfiniteMNIST-style image (a digit under a random affine and elastic deformation,
`keras_dyndp.datasets.infinite_mnist`). Each round, every client joins with probability p = ``--batch_size`` /
``--num_clients`` (the paper's 1e-3 for 250K clients), computes its gradient, clips it to C_t; the server adds
N(0, sigma_t^2) once to the sum, divides by the expected number of clients and steps. With one image per client
this is DP-SGD where "example" reads "client", so the same optimizer, sampler and accountant apply. MNIST's CNN
and settings, epsilon 0.4. The base digits: MNIST found offline, else scikit-learn's digits upsampled.

    python -m examples.federated_mnist --num_clients=250000 --epsilon=0.4

Several images per client, the other base sets and the paper's full runs: examples/README.md says where.
"""

import math
import os
import sys

from absl import flags

if __package__ in (None, ""):  # Run as `python examples/federated_mnist.py`: make the repository's packages importable.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import examples  # noqa: F401,E402  (quiets TensorFlow's start-up logs: import it first)

# isort: split
import tensorflow as tf  # noqa: E402

import keras_dyndp  # noqa: E402
from examples import models  # noqa: E402
from keras_dyndp import cli  # noqa: E402
from keras_dyndp import datasets  # noqa: E402

keras = tf.keras  # Keras 3, or Keras 2 on TensorFlow 2.15 and with TF_USE_LEGACY_KERAS=1.

flags.DEFINE_integer("num_clients", 250000, "Clients |S|, each holding one generated image.")
flags.DEFINE_integer("deformation_seed", 0, "Seed of the generated images (the same clients come back every run).")
cli.define_training_flags(epsilon=0.4, epochs=5, batch_size=250, learning_rate=0.15, unit="client")
FLAGS = flags.FLAGS


def load_clients() -> datasets.TaskData:
    """One deformed image per client from MNIST (if found offline) or scikit-learn's digits upsampled to 28x28."""
    try:
        base = datasets.load_mnist()
    except datasets.DataNotFoundError:
        base = datasets.load_digits()
        upsample = lambda images: tf.image.resize(images, (28, 28)).numpy().clip(0, 1)  # noqa: E731
        base.x_train, base.x_test = upsample(base.x_train), upsample(base.x_test)
    generate = datasets.infinite_mnist.generate_clients
    x, y = generate(base.x_train, base.y_train, FLAGS.num_clients, 1, FLAGS.deformation_seed)
    x_test = (base.x_test * 255).round().astype("uint8")
    return datasets.TaskData(x, y, x_test, base.y_test, 10, f"{FLAGS.num_clients} clients from {base.description}")


def main() -> None:
    data = load_clients()
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
    model = keras_dyndp.make_private(models.mnist_cnn(data.num_classes, uint8=True))
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
            privacy_unit="client",
        )
    )
    if FLAGS.model_dir:
        model.save_weights(os.path.join(FLAGS.model_dir, "federated_mnist.weights.h5"))
        print(f"Weights and TensorBoard privacy logs in {FLAGS.model_dir}")


if __name__ == "__main__":
    cli.run(main)
