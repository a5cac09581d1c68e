"""examples/chest_xray.py on a tiny image tree: a narrow VGG-11 without batch norm under DP."""

import numpy as np
import tensorflow as tf


def test_a_short_run_on_an_image_tree_stays_within_budget(run_example, tmp_path):
    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        for label in ("NORMAL", "PNEUMONIA"):
            folder = tmp_path / split / label
            folder.mkdir(parents=True)
            for i in range(4):
                image = rng.integers(0, 256, (40, 36, 1), dtype=np.uint8)
                tf.io.write_file(str(folder / f"im{i}.jpeg"), tf.io.encode_jpeg(image))
    _, steps, total, epsilon, target, out = run_example(
        "chest_xray",
        f"--chest_xray_dir={tmp_path}",
        "--image_size=32",
        "--vgg_width=0.0625",
        "--epochs=1",
        "--batch_size=4",
    )
    assert "8 training / 8 test images" in out
    assert steps == total == 2 and target == 1.0 and epsilon <= target
