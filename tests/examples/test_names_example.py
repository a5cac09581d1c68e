"""examples/names.py on generated <Language>.txt files: a character LSTM under DP."""


def test_a_short_run_on_language_files_stays_within_budget(run_example, tmp_path):
    for language, stem in (("English", "son"), ("Italian", "ini"), ("Japanese", "moto")):
        names = "\n".join(f"{chr(65 + i)}{stem}" for i in range(10))
        (tmp_path / f"{language}.txt").write_text(names + "\n", encoding="utf-8")
    _, steps, total, epsilon, target, out = run_example(
        "names", f"--names_dir={tmp_path}", "--epochs=1", "--batch_size=6"
    )
    assert "3 languages, 24 training / 6 test names" in out
    assert steps == total == 4 and target == 4.0 and epsilon <= target
