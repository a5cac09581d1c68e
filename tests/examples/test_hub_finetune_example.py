"""examples/hub_finetune.py on a tiny aclImdb folder, where KerasHub is installed (CI's hub stage; skipped elsewhere):
a classifier and a causal LM, each a small model from its constructor and a preset directory saved by
``save_to_preset`` (its own tokenizer), fine-tuned privately within the target epsilon, fully and with LoRA."""

import importlib.util

import pytest

keras_hub = pytest.importorskip("keras_hub")
if not any(importlib.util.find_spec(name) for name in ("tensorflow", "grain")):
    pytest.skip("KerasHub's fit and evaluate of arrays need grain or TensorFlow", allow_module_level=True)

_TINY = ("--epochs=1", "--batch_size=10", "--sequence_length=12", "--width=8", "--layers=1", "--max_tokens=60")


@pytest.fixture(name="imdb_dir")
def fixture_imdb_dir(acl_imdb_dir):
    return acl_imdb_dir(20)


_WORDS = "a great wonderful superb fun awful boring terrible bad movie number".split()


def _classifier_preset(directory):
    """A tiny BERT classifier with a WordPiece vocabulary of the test reviews' words."""
    tokenizer = keras_hub.tokenizers.BertTokenizer(vocabulary=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *_WORDS])
    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=5 + len(_WORDS), num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16
    )
    preprocessor = keras_hub.models.BertTextClassifierPreprocessor(tokenizer, sequence_length=12)
    keras_hub.models.BertTextClassifier(backbone, num_classes=2, preprocessor=preprocessor).save_to_preset(directory)


def _causal_lm_preset(directory):
    """A tiny GPT-2 with a byte-pair vocabulary of the test reviews' words (each a token of its own)."""
    letters = sorted(set("".join(_WORDS)) | set("0123456789A!,"))
    vocabulary = {"<|endoftext|>": 0, "Ġ": 1, **{letter: 2 + i for i, letter in enumerate(letters)}}
    vocabulary.update({f"Ġ{word}": len(vocabulary) + i for i, word in enumerate(_WORDS)})
    tokenizer = keras_hub.models.GPT2Tokenizer(
        vocabulary=vocabulary, merges=[f"Ġ {word}" for word in _WORDS if len(word) == 1]
    )
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=len(vocabulary),
        num_layers=1,
        num_heads=2,
        hidden_dim=8,
        intermediate_dim=16,
        max_sequence_length=12,
    )
    preprocessor = keras_hub.models.GPT2CausalLMPreprocessor(tokenizer, sequence_length=12)
    keras_hub.models.GPT2CausalLM(backbone, preprocessor=preprocessor).save_to_preset(directory)


@pytest.mark.parametrize("finetune", ["full", "lora"])
@pytest.mark.parametrize("preset", [False, True], ids=["constructor", "preset"])
@pytest.mark.parametrize("task", ["classifier", "causal_lm"])
def test_a_short_private_fine_tuning_of_a_keras_hub_model_stays_within_budget(
    run_example, imdb_dir, tmp_path, task, preset, finetune
):
    flags = [f"--imdb_dir={imdb_dir}", f"--task={task}", f"--finetune={finetune}", "--pretrain_epochs=1", *_TINY]
    if preset:
        if task == "causal_lm":
            pytest.importorskip("tensorflow_text")  # KerasHub's byte-pair tokenizer runs on tf.text
        (_causal_lm_preset if task == "causal_lm" else _classifier_preset)(tmp_path / "preset")
        flags.append(f"--preset={tmp_path / 'preset'}")
    _, steps, total, epsilon, target, out = run_example("hub_finetune", *flags)
    assert "40 private training / 20 public (of the test split) / 20 evaluation reviews" in out, out
    assert steps == total == 4 and target == 3.0 and epsilon <= target
    assert "Before private fine-tuning: accuracy: " in out and " ms per DP step" in out
    assert ("perplexity" in out and "Generated after the first 4 tokens" in out) == (task == "causal_lm")
    trained, total_parameters = (
        int(n) for n in out.split(f"--finetune={finetune}: ")[1].split(" parameters")[0].split(" of ")
    )
    assert trained < total_parameters / 2 if finetune == "lora" else trained == total_parameters
