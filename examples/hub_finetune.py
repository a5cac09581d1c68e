"""Private fine-tuning of a KerasHub text classifier on IMDB with dynamic DP-Adam: all weights (``--finetune=full``)
or KerasHub's LoRA adapters (``--finetune=lora``: ``backbone.enable_lora(--lora_rank)``), calibrated to a target
epsilon (PLD), through ``keras_dyndp.make_private`` with the default method.

Model: from a local preset directory when one is given (``--preset=PATH``: what ``keras_hub.models.TextClassifier
.from_preset`` reads, a preset fetched beforehand on a networked machine or written by ``save_to_preset``), its
tokenizer included; otherwise a small BERT built from its constructor (``--width``, ``--layers``; random weights) over
word ids counted on the public reviews, first trained without noise on them (``--pretrain_epochs``). Nothing is
downloaded.

Data (examples/imdb_texts.py): the PRIVATE set is IMDB's training split, the PUBLIC set a seeded half of its test split
(``--public_fraction``), the other half the evaluation set. Prints the epsilon spent, the test accuracy and the time
per DP step. Needs KerasHub (``pip install -e '.[hub]'``), on TensorFlow or on JAX.

    python -m examples.hub_finetune --imdb_dir=/data/aclImdb --finetune=lora
    python -m examples.hub_finetune --imdb_dir=/data/aclImdb --preset=/models/bert_tiny_en_uncased --finetune=full
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
flags.DEFINE_string("preset", None, "Local KerasHub preset directory of a text classifier (default: a small BERT).")
flags.DEFINE_enum("finetune", "lora", ["full", "lora"], "Private phase: all weights, or LoRA adapters and the head.")
flags.DEFINE_integer("lora_rank", 4, "Rank of the LoRA adapters (--finetune=lora).", lower_bound=1)
flags.DEFINE_float("public_fraction", 0.5, "Share of IMDB's test split used as public data.", 0.01, 0.99)
flags.DEFINE_integer(
    "pretrain_epochs", 2, "Non-private epochs on the public reviews (without --preset).", lower_bound=0
)
flags.DEFINE_enum("method", "dynamic", ["vanilla", "growing_mu", "sensitivity_decay", "dynamic"], "DP schedule.")
flags.DEFINE_float("epsilon", 3.0, "Target epsilon of the private phase (PLD accountant, delta = 1 / (10 N)).")
flags.DEFINE_integer("epochs", 1, "Private epochs: T = ceil(epochs N / batch_size) DP steps.", lower_bound=1)
flags.DEFINE_integer("batch_size", 500, "Expected private batch size p N.", lower_bound=1)
flags.DEFINE_float("learning_rate", None, "DP-Adam learning rate (default 0.001 for full, 0.005 for lora).")
flags.DEFINE_integer("sequence_length", 64, "Tokens per review (cut or padded).", lower_bound=2)
flags.DEFINE_integer("max_tokens", 5000, "Vocabulary size of the small BERT (without --preset).", lower_bound=3)
flags.DEFINE_integer("width", 64, "Hidden size of the small BERT (2 heads; without --preset).", lower_bound=2)
flags.DEFINE_integer("layers", 2, "Transformer layers of the small BERT (without --preset).", 1, 12)
flags.DEFINE_integer("verbose", 2, "Keras fit verbosity: 0 silent, 1 progress bar, 2 one line per epoch.")
FLAGS = flags.FLAGS


def keras_hub():
    """The keras_hub module; a one-line error naming the extra when it is not installed."""
    try:
        return importlib.import_module("keras_hub")
    except ImportError as error:
        raise cli.UsageError(f"needs KerasHub ({error}): pip install -e '.[hub]'") from error


def small_bert(public_texts: np.ndarray):
    """(a BERT classifier built from its constructor, ``texts -> inputs``): word ids of the public reviews' vocabulary
    after a [CLS] id (BERT classifies from the first token), padding mask, segment ids."""
    hub, length = keras_hub(), FLAGS.sequence_length
    vectorize = imdb_texts.vectorizer(public_texts, FLAGS.max_tokens, length - 1)
    cls_id = FLAGS.max_tokens

    def tokenize(texts: np.ndarray) -> dict:
        ids = np.concatenate([np.full((len(texts), 1), cls_id, np.int32), vectorize(texts)], axis=1)
        return {"token_ids": ids, "padding_mask": ids != 0, "segment_ids": np.zeros_like(ids)}

    backbone = hub.models.BertBackbone(
        vocabulary_size=FLAGS.max_tokens + 1,
        num_layers=FLAGS.layers,
        num_heads=2,
        hidden_dim=FLAGS.width,
        intermediate_dim=2 * FLAGS.width,
        max_sequence_length=length,
    )
    return hub.models.BertTextClassifier(backbone, num_classes=2, preprocessor=None), tokenize


def preset_classifier():
    """(the preset's classifier without its preprocessor, ``texts -> inputs`` by the preset's own preprocessor)."""
    hub = keras_hub()
    classifier = hub.models.TextClassifier.from_preset(FLAGS.preset, num_classes=2, preprocessor=None)
    preprocessor = hub.models.TextClassifierPreprocessor.from_preset(
        FLAGS.preset, sequence_length=FLAGS.sequence_length
    )

    def tokenize(texts: np.ndarray) -> dict:
        parts = [preprocessor(texts[start : start + 1000]) for start in range(0, len(texts), 1000)]
        return {name: np.concatenate([np.asarray(part[name]) for part in parts]) for name in parts[0]}

    return classifier, tokenize


def build(splits: dict):
    """The classifier to fine-tune privately (pretrained on the public reviews without --preset) and its inputs."""
    keras = importlib.import_module("keras")
    classifier, tokenize = preset_classifier() if FLAGS.preset else small_bert(splits["public"][0])
    data = {
        name: (tokenize(texts), np.asarray(labels, np.int32))
        for name, (texts, labels) in splits.items()
        if name != "source"
    }
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")  # per example
    metrics = [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]
    if not FLAGS.preset and FLAGS.pretrain_epochs:
        classifier.compile(keras.optimizers.Adam(0.001), loss, weighted_metrics=metrics)
        classifier.fit(*data["public"], batch_size=64, epochs=FLAGS.pretrain_epochs, verbose=FLAGS.verbose)
    classifier.compile(loss=loss, weighted_metrics=metrics)
    print(f"Before private fine-tuning: accuracy {classifier.evaluate(*data['evaluation'], verbose=0)[1]:.4f}")
    if FLAGS.finetune == "lora":
        classifier.backbone.enable_lora(FLAGS.lora_rank)
    return classifier, data, loss, metrics


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
        method=FLAGS.method,
        initial_clip=1.0,
        rho_mu=1 / 0.8,  # the paper's 1/rho_mu = 0.8 and 1/rho_c = 0.3, each used by the methods it shapes
        rho_c=1 / 0.3,
        learning_rate=FLAGS.learning_rate or (0.001 if FLAGS.finetune == "full" else 0.005),
    )
    classifier, data, loss, metrics = build(splits)  # after the budget's calibration: a bad flag value fails first
    trainable = sum(int(np.prod(v.shape)) for v in classifier.trainable_weights)
    print(f"--finetune={FLAGS.finetune}: {trainable} of {classifier.count_params()} parameters trained privately")
    model = keras_dyndp.make_private(classifier)
    model.compile(optimizer=optimizer, loss=loss, weighted_metrics=metrics)
    schedule = optimizer.schedule
    batches = keras_dyndp.poisson_batches(
        *data["private"],
        sampling_probability=schedule.sampling_probability,
        steps_per_epoch=-(-schedule.num_steps // FLAGS.epochs),
        pad_to_multiple=32,
    )
    timer = imdb_texts.step_timer(importlib.import_module("keras"))
    callbacks = [keras_dyndp.PrivacyLogger(), keras_dyndp.BudgetStop(), timer]
    model.fit(batches, epochs=FLAGS.epochs, callbacks=callbacks, verbose=FLAGS.verbose)
    print(
        f"Test accuracy: {model.evaluate(*data['evaluation'], verbose=0)[1]:.4f} ({len(data['evaluation'][1])} reviews)"
    )
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
