"""examples/imdb.py on a tiny aclImdb folder: DP-Adam on reviews, the vocabulary flagged outside the guarantee."""


def test_a_short_run_on_an_acl_imdb_folder_stays_within_budget(run_example, tmp_path):
    words = {"pos": "great wonderful superb fun", "neg": "awful boring terrible bad"}
    for split in ("train", "test"):
        for label in ("pos", "neg"):
            folder = tmp_path / split / label
            folder.mkdir(parents=True)
            for i in range(10):
                (folder / f"{i}_7.txt").write_text(f"A {words[label]} movie, number {i}!", encoding="utf-8")
    _, steps, total, epsilon, target, out = run_example(
        "imdb", f"--imdb_dir={tmp_path}", "--epochs=1", "--batch_size=5"
    )
    assert "20 training / 20 test reviews" in out and "outside the DP guarantee" in out
    assert steps == total == 4 and target == 3.0 and epsilon <= target
