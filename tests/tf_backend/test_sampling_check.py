"""Tests for keras_dyndp.tf_backend.sampling_check: the batches fit receives must match the schedule's sampling."""

import sys
import warnings

import numpy as np
import pytest
import tensorflow as tf

import keras_dyndp
from keras_dyndp import schedules
from keras_dyndp.core import batch_sizes
from keras_dyndp.tf_backend import data
from keras_dyndp.tf_backend import distribution
from keras_dyndp.tf_backend import keras_compat
from keras_dyndp.tf_backend import sampling_check
from keras_dyndp.tf_backend.optimizer import DynamicDPKerasSGD
from keras_dyndp.tf_backend.train_step import make_private

keras = keras_compat.keras
NUM_EXAMPLES, P = 400, 0.05  # p N = 20 expected examples per batch
LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
# make_private's step counts the rows of non-zero sample weight, with its fast methods and with method="jacobian"
# alike; a custom loop's minimize sees only the per-example losses and bounds the count by the rows with a non-zero
# loss and all the rows (ENTRIES below).
PATHS = ["jacobian", "make_private"]


def arrays(num_examples=NUM_EXAMPLES):
    x = np.random.default_rng(0).normal(size=(num_examples, 3)).astype(np.float32)
    return x, (x[:, 0] > 0).astype(np.int64)


def compiled_model(path="make_private", sampling_probability=P, expected_batch_size=NUM_EXAMPLES * P, **compile_kwargs):
    model = make_private(
        keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]), "jacobian" if path == "jacobian" else "auto"
    )
    schedule = schedules.DPSchedule(np.ones(100), np.ones(100), sampling_probability)
    optimizer = DynamicDPKerasSGD(
        schedule=schedule,
        expected_batch_size=expected_batch_size,
        public_batch_size=expected_batch_size is None,
        learning_rate=0.1,
    )
    model.compile(
        optimizer=optimizer,
        loss=LOSS,
        **compile_kwargs,
    )
    return model


def batches(x, y, batch_size):
    """Batches of ``batch_size`` rows in order: not Poisson, but a dataset, which fit takes with a warning."""
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch_size)


def sampling_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, sampling_check.SamplingWarning)]


@pytest.mark.parametrize("path", PATHS)
def test_full_batch_fit_is_refused_before_any_update(path):
    x, y = arrays()
    model = compiled_model(path)
    weights = model.get_weights()
    low, high = data.batch_size_range(NUM_EXAMPLES, P)
    expected = rf"too many examples in this batch: \W*{NUM_EXAMPLES}\W.*p=0.05 from N=400 .*between {low} and {high}\."
    with pytest.warns(sampling_check.SamplingWarning), pytest.raises(tf.errors.InvalidArgumentError, match=expected):
        model.fit(batches(x, y, NUM_EXAMPLES), epochs=1, verbose=0)
    assert int(model.optimizer.dp_step) == 0
    for after, before in zip(model.get_weights(), weights):
        np.testing.assert_array_equal(after, before)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("run_eagerly", [False, True])
def test_batches_far_below_the_expected_size_are_refused(run_eagerly, path):
    x, y = arrays(4000)  # p N = 200 expected examples per batch
    model = compiled_model(path, expected_batch_size=4000 * P, run_eagerly=run_eagerly)
    with (
        pytest.warns(sampling_check.SamplingWarning),
        pytest.raises(tf.errors.InvalidArgumentError, match=r"too few examples in this batch: \W*16\W.*p\*N=200"),
    ):
        model.fit(batches(x, y, 16), epochs=1, verbose=0)


@pytest.mark.parametrize("path", PATHS)
def test_poisson_batches_at_the_schedules_rate_train_without_warning(path):
    x, y = arrays()
    model = compiled_model(path)
    high = data.batch_size_range(NUM_EXAMPLES, P)[1]
    dataset = keras_dyndp.poisson_batches(x, y, sampling_probability=P, max_batch_size=high + 8)  # padded past it
    assert data.poisson_sampling(dataset).max_batch_size > high
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(dataset, epochs=1, verbose=0)
    assert sampling_warnings(caught) == []
    assert int(model.optimizer.dp_step) == data.expected_steps_per_epoch(P)


@pytest.mark.parametrize("path", PATHS)
def test_zero_losses_do_not_trip_the_check(path):
    x, y = arrays()
    model = compiled_model(path)
    model.layers[0].kernel.assign(tf.zeros([3, 2]))
    # Confident correct logits: every real example has loss exactly 0, like the zero-weight padding rows.
    model.layers[0].bias.assign([1e4, -1e4])
    model.fit(keras_dyndp.poisson_batches(x, np.zeros_like(y), sampling_probability=P), epochs=1, verbose=0)
    assert int(model.optimizer.dp_step) == data.expected_steps_per_epoch(P)


def test_poisson_batches_at_another_rate_are_refused():
    x, y = arrays()
    model = compiled_model()
    with pytest.raises(ValueError, match="sampled at p=0.1, but the optimizer's schedule is accounted at p=0.05"):
        model.fit(keras_dyndp.poisson_batches(x, y, sampling_probability=0.1), epochs=1, verbose=0)


@pytest.mark.parametrize("path", PATHS)
def test_poisson_batches_of_another_dataset_size_are_refused_before_the_first_step(path):
    x, y = arrays(NUM_EXAMPLES // 2)  # batches at the schedule's rate would be refused only inside the graph
    model = compiled_model(path)
    expected = "num_examples=400 was given to DynamicDPKerasSGD but the data has 200 examples: pass num_examples=len"
    with pytest.raises(ValueError, match=expected):
        model.fit(keras_dyndp.poisson_batches(x, y, sampling_probability=P), epochs=1, verbose=0)
    assert int(model.optimizer.dp_step) == 0


@pytest.mark.parametrize("path", PATHS)
def test_poisson_batches_capped_to_void_the_delta_are_refused_before_the_first_step(path):
    """A cap truncating most batches adds (1 + e^epsilon) T P[batch > cap] to delta: refused at fit's data check,
    naming the default cap; the default cap's overflow is recorded for PrivacyLogger's delta_total."""
    x, y = arrays()
    model = compiled_model(path)
    default = batch_sizes.default_max_batch_size(NUM_EXAMPLES, P)
    expected = rf"max_batch_size=10 truncates .* more than 1% of the target delta 0.0025.* default cap, {default},"
    with pytest.raises(ValueError, match=expected):
        model.fit(keras_dyndp.poisson_batches(x, y, sampling_probability=P, max_batch_size=10), epochs=1, verbose=0)
    assert int(model.optimizer.dp_step) == 0 and model.optimizer.overflow_probability is None
    model.fit(keras_dyndp.poisson_batches(x, y, sampling_probability=P, steps_per_epoch=2), epochs=1, verbose=0)
    size_range = batch_sizes.batch_size_range(NUM_EXAMPLES, P)  # a size outside it stops training: counted too
    expected = batch_sizes.overflow_probability(NUM_EXAMPLES, P, default, size_range)
    assert model.optimizer.overflow_probability == expected < 1e-11


def test_poisson_batches_need_a_normaliser_independent_of_the_rows():
    x, y = arrays()
    padded = keras_dyndp.poisson_batches(x, y, sampling_probability=P, steps_per_epoch=4, pad_to_multiple=8)
    by_rows = compiled_model(expected_batch_size=None)  # public_batch_size=True
    with pytest.raises(ValueError, match="Poisson batches, whose sizes are private, but .* public_batch_size=True"):
        by_rows.fit(padded, epochs=1, verbose=0)
    assert int(by_rows.optimizer.dp_step) == 0
    model = compiled_model()  # expected_batch_size = p N
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(padded, epochs=2, verbose=0)
    assert sampling_warnings(caught) == []
    assert int(model.optimizer.dp_step) == 8


class MappingFit(keras.Sequential):
    """A model whose class's fit maps (its preprocessing) over the dataset before Keras's fit, as KerasHub's do."""

    def fit(self, x=None, **kwargs):
        if kwargs.pop("fail", False):
            raise RuntimeError("failed before Keras's fit")
        return super().fit(x.map(lambda *batch: batch), **kwargs)


def test_poisson_batches_mapped_by_the_models_own_fit_are_checked_as_fit_received_them():
    x, y = arrays()
    model = make_private(MappingFit([keras.Input((3,)), keras.layers.Dense(2)]))
    schedule = schedules.DPSchedule(np.ones(100), np.ones(100), P)
    model.compile(DynamicDPKerasSGD(schedule=schedule, expected_batch_size=NUM_EXAMPLES * P), LOSS)
    dataset = keras_dyndp.poisson_batches(x, y, sampling_probability=P)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(dataset, epochs=1, verbose=0)
    assert sampling_warnings(caught) == []  # was: "received x of type _MapDataset, not batches ... poisson_batches"
    # A fit that fails before Keras's leaves nothing behind: arrays handed to Keras's fit unbound are still refused.
    with pytest.raises(RuntimeError, match="failed before"):
        model.fit(dataset, epochs=1, verbose=0, fail=True)
    with pytest.raises(ValueError, match=r"(?s)received arrays.*poisson_batches\(x, y, sampling_prob"):
        keras.Model.fit(model, x, y, batch_size=20, epochs=1, verbose=0)


def test_arrays_are_refused_before_the_first_step_unless_batch_sizes_are_public():
    x, y = arrays(NUM_EXAMPLES + 5)  # Keras would cut 20 batches of 20 and one of 5, refused after 20 steps
    model = compiled_model()
    with pytest.raises(ValueError, match=r"(?s)received arrays.*poisson_batches\(x, y, sampling_prob"):
        model.fit(x, y, batch_size=20, epochs=1, verbose=0)
    assert int(model.optimizer.dp_step) == 0
    public = compiled_model(expected_batch_size=None)  # public_batch_size=True: fixed-size batches, stated
    with pytest.warns(sampling_check.SamplingWarning, match="public_batch_size=True, so no batch size is checked"):
        public.fit(x, y, batch_size=20, epochs=1, verbose=0)
    assert int(public.optimizer.dp_step) == 21


@pytest.mark.parametrize(
    "make_input, note, expected_batch_size",
    [
        (lambda x, y: dict(x=x, y=y, batch_size=20), "ndarray", None),  # arrays: only with public_batch_size=True
        (lambda x, y: dict(x=batches(x, y, 20)), "BatchDataset", NUM_EXAMPLES * P),
    ],
)
def test_other_inputs_get_one_warning(make_input, note, expected_batch_size):
    x, y = arrays()
    model = compiled_model(expected_batch_size=expected_batch_size)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(epochs=1, verbose=0, **make_input(x, y))
        model.fit(epochs=1, verbose=0, **make_input(x, y))
    messages = sampling_warnings(caught)
    assert len(messages) == 1
    assert f"model.fit received x of type _{note}" in messages[0] or f"type {note}" in messages[0]
    assert "assumes Poisson sampling" in messages[0]
    assert "keras_dyndp.poisson_batches(x, y, sampling_probability=0.05)" in messages[0]


@pytest.mark.parametrize(
    "kwargs, note",
    [
        (dict(expected_batch_size=None), "public_batch_size=True, so no batch size is checked"),
        (dict(jit_compile=True), "XLA (jit_compile=True) drops the per-step batch-size check"),
    ],
)
def test_warning_says_when_batch_sizes_are_not_checked(kwargs, note):
    x, y = arrays()
    model = compiled_model(**kwargs)
    with pytest.warns(sampling_check.SamplingWarning, match=note.replace("(", r"\(").replace(")", r"\)")):
        model.fit(batches(x, y, NUM_EXAMPLES), epochs=1, verbose=0)  # public batch sizes, or XLA: nothing raises


def test_custom_training_loop_gets_one_warning():
    optimizer = DynamicDPKerasSGD(schedule=schedules.DPSchedule([1.0] * 2, [1.0] * 2, P), expected_batch_size=20)
    variable = tf.Variable([1.0, 2.0])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            with tf.GradientTape() as tape:
                loss = tf.stack([variable[0], variable[1]] * 10)
            optimizer.minimize(loss, [variable], tape=tape)
    messages = sampling_warnings(caught)
    assert len(messages) == 1 and "cannot see the batches" in messages[0]


def test_multi_worker_fit_refuses_poisson_batches_each_worker_seeded_alone(monkeypatch):
    """Built outside a multi-worker strategy's scope without a seed, each worker would sample its own batches; a given
    seed (or a dataset built in the scope, tests/test_multi_worker.py) is the same on every worker."""
    x, y = arrays()
    unseeded = keras_dyndp.poisson_batches(x, y, sampling_probability=P)
    seeded = keras_dyndp.poisson_batches(x, y, sampling_probability=P, seed=0)
    assert not data.poisson_sampling(unseeded).same_on_every_worker
    assert data.poisson_sampling(seeded).same_on_every_worker
    monkeypatch.setattr(distribution, "is_multi_worker", lambda: True)
    with pytest.raises(ValueError, match="seed each worker drew on its own"):
        compiled_model("make_private").fit(unseeded, epochs=1, verbose=0)
    compiled_model("make_private").fit(seeded, epochs=1, verbose=0)


def test_make_private_fit_checks_the_data_it_is_handed_without_reading_stack_frames(monkeypatch):
    """make_private's fit hands x to the checks; no frame (of any thread) is read for it."""

    def no_frames(*args):
        raise AssertionError("read stack frames")

    monkeypatch.setattr(sys, "_current_frames", no_frames)
    x, y = arrays()
    with pytest.raises(ValueError, match="sampled at p=0.1"):
        compiled_model("make_private").fit(keras_dyndp.poisson_batches(x, y, sampling_probability=0.1), verbose=0)
    with pytest.raises(ValueError, match="received arrays"):
        compiled_model("make_private").fit(x, y, batch_size=20, verbose=0)
    with pytest.warns(sampling_check.SamplingWarning, match="model.fit received x of type"):
        compiled_model("make_private").fit(batches(x, y, 20), verbose=0)


def test_train_on_batch_of_a_private_model_is_warned_once():
    x, y = arrays(20)
    model = compiled_model("make_private")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.train_on_batch(x, y)
        model.train_on_batch(x, y)
    messages = sampling_warnings(caught)
    assert len(messages) == 1 and "model.train_on_batch received x of type ndarray" in messages[0]


ENTRIES = ["fit_repeat", "train_on_batch", "minimize"]  # fit on a derived dataset, train_on_batch, a custom loop


def padded_batch(num_examples, num_rows):
    """The same first ``num_examples`` examples, padded with zero-weight rows to ``num_rows`` rows."""
    x, y = arrays(NUM_EXAMPLES)
    weights = (np.arange(num_rows) < num_examples).astype(np.float32)
    return x[:num_rows] * weights[:, None], y[:num_rows] * weights.astype(np.int64), weights


def one_step_update(entry, batch, **optimizer_kwargs):
    """The change of the weights after one DP step through ``entry`` (the noise seeded, so runs can be compared)."""
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, kernel_initializer="ones")])
    schedule = schedules.DPSchedule([1.0] * 4, [1.0] * 4, P)
    with pytest.warns(UserWarning, match="noise_seed=3 makes the DP noise reproducible"):
        optimizer = DynamicDPKerasSGD(schedule=schedule, learning_rate=1.0, noise_seed=3, **optimizer_kwargs)
    if entry != "minimize":
        model = make_private(model)
        model.compile(optimizer=optimizer, loss=LOSS)
    before = model.get_weights()
    x, y, weights = batch
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if entry == "fit_repeat":  # A derived dataset is not registered: fit cannot see how it was sampled.
            model.fit(tf.data.Dataset.from_tensors(batch).repeat(), steps_per_epoch=1, epochs=1, verbose=0)
        elif entry == "train_on_batch":
            model.train_on_batch(x, y, sample_weight=weights)
        else:
            with tf.GradientTape() as tape:
                loss = LOSS(y, model(x, training=True)) * weights
            optimizer.minimize(loss, model.trainable_variables, tape=tape)
    assert sampling_warnings(caught), "the optimizer cannot see these batches: it says so"
    return np.concatenate([(after - old).ravel() for after, old in zip(model.get_weights(), before)])


@pytest.mark.parametrize("entry", ENTRIES)
def test_every_path_divides_by_p_n_and_checks_the_batch_size(entry):
    """Before this was fixed, an optimizer given only a schedule divided by the padded rows on these paths (the
    update's scale gave the private batch size away: 84 examples -> 96 rows). Now it divides by p N: 5 examples
    padded to 8 or to 16 rows give the same update, and a batch of N examples is refused on every path."""
    with pytest.raises(ValueError, match="needs `expected_batch_size` = p\\*N"):
        DynamicDPKerasSGD(schedule=schedules.DPSchedule([1.0], [1.0], P))
    by_8, by_16 = (
        one_step_update(entry, padded_batch(5, rows), expected_batch_size=NUM_EXAMPLES * P) for rows in (8, 16)
    )
    assert np.abs(by_8).max() > 0.01
    np.testing.assert_allclose(by_16, by_8, rtol=1e-5, atol=1e-7)  # rows as normaliser: by_16 = by_8 / 2
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"too many examples in this batch: \W*400\W"):
        one_step_update(entry, padded_batch(NUM_EXAMPLES, NUM_EXAMPLES), expected_batch_size=NUM_EXAMPLES * P)


@pytest.mark.parametrize("entry", ["fit_repeat", "train_on_batch"])
def test_public_batch_sizes_divide_by_the_rows_and_refuse_padding_rows(entry):
    """public_batch_size=True divides by the rows, so make_private's step, which sees the sample weights, refuses
    a batch with zero-weight (padding) rows; a batch without them trains, divided by its rows."""
    unpadded = one_step_update(entry, padded_batch(8, 8), public_batch_size=True)
    by_p_n = one_step_update(entry, padded_batch(8, 8), expected_batch_size=16.0)
    np.testing.assert_allclose(unpadded, 2 * by_p_n, rtol=1e-5, atol=1e-7)  # 8 rows against p N = 16
    with pytest.raises(tf.errors.InvalidArgumentError, match="rows with sample weight 0 .* public_batch_size=True"):
        one_step_update(entry, padded_batch(5, 8), public_batch_size=True)


class RecuttingFit(keras.Sequential):
    """A model whose class's fit re-cuts (or otherwise changes) the batches before Keras's fit."""

    def fit(self, x=None, change=None, **kwargs):
        return super().fit(change(x), **kwargs)


@pytest.mark.parametrize(
    "change, received",
    [
        (lambda x: x.unbatch().batch(20), "BatchDataset"),
        (lambda x: x.map(lambda *batch: batch).filter(lambda *batch: True), "FilterDataset"),
        (lambda x: x.map(lambda *batch: batch).take(5).prefetch(1), "PrefetchDataset"),
    ],
)
def test_batches_the_models_own_fit_recuts_are_checked_as_keras_received_them(change, received):
    x, y = arrays()
    model = make_private(RecuttingFit([keras.Input((3,)), keras.layers.Dense(2)]))
    schedule = schedules.DPSchedule(np.ones(100), np.ones(100), P)
    model.compile(DynamicDPKerasSGD(schedule=schedule, expected_batch_size=NUM_EXAMPLES * P), LOSS)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(keras_dyndp.poisson_batches(x, y, sampling_probability=P), change=change, epochs=1, verbose=0)
    (message,) = sampling_warnings(caught)
    assert f"received x of type _{received}, not batches returned by keras_dyndp.poisson_batches" in message
