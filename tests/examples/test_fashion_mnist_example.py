"""examples/fashion_mnist.py: examples.mnist on Fashion-MNIST with the paper's C_0 = 4."""

from idx_files import write_idx_folder


def test_a_short_run_on_idx_files_stays_within_budget(run_example, tmp_path):
    write_idx_folder(tmp_path, num_train=80)
    _, steps, total, epsilon, target, out = run_example(
        "fashion_mnist", f"--idx_dir={tmp_path}", "--epochs=1", "--batch_size=20"
    )
    assert f"fashion_mnist IDX files in {tmp_path}" in out
    assert steps == total == 4 and target == 1.2 and epsilon <= target
