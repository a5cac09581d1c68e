"""keras_dyndp.rules.keras_hub_rules and the ready-made rules it uses (`layer_rules.rms_normalization`,
`layer_rules.added_weight`; on layers of their own: tests/rules/test_ready_made_rules.py), on the backend Keras runs on:
KerasHub's layers get their rules at the first lookup; each rule's per-example squared norms and clipped sums equal
brute-force per-example gradients (`rule_brute_force`); a model of them takes the ghost path (JAX: every layer tapped)
and steps as the vectorized path; a ReversibleEmbedding called with ``reverse=True`` keeps the per-example path on JAX
(vmap), while TensorFlow's tapped form of its rule covers both calls (tf_backend/per_example/test_reversible)."""

import warnings

import numpy as np
import pytest
import rule_brute_force

import keras_dyndp
from keras_dyndp import backend
from keras_dyndp.rules import registry
from keras_dyndp.schedules import DPSchedule

keras_hub = pytest.importorskip("keras_hub")
keras = pytest.importorskip("keras")
ON_TENSORFLOW = keras.backend.backend() == "tensorflow"

from keras_hub.src.layers.modeling.position_embedding import PositionEmbedding  # noqa: E402
from keras_hub.src.models.gemma.rms_normalization import RMSNormalization  # noqa: E402
from keras_hub.src.models.llama.llama_layernorm import LlamaLayerNorm  # noqa: E402
from keras_hub.src.models.mistral.mistral_layer_norm import MistralLayerNormalization  # noqa: E402
from keras_hub.src.models.qwen3.qwen3_layernorm import Qwen3LayerNorm  # noqa: E402

BATCH, LENGTH, WIDTH, VOCABULARY = rule_brute_force.BATCH, 5, 4, 7


NORMS = {
    "gemma": lambda: RMSNormalization(epsilon=1e-6),
    "llama": lambda: LlamaLayerNorm(epsilon=1e-5),
    "mistral": lambda: MistralLayerNormalization(epsilon=1e-6),
    "qwen3": lambda: Qwen3LayerNorm(epsilon=1e-6),
}


@pytest.mark.parametrize("family", sorted(NORMS))
def test_an_rms_norms_rule_is_its_per_example_scale_gradient(family):
    layer = rule_brute_force.built(NORMS[family](), (LENGTH, WIDTH))
    rng = np.random.default_rng(2)
    a = (rng.normal(size=(BATCH, LENGTH, WIDTH)) * np.array([1e-3, 1.0, 30.0])[:, None, None]).astype("float32")
    rule_brute_force.assert_rule_matches_brute_force(layer, a, rng.normal(size=a.shape).astype("float32"))


def test_qwen3s_per_head_norm_rule_sums_over_the_heads():
    layer = rule_brute_force.built(Qwen3LayerNorm(head_dim=WIDTH, epsilon=1e-6), (LENGTH, 2, WIDTH))
    rng = np.random.default_rng(3)
    a = rng.normal(size=(BATCH, LENGTH, 2, WIDTH)).astype("float32")
    rule_brute_force.assert_rule_matches_brute_force(layer, a, rng.normal(size=a.shape).astype("float32"))


def test_a_position_embedding_longer_than_the_input_gets_its_first_rows():
    layer = rule_brute_force.built(PositionEmbedding(sequence_length=LENGTH + 3), (LENGTH, WIDTH))
    rng = np.random.default_rng(5)
    a = rng.normal(size=(BATCH, LENGTH, WIDTH)).astype("float32")
    rule_brute_force.assert_rule_matches_brute_force(layer, a, rng.normal(size=a.shape).astype("float32"))


def _recorded(layer, shape, dtype, **kwargs):
    """``layer`` called once in a functional model (a recorded call), built."""
    keras.Model(inputs := keras.Input(shape, dtype=dtype), layer(inputs, **kwargs))
    return layer


@pytest.mark.skipif(ON_TENSORFLOW, reason="TensorFlow's rule is its tapped form (test_reversible)")
@pytest.mark.parametrize("tie_weights", [True, False])
@pytest.mark.parametrize("hubs", [False, True], ids=["keras", "keras_hub"])
def test_a_reversible_embeddings_forward_rule_is_its_per_example_gradient(tie_weights, hubs):
    cls = keras_hub.layers.ReversibleEmbedding if hubs else keras.layers.ReversibleEmbedding
    layer = _recorded(cls(VOCABULARY, WIDTH, tie_weights=tie_weights), (LENGTH,), "int32")
    rng = np.random.default_rng(6)
    for variable in layer.trainable_variables:
        variable.assign(rng.normal(size=variable.shape).astype("float32"))
    ids = rng.integers(0, VOCABULARY, size=(BATCH, LENGTH)).astype("int32")  # ids repeat within examples
    rule_brute_force.assert_rule_matches_brute_force(
        layer, ids, rng.normal(size=(BATCH, LENGTH, WIDTH)).astype("float32")
    )
    rule = registry.rule_for(layer)
    h = keras.ops.convert_to_tensor(rng.normal(size=(BATCH, 1, LENGTH, WIDTH)).astype("float32"))
    with pytest.raises(ValueError, match="reverse=True alone"):  # a reverse call's input and gradient
        rule.norms_and_sums(layer, h, keras.ops.ones((BATCH, 1, LENGTH, VOCABULARY)))


def test_a_reversible_embedding_with_a_recorded_reverse_call_has_no_rule_but_tensorflows_tapped_one():
    unrecorded = rule_brute_force.built(keras.layers.ReversibleEmbedding(VOCABULARY, WIDTH), (LENGTH,), "int32")
    assert registry.rule_for(unrecorded) is not None  # called inside another layer: its taps see every call
    layer = _recorded(keras.layers.ReversibleEmbedding(VOCABULARY, WIDTH), (LENGTH,), "int32")
    assert registry.rule_for(layer) is not None
    layer(keras.Input((LENGTH, WIDTH)), reverse=True)
    assert (registry.rule_for(layer) is not None) == ON_TENSORFLOW
    masked = _recorded(keras.layers.ReversibleEmbedding(VOCABULARY, WIDTH, mask_zero=True), (LENGTH,), "int32")
    assert registry.rule_for(masked) is None


def test_a_position_embedding_called_from_another_position_has_no_rule():
    layer = _recorded(PositionEmbedding(sequence_length=LENGTH + 3), (LENGTH, WIDTH), "float32")
    assert registry.rule_for(layer) is not None
    layer(keras.Input((LENGTH, WIDTH)), start_index=2)
    assert registry.rule_for(layer) is None


def test_a_gpt2_causal_lms_tied_embedding_has_only_tensorflows_tapped_rule_and_its_position_embedding_a_rule():
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=VOCABULARY, num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16, max_sequence_length=8
    )
    assert registry.rule_for(backbone.token_embedding) is not None  # the backbone alone: its forward call
    keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
    # Its output projection, a recorded reverse call: JAX's vmap; TensorFlow's tapped rule covers both calls.
    assert (registry.rule_for(backbone.token_embedding) is not None) == ON_TENSORFLOW
    assert registry.rule_for(backbone.position_embedding) is not None


def _dp_update(build, x, y, method: str) -> list[np.ndarray]:
    """The weights' moves in one noiseless DP step (learning rate 1, C 0.05: every example clipped; p N half the
    batch) of ``make_private(build(), method)`` on (x, y): minus the clipped sum over p N, float64."""
    model = keras_dyndp.make_private(build(), method=method)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sigma 0 (DegenerateNoiseWarning) and a batch not from poisson_batches
        optimizer = keras_dyndp.DynamicDPKerasSGD(
            schedule=DPSchedule(np.full(2, 0.05), np.zeros(2), 0.5),
            expected_batch_size=len(x) / 2,
            learning_rate=1.0,
            allow_degenerate_noise=True,
        )
        model.compile(
            optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
        )
        before = [np.asarray(w, np.float64) for w in model.trainable_weights]
        model.train_on_batch(x, y)
    return [np.asarray(w, np.float64) - b for w, b in zip(model.trainable_weights, before)]


def _assert_same_updates(first, second, tolerance=1e-5):
    scale = max(np.max(np.abs(update)) for update in second)
    for a, b in zip(first, second):
        np.testing.assert_allclose(a, b, rtol=0, atol=tolerance * scale)


def _tapped(model, x) -> list:
    """The layers JAX's taps tap in ``model`` on ``x``."""
    from keras_dyndp.jax_backend.per_example import taps  # pylint: disable=import-outside-toplevel

    values = [[v.value for v in variables] for variables in (model.trainable_variables, model.non_trainable_variables)]
    return [layer for layer, *_ in taps.tappable(model, *values, x).values()]


def _hub_layers_model(tie_weights: bool):
    """Token ids through KerasHub's layers (a ReversibleEmbedding, a PositionEmbedding longer than the input, the four
    RMS norms) and Dense layers to 3 logits at the first position; random scales."""
    keras.utils.set_random_seed(0)
    ids = keras.Input((LENGTH,), dtype="int32")
    h = keras_hub.layers.ReversibleEmbedding(VOCABULARY, WIDTH, tie_weights=tie_weights)(ids)
    h = RMSNormalization()(h + PositionEmbedding(LENGTH + 2)(h))
    h = keras.layers.Dense(WIDTH)(h)
    for norm in (LlamaLayerNorm(), MistralLayerNormalization(), Qwen3LayerNorm()):
        h = norm(h)
    model = keras.Model(ids, keras.layers.Dense(3)(h[:, 0]))
    rng = np.random.default_rng(7)
    for layer in model.layers:
        if hasattr(layer, "scale"):
            layer.scale.assign(rng.normal(size=layer.scale.shape).astype("float32"))
    return model


@pytest.mark.parametrize("tie_weights", [True, False])
def test_a_model_of_keras_hubs_layers_takes_the_ghost_path_and_steps_as_the_vectorized_path(tie_weights):
    rng = np.random.default_rng(8)
    x = rng.integers(0, VOCABULARY, size=(4, LENGTH)).astype("int32")
    y = rng.integers(0, 3, size=4).astype("int32")
    model = _hub_layers_model(tie_weights)
    hub_layers = [layer for layer in model.layers if type(layer).__module__.startswith("keras_hub")]
    assert len(hub_layers) == 6 and all(registry.rule_for(layer) is not None for layer in hub_layers)
    if backend.keras_backend() == "jax":
        assert {id(layer) for layer in hub_layers} <= {id(layer) for layer in _tapped(model, x)}
    # On TensorFlow method='ghost' raises where the model cannot take the ghost path.
    ghost = _dp_update(lambda: _hub_layers_model(tie_weights), x, y, "ghost")
    _assert_same_updates(ghost, _dp_update(lambda: _hub_layers_model(tie_weights), x, y, "vectorized"))


class _TiedHead(keras.layers.Layer):
    """Calls ``embedding`` (a ReversibleEmbedding) with ``reverse=True`` inside its own call: a call no functional
    model records."""

    def __init__(self, embedding, **kwargs):
        super().__init__(**kwargs)
        self.embedding = embedding

    def call(self, h):
        return self.embedding(h, reverse=True)


keras_dyndp.register_layer_rule(_TiedHead, per_example=True)  # on TensorFlow: else no ghost path to fall back from


def _tied_model():
    """Token ids, a ReversibleEmbedding's lookup (recorded), a Dense, then its reverse call (unrecorded, in
    `_TiedHead`): logits over the vocabulary at the first position."""
    keras.utils.set_random_seed(0)
    ids = keras.Input((LENGTH,), dtype="int32")
    embedding = keras.layers.ReversibleEmbedding(VOCABULARY, WIDTH)
    h = keras.layers.Dense(WIDTH)(embedding(ids))
    return keras.Model(ids, _TiedHead(embedding)(h)[:, 0])


def test_a_reversible_embedding_also_called_in_reverse_keeps_the_per_example_path_on_jax_and_the_ghost_path_on_tf():
    """Tied, called in reverse inside another layer: on TensorFlow the tapped rule sees both calls, and the ghost
    step's table norm (a float32 rounding bound above the exact one) steps as the vectorized path within 1e-3."""
    rng = np.random.default_rng(9)
    x = rng.integers(0, VOCABULARY, size=(4, LENGTH)).astype("int32")
    y = rng.integers(0, VOCABULARY, size=4).astype("int32")
    model = _tied_model()
    embedding = model.layers[1]
    assert isinstance(embedding, keras.layers.ReversibleEmbedding) and registry.rule_for(embedding) is not None
    if backend.keras_backend() == "jax":
        assert embedding not in _tapped(model, x)  # called twice
    else:
        ghost = _dp_update(_tied_model, x, y, "ghost")
        _assert_same_updates(ghost, _dp_update(_tied_model, x, y, "vectorized"), tolerance=1e-3)
    _assert_same_updates(_dp_update(_tied_model, x, y, "auto"), _dp_update(_tied_model, x, y, "vectorized"), 1e-3)
