"""Dynamic DP-SGD on paediatric chest radiographs (pneumonia or not) with VGG-11 without batch norm (Table 5).

Model: the VGG-11 convolution stack (64, M, 128, M, 256, 256, M, 512, 512, M, 512, 512, M; 3x3 convolutions, ReLU,
2x2 max-pooling) WITHOUT batch normalisation, as the paper and Ziller et al. do (batch norm mixes examples, so
per-example clipping would not bound one example's influence), then global average pooling, Dense(512, ReLU) and
one logit. ``--vgg_width`` scales every layer's width (tests use a tiny one). Images are grey-level, resized to
``--image_size`` (default 128 to keep CPU runs possible) and scaled to [0, 1] inside the model.

The paper gives no optimiser settings for this task: SGD with learning rate 0.05, C_0 = 1.5, expected batch 64,
10 epochs and default epsilon 1 (the paper reports 0.5, 1, 1.5) are ours.

Data: ``--chest_xray_dir``, the Kermany et al. folder tree ``train/{NORMAL,PNEUMONIA}`` and
``test/{NORMAL,PNEUMONIA}`` of image files (the "chest_xray" folder of Mendeley Data 10.17632/rscbjbr9sj.2 or the
Kaggle "chest-xray-pneumonia" copy), read with `keras.utils.image_dataset_from_directory`.

    python -m research.chest_xray --chest_xray_dir=/data/chest_xray --epsilon=1
"""

from __future__ import annotations

import os
import sys

from absl import flags

if __package__ in (None, ""):  # Run as `python research/NAME.py`: make the package `research` importable.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from examples import models
from keras_dyndp import datasets
from keras_dyndp.tf_backend.keras_compat import keras
from research import run_config
from research import run_flags
from research import trainer

flags.adopt_module_key_flags(run_flags)  # --helpshort lists the shared training flags too.

flags.DEFINE_string("chest_xray_dir", None, "Folder with train/{NORMAL,PNEUMONIA} and test/{NORMAL,PNEUMONIA}.")
flags.DEFINE_integer("image_size", 128, "Images are resized to image_size x image_size.")
flags.DEFINE_float("vgg_width", 1.0, "Multiplier of every VGG-11 layer width (1.0: the real VGG-11).")

FLAGS = flags.FLAGS


def load_data() -> datasets.TaskData:
    """Chest radiographs from --chest_xray_dir (see `datasets.load_chest_xray`)."""
    return datasets.load_chest_xray(FLAGS.chest_xray_dir, FLAGS.image_size)


def build_model(data: datasets.TaskData) -> keras.Model:
    """VGG-11 without batch normalisation (`examples.models.vgg11`) on the data's images, --vgg_width wide."""
    return models.vgg11(data.x_train.shape[1:], FLAGS.vgg_width)


def make_task() -> run_config.Task:
    """Chest X-ray with our settings (the paper gives none)."""
    return run_config.Task(
        name="chest_xray",
        load_data=load_data,
        build_model=build_model,
        epsilon=1.0,
        learning_rate=0.05,
        initial_clip=1.5,
        batch_size=64,
        epochs=10,
        binary=True,
    )


if __name__ == "__main__":
    trainer.run(make_task)
