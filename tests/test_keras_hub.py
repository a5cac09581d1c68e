"""KerasHub models (the `[hub]` extra) through `make_private` with the default method: each backbone family and text
classifier, built tiny from its constructor (random weights, nothing downloaded), trains, and one example alone moves
the update by at most C (sigma 0, learning rate 1), on the backend Keras runs on. Skipped without keras-hub, which CI
installs in its hub stage only (every release requires tensorflow-text, which brings TensorFlow; on JAX these
tests pass with keras-hub installed without its dependencies)."""

import warnings

import numpy as np
import pytest

import keras_dyndp
from keras_dyndp.schedules import DPSchedule

keras_hub = pytest.importorskip("keras_hub")
keras = pytest.importorskip("keras")

VOCABULARY, LENGTH, CLIP = 64, 8, 0.5
SMALL = {"vocabulary_size": VOCABULARY, "num_layers": 1, "hidden_dim": 16, "intermediate_dim": 32}
BACKBONES = {
    "bert": lambda: keras_hub.models.BertBackbone(num_heads=2, max_sequence_length=LENGTH, **SMALL),
    "distil_bert": lambda: keras_hub.models.DistilBertBackbone(num_heads=2, max_sequence_length=LENGTH, **SMALL),
    "roberta": lambda: keras_hub.models.RobertaBackbone(num_heads=2, max_sequence_length=LENGTH, **SMALL),
    "gpt2": lambda: keras_hub.models.GPT2Backbone(num_heads=2, max_sequence_length=LENGTH, **SMALL),
    "gemma": lambda: keras_hub.models.GemmaBackbone(num_query_heads=2, num_key_value_heads=1, head_dim=8, **SMALL),
    "llama3": lambda: keras_hub.models.Llama3Backbone(num_query_heads=2, num_key_value_heads=1, **SMALL),
    "mistral": lambda: keras_hub.models.MistralBackbone(num_query_heads=2, num_key_value_heads=1, **SMALL),
    "qwen3": lambda: keras_hub.models.Qwen3Backbone(num_query_heads=2, num_key_value_heads=1, head_dim=8, **SMALL),
}
CLASSIFIERS = {
    "bert": keras_hub.models.BertTextClassifier,
    "distil_bert": keras_hub.models.DistilBertTextClassifier,
    "roberta": keras_hub.models.RobertaTextClassifier,
}


def _inputs(backbone) -> dict:
    """One example's inputs, named as ``backbone`` takes them (token ids, padding mask, BERT's segment ids)."""
    ids = np.random.default_rng(0).integers(1, VOCABULARY, (1, LENGTH)).astype("int32")
    everything = {"token_ids": ids, "padding_mask": np.ones_like(ids), "segment_ids": np.zeros_like(ids)}
    return {name: everything[name] for name in backbone.input if name in everything}


def _with_head(backbone):
    inputs = {name: keras.Input((LENGTH,), dtype="int32", name=name) for name in _inputs(backbone)}
    features = backbone(inputs)
    features = features["sequence_output"] if isinstance(features, dict) else features
    return keras.Model(inputs, keras.layers.Dense(2)(features[:, 0]))


def _one_example_update(model, inputs) -> float:
    """The L2 norm of the update one example alone makes: one DP step, sigma 0, learning rate 1, C = CLIP."""
    model = keras_dyndp.make_private(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sigma 0 (DegenerateNoiseWarning) and a dataset not from poisson_batches
        optimizer = keras_dyndp.DynamicDPKerasSGD(
            schedule=DPSchedule(np.full(2, CLIP), np.zeros(2), 0.5),
            expected_batch_size=1.0,
            learning_rate=1.0,
            allow_degenerate_noise=True,
        )
        model.compile(
            optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
        )
        before = [np.asarray(w, np.float64) for w in model.trainable_weights]
        model.train_on_batch(inputs, np.array([1], "int32"))
    after = [np.asarray(w, np.float64) for w in model.trainable_weights]
    return float(np.sqrt(sum(np.sum((a - b) ** 2) for a, b in zip(after, before))))


@pytest.mark.parametrize("family", sorted(BACKBONES))
def test_a_backbone_with_a_dense_head_trains_and_one_example_moves_it_by_at_most_c(family):
    keras.utils.set_random_seed(0)
    backbone = BACKBONES[family]()
    update = _one_example_update(_with_head(backbone), _inputs(backbone))
    assert 0 < update <= CLIP * (1 + 1e-4)


@pytest.mark.parametrize("family", sorted(CLASSIFIERS))
def test_a_text_classifier_trains_and_one_example_moves_it_by_at_most_c(family):
    keras.utils.set_random_seed(0)
    backbone = BACKBONES[family]()
    classifier = CLASSIFIERS[family](backbone=backbone, num_classes=2, preprocessor=None)
    update = _one_example_update(classifier, _inputs(backbone))
    assert 0 < update <= CLIP * (1 + 1e-4)
