"""Tests for keras_dyndp.jax_backend.model_checks: batch-derived state is found by tracing, on the JAX backend."""

import pytest

jax = pytest.importorskip("jax")
keras = pytest.importorskip("keras")
if keras.backend.backend() != "jax":
    pytest.skip("Keras is not running on JAX (set KERAS_BACKEND=jax)", allow_module_level=True)

import numpy as np  # noqa: E402

import keras_dyndp  # noqa: E402
from keras_dyndp import schedules  # noqa: E402
from keras_dyndp.jax_backend import DynamicDPKerasSGD  # noqa: E402
from keras_dyndp.jax_backend import check_model  # noqa: E402
from keras_dyndp.jax_backend import make_private  # noqa: E402
from keras_dyndp.jax_backend import model_checks  # noqa: E402

pytestmark = [
    # Tests that measure the clipped sum without noise, and arrays with public_batch_size=True (fixed-size batches
    # by declaration): both warned by design.
    pytest.mark.filterwarnings("ignore::keras_dyndp.optimizer_base.DegenerateNoiseWarning"),
    pytest.mark.filterwarnings("ignore:model.fit received x of type ndarray:keras_dyndp.SamplingWarning"),
]


class _RunningMean(keras.layers.Layer):
    """Stores the batch mean (private), a call counter and a constant (public) in training."""

    def build(self, input_shape):
        self.mean = self.add_weight(shape=(input_shape[-1],), initializer="zeros", trainable=False, name="mean")
        self.calls = self.add_weight(shape=(), initializer="zeros", trainable=False, name="calls")
        self.flag = self.add_weight(shape=(), initializer="zeros", trainable=False, name="flag")

    def call(self, inputs, training=False):
        if training:
            self.mean.assign(0.9 * self.mean + 0.1 * keras.ops.mean(inputs, axis=0))
            self.calls.assign(self.calls + 1.0)
            self.flag.assign(1.0)
        return inputs


def _model(*middle):
    return keras.Sequential([keras.Input((5,)), keras.layers.Dense(4), *middle, keras.layers.Dense(2)], name="net")


def test_writes_computed_from_the_batch_are_found_and_counters_and_seeds_pass():
    model = _model(keras.layers.Dropout(0.5), _RunningMean(name="running"))
    x = np.ones((3, 5), "float32")
    assert model_checks.batch_dependent_writes(model, x) == ["net/running/mean"]
    abstract = jax.ShapeDtypeStruct((3, 5), np.float32)
    assert model_checks.batch_dependent_writes(model, abstract) == ["net/running/mean"]
    with pytest.raises(ValueError, match=r"writes the non-trainable variables \['net/running/mean'\]"):
        check_model(model, x)
    check_model(_model(keras.layers.Dropout(0.5), keras.layers.GaussianNoise(0.1)), x)  # random states only


def test_batch_normalization_is_refused_unless_frozen_and_the_top_level_name_resolves():
    assert keras_dyndp.check_model is check_model
    normalised = _model(keras.layers.BatchNormalization(name="bn"))
    with pytest.raises(ValueError, match="BatchNormalization"):
        check_model(normalised, np.ones((2, 5), "float32"))
    normalised.get_layer("bn").trainable = False  # inference mode, fixed statistics
    check_model(normalised, np.ones((2, 5), "float32"))
    with pytest.raises(ValueError, match="must be a keras.Model"):
        check_model(keras.layers.Dense(2), np.ones((2, 5), "float32"))


def test_make_private_names_the_variable_its_step_would_leak():
    model = make_private(_model(_RunningMean(name="running")))
    schedule = schedules.DPSchedule(np.ones(2), np.ones(2), 0.5)
    model.compile(
        optimizer=DynamicDPKerasSGD(schedule=schedule, public_batch_size=True),
        loss=keras.losses.MeanSquaredError(reduction="none"),
    )
    before = [np.asarray(v.value) for v in model.variables]
    with pytest.raises(ValueError, match=r"\['net/running/mean'\]"):
        model.fit(np.ones((4, 5), "float32"), np.zeros((4, 2), "float32"), batch_size=4, verbose=0)
    for variable, value in zip(model.variables, before):  # the refused trace left the model as it was
        np.testing.assert_array_equal(np.asarray(variable.value), value)
    assert model.predict(np.ones((1, 5), "float32"), verbose=0).shape == (1, 2)
