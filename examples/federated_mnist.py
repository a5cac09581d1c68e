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

    python -m examples.federated_mnist --num_clients=250000 --epsilon=0.4
"""

from __future__ import annotations

import os
import sys

import numpy as np
import tensorflow as tf
from absl import flags
from scipy import ndimage

if __package__ in (None, ""):  # Run as `python examples/NAME.py`: make the package `examples` importable.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from examples import datasets
from examples import fashion_mnist
from examples import mnist
from examples import training
from keras_dyndp.keras_compat import keras

flags.adopt_module_key_flags(training)  # --helpshort lists the shared training flags too.

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

IMAGE_SIZE = 28
_CHUNK = 8192


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
    from examples import digits

    data = digits.load_data()

    def resize(images: np.ndarray) -> np.ndarray:
        return tf.image.resize(images, (IMAGE_SIZE, IMAGE_SIZE)).numpy().clip(0.0, 1.0)

    data.x_train, data.x_test = resize(data.x_train), resize(data.x_test)
    return data


def deform(
    images: np.ndarray,
    rng: np.random.Generator,
    max_rotation_deg: float = 15.0,
    max_shear: float = 0.25,
    scale_range: tuple[float, float] = (0.85, 1.15),
    max_shift: float = 2.5,
    elastic_alpha: float = 2.0,
    elastic_sigma: float = 3.5,
) -> np.ndarray:
    """Random affine + elastic deformations of a batch of images [B, H, W] (values in [0, 1]), vectorised.

    Each output pixel samples the input (bilinearly, zero outside) at A (x - c) + c + shift + elastic(x), where A
    combines a rotation, a shear and a scaling, and the elastic field is uniform noise in [-1, 1] smoothed by a
    Gaussian of std `elastic_sigma` pixels and scaled to a largest displacement of `elastic_alpha` pixels.
    """
    batch, height, width = images.shape
    angle = np.deg2rad(rng.uniform(-max_rotation_deg, max_rotation_deg, batch))
    shear = rng.uniform(-max_shear, max_shear, batch)
    scale = rng.uniform(*scale_range, batch)
    cos, sin = np.cos(angle) / scale, np.sin(angle) / scale
    matrix = np.stack([np.stack([cos, -sin + shear * cos], -1), np.stack([sin, cos + shear * sin], -1)], -2)
    shift = rng.uniform(-max_shift, max_shift, (batch, 2))
    fields = ndimage.gaussian_filter(
        rng.uniform(-1, 1, (2, batch, height, width)), sigma=(0, 0, elastic_sigma, elastic_sigma)
    )
    fields *= elastic_alpha / np.maximum(np.abs(fields).max(axis=(2, 3), keepdims=True), 1e-12)
    rows, cols = np.meshgrid(np.arange(height) - (height - 1) / 2, np.arange(width) - (width - 1) / 2, indexing="ij")
    grid = np.stack([rows, cols], -1).reshape(1, -1, 2)
    source = np.einsum("bij,bpj->bpi", matrix, np.broadcast_to(grid, (batch,) + grid.shape[1:]))
    source_rows = source[..., 0].reshape(batch, height, width) + (height - 1) / 2 + shift[:, :1, None] + fields[0]
    source_cols = source[..., 1].reshape(batch, height, width) + (width - 1) / 2 + shift[:, 1:, None] + fields[1]
    return _bilinear(images, source_rows, source_cols)


def _bilinear(images: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    batch, height, width = images.shape
    padded = np.pad(images, ((0, 0), (1, 1), (1, 1)))  # A zero border: samples outside the image read 0.
    rows = np.clip(rows + 1, 0, height)
    cols = np.clip(cols + 1, 0, width)
    row0 = np.minimum(np.floor(rows).astype(np.int64), height)
    col0 = np.minimum(np.floor(cols).astype(np.int64), width)
    row_weight, col_weight = rows - row0, cols - col0
    flat = padded.reshape(-1)
    base = (np.arange(batch)[:, None, None] * (height + 2) + row0) * (width + 2) + col0

    def at(row_offset: int, col_offset: int) -> np.ndarray:
        return np.take(flat, base + row_offset * (width + 2) + col_offset)

    top = at(0, 0) * (1 - col_weight) + at(0, 1) * col_weight
    bottom = at(1, 0) * (1 - col_weight) + at(1, 1) * col_weight
    return top * (1 - row_weight) + bottom * row_weight


def generate_clients(
    base_images: np.ndarray, base_labels: np.ndarray, num_clients: int, images_per_client: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Deformed copies of the base images, grouped by client.

    Returns:
      uint8 images [num_clients, images_per_client, 28, 28, 1] and int64 labels [num_clients, images_per_client];
      with images_per_client == 1 the client axis is dropped ([num_clients, 28, 28, 1] and [num_clients]).
    """
    rng = np.random.default_rng(seed)
    total = num_clients * images_per_client
    sources = rng.permutation(np.resize(np.arange(len(base_labels)), total))
    images = np.empty((total, IMAGE_SIZE, IMAGE_SIZE), dtype=np.uint8)
    for start in range(0, total, _CHUNK):
        chunk = sources[start : start + _CHUNK]
        deformed = deform(base_images[chunk, :, :, 0], rng)
        images[start : start + len(chunk)] = np.round(np.clip(deformed, 0, 1) * 255).astype(np.uint8)
    labels = base_labels[sources].astype(np.int64)
    if images_per_client == 1:
        return images[..., None], labels
    return (
        images.reshape(num_clients, images_per_client, IMAGE_SIZE, IMAGE_SIZE, 1),
        labels.reshape(num_clients, images_per_client),
    )


def load_data() -> datasets.TaskData:
    """The clients' generated images (training) and the base test split (test)."""
    if FLAGS.num_clients < 1 or FLAGS.images_per_client < 1:
        raise training.FlagError(
            "--num_clients and --images_per_client must be >= 1. Received: "
            f"{FLAGS.num_clients}, {FLAGS.images_per_client}."
        )
    base, base_name = _base_set()
    x_train, y_train = generate_clients(
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
    image_layers = [keras.layers.Rescaling(1 / 255.0)] + mnist.cnn_layers(data.num_classes)
    if data.x_train.ndim == 4:  # One image per client: a plain Sequential.
        return keras.Sequential([keras.layers.Input((IMAGE_SIZE, IMAGE_SIZE, 1), dtype="uint8")] + image_layers)
    image_model = keras.Sequential([keras.layers.Input((IMAGE_SIZE, IMAGE_SIZE, 1), dtype="uint8")] + image_layers)
    inputs = keras.layers.Input((None, IMAGE_SIZE, IMAGE_SIZE, 1), dtype="uint8")
    return keras.Model(inputs, keras.layers.TimeDistributed(image_model)(inputs))


def make_task() -> training.Task:
    """Federated InfiniteMNIST-style task; p = batch_size / num_clients (the paper's 1e-3 for 250K clients)."""
    return training.Task(
        name="federated_mnist",
        load_data=load_data,
        build_model=build_model,
        epsilon=0.4,
        learning_rate=0.15,
        initial_clip=1.5,
        batch_size=max(1, round(1e-3 * FLAGS.num_clients)),
        epochs=5,
        rho_mu=1 / 0.8,
        rho_c=1 / 0.3,
        privacy_unit="client (all its images)",
        notes=(
            "client-level DP: Poisson client sampling with the probability p above; noise added once to the "
            "sum of clipped client updates (central DP).",
        ),
    )


if __name__ == "__main__":
    training.run(make_task)
