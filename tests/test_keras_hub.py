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


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="TensorFlow's ghost path")
@pytest.mark.parametrize("lora", [0, 2])
@pytest.mark.parametrize("family", sorted(BACKBONES))
def test_on_tensorflow_a_backbone_is_proven_per_example_and_ghost_clips_as_the_per_example_path(family, lora):
    """KerasHub's blocks are known to TensorFlow's ghost path as no class: the traced forward pass proves they keep
    the examples apart (`graph_rows`), and every trained layer has a rule (KerasHub's own: `keras_hub_rules`), full
    fine-tuning and LoRA; a padded example included."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    from keras_dyndp.tf_backend.per_example import clipped_sum  # pylint: disable=import-outside-toplevel
    from keras_dyndp.tf_backend.per_example import graph_rows  # pylint: disable=import-outside-toplevel

    keras.utils.set_random_seed(0)
    backbone = BACKBONES[family]()
    if lora:
        backbone.enable_lora(lora)
    model = _with_head(backbone)
    x = {name: np.repeat(value, 3, axis=0) for name, value in _inputs(backbone).items()}
    x["token_ids"] = np.random.default_rng(1).integers(1, VOCABULARY, (3, LENGTH)).astype("int32")
    if "padding_mask" in x:
        x["padding_mask"][1, LENGTH // 2 :] = 0
    y = np.array([0, 1, 1], "int32")
    assert graph_rows.first_mixing_op(model, x) is None
    assert clipped_sum._ghost_applies(model, x, model.trainable_variables, "ghost")  # pylint: disable=protected-access
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    results = {}
    for method in ("ghost", "vectorized"):
        random = tf.random.Generator.from_seed(3)  # The same dropout masks on both paths.
        sums, norms = tf.function(  # tf.map_fn (the per-example path on Keras 3) runs in a graph only
            lambda m=method, r=random: clipped_sum.clipped_gradient_sum(
                model, loss, x, y, None, 1e-3, model.trainable_variables, method=m, random_source=r
            )
        )()
        results[method] = np.concatenate([np.ravel(s) for s in sums]), np.asarray(norms)
    (ghost_sums, ghost_norms), (sums, norms) = results["ghost"], results["vectorized"]
    np.testing.assert_allclose(ghost_norms, norms, rtol=1e-4)
    np.testing.assert_allclose(ghost_sums, sums, atol=1e-5 * np.max(np.abs(sums)))


@pytest.mark.skipif(keras.backend.backend() != "jax", reason="JAX's taps; TensorFlow's ghost path needs known layers")
@pytest.mark.parametrize("family", sorted(BACKBONES))
def test_on_jax_every_trainable_layer_of_the_backbones_is_tapped(family):
    """KerasHub's blocks (TransformerEncoder, each model's decoder block, its attention) are declared nowhere: the
    forward pass runs per example, so the rules tap the layers inside them: Dense, EinsumDense and Keras's norms, and
    KerasHub's own (ReversibleEmbedding, PositionEmbedding, the RMS norms: keras_dyndp.rules.keras_hub_rules). Only
    what the rules leave out (a Dense bias) keeps its vmap gradient."""
    from keras_dyndp.jax_backend.per_example import taps  # pylint: disable=import-outside-toplevel
    from keras_dyndp.rules import sublayers  # pylint: disable=import-outside-toplevel

    keras.utils.set_random_seed(0)
    backbone = BACKBONES[family]()
    model = _with_head(backbone)
    values = [[v.value for v in variables] for variables in (model.trainable_variables, model.non_trainable_variables)]
    tapped = {id(layer) for layer, *_ in taps.tappable(model, *values, _inputs(backbone)).values()}
    trainable = [
        layer
        for layer in sublayers.layers(model)
        if layer.trainable_weights and not sublayers.layers(layer, include_self=False)
    ]
    assert len(trainable) >= 5 and all(id(layer) in tapped for layer in trainable), [
        f"{layer.name} ({type(layer).__name__})" for layer in trainable if id(layer) not in tapped
    ]


@pytest.mark.parametrize("family", sorted(CLASSIFIERS))
def test_a_text_classifier_trains_and_one_example_moves_it_by_at_most_c(family):
    keras.utils.set_random_seed(0)
    backbone = BACKBONES[family]()
    classifier = CLASSIFIERS[family](backbone=backbone, num_classes=2, preprocessor=None)
    update = _one_example_update(classifier, _inputs(backbone))
    assert 0 < update <= CLIP * (1 + 1e-4)


# Causal language models: KerasHub's convention, y the next tokens [B, L] and sample_weight the padding mask [B, L].
CAUSAL_LMS = {
    "gpt2": lambda backbone: keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None),
    "gemma": lambda backbone: keras_hub.models.GemmaCausalLM(backbone=backbone, preprocessor=None),
    "llama3": lambda backbone: keras_hub.models.Llama3CausalLM(backbone=backbone, preprocessor=None),
    "mistral": lambda backbone: keras_hub.models.MistralCausalLM(backbone=backbone, preprocessor=None),
    "qwen3": lambda backbone: keras_hub.models.Qwen3CausalLM(backbone=backbone, preprocessor=None),
}


def _next_token_batch(lengths) -> tuple[dict, np.ndarray, np.ndarray]:
    """``(x, y, sample_weight)`` as a CausalLM preprocessor gives them: token ids and padding mask, the next tokens,
    the mask (examples of ``lengths`` tokens, padded to LENGTH)."""
    ids = np.random.default_rng(0).integers(1, VOCABULARY, (len(lengths), LENGTH + 1)).astype("int32")
    mask = (np.arange(LENGTH + 1)[None] < np.asarray(lengths)[:, None] + 1).astype("int32")
    ids *= mask
    return {"token_ids": ids[:, :-1], "padding_mask": mask[:, :-1]}, ids[:, 1:], mask[:, 1:].astype("float32")


def _dp_step(model, batch, clip_norm=CLIP, expected_batch_size=1.0) -> list[np.ndarray]:
    """One DP step of ``model`` (made private) on ``batch`` (sigma 0, learning rate 1, a per-token loss); the
    trainable weights' moves times ``expected_batch_size``: minus the clipped sum."""
    model = keras_dyndp.make_private(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sigma 0 (DegenerateNoiseWarning) and a batch not from poisson_batches
        optimizer = keras_dyndp.DynamicDPKerasSGD(
            schedule=DPSchedule(np.full(2, clip_norm), np.zeros(2), 0.5),
            expected_batch_size=expected_batch_size,
            learning_rate=1.0,
            allow_degenerate_noise=True,
        )
        model.compile(
            optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
        )
        before = [np.asarray(w, np.float64) for w in model.trainable_weights]
        model.train_on_batch(*batch)
    return [(np.asarray(w, np.float64) - b) * expected_batch_size for w, b in zip(model.trainable_weights, before)]


def _norm(moves) -> float:
    return float(np.sqrt(sum(np.sum(move**2) for move in moves)))


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("family", sorted(CAUSAL_LMS))
def test_a_causal_lm_fine_tunes_privately_and_generates(family, lora):
    """One padded example alone moves the weights by at most C (LoRA: the frozen weights not at all); then
    ``generate`` completes a prompt of token ids as KerasHub documents it (no preprocessor: ``stop_token_ids=None``)."""
    keras.utils.set_random_seed(0)
    backbone = BACKBONES[family]()
    causal_lm = CAUSAL_LMS[family](backbone)
    if lora:
        backbone.enable_lora(4)
    frozen = [np.asarray(w) for w in causal_lm.non_trainable_weights]
    assert 0 < _norm(_dp_step(causal_lm, _next_token_batch([5]))) <= CLIP * (1 + 1e-4)
    for before, after in zip(frozen, causal_lm.non_trainable_weights):
        np.testing.assert_array_equal(before, np.asarray(after))
    prompt = {"token_ids": np.zeros((1, LENGTH), "int32"), "padding_mask": np.zeros((1, LENGTH), "int32")}
    prompt["token_ids"][0, :3], prompt["padding_mask"][0, :3] = [5, 6, 7], 1
    generated = causal_lm.generate(prompt, stop_token_ids=None)
    assert np.asarray(generated["token_ids"]).shape == (1, LENGTH)
    np.testing.assert_array_equal(np.asarray(generated["token_ids"])[0, :3], [5, 6, 7])
    assert np.all(np.asarray(generated["padding_mask"]))


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="TensorFlow's ghost path (JAX: vmap for it)")
@pytest.mark.parametrize("family", sorted(CAUSAL_LMS))
def test_on_tensorflow_a_causal_lm_takes_the_ghost_path_and_clips_as_the_per_example_path(family):
    """The token embedding's lookup and its reverse call (the output projection; tied in GPT-2, Gemma and Qwen 3, a
    table of its own in Llama 3 and Mistral) are both covered (`reversible`): the ghost path's norms (tied: a float32
    rounding bound above, never below) and clipped sums are the per-example path's, padded examples included."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    from keras_dyndp.tf_backend.per_example import clipped_sum  # pylint: disable=import-outside-toplevel

    keras.utils.set_random_seed(0)
    causal_lm = CAUSAL_LMS[family](BACKBONES[family]())
    x, y, mask = _next_token_batch([5, LENGTH, 2])
    assert clipped_sum._ghost_applies(causal_lm, x, causal_lm.trainable_variables, "ghost")  # pylint: disable=protected-access
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    results = {}
    for method in ("ghost", "vectorized"):
        random = tf.random.Generator.from_seed(3)  # The same dropout masks on both paths.
        sums, norms = tf.function(
            lambda m=method, r=random: clipped_sum.clipped_gradient_sum(
                causal_lm, loss, x, y, mask, 1e-3, causal_lm.trainable_variables, method=m, random_source=r
            )
        )()
        results[method] = np.concatenate([np.ravel(s) for s in sums]), np.asarray(norms)
    (ghost_sums, ghost_norms), (sums, norms) = results["ghost"], results["vectorized"]
    assert np.all(ghost_norms >= norms * (1 - 1e-5))
    np.testing.assert_allclose(ghost_norms, norms, rtol=1e-3)
    np.testing.assert_allclose(ghost_sums, sums, atol=1e-3 * np.max(np.abs(sums)))


def _gpt2_without_dropout():
    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.GPT2Backbone(num_heads=2, max_sequence_length=LENGTH, dropout=0.0, **SMALL)
    return keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)


def test_a_causal_lms_examples_are_clipped_alone_as_brute_force_per_example_gradients_say():
    """GPT-2, examples of 7, 4 and 2 tokens: the release is the sum of each example's gradient under KerasHub's own
    compiled loss (alone in Keras's non-private step), clipped; padding tokens move nothing."""
    x, y, mask = _next_token_batch([7, 4, 2])
    gradients = []
    for i in range(3):
        causal_lm = _gpt2_without_dropout()  # KerasHub's default compile: its loss, Keras's default reduction
        causal_lm.compile(optimizer=keras.optimizers.SGD(1.0))
        before = [np.asarray(w, np.float64) for w in causal_lm.trainable_weights]
        causal_lm.train_on_batch({key: value[i : i + 1] for key, value in x.items()}, y[i : i + 1], mask[i : i + 1])
        gradients.append([b - np.asarray(w, np.float64) for w, b in zip(causal_lm.trainable_weights, before)])
    norms = [_norm(gradient) for gradient in gradients]
    clip_norm = float(np.median(norms))  # one example clipped, one not
    released = _dp_step(_gpt2_without_dropout(), (x, y, mask), clip_norm, expected_batch_size=2.0)
    for j, move in enumerate(released):
        expected = sum(gradient[j] * min(1.0, clip_norm / norm) for gradient, norm in zip(gradients, norms))
        np.testing.assert_allclose(-move, expected, rtol=1e-3, atol=1e-5 * clip_norm)
    other = np.where(mask == 0, (y + 1) % VOCABULARY, y)  # other targets (and tokens) where the mask is 0
    x_other = {**x, "token_ids": np.where(x["padding_mask"] == 0, 3, x["token_ids"])}
    moved = _dp_step(_gpt2_without_dropout(), (x_other, other, mask), clip_norm, expected_batch_size=2.0)
    for a, b in zip(released, moved):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7 * clip_norm)


def test_a_causal_lm_with_a_preprocessor_trains_privately_on_its_output_and_generates_text():
    """KerasHub's documented flow offline: a GPT-2 tokenizer from a tiny vocabulary and merges, a DP step on raw text
    (the task's preprocessor gives ``(x, y, sample_weight)``), then ``generate`` on a string prompt returns a string."""
    pytest.importorskip("tensorflow_text")  # KerasHub's tokenizers run on tf.text (not on the JAX stack)
    vocabulary = {"<|endoftext|>": 0, "a": 1, "Ġquick": 2, "Ġfox": 3, "Ġ": 4, "q": 5, "u": 6, "i": 7, "c": 8, "k": 9}
    vocabulary.update({"f": 10, "o": 11, "x": 12, "Ġq": 13, "ui": 14, "ck": 15, "uick": 16, "Ġf": 17, "ox": 18})
    merges = ["Ġ q", "u i", "c k", "ui ck", "Ġq uick", "Ġ f", "o x", "Ġf ox"]
    tokenizer = keras_hub.models.GPT2Tokenizer(vocabulary=vocabulary, merges=merges)
    preprocessor = keras_hub.models.GPT2CausalLMPreprocessor(tokenizer, sequence_length=LENGTH)
    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.GPT2Backbone(
        **{**SMALL, "vocabulary_size": tokenizer.vocabulary_size()}, num_heads=2, max_sequence_length=LENGTH
    )
    causal_lm = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=preprocessor)
    _, _, sample_weight = preprocessor(["a quick fox"])
    assert tuple(sample_weight.shape) == (1, LENGTH)  # the padding mask of the next tokens
    assert 0 < _norm(_dp_step(causal_lm, (["a quick fox"],))) <= CLIP * (1 + 1e-4)  # preprocessed by the task
    text = causal_lm.generate("a quick", max_length=LENGTH)
    assert isinstance(text, str) and text.startswith("a quick")
