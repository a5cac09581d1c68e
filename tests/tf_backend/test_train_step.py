"""train_step: make_private's train step equals the DP update, trains, and refuses non-private setups."""

from __future__ import annotations

import functools
import warnings

import numpy as np
import pytest
import tensorflow as tf
from per_example.brute_force import LOSS  # tests/tf_backend/per_example/brute_force.py
from per_example.brute_force import reference

import keras_dyndp
from keras_dyndp import optimizer_base
from keras_dyndp import schedules
from keras_dyndp.callbacks import PrivacyLogger
from keras_dyndp.core import mechanism
from keras_dyndp.keras_glue import private_model
from keras_dyndp.tf_backend import DynamicDPKerasAdam
from keras_dyndp.tf_backend import DynamicDPKerasSGD
from keras_dyndp.tf_backend import keras_compat
from keras_dyndp.tf_backend.train_step import make_private

keras = keras_compat.keras
CLIP = 0.5
# Most tests compare with the exact clipped sums, so their optimizers add no noise (allow_degenerate_noise=True); the
# tests of that warning assert it (pytest.warns).
pytestmark = [
    pytest.mark.filterwarnings("ignore::keras_dyndp.optimizer_base.DegenerateNoiseWarning"),
    # batches(): exact batches in order, not Poisson samples, to compare with the reference (warned by design).
    pytest.mark.filterwarnings(
        "ignore:model.fit received x of type _?BatchDataset:keras_dyndp.core.batch_sizes.SamplingWarning"
    ),
    # Arrays with public_batch_size=True: fixed-size batches by declaration (warned by design).
    pytest.mark.filterwarnings("ignore:model.fit received x of type ndarray:keras_dyndp.SamplingWarning"),
]


def dp_optimizer(
    clip: float = CLIP, learning_rate: float = 0.5, noise: float = 0.0, expected_batch_size: float | None = None
) -> DynamicDPKerasSGD:
    """A DP SGD at p = 0.01 that divides by ``expected_batch_size`` (None: by the rows, stated public)."""
    schedule = schedules.DPSchedule(np.full(1000, clip), np.full(1000, noise), 0.01)
    return DynamicDPKerasSGD(
        schedule=schedule,
        expected_batch_size=expected_batch_size,
        public_batch_size=expected_batch_size is None,
        learning_rate=learning_rate,
        allow_degenerate_noise=True,
    )


def batches(x, y, batch_size: int, sample_weight=None) -> tf.data.Dataset:
    """Batches of ``batch_size`` rows in order (the last one shorter), as fit cuts arrays, which it refuses for an
    optimizer with ``expected_batch_size``; a dataset is taken (with a SamplingWarning) and its sizes checked."""
    rows = (x, y) if sample_weight is None else (x, y, sample_weight)
    return tf.data.Dataset.from_tensor_slices(rows).batch(batch_size)


def sequential() -> keras.Model:
    return keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            keras.layers.Conv2D(3, 3, strides=2, padding="same", activation="relu"),
            keras.layers.Flatten(),
            keras.layers.Dense(2),
        ]
    )


def functional() -> keras.Model:
    inputs = keras.Input(shape=(5,), dtype=tf.int32)
    hidden = keras.layers.Embedding(10, 4)(inputs)
    hidden = keras.layers.LSTM(4)(hidden)
    return keras.Model(inputs, keras.layers.Dense(2)(hidden))


class Subclassed(keras.Model):
    def __init__(self):
        super().__init__()
        self.hidden = keras.layers.Dense(6, activation="relu")
        self.norm = keras.layers.PReLU()  # No ghost rule: vectorized path.
        self.out = keras.layers.Dense(2)

    def call(self, inputs):
        return self.out(self.norm(self.hidden(inputs)))


def dataset(name: str, size: int = 32):
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, size)
    if name == "sequential":
        x = rng.normal(size=(size, 8, 8, 1)).astype(np.float32) + y[:, None, None, None]
    elif name == "functional":
        x = (rng.integers(0, 5, (size, 5)) + 5 * y[:, None]).astype(np.int32)
    else:
        x = rng.normal(size=(size, 3)).astype(np.float32) + y[:, None]
    return x, y


@pytest.mark.parametrize(
    "name,build,clip,learning_rate",
    [("sequential", sequential, 0.5, 0.5), ("functional", functional, 5.0, 2.0), ("subclassed", Subclassed, 0.5, 0.5)],
)
def test_fit_trains_and_counts_steps(name, build, clip, learning_rate):
    keras.utils.set_random_seed(0)
    model = make_private(build(), training_metrics=True)
    model.compile(
        optimizer=dp_optimizer(clip=clip, learning_rate=learning_rate, noise=0.01), loss=LOSS, metrics=["accuracy"]
    )
    x, y = dataset(name)
    loss_before = model.evaluate(x, y, verbose=0)[0]
    history = model.fit(x, y, batch_size=8, epochs=5, verbose=0)
    assert model.evaluate(x, y, verbose=0)[0] < loss_before
    assert "accuracy" in history.history
    assert int(model.optimizer.dp_step.numpy()) == 20


def test_one_step_is_the_clipped_update_and_ignores_zero_weight_rows():
    keras.utils.set_random_seed(0)
    model = sequential()
    x, y = dataset("sequential", 4)
    weights = np.array([1.0, 0.0, 1.0, 1.0], np.float32)
    model(x[:1])
    before = [v.numpy() for v in model.trainable_variables]
    expected_sums = reference(model, x, y, weights, CLIP)[0]
    model = make_private(model)
    model.compile(optimizer=dp_optimizer(learning_rate=0.1, expected_batch_size=4.0), loss=LOSS)
    model.fit(batches(x, y, 4, weights), epochs=1, verbose=0)
    for old, new, expected in zip(before, model.trainable_variables, expected_sums):
        np.testing.assert_allclose(new.numpy(), old - 0.1 * expected / 4, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("accumulation_steps", [1, 2])
@pytest.mark.filterwarnings("ignore:model.train_on_batch received x:keras_dyndp.SamplingWarning")
def test_one_step_reads_the_schedule_once_and_refuses_another_pair(monkeypatch, accumulation_steps):
    """(C_t, sigma_t) is read once per DP step: the clipping and the release use the one pair, and the optimizer
    takes no pair but the one it handed out."""
    reads, read = [], mechanism.schedule_values
    monkeypatch.setattr(mechanism, "schedule_values", lambda *args: reads.append(args[3]) or read(*args))
    model = make_private(sequential())
    schedule = schedules.DPSchedule(np.full(10, CLIP), np.full(10, 1.0), 0.01)
    optimizer = DynamicDPKerasSGD(schedule=schedule, expected_batch_size=4.0, accumulation_steps=accumulation_steps)
    model.compile(optimizer=optimizer, loss=LOSS, run_eagerly=True)
    model.train_on_batch(*dataset("sequential", 4))
    assert len(reads) == 1 and int(model.optimizer.released_steps) == 1
    with pytest.raises(ValueError, match="schedule_values must be None .read here. or the .C_t, sigma_t. pair"):
        model.optimizer.apply_clipped_sum(
            [tf.zeros(v.shape) for v in model.trainable_variables],
            4,
            4,
            model.trainable_variables,
            schedule_values=(tf.constant(1.0), tf.constant(0.0)),
        )


@pytest.fixture(name="jacobian_model", scope="module")
def fixture_jacobian_model():
    """A built make_private model on the jacobian path, for the tests of steps it refuses: a refused step changes
    nothing (each test checks it), so they share one model and its traced step."""
    keras.utils.set_random_seed(0)
    model = make_private(sequential(), method="jacobian")
    model.compile(optimizer=dp_optimizer(learning_rate=0.1, expected_batch_size=4.0), loss=LOSS)
    model(dataset("sequential", 1)[0])
    return model


@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_the_jacobian_path_refuses_a_batch_with_a_gradient_that_is_not_finite(value, jacobian_model):
    """The jacobian differentiates the batch together: one NaN example made the other examples' gradients NaN too
    (0 x NaN), and, their factors 0, the step released nothing of them (the conformance suite shows the same of the
    microbatch path). The step is refused before any update."""
    model = jacobian_model
    x, y = dataset("sequential", 4)
    x[0, 3, 3, 0] = value
    before = [v.numpy() for v in model.trainable_variables]
    steps = int(model.optimizer.dp_step.numpy())
    with pytest.raises(tf.errors.InvalidArgumentError, match="a gradient in this batch is not finite"):
        model.fit(batches(x, y, 4), epochs=1, verbose=0)
    for old, new in zip(before, model.trainable_variables):
        np.testing.assert_array_equal(old, new.numpy())
    assert int(model.optimizer.dp_step.numpy()) == steps


def test_refuses_non_dp_optimizer_and_averaged_loss():
    x, y = dataset("subclassed", 8)
    model = Subclassed()
    model.compile(optimizer=keras.optimizers.SGD(), loss=LOSS)
    model = make_private(model)  # compiled before with another optimizer (a KerasHub task compiles itself): bound
    with pytest.raises(ValueError, match="keras_dyndp DP optimizer"):
        model.fit(x, y, verbose=0)  # and refused where it would train
    model = make_private(Subclassed())
    model.compile(optimizer=keras.optimizers.SGD(), loss=LOSS)
    with pytest.raises(ValueError, match="keras_dyndp DP optimizer"):
        model.fit(x, y, verbose=0)
    model = make_private(Subclassed())
    model.compile(optimizer=dp_optimizer(), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with pytest.raises(ValueError, match="reduction"):
        model.fit(x, y, verbose=0)
    with pytest.raises(ValueError, match="`method`"):
        make_private(Subclassed(), method="fastest")


def test_training_metrics_false_computes_no_logs_from_the_private_batch():
    keras.utils.set_random_seed(0)
    model = make_private(sequential(), training_metrics=False)
    model.compile(optimizer=dp_optimizer(noise=0.01), loss=LOSS, metrics=["accuracy"])
    x, y = dataset("sequential")
    loss_before = model.evaluate(x, y, verbose=0)[0]
    model.reset_metrics()
    history = model.fit(x, y, batch_size=8, epochs=2, verbose=0)
    # No loss, no accuracy: nothing but the noised update left the steps; the public step count stands in.
    assert history.history == {"dp_step": [4, 8]}
    assert all(float(variable.numpy()) == 0 for metric in model.metrics for variable in metric.variables)
    assert int(model.optimizer.dp_step.numpy()) == 8 and model.evaluate(x, y, verbose=0)[0] < loss_before
    with pytest.raises(ValueError, match="`training_metrics` must be True or False"):
        make_private(sequential(), training_metrics="no")


def test_by_default_nothing_computed_on_the_training_batch_is_logged():
    """Default make_private: the logs hold dp_step, PrivacyLogger's values and the metrics of the validation data;
    an outlier in the training data moves none of the training logs (with the training loss logged, one outlier
    moved the epoch loss from 0.234 to 0.567)."""
    x, y = dataset("sequential")
    outlier = x.copy()
    outlier[0] = 100.0
    training_logs = []
    for x_train in (x, outlier):
        model = make_private(sequential())
        model.compile(optimizer=dp_optimizer(noise=1.0), loss=LOSS, metrics=["accuracy"])
        history = model.fit(
            x_train,
            y,
            batch_size=8,
            epochs=1,
            verbose=0,
            validation_data=(x[:8], y[:8]),
            callbacks=[PrivacyLogger("rdp", delta=1e-5)],
        )
        logs = history.history
        # Arrays with public_batch_size=True: not known to be Poisson batches, so the epsilon keys say so.
        public = {"dp_step", "epsilon_rdp_if_poisson", "epsilon_gdp_clt_if_poisson", "clip_norm", "noise_stddev"}
        assert set(logs) == public | {"val_loss", "val_accuracy"}
        assert np.isfinite(logs["val_loss"][0])
        assert model.optimizer.get_config()["private_train_step"]["training_metrics"] is False
        training_logs.append({key: value for key, value in logs.items() if not key.startswith("val_")})
    assert training_logs[0] == training_logs[1]


def test_training_metrics_false_fits_before_any_metric_is_built_and_can_be_switched_back():
    # Keras 3 builds the compiled metrics on their first update; with training_metrics=False fit's epoch end
    # must not ask the never-updated metrics for results (here nothing evaluated before fit built them).
    model = make_private(sequential(), training_metrics=False)
    model.compile(optimizer=dp_optimizer(noise=1.0), loss=LOSS, metrics=["accuracy"])
    x, y = dataset("sequential")
    logger = PrivacyLogger("rdp", delta=1e-5)
    history = model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[logger])
    assert history.history["dp_step"] == [4, 8]
    assert "loss" not in history.history and "accuracy" not in history.history
    assert len(history.history["epsilon_rdp_if_poisson"]) == 2  # arrays: not known to be Poisson batches
    make_private(model, training_metrics=True)  # Opted in: the epoch logs are the metrics' results.
    history = model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert set(history.history) == {"loss", "accuracy"}


@pytest.mark.parametrize(
    "norm",
    [
        lambda: keras.layers.BatchNormalization(),  # Trainable scale and offset: vectorized path.
        lambda: keras.layers.BatchNormalization(center=False, scale=False),  # No weights: ghost path.
    ],
    ids=["vectorized", "ghost"],
)
def test_batch_normalisation_is_refused_before_the_first_step(norm):
    model = make_private(keras.Sequential([keras.Input((3,)), norm(), keras.layers.Dense(2)]))
    schedule = schedules.DPSchedule(np.full(10, CLIP), np.full(10, 1e6), 8 / 8)  # Batch 8 of 8 examples.
    model.compile(
        optimizer=DynamicDPKerasSGD(schedule=schedule, expected_batch_size=8, allow_degenerate_noise=True), loss=LOSS
    )
    before = [v.numpy() for v in model.variables]
    x, y = dataset("subclassed", 8)
    with pytest.raises(ValueError, match="BatchNormalization.*GroupNormalization"):
        model.fit(batches(x, y, 8), verbose=0)
    assert int(model.optimizer.dp_step.numpy()) == 0
    for old, new in zip(before, model.variables):  # moving_mean among them: nothing was released.
        np.testing.assert_array_equal(old, new.numpy())


def time_distributed() -> keras.Model:
    inputs = keras.Input(shape=(3, 4))
    hidden = keras.layers.TimeDistributed(keras.layers.Dense(3, activation="tanh"))(inputs)
    hidden = keras.layers.TimeDistributed(keras.layers.Dense(2))(hidden)
    return keras.Model(inputs, keras.layers.GlobalAveragePooling1D()(hidden))


def test_time_distributed_fit_with_a_partial_last_batch_clips_each_example():
    """5 examples in batches of 2, 2 and 1 on the ghost path: each step is the sum of per-example clipped
    gradients divided by the expected batch size 2."""
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(5, 3, 4)).astype(np.float32) * 3
    y = rng.integers(0, 2, 5)
    model, expected = time_distributed(), time_distributed()
    expected.set_weights(model.get_weights())
    for batch in (slice(0, 2), slice(2, 4), slice(4, 5)):
        sums = reference(expected, x[batch], y[batch], np.ones(len(y[batch])), CLIP)[0]
        for variable, total in zip(expected.trainable_variables, sums):
            variable.assign_sub(0.5 * total / 2)
    schedule = schedules.DPSchedule(np.full(10, CLIP), np.zeros(10), 2 / 5)
    model = make_private(model, method="ghost")
    optimizer = DynamicDPKerasSGD(
        schedule=schedule, expected_batch_size=2, learning_rate=0.5, allow_degenerate_noise=True
    )
    model.compile(optimizer=optimizer, loss=LOSS)
    model.fit(batches(x, y, 2), epochs=1, verbose=0)
    assert int(model.optimizer.dp_step.numpy()) == 3
    for actual, wanted in zip(model.trainable_variables, expected.trainable_variables):
        np.testing.assert_allclose(actual.numpy(), wanted.numpy(), rtol=1e-5, atol=1e-7)


def _with_policy(policy: str, build):
    keras.mixed_precision.set_global_policy(policy)
    try:
        return build()
    finally:
        keras.mixed_precision.set_global_policy("float32")


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision_clips_sums_and_noises_in_float32(policy):
    tf.keras.utils.set_random_seed(0)
    x, y = dataset("sequential", 4)
    model = _with_policy(policy, sequential)
    reference_model = sequential()
    reference_model.set_weights(model.get_weights())
    assert model.layers[0].compute_dtype == policy.split("_")[1] and model.layers[0].kernel.dtype == "float32"
    before = [v.numpy() for v in model.trainable_variables]
    model = make_private(model)
    clip = 0.05
    expected, norms = reference(reference_model, x[:1], y[:1], np.ones(1, np.float32), clip)[:2]  # In float32.
    assert norms[0] > 10 * clip
    model.compile(optimizer=_with_policy(policy, lambda: dp_optimizer(clip=clip, learning_rate=1.0)), loss=LOSS)
    # One example, clipped: the update is C times its direction. Clipping in the policy's precision would miss the
    # norm by ~0.1% (float16) or ~0.4% (bfloat16).
    model.fit(x[:1], y[:1], batch_size=1, epochs=1, verbose=0)
    update = [old - new.numpy() for old, new in zip(before, model.trainable_variables)]
    assert np.sqrt(sum(np.sum(u.astype(np.float64) ** 2) for u in update)) == pytest.approx(clip, rel=1e-5)
    cosine = sum(np.sum(u * e) for u, e in zip(update, expected)) / clip**2
    assert cosine > 0.99  # The same direction, computed in low precision.
    optimizer = keras_compat.unwrap_optimizer(model.optimizer)
    assert (model.optimizer is not optimizer) == (policy == "mixed_float16")  # LossScaleOptimizer, bypassed.
    assert int(optimizer.dp_step.numpy()) == 1


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision_fit_trains_on_every_path_and_refuses_ghost(policy):
    x, y = dataset("sequential")
    for method, num_microbatches in (("auto", None), ("vectorized", None), ("auto", 4)):
        tf.keras.utils.set_random_seed(0)
        model = make_private(_with_policy(policy, sequential), method=method)
        schedule = schedules.DPSchedule(np.full(100, CLIP), np.full(100, 0.01), 0.01)
        optimizer = functools.partial(
            DynamicDPKerasSGD,
            schedule=schedule,
            public_batch_size=True,
            learning_rate=0.5,
            num_microbatches=num_microbatches,
        )
        model.compile(optimizer=_with_policy(policy, optimizer), loss=LOSS)
        loss_before = model.evaluate(x, y, verbose=0)
        model.fit(x, y, batch_size=8, epochs=3, verbose=0)
        assert model.evaluate(x, y, verbose=0) < loss_before
        assert int(keras_compat.unwrap_optimizer(model.optimizer).dp_step.numpy()) == 12
        assert all(variable.dtype == "float32" for variable in model.trainable_variables)
    model = make_private(_with_policy(policy, sequential), method="ghost")
    model.compile(optimizer=_with_policy(policy, dp_optimizer), loss=LOSS)
    with pytest.raises(ValueError, match="method='ghost'.* does not support mixed precision"):
        model.fit(x, y, batch_size=8, verbose=0)


def test_load_model_restores_make_private_with_its_arguments(tmp_path):
    x, y = dataset("sequential", 16)
    model = make_private(sequential(), method="vectorized", training_metrics=False)
    model.compile(
        optimizer=DynamicDPKerasAdam(
            schedule=schedules.DPSchedule(np.full(10, CLIP), np.full(10, 0.1), 0.5),
            public_batch_size=True,
            learning_rate=0.01,
        ),
        loss=LOSS,
    )
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    arguments = {"method": "vectorized", "training_metrics": False}
    assert loaded.optimizer.get_config()["private_train_step"] == arguments
    assert private_model.is_private(loaded)
    assert private_model.record(loaded).config == private_model.PrivateConfig("vectorized", training_metrics=False)
    history = loaded.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert history.history == {"dp_step": [4]}  # The restored step, with training_metrics=False.


def test_a_model_never_made_private_is_not_made_private_by_load_model(tmp_path):
    x, y = dataset("sequential", 16)
    model = sequential()
    model.compile(optimizer=dp_optimizer(), loss=LOSS)
    model(x[:1])
    model.save(str(tmp_path / "model.keras"))
    loaded = keras.models.load_model(str(tmp_path / "model.keras"))
    assert loaded.optimizer.get_config()["private_train_step"] is None and not private_model.is_private(loaded)
    with pytest.raises(RuntimeError, match=r"call model = keras_dyndp\.make_private\(model\)"):
        loaded.fit(x, y, batch_size=8, verbose=0)


def _poisson_model(num_steps: int = 3, **optimizer_kwargs) -> keras.Model:
    """A make_private model whose DP SGD runs ``num_steps`` steps at p = 0.25 (p N = 8 of 32 rows)."""
    model = make_private(keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]))
    schedule = schedules.DPSchedule(np.ones(num_steps), np.ones(num_steps), 0.25)
    model.compile(optimizer=DynamicDPKerasSGD(schedule=schedule, **optimizer_kwargs), loss=LOSS)
    return model


def test_fit_refuses_arrays_before_the_first_step_showing_the_two_line_fix():
    x, y = dataset("subclassed")
    model = _poisson_model(expected_batch_size=8.0)
    with pytest.raises(ValueError, match="model.fit received arrays") as refused:
        model.fit(x, y, batch_size=8, verbose=0)  # 32 rows: 4 fixed-size batches, not a Poisson sample
    assert "keras_dyndp.poisson_batches(x, y, sampling_probability=0.25)" in str(refused.value)
    assert "public_batch_size=True" in str(refused.value)
    assert int(model.optimizer.dp_step) == 0
    # Stated fixed-size batches take arrays (warned: the epsilon assumes Poisson sampling), a last short batch too.
    public = _poisson_model(num_steps=10, public_batch_size=True)
    with pytest.warns(UserWarning, match="not batches returned by keras_dyndp.poisson_batches"):
        public.fit(x[:30], y[:30], batch_size=8, verbose=0)
    assert int(public.optimizer.dp_step) == 4


def test_training_past_the_budget_is_one_short_keras_dyndp_error():
    x, y = dataset("subclassed")
    batches = keras_dyndp.poisson_batches(x, y, sampling_probability=0.25, seed=0)
    model = _poisson_model(expected_batch_size=8.0)
    for start in (0, 3):  # Past T in the middle of a fit (checked before the batch), then at the start of one.
        with pytest.raises(optimizer_base.BudgetExhaustedError) as exhausted:
            model.fit(batches, epochs=2, verbose=0)
        message = str(exhausted.value)
        assert message.startswith("DP budget exhausted: all 3 steps")
        # BudgetStop would have ended the first fit at T; it cannot help one that starts there.
        assert ("keras_dyndp.BudgetStop()" in message) == (start == 0)
        assert "\n" not in message and exhausted.value.__cause__ is None
        assert exhausted.value.__context__ is None or exhausted.value.__suppress_context__
        assert int(model.optimizer.dp_step) == 3, start


def test_fit_on_a_poisson_dataset_gives_no_shuffle_warning():
    x, y = dataset("subclassed")
    model = _poisson_model(expected_batch_size=8.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(keras_dyndp.poisson_batches(x, y, sampling_probability=0.25, seed=0, steps_per_epoch=2), verbose=0)
    assert not [str(warning.message) for warning in caught if "shuffle" in str(warning.message)]
    assert int(model.optimizer.dp_step) == 2


# Every entry point: ``keras.Model.fit(model, ...)`` and ``keras.Model.train_on_batch(model, ...)`` called unbound
# skip the instance's wrappers, and ``model.train_function`` runs without them: each entry point refuses or warns as
# docs/privacy.md says. Keras 3 shows an unbound entry point's data to the model's ``_maybe_symbolic_build``, Keras 2
# in the frame of the call that makes the train function (`keras_compat.unbound_entry_data`).


def test_unbound_fit_refuses_arrays_and_checks_poisson_batches_as_the_bound_fit():
    x, y = dataset("subclassed")
    model = _poisson_model(num_steps=10, expected_batch_size=8.0)
    with pytest.raises(ValueError, match="model.fit received arrays"):
        keras.Model.fit(model, x, y, batch_size=8, verbose=0)
    assert int(model.optimizer.dp_step) == 0
    with pytest.raises(ValueError, match="sampled at p=0.5"):
        batches = keras_dyndp.poisson_batches(x, y, sampling_probability=0.5)
        keras.Model.fit(model, batches, verbose=0, shuffle=False)  # Keras warns on a dataset and shuffle=True
    assert int(model.optimizer.dp_step) == 0


def test_unbound_train_on_batch_and_the_train_function_warn_that_their_sampling_is_unknown():
    x, y = dataset("subclassed")
    with pytest.warns(UserWarning, match="model.train_on_batch received x of type"):
        keras.Model.train_on_batch(_poisson_model(public_batch_size=True), x[:8], y[:8])
    direct = _poisson_model(public_batch_size=True)
    with pytest.warns(UserWarning, match="cannot see the batches of this training step"):
        train_function = direct.make_train_function() or direct.train_function
        train_function(iter(tf.data.Dataset.from_tensors((x[:8], y[:8]))))
    assert int(direct.optimizer.dp_step) == 1


@pytest.mark.filterwarnings("ignore::keras_dyndp.SamplingWarning")
def test_past_the_budget_every_entry_point_raises_one_budget_error():
    x, y = dataset("subclassed")
    batches = keras_dyndp.poisson_batches(x, y, sampling_probability=0.25, seed=0, steps_per_epoch=2)
    model = _poisson_model(expected_batch_size=8.0)
    with pytest.raises(optimizer_base.BudgetExhaustedError, match="DP budget exhausted: all 3 steps"):
        keras.Model.fit(model, batches, epochs=3, verbose=0, shuffle=False)
    assert int(model.optimizer.dp_step) == 3
    spent = model.get_weights()
    with pytest.raises(optimizer_base.BudgetExhaustedError, match="DP budget exhausted: all 3 steps"):
        keras.Model.train_on_batch(model, x[:8], y[:8])
    for want, got in zip(spent, model.get_weights()):
        np.testing.assert_array_equal(got, want)


@pytest.mark.filterwarnings("ignore::keras_dyndp.SamplingWarning")
def test_a_rewound_step_counter_draws_new_noise_through_an_unbound_fit():
    x, y = dataset("subclassed")
    model = make_private(keras.Sequential([keras.Input((3,)), keras.layers.Dense(40)]))
    schedule = schedules.DPSchedule(np.full(4, 1e-3), np.full(4, 5.0), 0.25)  # the update is the noise
    model.compile(optimizer=DynamicDPKerasSGD(schedule=schedule, public_batch_size=True), loss=LOSS)
    kernel = model.trainable_variables[0]
    start = kernel.numpy().copy()
    updates = []
    for _ in range(2):
        kernel.assign(start)
        model.optimizer.iterations.assign(0)  # and the steps released, as a restore of the step-0 state sets them
        model.optimizer._released_steps.assign(-1)  # pylint: disable=protected-access
        keras.Model.fit(model, x[:8], y[:8], batch_size=8, verbose=0)
        updates.append((kernel.numpy() - start).ravel())
    assert abs(np.corrcoef(*updates)[0, 1]) < 0.3
