"""Private fine-tuning of a KerasHub model on IMDB with dynamic DP-Adam: a sentiment classifier
(``--task=classifier``) or a causal language model of the reviews (``--task=causal_lm``: next-token prediction, each
review's loss the mean over its positions of its tokens' losses under its padding mask), all weights
(``--finetune=full``) or KerasHub's LoRA adapters (``--finetune=lora``: ``backbone.enable_lora(--lora_rank)``),
calibrated to a target epsilon (PLD), through ``keras_dyndp.make_private`` with the default method.

Model: from a local preset directory when one is given (``--preset=PATH``: what KerasHub's ``from_preset`` reads, a
preset fetched beforehand on a networked machine or written by ``save_to_preset``), its tokenizer included; otherwise
a small BERT (classifier) or GPT-2 (causal LM) built from its constructor (``--width``, ``--layers``; random weights)
over word ids counted on the public reviews, first trained without noise on them (``--pretrain_epochs``). Nothing is
downloaded.

Data (examples/imdb_texts.py): the PRIVATE set is IMDB's training split, the PUBLIC set a seeded half of its test split
(``--public_fraction``), the other half the evaluation set. Prints the epsilon spent, the test accuracy (a causal LM's:
of the next token, and its perplexity; then a continuation it generates) and the time per DP step. Needs KerasHub
(``pip install -e '.[hub]'``), on TensorFlow or on JAX.

    python -m examples.hub_finetune --imdb_dir=/data/aclImdb --finetune=lora
    python -m examples.hub_finetune --imdb_dir=/data/aclImdb --preset=/models/bert_tiny_en_uncased --finetune=full
    python -m examples.hub_finetune --imdb_dir=/data/aclImdb --task=causal_lm --preset=/models/gpt2_base_en
"""

import importlib
import os
import statistics
import sys

import numpy as np
from absl import flags

if __package__ in (None, ""):  # Run as `python examples/hub_finetune.py`: make the repository importable.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import examples  # noqa: F401,E402  (quiets TensorFlow's start-up logs: import it first)

# isort: split
import keras_dyndp  # noqa: E402
from examples import imdb_texts  # noqa: E402
from keras_dyndp import cli  # noqa: E402

flags.DEFINE_string("imdb_dir", None, "Extracted aclImdb folder (train/{pos,neg}, test/{pos,neg} of .txt files).")
flags.DEFINE_string("data_dir", None, "TensorFlow Datasets data directory (default ~/tensorflow_datasets).")
flags.DEFINE_enum("task", "classifier", ["classifier", "causal_lm"], "Sentiment classifier or causal language model.")
flags.DEFINE_string("preset", None, "Local KerasHub preset directory of the task's model (default: a small one).")
flags.DEFINE_enum("finetune", "lora", ["full", "lora"], "Private phase: all weights, or LoRA adapters and the head.")
flags.DEFINE_integer("lora_rank", 4, "Rank of the LoRA adapters (--finetune=lora).", lower_bound=1)
flags.DEFINE_float("public_fraction", 0.5, "Share of IMDB's test split used as public data.", 0.01, 0.99)
flags.DEFINE_integer(
    "pretrain_epochs", 2, "Non-private epochs on the public reviews (without --preset).", lower_bound=0
)
flags.DEFINE_enum("method", "dynamic", cli.METHODS, cli.METHOD_HELP)
flags.DEFINE_float("epsilon", 3.0, "Target epsilon of the private phase (PLD accountant, delta = 1 / (10 N)).")
flags.DEFINE_integer("epochs", 1, "Private epochs: T = ceil(epochs N / batch_size) DP steps.", lower_bound=1)
flags.DEFINE_integer("batch_size", 500, "Expected private batch size p N.", lower_bound=1)
flags.DEFINE_float("learning_rate", None, "DP-Adam learning rate (default 0.001 for full, 0.005 for lora).")
flags.DEFINE_integer("sequence_length", 64, "Tokens per review (cut or padded).", lower_bound=2)
flags.DEFINE_integer("max_tokens", 5000, "Vocabulary size of the small model (without --preset).", lower_bound=3)
flags.DEFINE_integer("width", 64, "Hidden size of the small model (2 heads; without --preset).", lower_bound=2)
flags.DEFINE_integer("layers", 2, "Transformer layers of the small model (without --preset).", 1, 12)
flags.DEFINE_integer("verbose", 2, "Keras fit verbosity: 0 silent, 1 progress bar, 2 one line per epoch.")
FLAGS = flags.FLAGS


def keras_hub():
    """The keras_hub module; a one-line error naming the extra when it is not installed."""
    try:
        return importlib.import_module("keras_hub")
    except ImportError as error:
        raise cli.UsageError(f"needs KerasHub ({error}): pip install -e '.[hub]'") from error


def small_bert(public_texts: np.ndarray):
    """(a BERT classifier built from its constructor, ``(texts, labels) -> (inputs, labels, None)``, None): word ids
    of the public reviews' vocabulary after a [CLS] id (BERT classifies from the first token), padding mask, segment
    ids."""
    hub, length = keras_hub(), FLAGS.sequence_length
    vectorize = imdb_texts.vectorizer(public_texts, FLAGS.max_tokens, length - 1)

    def tokenize(texts: np.ndarray, labels: np.ndarray) -> tuple:
        ids = np.concatenate([np.full((len(texts), 1), FLAGS.max_tokens, np.int32), vectorize(texts)], axis=1)
        return {"token_ids": ids, "padding_mask": ids != 0, "segment_ids": np.zeros_like(ids)}, labels, None

    backbone = hub.models.BertBackbone(max_sequence_length=length, **_small(FLAGS.max_tokens + 1))
    return hub.models.BertTextClassifier(backbone, num_classes=2, preprocessor=None), tokenize, None


def small_gpt2(public_texts: np.ndarray):
    """(a GPT-2 causal LM built from its constructor, ``(texts, labels) -> (inputs, next word ids, mask)``,
    ``ids -> text``) over the public reviews' word ids."""
    hub, length = keras_hub(), FLAGS.sequence_length
    vectorize = imdb_texts.vectorizer(public_texts, FLAGS.max_tokens, length + 1)

    def tokenize(texts: np.ndarray, labels: np.ndarray) -> tuple:
        ids = vectorize(texts)
        return {"token_ids": ids[:, :-1], "padding_mask": ids[:, :-1] != 0}, ids[:, 1:], ids[:, 1:] != 0

    backbone = hub.models.GPT2Backbone(max_sequence_length=length, **_small(FLAGS.max_tokens))
    return hub.models.GPT2CausalLM(backbone, preprocessor=None), tokenize, vectorize.words


def _small(vocabulary_size: int) -> dict:
    width = FLAGS.width
    dims = {"hidden_dim": width, "intermediate_dim": 2 * width, "num_heads": 2, "num_layers": FLAGS.layers}
    return {"vocabulary_size": vocabulary_size, **dims}


def from_preset():
    """(the preset's task model without its preprocessor, ``(texts, labels) -> (inputs, y, weights)`` by the preset's
    own preprocessor, ``ids -> text`` for a causal LM)."""
    hub, causal = keras_hub(), FLAGS.task == "causal_lm"
    kind = (hub.models.CausalLM, hub.models.CausalLMPreprocessor) if causal else None
    kind = kind or (hub.models.TextClassifier, hub.models.TextClassifierPreprocessor)
    model = kind[0].from_preset(FLAGS.preset, preprocessor=None, **({} if causal else {"num_classes": 2}))
    preprocessor = kind[1].from_preset(FLAGS.preset, sequence_length=FLAGS.sequence_length)

    def tokenize(texts: np.ndarray, labels: np.ndarray) -> tuple:
        parts = [preprocessor(list(texts[start : start + 1000])) for start in range(0, len(texts), 1000)]
        if not causal:
            return _joined(parts), labels, None
        x, y, weights = (_joined(leaves) for leaves in zip(*parts))
        return x, y, weights

    return model, tokenize, (preprocessor.tokenizer.detokenize if causal else None)


def _joined(parts: list):
    """The preprocessor's outputs for consecutive chunks (dicts of tensors, or tensors) joined, in numpy."""
    if isinstance(parts[0], dict):
        return {name: _joined([part[name] for part in parts]) for name in parts[0]}
    return np.concatenate([np.asarray(part) for part in parts])


def build(splits: dict):
    """The task model to fine-tune privately (pretrained on the public reviews without --preset), its data
    ``{split: (x, y, sample_weight)}``, loss, metrics and ``ids -> text`` (causal LM)."""
    keras = importlib.import_module("keras")
    builder = small_gpt2 if FLAGS.task == "causal_lm" else small_bert
    model, tokenize, detokenize = from_preset() if FLAGS.preset else builder(splits["public"][0])
    data = {name: tokenize(texts, np.asarray(labels, np.int32)) for name, (texts, labels) in splits.items()}
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")  # per example (per token)
    metrics = [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]
    if FLAGS.task == "causal_lm":  # per token, weighted by the padding mask
        metrics.append(keras.metrics.SparseCategoricalCrossentropy(from_logits=True, name="cross_entropy"))
    if not FLAGS.preset and FLAGS.pretrain_epochs:
        model.compile(keras.optimizers.Adam(0.001), loss, weighted_metrics=metrics)
        x, y, weights = data["public"]
        model.fit(x, y, sample_weight=weights, batch_size=64, epochs=FLAGS.pretrain_epochs, verbose=FLAGS.verbose)
    model.compile(loss=loss, weighted_metrics=metrics)
    print(f"Before private fine-tuning: {evaluation(model, data)}")
    if FLAGS.finetune == "lora":
        model.backbone.enable_lora(FLAGS.lora_rank)
    return model, data, loss, metrics, detokenize


def evaluation(model, data: dict) -> str:
    """Accuracy on the evaluation reviews (a causal LM's: of the next token, and its perplexity)."""
    x, y, weights = data["evaluation"]
    results = model.evaluate(x, y, sample_weight=weights, verbose=0, return_dict=True)
    perplexity = f", perplexity {np.exp(results['cross_entropy']):.1f}" if "cross_entropy" in results else ""
    what = "next-word accuracy" if "cross_entropy" in results else "accuracy"
    return f"accuracy: {results['accuracy']:.4f} ({len(data['evaluation'][1])} reviews, {what}{perplexity})"


def generated(model, data: dict, detokenize) -> str:
    """The causal LM's continuation of the first evaluation review's first 4 tokens (greedy, to the full length)."""
    x = {name: np.array(value[:1]) for name, value in data["evaluation"][0].items()}
    x["padding_mask"][:, 4:] = False
    x["token_ids"][:, 4:] = 0
    ids = np.asarray(model.generate(x, stop_token_ids=None)["token_ids"])[0]
    return str(detokenize(ids))


def main() -> None:
    keras_hub()  # before anything else: without it nothing below can run
    splits = imdb_texts.imdb_splits(FLAGS.imdb_dir, FLAGS.data_dir, FLAGS.public_fraction)
    num_examples = len(splits["private"][1])
    delta = 1 / (10 * num_examples)
    optimizer = keras_dyndp.DynamicDPKerasAdam(
        target_epsilon=FLAGS.epsilon,
        target_delta=delta,
        num_examples=num_examples,
        batch_size=FLAGS.batch_size,
        epochs=FLAGS.epochs,
        **cli.schedule_arguments(FLAGS.method),
        initial_clip=1.0,
        rho_mu=1 / 0.8,  # the paper's 1/rho_mu = 0.8 and 1/rho_c = 0.3, each used by the methods it shapes
        rho_c=1 / 0.3,
        learning_rate=FLAGS.learning_rate or (0.001 if FLAGS.finetune == "full" else 0.005),
    )
    task_model, data, loss, metrics, detokenize = build(splits)  # after the calibration: a bad flag fails first
    trainable = sum(int(np.prod(v.shape)) for v in task_model.trainable_weights)
    print(f"--finetune={FLAGS.finetune}: {trainable} of {task_model.count_params()} parameters trained privately")
    model = keras_dyndp.make_private(task_model)
    model.compile(optimizer=optimizer, loss=loss, weighted_metrics=metrics)
    schedule = optimizer.schedule
    x, y, weights = data["private"]
    batches = keras_dyndp.poisson_batches(
        x,
        y,
        sample_weight=weights,
        sampling_probability=schedule.sampling_probability,
        steps_per_epoch=-(-schedule.num_steps // FLAGS.epochs),
        pad_to_multiple=32,
    )
    timer = imdb_texts.step_timer(importlib.import_module("keras"))
    callbacks = [keras_dyndp.PrivacyLogger(), keras_dyndp.BudgetStop(), timer]
    model.fit(batches, epochs=FLAGS.epochs, callbacks=callbacks, verbose=FLAGS.verbose)
    print(f"Test {evaluation(model, data)}")
    if detokenize is not None:
        print(f"Generated after the first 4 tokens of an evaluation review: {generated(model, data, detokenize)}")
    step_ms = 1e3 * statistics.median(timer.intervals) if timer.intervals else float("nan")
    print(f"Step time: {step_ms:.1f} ms per DP step (median of {len(timer.intervals)}, compilation excluded)")
    public = "the public reviews (of the test split named on the first line) trained without noise: not protected"
    summary = keras_dyndp.run_summary(
        schedule,
        delta,
        optimizer.released_steps,
        method=FLAGS.method,
        overflow_probability=optimizer.overflow_probability,
        privacy_unit="training review",
        notes=[f"the preset's own pretraining data ({FLAGS.preset}): not protected"] if FLAGS.preset else [public],
    )
    print(summary)


if __name__ == "__main__":
    cli.run(main)
