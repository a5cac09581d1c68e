"""examples/mnist_on_disk.py on tiny IDX files, on the backend Keras runs on: the images are written once as .npy
files and trained from as memmaps; a short run spends no more than its target epsilon, and a second run reads the
files it finds."""

import numpy as np
from idx_files import write_idx_folder


def test_a_short_run_from_memmaps_stays_within_budget_and_reuses_the_files(run_example, tmp_path):
    write_idx_folder(tmp_path, num_train=80)
    memmaps = tmp_path / "memmaps"
    arguments = (f"--idx_dir={tmp_path}", f"--memmap_dir={memmaps}", "--epochs=2", "--batch_size=20", "--epsilon=2")
    _, steps, total, epsilon, target, out = run_example("mnist_on_disk", *arguments)
    assert f"MNIST from mnist IDX files in {tmp_path}: 80 training / 20 test images, written to {memmaps}" in out
    assert "(20 test images; 80 training images on disk)" in out
    assert steps == total == 8 and target == 2.0 and epsilon <= target
    images = np.load(memmaps / "train_images.npy", mmap_mode="r")
    assert images.dtype == np.uint8 and images.shape == (80, 28, 28)
    _, steps, _, _, _, out = run_example("mnist_on_disk", *arguments[1:])  # no --idx_dir: the files are there
    assert f"MNIST from the .npy files in {memmaps}" in out and steps == 8
