"""examples/imdb.py on a tiny aclImdb folder: DP-Adam on reviews, the vocabulary flagged outside the guarantee."""


def test_a_short_run_on_an_acl_imdb_folder_stays_within_budget(run_example, acl_imdb_dir):
    imdb_dir = acl_imdb_dir(10)
    _, steps, total, epsilon, target, out = run_example(
        "imdb", f"--imdb_dir={imdb_dir}", "--epochs=1", "--batch_size=5"
    )
    assert "20 training / 20 test reviews" in out and "outside the DP guarantee" in out
    assert steps == total == 4 and target == 3.0 and epsilon <= target
