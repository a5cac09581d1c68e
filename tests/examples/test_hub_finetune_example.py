"""examples/hub_finetune.py on a tiny aclImdb folder, where KerasHub is installed (CI's hub stage; skipped elsewhere):
a small BERT from its constructor, and a preset directory saved by ``save_to_preset`` (its own tokenizer), each
fine-tuned privately within the target epsilon, fully and with LoRA."""

import importlib.util

import pytest

keras_hub = pytest.importorskip("keras_hub")
if not any(importlib.util.find_spec(name) for name in ("tensorflow", "grain")):
    pytest.skip("KerasHub's fit and evaluate of arrays need grain or TensorFlow", allow_module_level=True)

_TINY = ("--epochs=1", "--batch_size=10", "--sequence_length=12", "--width=8", "--layers=1", "--max_tokens=60")


@pytest.fixture(name="imdb_dir")
def fixture_imdb_dir(acl_imdb_dir):
    return acl_imdb_dir(20)


@pytest.fixture(name="preset_dir")
def fixture_preset_dir(tmp_path):
    """A tiny BERT classifier preset with a WordPiece vocabulary of the test reviews' words."""
    words = "a great wonderful superb fun awful boring terrible bad movie number".split()
    tokenizer = keras_hub.tokenizers.BertTokenizer(vocabulary=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words])
    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=5 + len(words), num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16
    )
    preprocessor = keras_hub.models.BertTextClassifierPreprocessor(tokenizer, sequence_length=12)
    keras_hub.models.BertTextClassifier(backbone, num_classes=2, preprocessor=preprocessor).save_to_preset(tmp_path)
    return tmp_path


@pytest.mark.parametrize("finetune", ["full", "lora"])
@pytest.mark.parametrize("preset", [False, True], ids=["constructor", "preset"])
def test_a_short_private_fine_tuning_of_a_keras_hub_classifier_stays_within_budget(
    run_example, imdb_dir, preset_dir, preset, finetune
):
    flags = [f"--imdb_dir={imdb_dir}", f"--finetune={finetune}", "--pretrain_epochs=1", *_TINY]
    _, steps, total, epsilon, target, out = run_example("hub_finetune", *flags, *([f"--preset={preset_dir}"] * preset))
    assert "40 private training / 20 public (of the test split) / 20 evaluation reviews" in out, out
    assert steps == total == 4 and target == 3.0 and epsilon <= target
    assert "Before private fine-tuning: accuracy " in out and " ms per DP step" in out
    trained, total_parameters = (
        int(n) for n in out.split(f"--finetune={finetune}: ")[1].split(" parameters")[0].split(" of ")
    )
    assert trained < total_parameters / 2 if finetune == "lora" else trained == total_parameters
