"""Paediatric chest radiographs (Kermany et al.: pneumonia or not) from the train|test/NORMAL|PNEUMONIA folder tree."""

from __future__ import annotations

import os

import numpy as np

from keras_dyndp.datasets.core import DataNotFoundError
from keras_dyndp.datasets.core import TaskData
from keras_dyndp.datasets.core import missing_folders

CHEST_XRAY_CLASSES = ["NORMAL", "PNEUMONIA"]


def _read_chest_xray_split(directory: str, image_size: int) -> tuple[np.ndarray, np.ndarray]:
    import tensorflow as tf  # pylint: disable=import-outside-toplevel  (the JAX example imports this module)

    labelled = {"labels": "inferred", "label_mode": "int", "class_names": CHEST_XRAY_CLASSES, "color_mode": "grayscale"}
    images = tf.keras.utils.image_dataset_from_directory(
        directory, image_size=(image_size, image_size), batch_size=256, shuffle=False, **labelled
    )
    parts = [(tf.cast(tf.round(x), tf.uint8).numpy(), y.numpy()) for x, y in images]  # uint8: 5216 128x128 in 85 MB
    return np.concatenate([x for x, _ in parts]), np.concatenate([y for _, y in parts]).astype(np.float32)[:, None]


def load_chest_xray(root: str | None, image_size: int = 128) -> TaskData:
    """uint8 images [N, size, size, 1] from `root` (--chest_xray_dir); float labels [N, 1], 0 NORMAL / 1 PNEUMONIA."""
    how_to_get = (
        "Get it from https://data.mendeley.com/datasets/rscbjbr9sj/2 (ChestXRay2017.zip) or Kaggle's "
        "paultimothymooney/chest-xray-pneumonia, and pass --chest_xray_dir=.../chest_xray."
    )
    if not root:
        raise DataNotFoundError(f"chest_xray: no --chest_xray_dir given. {how_to_get}")
    missing = missing_folders(root, CHEST_XRAY_CLASSES)
    if missing:
        raise DataNotFoundError(f"chest_xray: missing folders {', '.join(missing)}. {how_to_get}")
    x_train, y_train = _read_chest_xray_split(os.path.join(root, "train"), image_size)
    x_test, y_test = _read_chest_xray_split(os.path.join(root, "test"), image_size)
    description = (
        f"chest_xray from {root}: {len(y_train)} training / {len(y_test)} test images "
        f"({image_size}x{image_size}; no statistic of the private labels is printed)"
    )
    return TaskData(x_train, y_train, x_test, y_test, num_classes=2, description=description)
