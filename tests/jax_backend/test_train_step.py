"""Tests for keras_dyndp.jax_backend.train_step: make_private's vmapped per-example step on Keras 3's JAX backend."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

jax = pytest.importorskip("jax")
keras = pytest.importorskip("keras")
if keras.backend.backend() != "jax":
    pytest.skip("Keras is not running on JAX (set KERAS_BACKEND=jax)", allow_module_level=True)

import jax_brute_force as brute_force  # noqa: E402
import numpy as np  # noqa: E402

import keras_dyndp  # noqa: E402
from keras_dyndp import ScheduleRestartWarning  # noqa: E402
from keras_dyndp import optimizer_base  # noqa: E402
from keras_dyndp import schedules  # noqa: E402
from keras_dyndp.callbacks import BudgetStop  # noqa: E402  (the top-level name)
from keras_dyndp.callbacks import PrivacyLogger  # noqa: E402
from keras_dyndp.core import batch_sizes  # noqa: E402
from keras_dyndp.core import mechanism  # noqa: E402
from keras_dyndp.core.noise_seed import NoiseSeedWarning  # noqa: E402
from keras_dyndp.jax_backend import DynamicDPKerasAdagrad  # noqa: E402
from keras_dyndp.jax_backend import DynamicDPKerasAdam  # noqa: E402
from keras_dyndp.jax_backend import DynamicDPKerasRMSprop  # noqa: E402
from keras_dyndp.jax_backend import DynamicDPKerasSGD  # noqa: E402
from keras_dyndp.jax_backend import distribution  # noqa: E402
from keras_dyndp.jax_backend import make_private  # noqa: E402
from keras_dyndp.jax_backend.per_example import taps  # noqa: E402

LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
pytestmark = [
    # FixedBatches: exact batches in order, not Poisson samples, to compare with the reference (warned by design).
    pytest.mark.filterwarnings(
        "ignore:model.fit received x of type FixedBatches:keras_dyndp.core.batch_sizes.SamplingWarning"
    ),
    # Tests that measure the clipped sum without noise, and arrays with public_batch_size=True (fixed-size batches
    # by declaration): both warned by design.
    pytest.mark.filterwarnings("ignore::keras_dyndp.optimizer_base.DegenerateNoiseWarning"),
    pytest.mark.filterwarnings("ignore:model.fit received x of type ndarray:keras_dyndp.SamplingWarning"),
]


def _data(num_rows=12, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(num_rows, 6, 6, 1)).astype("float32") * 3
    return x, rng.integers(0, 3, size=num_rows).astype("int32")


def _cnn(seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [
            keras.Input((6, 6, 1)),
            keras.layers.Conv2D(3, 3, activation="tanh"),
            keras.layers.Flatten(),
            keras.layers.Dense(3),
        ]
    )


def _weights(model):
    return [np.asarray(v.value, np.float64) for v in model.trainable_variables]


def _schedule(clip_norms, noise_stddevs=None, p=0.5):
    clip_norms = np.asarray(clip_norms, float)
    noise = np.zeros_like(clip_norms) if noise_stddevs is None else np.asarray(noise_stddevs, float)
    return schedules.DPSchedule(clip_norms, noise, p)


def test_top_level_names_resolve_to_the_jax_backend():
    assert keras_dyndp.keras_backend() == "jax"
    assert keras_dyndp.DynamicDPKerasSGD is DynamicDPKerasSGD
    assert keras_dyndp.make_private is make_private and keras_dyndp.BudgetStop is BudgetStop
    with pytest.raises(ImportError, match="needs TensorFlow"):
        keras_dyndp.shuffled_batches  # noqa: B018


@pytest.mark.parametrize("jit_compile", [True, False])
def test_each_step_applies_the_clipped_sum_of_a_per_example_loop_with_the_steps_clip_norm(jit_compile):
    x, y = _data()
    model = make_private(_cnn())
    clip_norms = [0.5, 2.0, 0.1]  # C_t changes at every step; some rows are clipped, some not
    optimizer = DynamicDPKerasSGD(
        schedule=_schedule(clip_norms), allow_degenerate_noise=True, public_batch_size=True, learning_rate=1.0
    )
    model.compile(optimizer=optimizer, loss=LOSS, jit_compile=jit_compile)
    for step, clip_norm in enumerate(clip_norms):
        batch = slice(4 * step, 4 * step + 4)
        before = _weights(model)
        expected = brute_force.clipped_sum(model, LOSS, x[batch], y[batch], clip_norm)
        model.fit(x[batch], y[batch], batch_size=4, epochs=1, verbose=0, shuffle=False)
        for old, new, total in zip(before, _weights(model), expected):
            np.testing.assert_allclose(new, old - total / 4, rtol=1e-4, atol=1e-6)
        assert int(model.optimizer.dp_step.numpy()) == step + 1


def test_padding_rows_with_weight_zero_add_nothing_and_expected_batch_size_normalises():
    x, y = _data(8)
    weights = np.array([1, 1, 0, 1, 0, 1, 1, 1], "float32")
    model = make_private(_cnn())
    optimizer = DynamicDPKerasSGD(
        schedule=_schedule([0.3, 0.3], p=0.6), allow_degenerate_noise=True, expected_batch_size=5.0, learning_rate=1.0
    )
    model.compile(optimizer=optimizer, loss=LOSS)
    before = _weights(model)
    expected = brute_force.clipped_sum(model, LOSS, x, y, 0.3, weights)
    model.fit(brute_force.FixedBatches(x, y, 8, weights), epochs=1, verbose=0)
    for old, new, total in zip(before, _weights(model), expected):
        np.testing.assert_allclose(new, old - total / 5.0, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("accumulation_steps", [1, 2])
def test_one_step_reads_the_schedule_once_and_refuses_another_pair(monkeypatch, accumulation_steps):
    """(C_t, sigma_t) is read once per DP step (once per trace of the jitted step): the clipping and the release use
    the one pair, and the optimizer takes no pair but the one it handed out."""
    reads, read = [], mechanism.schedule_values
    monkeypatch.setattr(mechanism, "schedule_values", lambda *args: reads.append(args[3]) or read(*args))
    model = make_private(_cnn())
    optimizer = DynamicDPKerasSGD(
        schedule=_schedule([0.3] * 4, [1.0] * 4), expected_batch_size=8.0, accumulation_steps=accumulation_steps
    )
    model.compile(optimizer=optimizer, loss=LOSS)
    with pytest.warns(batch_sizes.SamplingWarning):
        model.train_on_batch(*_data(8))
    assert len(reads) == 1 and optimizer.released_steps == 1
    state = optimizer.new_run([v.value for v in optimizer.variables])
    with pytest.raises(ValueError, match="schedule_values must be None .read here. or the .C_t, sigma_t. pair"):
        values = [np.zeros(v.shape, np.float32) for v in model.trainable_variables]
        optimizer.stateless_apply_clipped_sum(state, values, 8, 8, values, schedule_values=(1.0, 0.0))


def test_the_model_checks_run_once_per_fit(monkeypatch):
    """make_private's checks of the model run once in a fit (its entry point), not again in the train function it
    makes nor in the traced step; a step traced outside any entry point (a custom loop's) still runs them."""
    calls, check = [], distribution.check_distribution  # the first of the checks
    monkeypatch.setattr(distribution, "check_distribution", lambda: calls.append(1) or check())
    model = make_private(_cnn())
    optimizer = DynamicDPKerasSGD(schedule=_schedule([0.3] * 4), allow_degenerate_noise=True, public_batch_size=True)
    model.compile(optimizer=optimizer, loss=LOSS)
    model.fit(*_data(8), batch_size=4, epochs=1, verbose=0)
    assert len(calls) == 1
    state = [[v.value for v in variables] for variables in (model.trainable_variables, model.non_trainable_variables)]
    state += [optimizer.new_run([v.value for v in optimizer.variables]), []]
    jax.eval_shape(model.train_step, state, _data(4))
    assert len(calls) == 2


@pytest.mark.parametrize("accumulation_steps", [2, 3, 10])
def test_accumulation_clips_the_batch_in_physical_batches_with_the_one_pass_result(accumulation_steps):
    """10 rows in k physical batches (padded to k * ceil(10 / k)), sample weights with zeros, taps and vmap: the
    update, the step count and the logged loss and accuracy are those of one pass over the batch."""
    keras.utils.set_random_seed(4)
    layers = [keras.Input((6,)), keras.layers.Embedding(20, 4), keras.layers.GlobalAveragePooling1D()]
    model = make_private(keras.Sequential([*layers, keras.layers.Dense(3)]), training_metrics=True)
    optimizer = DynamicDPKerasSGD(
        schedule=_schedule([0.05, 0.05]),
        allow_degenerate_noise=True,
        expected_batch_size=10.0,  # p N, with p = 0.5: the zero-weight rows are not counted, and not refused
        accumulation_steps=accumulation_steps,
        learning_rate=1.0,
    )
    model.compile(optimizer=optimizer, loss=LOSS, metrics=["accuracy"])
    x = np.random.default_rng(1).integers(0, 20, size=(10, 6)).astype("int32")
    x[:, 3:] = x[:, :3]
    y = np.arange(10, dtype="int32") % 3
    weights = np.array([1, 1, 0, 1, 1, 1, 0, 1, 1, 1], "float32")
    before = _weights(model)
    expected = brute_force.clipped_sum(model, LOSS, x, y, 0.05, weights)
    logits = model(x)
    accuracy = keras.metrics.SparseCategoricalAccuracy()
    accuracy.update_state(y, logits)  # Keras's `metrics` ignore sample weights (`weighted_metrics` use them)
    history = model.fit(brute_force.FixedBatches(x, y, 10, weights), epochs=1, verbose=0)
    for old, new, total in zip(before, _weights(model), expected):
        np.testing.assert_allclose(new, old - total / 10, rtol=1e-4, atol=1e-7)
    assert int(optimizer.dp_step.numpy()) == 1
    assert history.history["loss"][0] == pytest.approx(float(np.mean(LOSS(y, logits) * weights)), rel=1e-5)
    assert history.history["accuracy"][0] == pytest.approx(float(accuracy.result()), rel=1e-6)


@pytest.mark.parametrize(
    "dp_class", [DynamicDPKerasSGD, DynamicDPKerasAdam, DynamicDPKerasAdagrad, DynamicDPKerasRMSprop]
)
def test_every_optimizer_applies_its_update_rule_to_the_clipped_mean(dp_class):
    x, y = _data(6)
    model = make_private(_cnn())
    model.compile(
        optimizer=dp_class(
            schedule=_schedule([0.2, 0.2]), allow_degenerate_noise=True, public_batch_size=True, learning_rate=0.01
        ),
        loss=LOSS,
    )
    reference = _cnn()
    base = getattr(keras.optimizers, dp_class.__name__.removeprefix("DynamicDPKeras"))(learning_rate=0.01)
    base.build(reference.trainable_variables)
    expected = brute_force.clipped_sum(model, LOSS, x, y, 0.2)
    base.apply([np.asarray(g / 6, "float32") for g in expected], reference.trainable_variables)
    model.fit(x, y, batch_size=6, epochs=1, verbose=0, shuffle=False)
    for new, want in zip(_weights(model), _weights(reference)):
        np.testing.assert_allclose(new, want, rtol=1e-4, atol=1e-6)


def test_noise_std_on_the_sum_follows_the_schedule_at_steps_0_and_2():
    keras.utils.set_random_seed(0)
    model = make_private(keras.Sequential([keras.Input((100,)), keras.layers.Dense(50, use_bias=False)]))
    sigmas = [4.0, 4.0, 12.0]
    optimizer = DynamicDPKerasSGD(
        schedule=_schedule([1e-6] * 3, sigmas, p=0.5),
        allow_degenerate_noise=True,
        expected_batch_size=8.0,
        learning_rate=1.0,
    )
    model.compile(optimizer=optimizer, loss=keras.losses.MeanSquaredError(reduction="none"))
    x, y = np.ones((8, 100), "float32"), np.zeros((8, 50), "float32")
    for step in range(3):
        before = _weights(model)[0]
        model.fit(brute_force.FixedBatches(x, y, 8), epochs=1, verbose=0)
        update = _weights(model)[0] - before  # -(clipped sum (<= 8e-6) + noise) / 8, over 5000 coordinates
        if step != 1:
            assert np.std(update) == pytest.approx(sigmas[step] / 8, rel=0.05)
            assert abs(np.mean(update)) < 0.1 * sigmas[step] / 8


@pytest.mark.parametrize("accumulation_steps", [1, 16])
def test_dropout_draws_one_mask_for_every_example_and_advances_its_seed(accumulation_steps):
    """16 copies of one example, in one batch or 16 physical batches of one row: every example draws the step's
    mask (one secret draw per step, whatever the row's position), and the kept state advances."""
    keras.utils.set_random_seed(1)
    dense = keras.layers.Dense(4, kernel_initializer="ones", use_bias=False)
    model = make_private(keras.Sequential([keras.Input((10,)), keras.layers.Dropout(0.5), dense]))
    model.compile(
        optimizer=DynamicDPKerasSGD(
            schedule=_schedule([1e6, 1e6]),
            allow_degenerate_noise=True,
            public_batch_size=True,
            accumulation_steps=accumulation_steps,
            learning_rate=1.0,
        ),
        loss=keras.losses.MeanSquaredError(reduction="none"),
    )
    x = np.eye(10, dtype="float32")[:1].repeat(16, axis=0)  # 16 copies of one example
    seeds_before = [np.asarray(v.value).copy() for v in model.non_trainable_variables]
    kernel_before = _weights(model)[0]
    model.fit(x, np.zeros((16, 4), "float32"), batch_size=16, epochs=1, verbose=0)
    # A kept copy's gradient for w_00: d/dw of mean_j((2 w_0j)^2) over 4 outputs = 2 (dropout scale 2, w = 1); the
    # update is the sum over kept copies / 16 rows. One mask for all copies keeps all of them or none: 1 or 0.
    fraction = (kernel_before[0, 0] - _weights(model)[0][0, 0]) / 2.0
    assert min(abs(fraction), abs(fraction - 1.0)) < 1e-5
    assert any(not np.array_equal(a, np.asarray(v.value)) for a, v in zip(seeds_before, model.non_trainable_variables))


def _step_sum(model, x, y, clip_norm, sample_weight=None, noise_seed=None):
    """The clipped sum of one step of ``model`` on (x, y) with next to no noise (sigma = 1e-4 C, the smallest the
    accountants accept; with one ``noise_seed`` two runs draw the same noise): the update times p N = 8."""
    model = make_private(model)
    optimizer = DynamicDPKerasSGD(
        schedule=_schedule([clip_norm], [1e-4 * clip_norm]),
        expected_batch_size=8.0,
        learning_rate=8.0,
        noise_seed=noise_seed,
    )
    model.compile(optimizer=optimizer, loss=keras.losses.MeanSquaredError(reduction="none"), jit_compile=False)
    before = _weights(model)
    model.fit(brute_force.FixedBatches(x, y, len(x), sample_weight), epochs=1, verbose=0)
    return np.concatenate([(old - new).ravel() for old, new in zip(before, _weights(model))])


def _dropout_model():
    keras.utils.set_random_seed(7)  # the global seed users publish for reproducibility
    return keras.Sequential([keras.Input((10,)), keras.layers.Dropout(0.5), keras.layers.Dense(3)])


def test_dropout_masks_are_secret_and_do_not_follow_the_rows_position():
    """The masks were once drawn from the Keras seed offset by the row's position: with the published
    seed an attacker replayed them exactly, and deleting row 0 shifted every later row's mask (2.55 C here, noise
    off). Now every example draws the step's secret masks (the optimizer's noise source), whatever its row:
    deleting an example moves the clipped sum by at most C, and a replay from the published seed misses."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, 10)).astype("float32") * 3
    y = rng.normal(size=(8, 3)).astype("float32") * 3  # every row's gradient is clipped
    with pytest.warns(NoiseSeedWarning):  # one secret for both runs: the same noise and masks
        full = _step_sum(_dropout_model(), x, y, 1.0, noise_seed=5)
        neighbour = _step_sum(_dropout_model(), x[1:], y[1:], 1.0, noise_seed=5)
    assert 0.99 <= np.linalg.norm(full - neighbour) <= 1.0 + 1e-4
    replayed = _step_sum(_dropout_model(), x, y, 1.0)  # the published seed, another secret
    assert np.linalg.norm(full - replayed) > 0.5  # main: 0.0009 (the masks were public, only the noise differed)


def test_a_layer_that_mixes_examples_moves_the_clipped_sum_by_c_at_most():
    """A fixed attack (once 3.52 C on TensorFlow's ghost path): every JAX path runs each example alone (``jax.vmap``
    of a batch of one), so a Lambda that adds the batch mean sees only its own example: deleting a row moves the
    clipped sum by C."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(8, 5)).astype("float32") * 3
    y = rng.normal(size=(8, 2)).astype("float32") * 3

    def mixing_model():
        keras.utils.set_random_seed(2)
        return keras.Sequential(
            [
                keras.Input((5,)),
                keras.layers.Dense(4),
                keras.layers.Lambda(lambda h: h + keras.ops.mean(h, axis=0)),
                keras.layers.Dense(2),
            ]
        )

    with pytest.warns(NoiseSeedWarning):  # the same noise in both runs
        full = _step_sum(mixing_model(), x, y, 1.0, noise_seed=5)
        neighbour = _step_sum(mixing_model(), np.delete(x, 3, axis=0), np.delete(y, 3, axis=0), 1.0, noise_seed=5)
    assert 0.99 <= np.linalg.norm(full - neighbour) <= 1.0 + 1e-4


def test_budget_spent_refuses_the_step_and_keeps_the_model():
    x, y = _data(8)
    model = make_private(_cnn())
    model.compile(
        optimizer=DynamicDPKerasSGD(
            schedule=_schedule([1.0] * 2, [0.5] * 2),
            allow_degenerate_noise=True,
            public_batch_size=True,
            learning_rate=0.1,
        ),
        loss=LOSS,
    )
    model.fit(x, y, batch_size=4, epochs=1, verbose=0)
    after_budget = _weights(model)
    with pytest.raises(RuntimeError, match="DP budget exhausted: all 2 steps"):
        model.fit(x, y, batch_size=4, epochs=1, verbose=0)
    for want, got in zip(after_budget, _weights(model)):
        np.testing.assert_array_equal(got, want)
    assert int(model.optimizer.dp_step.numpy()) == 2
    assert model.predict(x[:2], verbose=0).shape == (2, 3)  # the state is back in the model
    with pytest.raises(RuntimeError, match="DP budget exhausted"):
        model.train_on_batch(x[:4], y[:4])
    for want, got in zip(after_budget, _weights(model)):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("fit", [keras.Model.fit, lambda model, *args, **kwargs: model.fit(*args, **kwargs)])
def test_a_batch_far_outside_the_poisson_range_is_refused_and_not_applied(fit):
    """Also by ``keras.Model.fit(model, ...)`` called unbound, in the same call (it returned normally)."""
    x, y = _data(80)
    model = make_private(_cnn())
    # N = 10 / 0.01 = 1000 examples at p = 0.01: a batch of 80 is far above the range (0, 44).
    optimizer = DynamicDPKerasSGD(
        schedule=_schedule([1.0] * 3, [1.0] * 3, p=0.01), allow_degenerate_noise=True, expected_batch_size=10.0
    )
    model.compile(optimizer=optimizer, loss=LOSS)
    before = _weights(model)
    with pytest.raises(
        RuntimeError, match=r"too many examples in this batch: 80.*between \d+ and \d+.*The step was not applied"
    ):
        fit(model, brute_force.FixedBatches(x, y, 80), epochs=1, verbose=0)
    for want, got in zip(before, _weights(model)):
        np.testing.assert_array_equal(got, want)
    assert int(model.optimizer.dp_step.numpy()) == 0


@pytest.mark.parametrize("reduction", ["none", "sum_over_batch_size"])
def test_keras_default_train_step_is_refused_naming_make_private(reduction):
    x, y = _data(4)
    model = _cnn()
    model.compile(
        optimizer=DynamicDPKerasSGD(
            schedule=_schedule([1.0], [1.0]), allow_degenerate_noise=True, public_batch_size=True
        ),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=reduction),
    )
    with pytest.raises(
        RuntimeError, match=r"Keras.s own train step.*call model = keras_dyndp\.make_private\(model\) before model\.fit"
    ):
        model.fit(x, y, batch_size=4, verbose=0)
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, batch_size=4, verbose=0)  # compiled anew without a DP optimizer: Keras's own step is no DP step


def test_gradients_that_the_dp_step_did_not_noise_are_refused():
    model = _cnn()
    optimizer = DynamicDPKerasSGD(schedule=_schedule([1.0], [1.0]), allow_degenerate_noise=True, public_batch_size=True)
    optimizer.build(model.trainable_variables)
    with pytest.raises(RuntimeError, match="accepts only the gradients its own DP step noised.*make_private"):
        optimizer.apply([np.zeros(v.shape, "float32") for v in model.trainable_variables])


class _SeedFromData(keras.layers.Layer):
    """Writes floor(1000 x the batch's sum) into its random-generator state (an attack that once trained on JAX)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.seed_generator = keras.random.SeedGenerator(1)

    def call(self, inputs, training=False):
        if training:
            total = keras.ops.floor(1000 * keras.ops.sum(inputs)) * keras.ops.ones((2,))
            self.seed_generator.state.assign(keras.ops.cast(total, self.seed_generator.state.dtype))
        return inputs


class _StoredDraw(_SeedFromData):
    """Stores a random draw of its training call: in the DP step, a draw from the step's secret state."""

    def build(self, input_shape):
        self.draw = self.add_weight(shape=(), initializer="zeros", trainable=False)

    def call(self, inputs, training=False):
        if training:
            self.draw.assign(keras.random.uniform((), seed=self.seed_generator))
        return inputs


class _BatchSum(keras.layers.Layer):
    """Stores the sum of its input batch: state computed from the data."""

    def build(self, input_shape):
        self.total = self.add_weight(shape=(), initializer="zeros", trainable=False)

    def call(self, inputs, training=False):
        if training:
            self.total.assign(keras.ops.sum(inputs))
        return inputs


@pytest.mark.parametrize(
    "layers, loss, message",
    [
        ([keras.layers.BatchNormalization()], LOSS, "GroupNormalization"),
        ([_BatchSum()], LOSS, "writes the non-trainable variables"),
        ([_SeedFromData(name="leaky")], LOSS, r"seed_generator_state'\] \(of layers \['leaky'\]\)"),
        ([_StoredDraw()], LOSS, "computed from its random draws in the DP step"),
        ([keras.layers.Dense(3, kernel_regularizer="l2")], LOSS, "regularisation losses"),
        ([], keras.losses.SparseCategoricalCrossentropy(from_logits=True), 'reduction="none"'),
    ],
)
def test_models_and_losses_that_break_per_example_privacy_are_refused(layers, loss, message):
    x, y = _data(4)
    model = make_private(
        keras.Sequential([keras.Input((6, 6, 1)), *layers, keras.layers.Flatten(), keras.layers.Dense(3)])
    )
    model.compile(
        optimizer=DynamicDPKerasSGD(
            schedule=_schedule([1.0], [1.0]), allow_degenerate_noise=True, public_batch_size=True
        ),
        loss=loss,
    )
    before = [np.asarray(v.value) for v in model.variables]
    with pytest.raises(ValueError, match=message):
        model.fit(x, y, batch_size=4, verbose=0)
    for variable, value in zip(model.variables, before):  # refused before any step, the model intact
        np.testing.assert_array_equal(np.asarray(variable.value), value)


def test_a_non_dp_optimizer_and_bad_arguments_are_refused():
    x, y = _data(4)
    model = make_private(_cnn())
    model.compile(optimizer=keras.optimizers.SGD(), loss=LOSS)
    with pytest.raises(ValueError, match="must be a keras_dyndp DP optimizer of the JAX backend"):
        model.fit(x, y, batch_size=4, verbose=0)
    with pytest.raises(ValueError, match="`method` must be one of"):
        make_private(_cnn(), method="jacobian")
    with pytest.raises(ValueError, match="`training_metrics` must be True or False"):
        make_private(_cnn(), training_metrics=1)
    with pytest.raises(ValueError, match="`model` must be a keras.Model"):
        make_private(object())


def test_by_default_nothing_computed_on_the_training_batch_is_logged():
    """Default make_private: the logs hold dp_step, PrivacyLogger's values and the metrics of the validation data;
    an outlier in the training data moves none of the training logs (with the training loss logged, one outlier
    moved the epoch loss from 0.205 to 0.977)."""
    x, y = _data(8)
    outlier = x.copy()
    outlier[0] = 100.0
    training_logs = []
    for x_train in (x, outlier):
        model = make_private(_cnn())
        model.compile(
            optimizer=DynamicDPKerasSGD(
                schedule=_schedule([1.0] * 2, [1.0] * 2), allow_degenerate_noise=True, public_batch_size=True
            ),
            loss=LOSS,
            metrics=["accuracy"],
        )
        history = model.fit(
            x_train,
            y,
            batch_size=4,
            epochs=1,
            verbose=0,
            validation_data=(x[:4], y[:4]),
            callbacks=[PrivacyLogger("gdp_clt", delta=1e-5)],
        )
        logs = history.history
        # Arrays with public_batch_size=True: not known to be Poisson batches, so the epsilon key says so.
        public = {"dp_step", "epsilon_gdp_clt_if_poisson", "clip_norm", "noise_stddev"}
        assert set(logs) == public | {"val_loss", "val_accuracy"} and np.isfinite(logs["val_loss"][0])
        training_logs.append({key: value for key, value in logs.items() if not key.startswith("val_")})
    assert training_logs[0] == training_logs[1] and training_logs[0]["dp_step"] == [2]


def test_mixed_bfloat16_clips_float32_gradients_and_mixed_float16_is_refused():
    x, y = _data(8)
    try:
        keras.config.set_dtype_policy("mixed_bfloat16")
        model = make_private(_cnn())
        model.compile(
            optimizer=DynamicDPKerasSGD(
                schedule=_schedule([0.5, 0.5]), allow_degenerate_noise=True, public_batch_size=True, learning_rate=1.0
            ),
            loss=LOSS,
        )
        before = _weights(model)
        model.fit(x, y, batch_size=8, epochs=1, verbose=0)
        change = np.sqrt(sum(np.sum((new - old) ** 2) for old, new in zip(before, _weights(model))))
        assert 0 < change <= 0.5 + 1e-6  # the mean of 8 gradients clipped to 0.5, no noise
        assert all(v.dtype == "float32" for v in model.trainable_variables)
        keras.config.set_dtype_policy("mixed_float16")
        model = make_private(_cnn())
        model.compile(
            optimizer=DynamicDPKerasSGD(schedule=_schedule([0.5]), allow_degenerate_noise=True, public_batch_size=True),
            loss=LOSS,
        )
        with pytest.raises(ValueError, match="LossScaleOptimizer"):
            model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    finally:
        keras.config.set_dtype_policy("float32")


def test_data_and_model_parallel_release_the_one_device_step():
    """In a process of its own with 2 CPU devices (`distributed_step.py`): DataParallel and ModelParallel (one kernel
    sharded) give the per-example loop's update, noise of the schedule's std (one key per step) and the same
    variables on every device."""
    script = os.path.join(os.path.dirname(__file__), "distributed_step.py")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(__file__), *sys.path])}
    result = subprocess.run([sys.executable, script], capture_output=True, text=True, env=env, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads(result.stdout)
    assert results["devices"] == 2
    for kind, sharded in (("data", 0), ("model", 1)):
        case = results[kind]
        assert case["max_deviation"] < 1e-6
        assert case["sharded_variables"] == sharded
        assert case["noise_std_ratio"] == pytest.approx(1.0, abs=0.08)
        assert case["replicas"] == 2 and case["replicas_equal"]


class _TwiceEmbedded(keras.Model):
    """One Embedding called on two inputs: its table keeps the vmap path."""

    def __init__(self):
        super().__init__()
        self.embedding = keras.layers.Embedding(20, 4)
        self.dense = keras.layers.Dense(3)

    def call(self, inputs, training=False):
        del training  # Unused.
        first = keras.ops.mean(self.embedding(inputs), axis=1)
        second = keras.ops.mean(self.embedding(inputs[:, ::-1] % 7), axis=1)
        return self.dense(first * second)


class _Tied(keras.Model):
    """An Embedding whose table is also the output projection: read outside the layer's call."""

    def __init__(self):
        super().__init__()
        self.embedding = keras.layers.Embedding(20, 4)

    def call(self, inputs, training=False):
        del training  # Unused.
        pooled = keras.ops.mean(self.embedding(inputs), axis=1)
        return keras.ops.matmul(pooled, keras.ops.transpose(self.embedding.embeddings[:3]))


class _TiedOutput(keras.layers.Layer):
    """A functional model's output projection: the transposed table of ``embedding`` (once a relative error
    0.563 on JAX, the taps missed this read's gradient)."""

    def __init__(self, embedding, **kwargs):
        super().__init__(**kwargs)
        self.embedding = embedding

    def call(self, inputs):
        return keras.ops.matmul(inputs, keras.ops.transpose(self.embedding.embeddings[:3]))


def _tied_functional():
    inputs = keras.Input((6,))
    embedding = keras.layers.Embedding(20, 4)
    pooled = keras.layers.GlobalAveragePooling1D()(embedding(inputs))
    return keras.Model(inputs, _TiedOutput(embedding)(pooled))


@pytest.mark.parametrize("model_class", [None, _TwiceEmbedded, _Tied, _tied_functional])
def test_embedding_tables_clip_as_the_per_example_loop_with_repeated_tokens(model_class):
    keras.utils.set_random_seed(3)
    if model_class is not None:
        model = model_class()
        model(np.zeros((1, 6), "int32"))
    else:
        model = keras.Sequential(
            [
                keras.Input((6,)),
                keras.layers.Embedding(20, 4),
                keras.layers.GlobalAveragePooling1D(),
                keras.layers.Dense(3),
            ]
        )
    model = make_private(model)
    model.compile(
        optimizer=DynamicDPKerasSGD(
            schedule=_schedule([0.05, 0.05]), allow_degenerate_noise=True, public_batch_size=True, learning_rate=1.0
        ),
        loss=LOSS,
    )
    x = np.random.default_rng(0).integers(0, 20, size=(8, 6)).astype("int32")
    x[:, 3:] = x[:, :3]  # every row repeats its tokens: their rows of the table gradient add up
    y = np.arange(8, dtype="int32") % 3
    before = _weights(model)
    expected = brute_force.clipped_sum(model, LOSS, x, y, 0.05)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
    for old, new, total in zip(before, _weights(model), expected):
        np.testing.assert_allclose(new, old - total / 8, rtol=1e-4, atol=1e-7)


def _every_rule_model():
    """Conv2D on two rows per example, DepthwiseConv2D, GroupNormalization, Dense over a sequence axis, a Dense
    called twice and one whose kernel a Lambda reads (both kept on the vmap path), LayerNormalization."""
    keras.utils.set_random_seed(5)
    inputs = keras.Input((6, 6, 1))
    h = keras.layers.Lambda(lambda v: keras.ops.concatenate([v, -v]))(inputs)  # two rows per example
    h = keras.layers.Conv2D(4, 3, padding="same", activation="relu")(h)
    fold = keras.layers.Lambda(lambda v: keras.ops.sum(keras.ops.reshape(v, (2, -1, 6, 6, 4)), axis=0), (6, 6, 4))
    h = fold(h)
    h = keras.layers.DepthwiseConv2D(3, strides=2, depth_multiplier=2)(h)
    h = keras.layers.GroupNormalization(2)(h)
    h = keras.layers.Reshape((4, 8))(h)
    shared, read = keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(4)
    h = keras.layers.LayerNormalization()(shared(shared(keras.layers.Dense(8)(h))))
    h = keras.layers.Lambda(lambda v: v + keras.ops.matmul(v, keras.ops.transpose(read.kernel))[..., :4])(read(h))
    return keras.Model(inputs, keras.layers.Dense(3)(keras.layers.Flatten()(h)))


@pytest.mark.parametrize("method", ["ghost", "vectorized"])
def test_ghost_and_vmap_paths_clip_as_the_per_example_loop_with_shared_and_read_kernels(method):
    """Sample weights with zeros (padding rows add nothing), at full matmul precision: rtol 1e-5."""
    x, y = _data(8)
    weights = np.array([1, 0.5, 0, 1, 1, 2, 0, 1], "float32")
    model = make_private(_every_rule_model(), method)
    model.compile(
        optimizer=DynamicDPKerasSGD(
            schedule=_schedule([0.5], p=0.6), allow_degenerate_noise=True, expected_batch_size=5.0, learning_rate=1.0
        ),
        loss=LOSS,
    )
    values = [[v.value for v in variables] for variables in (model.trainable_variables, model.non_trainable_variables)]
    tapped = taps.tappable(model, *values, x)
    assert [type(layer).__name__ for layer, *_ in tapped.values()] == (
        ["Conv2D", "DepthwiseConv2D", "GroupNormalization", "Dense", "LayerNormalization", "Dense"]
    )
    before = _weights(model)
    with jax.default_matmul_precision("highest"):
        expected = brute_force.clipped_sum(model, LOSS, x, y, 0.5, weights)
        model.fit(brute_force.FixedBatches(x, y, 8, weights), epochs=1, verbose=0)
    for old, new, total in zip(before, _weights(model), expected):
        np.testing.assert_allclose(new, old - total / 5.0, rtol=1e-5, atol=1e-7)


def test_without_keras_backend_set_and_without_tensorflow_the_message_says_what_to_do(tmp_path):
    if importlib.util.find_spec("tensorflow") is not None:
        pytest.skip("TensorFlow is installed here")
    env = {key: value for key, value in os.environ.items() if key != "KERAS_BACKEND"}
    env["KERAS_HOME"] = str(tmp_path)  # no keras.json choosing jax
    code = "import keras_dyndp; keras_dyndp.DynamicDPKerasSGD"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)
    assert result.returncode != 0 and "set KERAS_BACKEND=jax" in result.stderr


def test_fit_refuses_arrays_before_the_first_step_showing_the_two_line_fix():
    x, y = _data()
    model = make_private(_cnn())
    model.compile(
        optimizer=DynamicDPKerasSGD(schedule=_schedule([1.0] * 3, [1.0] * 3), expected_batch_size=6.0), loss=LOSS
    )
    with pytest.raises(ValueError, match="model.fit received arrays") as refused:
        model.fit(x, y, batch_size=6, verbose=0)
    assert "keras_dyndp.poisson_batches(x, y, sampling_probability=0.5)" in str(refused.value)
    assert "public_batch_size=True" in str(refused.value) and int(model.optimizer.dp_step.numpy()) == 0


def test_training_past_the_budget_is_one_short_keras_dyndp_error():
    x, y = _data()
    model = make_private(_cnn())
    model.compile(
        optimizer=DynamicDPKerasSGD(schedule=_schedule([1.0] * 3, [1.0] * 3), expected_batch_size=6.0), loss=LOSS
    )
    batches = keras_dyndp.poisson_batches(x, y, sampling_probability=0.5, steps_per_epoch=2, seed=0)
    for start in (0, 3):  # Past T in the middle of a fit, then at the start of one (before any step).
        with pytest.raises(optimizer_base.BudgetExhaustedError) as exhausted:
            model.fit(batches, epochs=2, verbose=0)
        message = str(exhausted.value)
        assert message.startswith("DP budget exhausted: all 3 steps")
        # BudgetStop would have ended the first fit at T; it cannot help one that starts there.
        assert ("keras_dyndp.BudgetStop()" in message) == (start == 0)
        assert "\n" not in message and exhausted.value.__cause__ is None
        assert exhausted.value.__context__ is None or exhausted.value.__suppress_context__
        assert int(model.optimizer.dp_step.numpy()) == 3, start


def test_compiling_with_another_optimizer_traces_the_step_anew():
    """JAX caches jitted traces by the function object: after ``compile`` with a second DP optimizer the rebuilt
    train function replayed the first optimizer's trace (its clip norm: an update of norm 1.06 where the second
    schedule's C = 1e-3 allows about 1e-3) while the second optimizer's counter advanced."""
    x, y = np.full((4, 3), 10.0, "float32"), np.zeros((4, 2), "float32")
    model = make_private(keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]))
    loss = keras.losses.MeanSquaredError(reduction="none")
    for clip_norm in (1.0, 1e-3):
        optimizer = DynamicDPKerasSGD(
            schedule=_schedule([clip_norm] * 4, [clip_norm] * 4), public_batch_size=True, learning_rate=1.0
        )
        model.compile(optimizer=optimizer, loss=loss)
        before = _weights(model)
        if clip_norm == 1.0:
            model.fit(x, y, batch_size=4, verbose=0)
            continue
        with pytest.warns(ScheduleRestartWarning, match="starts over"):  # a fresh optimizer on a trained model
            model.fit(x, y, batch_size=4, verbose=0)
    update = np.sqrt(sum(np.sum((new - old) ** 2) for new, old in zip(_weights(model), before)))
    assert int(optimizer.dp_step.numpy()) == 1
    assert update < 0.01  # the second schedule's: C / 4 rows plus noise of std C / 4 per coordinate


# Every way of driving a made-private model (``keras.Model.fit(model, ...)`` and
# ``keras.Model.train_on_batch(model, ...)`` called unbound, which skip the instance's wrappers, and
# ``model.train_function`` after ``make_train_function``) runs the checks that protect the release.


def _noise_only_model():
    """A made-private Dense whose update is the noise (C = 1e-3, sigma = 5), with public batch sizes (arrays)."""
    keras.utils.set_random_seed(0)
    model = make_private(keras.Sequential([keras.Input((5,)), keras.layers.Dense(40)]))
    optimizer = DynamicDPKerasSGD(schedule=_schedule([1e-3] * 4, [5.0] * 4), public_batch_size=True, learning_rate=1.0)
    model.compile(optimizer=optimizer, loss=keras.losses.MeanSquaredError(reduction="none"))
    return model


def _variable_groups(model):
    """The variables of the state Keras hands the train function, in its order."""
    return (
        model.trainable_variables,
        model.non_trainable_variables,
        model.optimizer.variables,
        model.metrics_variables,
    )


def _direct_train_function(model, x, y):
    """One step through ``model.train_function`` after ``model.make_train_function()``, as a custom loop drives it:
    the state read from the variables (which the step takes over) and assigned back."""
    model.optimizer.build(model.trainable_variables)
    model.make_train_function()
    state = tuple([variable.value for variable in group] for group in _variable_groups(model))
    _, state = model.train_function(state, iter([(x, y)]))
    for variables, values in zip(_variable_groups(model), state):
        for variable, value in zip(variables, values):
            variable.assign(value)


@pytest.mark.filterwarnings("ignore::keras_dyndp.SamplingWarning")
@pytest.mark.parametrize("entry_point", ["unbound fit", "unbound train_on_batch", "train_function"])
def test_a_rewound_step_counter_draws_new_noise_on_every_entry_point(entry_point):
    """Unbound ``fit`` and ``train_on_batch`` skipped the run nonce's refresh: after ``iterations.assign(0)`` the
    noise repeated exactly (correlation +1.0000)."""
    x = np.linspace(-1, 1, 40, dtype="float32").reshape(8, 5)
    y = np.zeros((8, 40), "float32")
    model = _noise_only_model()
    train = {
        "unbound fit": lambda: keras.Model.fit(model, x, y, batch_size=8, verbose=0),
        "unbound train_on_batch": lambda: keras.Model.train_on_batch(model, x, y),
        "train_function": lambda: _direct_train_function(model, x, y),
    }[entry_point]
    kernel = model.trainable_variables[0]
    start = np.asarray(kernel.value).copy()
    updates = []
    for _ in range(2):
        kernel.assign(start)
        model.optimizer.iterations.assign(0)  # and the steps released, as a restore of the step-0 state sets them
        model.optimizer._released_steps.assign(-1)  # pylint: disable=protected-access
        train()
        assert int(model.optimizer.dp_step.numpy()) == 1
        updates.append((np.asarray(kernel.value) - start).ravel())
    assert np.std(updates[0]) > 0.1  # the noise, 5 / 8 per coordinate
    assert abs(np.corrcoef(*updates)[0, 1]) < 0.3


def _poisson_model(num_steps=3):
    model = make_private(_cnn())
    optimizer = DynamicDPKerasSGD(schedule=_schedule([1.0] * num_steps, [1.0] * num_steps), expected_batch_size=6.0)
    model.compile(optimizer=optimizer, loss=LOSS)
    return model


@pytest.mark.filterwarnings("ignore::keras_dyndp.SamplingWarning")
def test_past_the_budget_unbound_fit_and_train_on_batch_raise_and_apply_nothing():
    """Unbound ``fit`` over the budget returned normally after 3 of 6 steps, the refusal left unreported."""
    x, y = _data()
    model = _poisson_model()
    batches = keras_dyndp.poisson_batches(x, y, sampling_probability=0.5, steps_per_epoch=2, seed=0)
    with pytest.raises(optimizer_base.BudgetExhaustedError, match="DP budget exhausted: all 3 steps"):
        keras.Model.fit(model, batches, epochs=3, verbose=0)
    assert int(model.optimizer.dp_step.numpy()) == 3
    spent = _weights(model)
    with pytest.raises(optimizer_base.BudgetExhaustedError, match="DP budget exhausted: all 3 steps"):
        keras.Model.train_on_batch(model, *batches[0])
    with pytest.raises(optimizer_base.BudgetExhaustedError, match="DP budget exhausted: all 3 steps"):
        keras.Model.fit(model, batches, verbose=0)
    for want, got in zip(spent, _weights(model)):
        np.testing.assert_array_equal(got, want)
    assert int(model.optimizer.dp_step.numpy()) == 3
    assert model.predict(x[:2], verbose=0).shape == (2, 3)  # the state is back in the model


def test_every_entry_point_refuses_or_warns_on_data_that_is_not_poisson_sampled():
    """Unbound ``fit`` trained 20 fixed-size steps of arrays without even a SamplingWarning."""
    x, y = _data()
    model = _poisson_model()
    with pytest.raises(ValueError, match="model.fit received arrays"):
        keras.Model.fit(model, x, y, batch_size=6, verbose=0)
    assert int(model.optimizer.dp_step.numpy()) == 0
    with pytest.raises(ValueError, match="sampled at p=0.25"):
        keras.Model.fit(model, keras_dyndp.poisson_batches(x, y, sampling_probability=0.25), verbose=0)
    with pytest.warns(batch_sizes.SamplingWarning, match="model.train_on_batch received x of type"):
        keras.Model.train_on_batch(model, x[:6], y[:6])
    direct = _poisson_model()
    with pytest.warns(batch_sizes.SamplingWarning, match="cannot see the batches of this training step"):
        _direct_train_function(direct, x[:6], y[:6])
    assert int(direct.optimizer.dp_step.numpy()) == 1


def test_under_several_processes_only_poisson_batches_given_to_fit_are_taken_on_every_entry_point(monkeypatch):
    """In 2 processes, arrays given to an unbound ``fit`` put every example into the global batch twice."""
    x, y = _data()
    model = make_private(_cnn())
    optimizer = DynamicDPKerasSGD(schedule=_schedule([1.0] * 3, [1.0] * 3), public_batch_size=True)
    model.compile(optimizer=optimizer, loss=LOSS)
    monkeypatch.setattr(jax, "process_count", lambda: 2)  # after the optimizer agreed on its key (a collective)
    keras.distribution.set_distribution(
        keras.distribution.DataParallel(devices=jax.devices(), auto_shard_dataset=False)
    )
    try:
        for train in (
            lambda: keras.Model.fit(model, x, y, batch_size=6, verbose=0),
            lambda: keras.Model.train_on_batch(model, x[:6], y[:6]),
            lambda: model.make_train_function(),
        ):
            with pytest.raises(ValueError, match="count each example 2 times"):
                train()
    finally:
        keras.distribution.set_distribution(None)
    assert int(model.optimizer.dp_step.numpy()) == 0
