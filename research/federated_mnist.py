"""Federated dynamic DP-SGD (the paper's Alg. 4) on InfiniteMNIST-style data: client-level DP, Poisson clients.

The federated setting of the paper (Table 4): every client holds one generated image (``--images_per_client``),
so one client cannot train a model alone. Each round t (0-based):

1. the server computes C_t and sigma_t from the dynamic schedule (the same `DPSchedule` as centralised training);
2. every client joins the round independently with probability p (Poisson client sampling,
   p = ``--batch_size`` / ``--num_clients``; the paper's p = 1e-3 for 250K clients is the default);
3. each sampled client computes its Fed-SGD update, the gradient of its mean loss over its own images at the
   current model, and clips it to L2 norm C_t;
4. the server sums the clipped updates, adds Gaussian noise N(0, sigma_t^2 I) once to the SUM, divides by the
   expected number of clients p |S| and takes an SGD step.

This is client-level (epsilon, delta)-DP under add-or-remove-one-client adjacency: the clipped sum has
sensitivity C_t in one client, exactly as DP-SGD's has in one example, so the schedule's accounting (GDP-CLT and
RDP for Poisson sampling with rate p) applies with "client" in place of "example". Alg. 4 as printed has each
client add its own noise and the server divide by |S_t| twice; we add the noise once, centrally (or, equivalently
in distribution, each client could add N(0, sigma_t^2 / m) for m expected clients in a secure aggregation); with
per-client noise of the full sigma_t the sum would carry sqrt(|S_t|) times the accounted noise.

With one image per client the round is literally DP-SGD with per-example clipping, and runs through the same
fast path; with several, the clients' images are stacked on a second axis and a TimeDistributed model gives
each client one loss (its mean), clipped as one unit (ghost clipping groups each client's images).

Data ("InfiniteMNIST-style"): the paper uses InfiniteMNIST (Loosli et al.), MNIST digits under random
transformations. This script generates ``--num_clients`` x ``--images_per_client`` images the same way from a base
set (MNIST through tfds when prepared, else Fashion-MNIST IDX files such as Debian's, else scikit-learn's digits
upsampled to 28x28; ``--base``): a random affine map (rotation, scale, shear, translation) and a smooth random
elastic displacement field (Simard et al. 2003), seeded by ``--deformation_seed`` only, so the same clients come
back for every run (250K clients: about 70 s and 196 MB of uint8 on 2 CPU cores). The test set is the base set's
untouched test split. Model and optimiser are MNIST's.

    python -m research.federated_mnist --num_clients=250000 --epsilon=0.4
"""

from __future__ import annotations

import dataclasses
import os
import sys

import numpy as np
import tensorflow as tf
from absl import flags

if __package__ in (None, ""):  # Run as `python research/NAME.py`: make the package `research` importable.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from examples import models
from keras_dyndp import datasets
from keras_dyndp.datasets import infinite_mnist
from keras_dyndp.tf_backend.keras_compat import keras
from research import fashion_mnist
from research import mnist
from research import run_config
from research import run_flags
from research import trainer

flags.adopt_module_key_flags(run_flags)  # --helpshort lists the shared training flags too.

flags.DEFINE_enum(
    "base",
    "auto",
    ["auto", "mnist", "fashion_mnist", "digits"],
    "Base image set the clients' images are generated from (auto: the first available of mnist, "
    "fashion_mnist, digits).",
)
flags.DEFINE_integer("num_clients", 250000, "Number of clients |S|, >= 1.")
flags.DEFINE_integer("images_per_client", 1, "Generated images each client holds, >= 1.")
flags.DEFINE_integer("deformation_seed", 0, "Seed of the generated images (independent of --seed).")

FLAGS = flags.FLAGS


def _base_set() -> tuple[datasets.TaskData, str]:
    """The base images (float32 [N, 28, 28, 1] in [0, 1]) and their name."""
    loaders = {"mnist": mnist.load_data, "fashion_mnist": fashion_mnist.load_data, "digits": _digits_28}
    names = list(loaders) if FLAGS.base == "auto" else [FLAGS.base]
    errors = []
    for name in names:
        try:
            return loaders[name](), name
        except datasets.DataNotFoundError as error:
            errors.append(str(error))
    raise datasets.DataNotFoundError("federated_mnist: no base set found: " + " | ".join(errors))


def _digits_28() -> datasets.TaskData:
    data = datasets.load_digits()
    size = (infinite_mnist.IMAGE_SIZE, infinite_mnist.IMAGE_SIZE)
    data.x_train, data.x_test = (tf.image.resize(x, size).numpy().clip(0.0, 1.0) for x in (data.x_train, data.x_test))
    return data


def load_data() -> datasets.TaskData:
    """The clients' generated images (training) and the base test split (test)."""
    if FLAGS.num_clients < 1 or FLAGS.images_per_client < 1:
        raise run_config.FlagError(
            "--num_clients and --images_per_client must be >= 1. Received: "
            f"{FLAGS.num_clients}, {FLAGS.images_per_client}."
        )
    base, base_name = _base_set()
    x_train, y_train = infinite_mnist.generate_clients(
        base.x_train, base.y_train, FLAGS.num_clients, FLAGS.images_per_client, FLAGS.deformation_seed
    )
    x_test = np.round(base.x_test * 255).astype(np.uint8)
    y_test = base.y_test
    if FLAGS.images_per_client > 1:
        x_test, y_test = x_test[:, None], y_test[:, None]
    return datasets.TaskData(
        x_train=x_train,
        y_train=y_train,
        x_test=x_test,
        y_test=y_test,
        num_classes=10,
        description=f"federated {base_name}: {FLAGS.num_clients} clients x {FLAGS.images_per_client} deformed "
        f"image(s) (deformation seed {FLAGS.deformation_seed}); test: {len(y_test)} {base_name} "
        "test images",
    )


def build_model(data: datasets.TaskData) -> keras.Model:
    """MNIST's CNN on uint8 images; with several images per client, applied to each one (TimeDistributed)."""
    image_model = models.mnist_cnn(data.num_classes, uint8=True)
    if data.x_train.ndim == 4:  # One image per client: a plain Sequential.
        return image_model
    size = infinite_mnist.IMAGE_SIZE
    inputs = keras.layers.Input((None, size, size, 1), dtype="uint8")
    return keras.Model(inputs, keras.layers.TimeDistributed(image_model)(inputs))


def make_task() -> run_config.Task:
    """Federated InfiniteMNIST-style task; p = batch_size / num_clients (the paper's 1e-3 for 250K clients)."""
    return dataclasses.replace(  # MNIST's optimiser settings
        mnist.make_task(),
        name="federated_mnist",
        load_data=load_data,
        build_model=build_model,
        epsilon=0.4,
        batch_size=max(1, round(1e-3 * FLAGS.num_clients)),
        epochs=5,
        privacy_unit="client (all its images)",
        notes=(
            "client-level DP: Poisson client sampling with the probability p above; noise added once to the "
            "sum of clipped client updates (central DP).",
        ),
    )


if __name__ == "__main__":
    trainer.run(make_task)
