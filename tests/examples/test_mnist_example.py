"""examples/mnist.py on tiny IDX files: a short run spends no more than its target epsilon."""

import numpy as np

from keras_dyndp.datasets import mnist


def write_idx_folder(directory, num_train=80, num_test=20):
    rng = np.random.default_rng(0)
    arrays = {
        "x_train": rng.integers(0, 256, (num_train, 28, 28)),
        "y_train": rng.integers(0, 10, num_train),
        "x_test": rng.integers(0, 256, (num_test, 28, 28)),
        "y_test": rng.integers(0, 10, num_test),
    }
    for key, stem in mnist.IDX_FILES.items():
        mnist.write_idx(str(directory / (stem + ".gz")), arrays[key])


def test_a_short_run_on_idx_files_stays_within_budget(run_example, tmp_path):
    write_idx_folder(tmp_path)
    _, steps, total, epsilon, target, out = run_example(
        "mnist", f"--idx_dir={tmp_path}", "--epochs=2", "--batch_size=20", "--epsilon=2"
    )
    assert f"mnist IDX files in {tmp_path}: 80 training / 20 test images" in out
    assert steps == total == 8 and target == 2.0 and epsilon <= target
