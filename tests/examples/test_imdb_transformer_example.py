"""examples/imdb_transformer.py on a tiny aclImdb folder, on TensorFlow and on JAX (whichever Keras runs on):
pretraining on the public half of the test split, then private fine-tuning of all weights or of LoRA adapters at
the same target epsilon; Keras 2 refuses LoRA in one line with status 2."""

import importlib.metadata
import os

import pytest

_KERAS_2 = os.environ.get("TF_USE_LEGACY_KERAS") == "1" or importlib.metadata.version("keras").startswith("2.")
_TINY = ("--epochs=1", "--batch_size=10", "--sequence_length=16", "--width=8", "--max_tokens=60", "--pretrain_epochs=1")


@pytest.fixture(name="imdb_dir")
def fixture_imdb_dir(acl_imdb_dir):
    """20 reviews per class in train/ (private) and test/ (half public, half evaluation)."""
    return acl_imdb_dir(20)


@pytest.mark.parametrize("mode", ["full", "lora", "none"])
def test_a_short_fine_tuning_run_stays_within_budget(run_example, imdb_dir, mode):
    if mode == "lora" and _KERAS_2:
        pytest.skip("Keras 2 has no LoRA (refused: the test below)")
    _, steps, total, epsilon, target, out = run_example(
        "imdb_transformer", f"--imdb_dir={imdb_dir}", f"--finetune={mode}", *_TINY
    )
    assert "40 private training / 20 public (of the test split) / 20 evaluation reviews" in out, out
    assert steps == total == 4 and target == 3.0 and epsilon <= target
    assert "Step time: " in out and " ms per DP step" in out
    assert ("Pretrained (public data only) accuracy" in out) == (mode != "none")
    trained, total_parameters = (
        int(n) for n in out.split(f"--finetune={mode}: ")[1].split(" parameters")[0].split(" of ")
    )
    if mode == "lora":
        assert trained < total_parameters / 2
    else:
        assert trained == total_parameters


@pytest.mark.skipif(not _KERAS_2, reason="Keras 3 has LoRA")
def test_keras_2_refuses_lora_in_one_line_with_status_2(example_server, imdb_dir):
    result = example_server.run("examples.imdb_transformer", [f"--imdb_dir={imdb_dir}", "--finetune=lora"], timeout=180)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1, result.stderr[-2000:]
    assert lines[0].startswith("imdb_transformer.py: error: ") and "enable_lora" in lines[0], lines[0]
