"""Private fine-tuning of a small transformer on IMDB: pretrain without noise on public reviews, then fine-tune with
dynamic DP-Adam on the private ones, all weights (``--finetune=full``) or low-rank adapters (``--finetune=lora``).

Data (nothing downloaded; `keras_dyndp.datasets.load_imdb_texts`): the PRIVATE set is IMDB's training split (25,000
labelled reviews). The PUBLIC set is a seeded half of IMDB's test split (``--public_fraction``), the other half is
the evaluation set. IMDB's test reviews are of other movies than its training reviews (aclImdb's README), so the two
are disjoint; calling them public is the simulation's premise (they are published with the data set), as it would
be for a public pretraining corpus. The vocabulary (``--max_tokens`` words) is counted on the public reviews only,
so nothing but the noised fine-tuning steps reads the private reviews: the whole run is within the DP guarantee.

Model: Embedding(max_tokens, d) plus learned positions (an EinsumDense over the position and feature axes, whose bias
is one vector per position), ``--blocks`` post-norm blocks of MultiHeadAttention, LayerNormalization and a ReLU
feed-forward, average pooling, Dense(1). ``--finetune=lora`` freezes the pretrained weights and calls Keras 3's
``layer.enable_lora(--lora_rank)`` on the attention projections and feed-forward layers (the head trains fully);
Keras 2 has no LoRA and refuses the flag. ``--finetune=none`` trains from scratch privately (no pretraining).
Every mode is calibrated to the same target epsilon (PLD) for the same steps.

    python -m examples.imdb_transformer --imdb_dir=/data/aclImdb --finetune=full
    KERAS_BACKEND=jax python -m examples.imdb_transformer --imdb_dir=/data/aclImdb --finetune=lora
"""

import importlib.metadata
import os
import statistics
import sys

import numpy as np
from absl import flags

if __package__ in (None, ""):  # Run as `python examples/imdb_transformer.py`: make the repository importable.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import examples  # noqa: F401,E402  (quiets TensorFlow's start-up logs: import it first)

# isort: split
if os.environ.get("KERAS_BACKEND", "tensorflow") == "tensorflow":
    import tensorflow as tf  # noqa: E402

    keras = tf.keras  # Keras 3, or Keras 2 on TensorFlow 2.15 and with TF_USE_LEGACY_KERAS=1.
else:
    import keras  # noqa: E402

import keras_dyndp  # noqa: E402
from examples import imdb_texts  # noqa: E402
from keras_dyndp import cli  # noqa: E402

HAS_LORA = hasattr(keras.layers.Dense, "enable_lora")
KERAS_VERSION = getattr(keras, "__version__", None) or importlib.metadata.version("keras")  # tf.keras 2.15 lacks it
flags.DEFINE_string("imdb_dir", None, "Extracted aclImdb folder (train/{pos,neg}, test/{pos,neg} of .txt files).")
flags.DEFINE_string("data_dir", None, "TensorFlow Datasets data directory (default ~/tensorflow_datasets).")
flags.DEFINE_enum("finetune", "full", ["none", "full", "lora"], "Private phase: from scratch, all weights, LoRA.")
flags.DEFINE_integer("lora_rank", 4, "Rank of the LoRA adapters (--finetune=lora).", lower_bound=1)
flags.DEFINE_float("public_fraction", 0.5, "Share of IMDB's test split used as public data.", 0.01, 0.99)
flags.DEFINE_integer("pretrain_epochs", 2, "Non-private epochs on the public reviews.", lower_bound=0)
flags.DEFINE_enum("method", "dynamic", cli.METHODS, cli.METHOD_HELP)
flags.DEFINE_float("epsilon", 3.0, "Target epsilon of the private phase (PLD accountant, delta = 1 / (10 N)).")
flags.DEFINE_integer("epochs", 2, "Private epochs: T = ceil(epochs N / batch_size) DP steps.", lower_bound=1)
flags.DEFINE_integer(
    "batch_size", 1000, "Expected private batch size p N (tune it first: examples/README.md).", lower_bound=1
)
flags.DEFINE_float("learning_rate", None, "DP-Adam learning rate (default 0.001 for full, 0.005 otherwise).")
flags.DEFINE_integer("max_tokens", 10000, "Vocabulary size (counted on the public reviews).", lower_bound=3)
flags.DEFINE_integer("sequence_length", 128, "Tokens per review (cut or padded).", lower_bound=1)
flags.DEFINE_integer("width", 64, "Model width d (4 heads of d / 4).", lower_bound=4)
flags.DEFINE_integer("blocks", 1, "Transformer blocks.", lower_bound=1, upper_bound=4)
flags.DEFINE_integer("verbose", 2, "Keras fit verbosity: 0 silent, 1 progress bar, 2 one line per epoch.")
flags.register_validator(
    "finetune",
    lambda mode: mode != "lora" or HAS_LORA,
    f"--finetune=lora needs Keras 3's layer.enable_lora; this is Keras {KERAS_VERSION}: use --finetune=full",
)
FLAGS = flags.FLAGS


def load() -> dict:
    """Private training reviews, public reviews and evaluation reviews: token ids and float labels [N, 1]."""
    splits = imdb_texts.imdb_splits(FLAGS.imdb_dir, FLAGS.data_dir, FLAGS.public_fraction)
    vectorize = imdb_texts.vectorizer(splits["public"][0], FLAGS.max_tokens, FLAGS.sequence_length)
    label = lambda y: np.asarray(y, np.float32)[:, None]  # noqa: E731
    return {name: (vectorize(texts), label(labels)) for name, (texts, labels) in splits.items()}


def build_model() -> keras.Model:
    """Embedding, learned positions, ``--blocks`` transformer blocks, average pooling, one logit."""
    layers, length, width = keras.layers, FLAGS.sequence_length, FLAGS.width
    inputs = keras.Input((length,), dtype="int32")
    h = layers.Embedding(FLAGS.max_tokens, width)(inputs)
    h = layers.EinsumDense("btf,fe->bte", output_shape=(length, width), bias_axes="te", name="positions")(h)
    for _ in range(FLAGS.blocks):
        h = layers.LayerNormalization()(layers.Add()([h, layers.MultiHeadAttention(4, width // 4)(h, h)]))
        feed_forward = layers.Dense(width)(layers.Dense(2 * width, activation="relu")(h))
        h = layers.LayerNormalization()(layers.Add()([h, feed_forward]))
    h = layers.GlobalAveragePooling1D()(h)
    return keras.Model(inputs, layers.Dense(1, name="head")(h))


def pretrained_model(public: tuple) -> keras.Model:
    """``--pretrain_epochs`` of non-private Adam on the public reviews (none with --finetune=none)."""
    model = build_model()
    if FLAGS.finetune != "none" and FLAGS.pretrain_epochs:
        model.compile(keras.optimizers.Adam(0.001), keras.losses.BinaryCrossentropy(from_logits=True))
        model.fit(*public, batch_size=64, epochs=FLAGS.pretrain_epochs, verbose=FLAGS.verbose)
    return model


def add_lora(model: keras.Model) -> None:
    """Freezes everything but the head; LoRA adapters on the attention projections and feed-forward layers."""
    for layer in model.layers:
        layer.trainable = layer.name == "head"
        if isinstance(layer, keras.layers.MultiHeadAttention):
            layer.trainable = True
            for dense in (layer.query_dense, layer.key_dense, layer.value_dense, layer.output_dense):
                dense.enable_lora(FLAGS.lora_rank)
        elif isinstance(layer, keras.layers.Dense) and layer.name != "head":
            layer.trainable = True
            layer.enable_lora(FLAGS.lora_rank)


def main() -> None:
    data = load()
    (x, y), (x_eval, y_eval) = data["private"], data["evaluation"]
    delta = 1 / (10 * len(y))
    optimizer = keras_dyndp.DynamicDPKerasAdam(
        target_epsilon=FLAGS.epsilon,
        target_delta=delta,
        num_examples=len(y),
        batch_size=FLAGS.batch_size,
        epochs=FLAGS.epochs,
        **cli.schedule_arguments(FLAGS.method),
        initial_clip=1.0,
        rho_mu=1 / 0.8,  # the paper's 1/rho_mu = 0.8 and 1/rho_c = 0.3, each used by the methods it shapes
        rho_c=1 / 0.3,
        learning_rate=FLAGS.learning_rate or (0.001 if FLAGS.finetune == "full" else 0.005),
    )
    schedule = optimizer.schedule
    pretrained = pretrained_model(data["public"])  # after the budget's calibration: a bad flag value fails first
    loss = keras.losses.BinaryCrossentropy(from_logits=True, reduction="none")  # per example
    metrics = [keras.metrics.BinaryAccuracy(name="accuracy", threshold=0.0)]  # on logits
    if FLAGS.finetune != "none":
        pretrained.compile(loss=loss, weighted_metrics=metrics)
        print(f"Pretrained (public data only) accuracy: {pretrained.evaluate(x_eval, y_eval, verbose=0)[1]:.4f}")
    model = build_model()
    model.set_weights(pretrained.get_weights())
    if FLAGS.finetune == "lora":
        add_lora(model)
    trainable = sum(int(np.prod(v.shape)) for v in model.trainable_weights)
    print(f"--finetune={FLAGS.finetune}: {trainable} of {model.count_params()} parameters trained privately")
    model = keras_dyndp.make_private(model)
    model.compile(optimizer=optimizer, loss=loss, weighted_metrics=metrics)
    steps_per_epoch = -(-schedule.num_steps // FLAGS.epochs)
    batches = keras_dyndp.poisson_batches(
        x, y, sampling_probability=schedule.sampling_probability, steps_per_epoch=steps_per_epoch, pad_to_multiple=32
    )
    timer = imdb_texts.step_timer(keras)
    callbacks = [keras_dyndp.PrivacyLogger(delta=delta), keras_dyndp.BudgetStop(), timer]
    model.fit(batches, epochs=FLAGS.epochs, callbacks=callbacks, verbose=FLAGS.verbose)
    _, accuracy = model.evaluate(x_eval, y_eval, verbose=0)
    print(
        f"Test accuracy: {accuracy:.4f} ({len(y_eval)} evaluation reviews; Keras {KERAS_VERSION} on "
        f"{keras.backend.backend()})"
    )
    step_ms = 1e3 * statistics.median(timer.intervals) if timer.intervals else float("nan")
    print(f"Step time: {step_ms:.1f} ms per DP step (median of {len(timer.intervals)}, compilation excluded)")
    public = "the public reviews (of the test split named on the first line) trained without noise: not protected"
    notes = [] if FLAGS.finetune == "none" else [public]
    steps = optimizer.released_steps
    print(
        keras_dyndp.run_summary(
            schedule,
            delta,
            steps,
            method=FLAGS.method,
            overflow_probability=optimizer.overflow_probability,
            privacy_unit="training review",
            notes=notes,
        )
    )


if __name__ == "__main__":
    cli.run(main)
