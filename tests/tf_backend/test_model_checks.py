"""model_checks: layers that mix examples or store batch-derived state are refused, harmless state writes are not."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import tensorflow as tf

from keras_dyndp.tf_backend import model_checks
from keras_dyndp.tf_backend.keras_compat import keras

L = keras.layers


class Writer(L.Layer):
    """Writes to its own variables in ``call``, in the way named by ``mode``."""

    def __init__(self, mode: str, **kwargs):
        super().__init__(**kwargs)
        self.mode = mode
        if mode == "metric_object":
            self.input_mean = keras.metrics.Mean(name="input_mean")

    def build(self, input_shape):
        self.stat = self.add_weight(name="stat", shape=input_shape[1:], trainable=False, initializer="zeros")
        self.steps = self.add_weight(name="steps", shape=(), trainable=False, initializer="zeros")

    def _store_ones(self):
        self.stat.assign(tf.ones(self.stat.shape))
        return tf.constant(0.0)

    def call(self, inputs):
        if self.mode == "batch_mean":
            self.stat.assign(tf.reduce_mean(inputs, axis=0))
        elif self.mode == "batch_size":
            self.steps.assign_add(tf.cast(tf.shape(inputs)[0], tf.float32))
        elif self.mode == "in_cond":
            tf.cond(tf.reduce_sum(inputs) > 0.0, self._store_ones, lambda: tf.constant(0.0))
        elif self.mode == "in_while_loop":
            tf.while_loop(lambda i: i < 2, lambda i: (self.stat.assign_add(inputs[0]), i + 1)[1], [0])
        elif self.mode == "in_tf_function":
            # A new tf.function at each call: Keras 3 builds the model symbolically with writes recorded instead of
            # run (StatelessScope), and a tf.function first traced there would be reused without its write.
            tf.function(lambda batch: self.stat.assign(tf.reduce_mean(batch, axis=0)))(inputs)
        elif self.mode == "step_counter":
            self.steps.assign_add(1.0)
        elif self.mode == "add_metric":
            self.add_metric(tf.reduce_mean(inputs), name="input_mean")
        elif self.mode == "metric_object":
            self.input_mean.update_state(inputs)
        return inputs


def sequential(*layers: L.Layer) -> keras.Model:
    return keras.Sequential([L.Input((4,)), *layers, L.Dense(2)])


def frozen(layer: L.Layer) -> L.Layer:
    layer.trainable = False
    return layer


def time_distributed_batch_norm() -> L.Layer:
    return keras.Sequential(
        [
            L.Reshape((2, 2)),
            L.TimeDistributed(keras.Sequential([L.Input((2,)), L.BatchNormalization(name="inner_norm")])),
            L.Flatten(),
        ]
    )


@pytest.mark.parametrize(
    "layer,name,cls",
    [
        (lambda: L.BatchNormalization(name="norm"), "norm", "BatchNormalization"),
        (lambda: L.BatchNormalization(center=False, scale=False, name="norm"), "norm", "BatchNormalization"),
        (lambda: L.BatchNormalization(synchronized=True, name="norm"), "norm", "BatchNormalization"),
        pytest.param(
            lambda: L.experimental.SyncBatchNormalization(name="norm"),
            "norm",
            "SyncBatchNormalization",
            marks=pytest.mark.keras2_only(reason="Keras 3 has no SyncBatchNormalization (synchronized=True)"),
        ),
        pytest.param(
            lambda: tf.compat.v1.keras.layers.BatchNormalization(name="norm"),
            "norm",
            "BatchNormalization",
            marks=pytest.mark.keras2_only(reason="Keras 3 has no TF1 layers"),
        ),
        # TF1's BatchNormalization uses batch statistics in training even when frozen.
        pytest.param(
            lambda: frozen(tf.compat.v1.keras.layers.BatchNormalization(name="norm")),
            "norm",
            "BatchNormalization",
            marks=pytest.mark.keras2_only(reason="Keras 3 has no TF1 layers"),
        ),
        (time_distributed_batch_norm, "inner_norm", "BatchNormalization"),
    ],
)
def test_batch_normalisation_is_refused_naming_the_layer_and_the_replacement(layer, name, cls):
    with pytest.raises(ValueError, match=rf"Layer '{name}' \({cls}\).*GroupNormalization.*LayerNormalization"):
        model_checks.check_model(sequential(layer()))


def test_frozen_batch_normalisation_runs_in_inference_mode_and_is_accepted():
    model = sequential(frozen(L.BatchNormalization()))
    model_checks.check_model(model)
    x = np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32)
    # Keras runs a frozen BatchNormalization with its moving statistics: each example alone gives its own output.
    np.testing.assert_allclose(model(x, training=True)[:1], model(x[:1], training=True), rtol=1e-6)


@pytest.mark.parametrize(
    "mode,variable",
    [
        ("batch_mean", "stat"),
        ("batch_size", "steps"),
        ("in_cond", "stat"),
        ("in_while_loop", "stat"),
        ("in_tf_function", "stat"),
    ],
)
def test_writes_computed_from_the_batch_are_refused(mode, variable):
    model = sequential(Writer(mode, name="writer"))
    # Keras 2 names the variable 'writer/stat:0', Keras 3 by its path 'sequential_7/writer/stat'.
    with pytest.raises(ValueError, match=rf"variable '([\w/]+/)?writer/{variable}(:0)?' of layer 'writer' \(Writer\)"):
        model_checks.check_model(model)


@pytest.mark.parametrize(
    "layers",
    [
        pytest.param(lambda: [Writer("step_counter")], id="step_counter"),
        pytest.param(lambda: [Writer("metric_object")], id="metric_object"),
        pytest.param(
            lambda: [Writer("add_metric")],
            id="add_metric",
            marks=pytest.mark.keras2_only(reason="Keras 3 layers have no add_metric"),
        ),
        pytest.param(
            lambda: [L.Dropout(0.5), L.GaussianNoise(0.1), L.LayerNormalization(), L.GroupNormalization(2)],
            id="dropout_noise_and_per_example_norms",
        ),
        pytest.param(
            lambda: [L.Reshape((2, 2, 1)), L.RandomFlip(), L.RandomRotation(0.1), L.Flatten()], id="augmentation"
        ),
    ],
)
def test_writes_independent_of_the_batch_are_allowed(layers):
    model = sequential(*layers())
    model_checks.check_model(model, np.zeros((3, 4), np.float32))


def test_a_model_never_built_needs_inputs():
    class Subclassed(keras.Model):
        def __init__(self):
            super().__init__()
            self.writer = Writer("batch_mean", name="writer")

        def call(self, inputs):
            return self.writer(inputs)

    with pytest.raises(ValueError, match="never been built or called"):
        model_checks.check_model(Subclassed())
    with pytest.raises(ValueError, match="layer 'writer'"):
        model_checks.check_model(Subclassed(), tf.TensorSpec([None, 3]))


def test_recorded_input_specs_are_traced_when_no_inputs_are_given():
    """A functional model's int ids and a Sequential model built by calling it: their recorded specs are traced."""
    ids = L.Input((3,), dtype="int32")
    hidden = L.GlobalAveragePooling1D()(L.Embedding(5, 4)(ids))
    with pytest.raises(ValueError, match="layer 'writer'"):
        model_checks.check_model(keras.Model(ids, Writer("batch_mean", name="writer")(hidden)))
    called = keras.Sequential([L.Dense(4), Writer("batch_mean", name="writer")])
    with pytest.raises(ValueError, match="never been built or called"):
        model_checks.check_model(called)
    called(np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match="layer 'writer'"):
        model_checks.check_model(called)
    model_checks.check_model(keras.Model(ids, L.Dense(2)(hidden)))


def test_custom_training_loop_warns_once_unless_the_model_was_checked():
    optimizer = keras.optimizers.SGD()
    model = sequential()
    with pytest.warns(UserWarning, match="keras_dyndp.check_model"):
        model_checks.check_training_model(optimizer, None, model.trainable_variables)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        model_checks.check_training_model(optimizer, None, model.trainable_variables)  # Once per optimizer.
        checked = sequential()
        model_checks.check_model(checked)
        model_checks.check_training_model(keras.optimizers.SGD(), None, checked.trainable_variables)


def test_the_graph_check_alone_finds_batch_normalisation_moving_averages():
    """A BatchNormalization class missing from the list would still be caught by its writes."""
    model = sequential(L.BatchNormalization(name="norm"))
    with pytest.raises(ValueError, match=r"variable '([\w/]+/)?norm/moving_mean(:0)?' of layer 'norm'"):
        model_checks._check_writes(model, tf.TensorSpec([None, 4]))


def test_unfreezing_batch_normalisation_calls_for_a_new_check():
    norm = frozen(L.BatchNormalization(name="norm"))
    model = sequential(norm)
    model_checks.check_before_training(model)
    norm.trainable = True
    with pytest.raises(ValueError, match="Layer 'norm'"):
        model_checks.check_before_training(model)
