"""clipped_sum: per-example clipped sums of both methods against a loop of single-example tape.gradient."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from brute_force import LOSS
from brute_force import assert_matches
from brute_force import reference

from keras_dyndp.tf_backend import per_example
from keras_dyndp.tf_backend.keras_compat import keras

pytestmark = pytest.mark.xdist_group("clipped_sum")  # its module fixtures run once (tests/conftest.py)

BATCH = 6
WEIGHTS = np.array([1.0, 0.0, 1.0, 2.0, 0.0, 1.0], np.float32)


def cnn() -> keras.Model:
    return keras.Sequential(
        [
            keras.Input((16, 16, 1)),
            keras.layers.Conv2D(4, 8, strides=2, padding="same", activation="relu"),
            keras.layers.MaxPool2D(2, 1),
            keras.layers.Conv2D(6, 3, strides=2, padding="valid", activation="relu"),
            keras.layers.MaxPool2D(2, 1),
            keras.layers.Flatten(),
            keras.layers.Dense(8, activation="relu"),
            keras.layers.Dense(3),
        ]
    )


def lstm() -> keras.Model:
    return keras.Sequential(
        [
            keras.Input((5,)),
            keras.layers.Embedding(7, 4),
            keras.layers.LSTM(5, return_sequences=True),
            keras.layers.LSTM(3),
            keras.layers.Dense(3),
        ]
    )


def text() -> keras.Model:
    inputs = keras.Input(shape=(6,), dtype=tf.int32)
    hidden = keras.layers.Embedding(5, 4)(inputs)
    hidden = keras.layers.Dense(4, activation="tanh")(hidden)  # Dense over a sequence axis.
    hidden = keras.layers.GlobalAveragePooling1D()(hidden)
    return keras.Model(inputs, keras.layers.Dense(3)(hidden))


class WithoutRule(keras.Model):
    """Subclassed model with a PReLU: no ghost rule, so the whole model is vectorized."""

    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(5, activation="relu")
        self.norm = keras.layers.PReLU()
        self.out = keras.layers.Dense(3)

    def call(self, inputs):
        return self.out(self.norm(self.dense(inputs)))


def data(name: str):
    rng = np.random.default_rng(1)
    y = tf.constant(rng.integers(0, 3, BATCH), tf.int32)
    if name == "cnn":
        return tf.constant(rng.normal(size=(BATCH, 16, 16, 1)), tf.float32), y
    if name == "lstm":
        return tf.constant(rng.integers(0, 7, (BATCH, 5)), tf.int32), y
    if name == "text":
        return tf.constant(rng.integers(0, 5, (BATCH, 6)), tf.int32), y
    return tf.constant(rng.normal(size=(BATCH, 4)), tf.float32), y


MODELS = {"cnn": cnn, "lstm": lstm, "text": text, "without_rule": WithoutRule}


@pytest.fixture(scope="module", params=sorted(MODELS))
def case(request):
    keras.utils.set_random_seed(0)
    model = MODELS[request.param]()
    x, y = data(request.param)
    model(x[:1])
    clip_norm = 0.3
    return request.param, model, x, y, clip_norm, reference(model, x, y, WEIGHTS, clip_norm)


@pytest.mark.parametrize("method", ["auto", "vectorized"])
def test_clipped_sum_matches_reference(case, method):
    _, model, x, y, clip_norm, (expected_sums, expected_norms) = case
    step = tf.function(
        lambda: per_example.clipped_gradient_sum(
            model, LOSS, x, y, tf.constant(WEIGHTS), clip_norm, model.trainable_variables, method=method
        )
    )
    sums, norms = step()
    assert_matches(sums, norms, (expected_sums, expected_norms))
    assert np.all(norms.numpy()[WEIGHTS == 0] == 0)


def test_ghost_path_compiles_with_xla(case):
    name, model, x, y, clip_norm, (expected_sums, expected_norms) = case
    if name not in ("cnn", "text"):
        pytest.skip("One conv and one embedding model keep the test short.")
    step = tf.function(
        lambda: per_example.clipped_gradient_sum(
            model, LOSS, x, y, tf.constant(WEIGHTS), clip_norm, model.trainable_variables
        ),
        jit_compile=True,
    )
    sums, norms = step()
    assert_matches(sums, norms, (expected_sums, expected_norms))


def test_ghost_rules_cover_models(case):
    name, model, *_ = case
    assert per_example.ghost_supported(model, model.trainable_variables) == (name != "without_rule")


@pytest.mark.parametrize("recurrent", ["LSTM", "GRU", "SimpleRNN"])
def test_recurrent_layers_take_map_fn_on_the_vectorized_path(recurrent):
    """pfor turns these graphs into ones that fail only when run (SimpleRNN after an Embedding on Keras 2 too)."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.layers.Embedding(7, 3), getattr(keras.layers, recurrent)(2), keras.layers.Dense(3)])
    x, y = data("lstm")
    model(x[:1])
    expected_sums, expected_norms = reference(model, x, y, WEIGHTS, 0.1)
    sums, norms = tf.function(
        lambda: per_example.clipped_gradient_sum(
            model, LOSS, x, y, tf.constant(WEIGHTS), 0.1, model.trainable_variables, method="vectorized"
        )
    )()
    assert_matches(sums, norms, (expected_sums, expected_norms))


def test_ghost_refuses_model_without_rule():
    model = WithoutRule()
    x, y = data("without_rule")
    model(x[:1])
    with pytest.raises(ValueError, match="method='ghost'"):
        per_example.clipped_gradient_sum(model, LOSS, x, y, None, 1.0, model.trainable_variables, method="ghost")


def test_tensor_float_32_on_a_gpu_sends_the_model_to_the_vectorized_path(monkeypatch):
    """TF32's rounding of the ghost sums (2^-10 of terms that can dwarf an example's gradient) is not bounded by the
    clip norm: with TF32 on and a GPU visible, 'auto' clips on the vectorized path and 'ghost' refuses."""
    model = cnn()
    x, y = data("cnn")
    model(x[:1])
    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: ["GPU:0"] if kind == "GPU" else [])
    monkeypatch.setattr(tf.config.experimental, "tensor_float_32_execution_enabled", lambda: True)
    ghost_calls = []
    monkeypatch.setattr(per_example.ghost, "clipped_sum", lambda *args: ghost_calls.append(args) or [None] * 4)
    sums, norms = per_example.clipped_gradient_sum(
        model, LOSS, x, y, tf.constant(WEIGHTS), 0.5, model.trainable_variables
    )
    assert not ghost_calls
    assert_matches(sums, norms, reference(model, x, y, WEIGHTS, 0.5))
    with pytest.raises(ValueError, match=r"TensorFloat-32 is on.*enable_tensor_float_32_execution\(False\)"):
        per_example.clipped_gradient_sum(model, LOSS, x, y, None, 1.0, model.trainable_variables, method="ghost")
    monkeypatch.setattr(tf.config.experimental, "tensor_float_32_execution_enabled", lambda: False)
    per_example.clipped_gradient_sum(model, LOSS, x, y, None, 1.0, model.trainable_variables, method="ghost")
    assert len(ghost_calls) == 1


def test_shared_layer_falls_back_to_vectorized():
    dense = keras.layers.Dense(4)
    inputs = keras.Input(shape=(4,))
    model = keras.Model(inputs, keras.layers.Dense(3)(dense(dense(inputs))))
    x, y = data("without_rule")
    expected_sums, expected_norms = reference(model, x, y, WEIGHTS, 0.5)
    sums, norms = per_example.clipped_gradient_sum(
        model, LOSS, x, y, tf.constant(WEIGHTS), 0.5, model.trainable_variables
    )
    assert_matches(sums, norms, (expected_sums, expected_norms))


def test_zero_clip_norm_gives_zero_sums_and_scalar_loss_is_refused():
    model = text()
    x, y = data("text")
    sums, _ = per_example.clipped_gradient_sum(model, LOSS, x, y, None, 0.0, model.trainable_variables)
    assert all(np.all(s.numpy() == 0) for s in sums)
    with pytest.raises(ValueError, match="one loss per example"):
        per_example.clipped_gradient_sum(
            model,
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            x,
            y,
            None,
            1.0,
            model.trainable_variables,
        )
    with pytest.raises(ValueError, match="`method`"):
        per_example.clipped_gradient_sum(model, LOSS, x, y, None, 1.0, model.trainable_variables, method="x")


class _UnusedWeight(keras.layers.Layer):
    """A layer holding a trainable weight its call does not read (as a KerasHub backbone holds the untied output
    embedding it does not call)."""

    def build(self, input_shape):
        self.unused = self.add_weight(shape=(2,), initializer="ones", name="unused")

    def call(self, inputs):
        return inputs


@pytest.mark.parametrize("method", ["vectorized", "jacobian"])
def test_a_variable_the_loss_does_not_use_gets_a_zero_sum(method):
    inputs, dense = keras.Input(shape=(4,)), keras.layers.Dense(3)
    model = keras.Model(inputs, dense(_UnusedWeight()(inputs)))
    x, y = data("without_rule")
    sums, norms = per_example.clipped_gradient_sum(
        model, LOSS, x, y, tf.constant(WEIGHTS), 0.5, model.trainable_variables, method=method
    )
    used = [s for s, v in zip(sums, model.trainable_variables) if "unused" not in v.name]
    unused = [s for s, v in zip(sums, model.trainable_variables) if "unused" in v.name]
    assert len(used) == 2 and len(unused) == 1 and np.all(unused[0].numpy() == 0)
    assert_matches(used, norms, reference(keras.Model(inputs, dense(inputs)), x, y, WEIGHTS, 0.5))
