"""examples/mnist.py on tiny IDX files: a short run spends no more than its target epsilon."""

from idx_files import write_idx_folder


def test_a_short_run_on_idx_files_stays_within_budget(run_example, tmp_path):
    write_idx_folder(tmp_path, num_train=80)
    _, steps, total, epsilon, target, out = run_example(
        "mnist", f"--idx_dir={tmp_path}", "--epochs=2", "--batch_size=20", "--epsilon=2"
    )
    assert f"mnist IDX files in {tmp_path}: 80 training / 20 test images" in out
    assert steps == total == 8 and target == 2.0 and epsilon <= target
