"""Files a user has, turned into a `tfds.data_source` offline and read by `keras_dyndp.poisson_batches` (the recipe of
docs/usage.md, "Your own files as a tfds data source, offline"): what the `[examples]` and `[test]` extras install
must be enough (tfds imports importlib_resources to prepare any dataset but declares it only for Python < 3.9)."""

import numpy as np
import pytest

import keras_dyndp

tfds = pytest.importorskip("tensorflow_datasets")


def test_arrays_written_as_a_tfds_dataset_offline_read_back_as_poisson_batches(tmp_path):
    pytest.importorskip("tensorflow", reason="tfds writes its files with TensorFlow's I/O (reading needs none)")
    rng = np.random.default_rng(0)
    images, labels = rng.integers(0, 256, (40, 8, 8, 1), dtype=np.uint8), np.arange(40) % 10
    tfds.dataset_builders.store_as_tfds_dataset(
        name="my_images",
        version="1.0.0",
        data_dir=str(tmp_path),
        features=tfds.features.FeaturesDict(
            {
                "image": tfds.features.Tensor(shape=(8, 8, 1), dtype=np.uint8),
                "label": tfds.features.ClassLabel(num_classes=10),
            }
        ),
        split_datasets={"train": [(str(i), {"image": x, "label": y}) for i, (x, y) in enumerate(zip(images, labels))]},
        file_format="array_record",
    )
    source = tfds.data_source("my_images", split="train", data_dir=str(tmp_path))
    assert len(source) == 40
    batches = keras_dyndp.poisson_batches(
        source, sampling_probability=0.25, seed=0, map=lambda e: (e["image"].astype("float32") / 255, e["label"])
    )
    by_image = {x.tobytes(): y for x, y in zip(images.astype("float32") / 255, labels)}
    batch = next(iter(batches)) if keras_dyndp.keras_backend() != "jax" else batches[0]
    x, y, w = (np.asarray(part) for part in batch)
    rows = w > 0
    assert rows.sum() > 0 and all(by_image[a.tobytes()] == b for a, b in zip(x[rows], y[rows]))
