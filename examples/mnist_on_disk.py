"""Dynamic DP-SGD on MNIST read from disk: the paper's CNN trained on Poisson batches of a numpy memmap.

The same task, model and budget as `examples.mnist` (SGD with learning rate 0.15, C_0 = 1.5, p = 250 / N, 20
epochs, delta = 1 / (10 N), the dynamic schedule, epsilon 1.2), but the training images are never held in memory:
they are written once as uint8 ``.npy`` files under ``--memmap_dir`` (from the IDX files or any other source
`keras_dyndp.datasets.load_mnist` finds; nothing is downloaded), mapped back with ``np.load(..., mmap_mode='r')``,
and `keras_dyndp.poisson_batches` reads only each step's sampled rows (positioned reads of the file), decoding each
example with a ``map`` (uint8 -> float32 in [0, 1], a channel axis). A folder that already holds the four files is
read as it is: any uint8 [N, 28, 28] images and int labels written there work. docs/usage.md ("Data on disk") says
which sources are accepted and what each costs. Runs on the backend Keras runs on (KERAS_BACKEND=jax for JAX).

    python -m examples.mnist_on_disk --memmap_dir=/tmp/mnist_memmap
    python -m examples.mnist_on_disk --idx_dir=/path/to/idx --memmap_dir=/tmp/mnist_memmap --epsilon=0.4
"""

import math
import os
import shutil
import sys
import tempfile

from absl import flags

if __package__ in (None, ""):  # Run as `python examples/mnist_on_disk.py`: make the repository importable.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import examples  # noqa: F401,E402  (quiets TensorFlow's start-up logs: import it first)

# isort: split
import numpy as np  # noqa: E402

import keras_dyndp  # noqa: E402
from examples import models  # noqa: E402
from keras_dyndp import cli  # noqa: E402
from keras_dyndp import datasets  # noqa: E402
from keras_dyndp.backend import keras_module  # noqa: E402

keras = keras_module()

flags.DEFINE_string("idx_dir", None, "Folder with MNIST's four IDX files, plain or .gz. Default: searched.")
flags.DEFINE_string("data_dir", None, "TensorFlow Datasets data directory (default ~/tensorflow_datasets).")
flags.DEFINE_string(
    "memmap_dir",
    None,
    "Folder of the .npy files trained from (train_images, train_labels, test_images, test_labels): read if there, "
    "else written from MNIST. Default: a temporary folder, deleted at the end.",
)
cli.define_training_flags(epsilon=1.2, epochs=20, batch_size=250, learning_rate=0.15, model_dir=False)
flags.DEFINE_float("initial_clip", 1.5, "Clip norm C_0 of the first step.")
FLAGS = flags.FLAGS

FILES = ("train_images", "train_labels", "test_images", "test_labels")


def write_memmaps(directory: str) -> str:
    """The four .npy files in ``directory``, written from `keras_dyndp.datasets.load_mnist` unless all are there
    (images uint8 [N, 28, 28], labels int32: JAX holds no int64 by default); returns what was read."""
    paths = [os.path.join(directory, name + ".npy") for name in FILES]
    if all(os.path.exists(path) for path in paths):
        return f"the .npy files in {directory}"
    data = datasets.load_mnist(FLAGS.idx_dir, FLAGS.data_dir)
    os.makedirs(directory, exist_ok=True)
    for path, array in zip(paths, (data.x_train, data.y_train, data.x_test, data.y_test)):
        if array.dtype.kind == "f":  # float32 in [0, 1], [N, 28, 28, 1] -> the uint8 pixels
            array = np.round(array.reshape(len(array), 28, 28) * 255).astype(np.uint8)
        np.save(path, array if array.dtype == np.uint8 else array.astype(np.int32))
    return f"{data.description}, written to {directory}"


def decode(example: tuple) -> tuple:
    """One example ``(uint8 image [28, 28], label)`` -> ``(float32 [28, 28, 1] in [0, 1], label)``."""
    image, label = example
    return image[..., None].astype(np.float32) / 255.0, label


def train(directory: str) -> None:
    """Trains from the memmaps in ``directory`` and prints the test accuracy and the privacy summary."""
    train_images, train_labels, test_images, test_labels = (
        np.load(os.path.join(directory, name + ".npy"), mmap_mode="r") for name in FILES
    )
    num_train = len(train_images)
    delta = 1 / (10 * num_train)
    optimizer = keras_dyndp.DynamicDPKerasSGD(
        target_epsilon=FLAGS.epsilon,
        target_delta=delta,
        num_examples=num_train,
        batch_size=FLAGS.batch_size,
        epochs=FLAGS.epochs,
        **cli.schedule_arguments(FLAGS.method),
        initial_clip=FLAGS.initial_clip,
        rho_mu=1 / 0.8,  # the paper's 1/rho_mu = 0.8 and 1/rho_c = 0.3, each used by the methods it shapes
        rho_c=1 / 0.3,
        learning_rate=FLAGS.learning_rate,
    )
    schedule = optimizer.schedule
    model = keras_dyndp.make_private(models.mnist_cnn())
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none"),  # per example
        weighted_metrics=["accuracy"],  # padding rows of the Poisson batches have weight 0
    )
    batches = keras_dyndp.poisson_batches(
        train_images,  # a memmap: each step reads only its sampled rows
        train_labels,
        map=decode,
        sampling_probability=schedule.sampling_probability,
        steps_per_epoch=math.ceil(schedule.num_steps / FLAGS.epochs),
        pad_to_multiple=32,
    )
    callbacks = [keras_dyndp.PrivacyLogger(delta=delta), keras_dyndp.BudgetStop()]
    model.fit(batches, epochs=FLAGS.epochs, callbacks=callbacks, verbose=FLAGS.verbose)

    test_x = np.asarray(test_images, np.float32)[..., None] / 255.0  # the test set is small: held in memory
    _, accuracy = model.evaluate(test_x, np.asarray(test_labels), verbose=0)
    steps = optimizer.released_steps
    print(f"Test accuracy: {accuracy:.4f} ({len(test_labels)} test images; {num_train} training images on disk)")
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


def main() -> None:
    directory = FLAGS.memmap_dir or tempfile.mkdtemp(prefix="mnist_memmap_")
    try:
        print(f"MNIST from {write_memmaps(directory)}")
        train(directory)
    finally:
        if FLAGS.memmap_dir is None:
            shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    cli.run(main)
