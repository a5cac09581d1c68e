"""Tests for keras_dyndp.jax_backend.optimizer: config, save/load, resume, noise source, rescaling, refusals."""

import warnings

import pytest

jax = pytest.importorskip("jax")
keras = pytest.importorskip("keras")
if keras.backend.backend() != "jax":
    pytest.skip("Keras is not running on JAX (set KERAS_BACKEND=jax)", allow_module_level=True)

import jax_brute_force as brute_force  # noqa: E402
import numpy as np  # noqa: E402

from keras_dyndp import optimizer_base  # noqa: E402
from keras_dyndp import schedules  # noqa: E402
from keras_dyndp.accounting import noise_range  # noqa: E402
from keras_dyndp.callbacks import PrivacyLogger  # noqa: E402
from keras_dyndp.core import batch_sizes  # noqa: E402
from keras_dyndp.core.noise_seed import NoiseSeedWarning  # noqa: E402
from keras_dyndp.jax_backend import DynamicDPKerasAdam  # noqa: E402
from keras_dyndp.jax_backend import DynamicDPKerasSGD  # noqa: E402
from keras_dyndp.jax_backend import JaxDPOptimizerMixin  # noqa: E402
from keras_dyndp.jax_backend import make_private  # noqa: E402
from keras_dyndp.keras_glue import private_model  # noqa: E402
from keras_dyndp.keras_glue import restarts  # noqa: E402

pytestmark = [
    # Tests that measure the clipped sum without noise, and arrays with public_batch_size=True (fixed-size batches
    # by declaration): both warned by design.
    pytest.mark.filterwarnings("ignore::keras_dyndp.optimizer_base.DegenerateNoiseWarning"),
    pytest.mark.filterwarnings("ignore:model.fit received x of type ndarray:keras_dyndp.SamplingWarning"),
]

LOSS = keras.losses.MeanSquaredError(reduction="none")


def _schedule(num_steps=4, clip=1.0, noise=2.0, p=0.5):
    return schedules.DPSchedule(np.full(num_steps, clip), np.full(num_steps, noise), p)


def _model(seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((5,)), keras.layers.Dense(40)])


def _data():
    x = np.linspace(-1, 1, 40, dtype="float32").reshape(8, 5)
    return x, np.zeros((8, 40), "float32")


def _kernel(model):
    return np.asarray(model.trainable_variables[0].value).copy()


def _private(optimizer, seed=0):
    model = make_private(_model(seed))
    model.compile(optimizer=optimizer, loss=LOSS)
    return model


def test_budget_arguments_and_config_round_trip():
    optimizer = DynamicDPKerasAdam(
        target_epsilon=2.0, target_delta=1e-5, num_examples=1000, batch_size=50, epochs=2, method="dynamic",
        initial_clip=1.5, rho_mu=1.25, rho_c=2.0, learning_rate=0.01,
    )  # fmt: skip
    assert isinstance(optimizer, JaxDPOptimizerMixin) and isinstance(optimizer, keras.optimizers.Adam)
    assert optimizer.schedule.num_steps == 40 and optimizer.expected_batch_size == 50.0
    assert optimizer.batch_size_range[0] < 50 < optimizer.batch_size_range[1]
    restored = DynamicDPKerasAdam.from_config(optimizer.get_config())
    np.testing.assert_array_equal(restored.schedule.noise_stddevs, optimizer.schedule.noise_stddevs)
    assert float(np.asarray(restored.learning_rate)) == pytest.approx(0.01) and restored.expected_batch_size == 50.0


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"loss_scale_factor": 2.0}, "do not support `loss_scale_factor`"),
    ],
)
def test_what_the_jax_backend_cannot_do_is_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DynamicDPKerasSGD(schedule=_schedule(), public_batch_size=True, **kwargs)


def test_save_and_load_keep_the_schedule_counter_and_private_step():
    x, y = _data()
    model = _private(DynamicDPKerasSGD(schedule=_schedule(), public_batch_size=True, learning_rate=0.1))
    model.fit(x, y, batch_size=8, epochs=2, verbose=0)
    path = f"{pytest.importorskip('tempfile').mkdtemp()}/model.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    assert type(loaded.optimizer) is DynamicDPKerasSGD and int(loaded.optimizer.dp_step.numpy()) == 2
    # The file's config holds the schedule, so the saved fingerprint matches the reloaded optimizer's by construction.
    assert tuple(loaded.optimizer.schedule_fingerprint.numpy().tolist()) == model.optimizer.schedule.fingerprint
    np.testing.assert_array_equal(loaded.optimizer.schedule.clip_norms, model.optimizer.schedule.clip_norms)
    assert private_model.is_private(loaded)  # restored at load from the optimizer's config
    loaded.fit(x, y, batch_size=8, epochs=2, verbose=0)
    assert int(loaded.optimizer.dp_step.numpy()) == 4  # the schedule continues where it stopped


@pytest.mark.parametrize("noise_multiplier", [0.0, 1e-6])
def test_degenerate_noise_is_refused_at_construction(noise_multiplier):
    schedule = schedules.DPSchedule([2.0] * 3, [2.0, 2.0 * noise_multiplier, 2.0], 0.5)  # sigma = z C at step 1
    with pytest.raises(noise_range.NoiseOutOfRangeError, match=r"`schedule`: .* step 1 .*\[0\.0001, 10000\]"):
        DynamicDPKerasSGD(schedule=schedule, expected_batch_size=4)
    with pytest.warns(optimizer_base.DegenerateNoiseWarning, match="no meaningful"):
        DynamicDPKerasSGD(schedule=schedule, expected_batch_size=4, allow_degenerate_noise=True)
    DynamicDPKerasSGD(schedule=schedules.DPSchedule([2.0] * 3, [2e-4, 2.0, 2e4], 0.5), expected_batch_size=4)


@pytest.mark.filterwarnings("ignore:model.fit received x of type FixedBatches:keras_dyndp.SamplingWarning")
def test_a_step_counter_restored_into_another_schedule_is_refused(tmp_path):
    x, y = _data()
    schedule_a, schedule_b = _schedule(noise=1.0), _schedule(noise=0.01)  # same C and p, 100 times less noise
    model = _private(DynamicDPKerasSGD(schedule=schedule_a, expected_batch_size=4, learning_rate=0.1))
    model.fit(brute_force.FixedBatches(x, y, 8), epochs=2, verbose=0)
    path = str(tmp_path / "model.weights.h5")  # Keras 3's weights file holds the optimizer's variables too.
    model.save_weights(path)

    def restored(schedule):
        new = _private(DynamicDPKerasSGD(schedule=schedule, expected_batch_size=4, learning_rate=0.1))
        new.optimizer.build(new.trainable_variables)
        new.load_weights(path)
        assert int(new.optimizer.dp_step.numpy()) == 2
        return new

    other = restored(schedule_b)
    kernel = _kernel(other)
    with pytest.raises(RuntimeError, match=r"another DP schedule.*Steps taken \(dp_step\): 2\."):
        other.fit(brute_force.FixedBatches(x, y, 8), epochs=1, verbose=0)
    assert int(other.optimizer.dp_step.numpy()) == 2
    np.testing.assert_array_equal(_kernel(other), kernel)  # the refused step changed nothing
    with pytest.raises(RuntimeError, match="another DP schedule"):  # PrivacyLogger refuses before any step
        other.fit(brute_force.FixedBatches(x, y, 8), epochs=1, verbose=0, callbacks=[PrivacyLogger("rdp", delta=1e-5)])
    same = restored(schedule_a)
    same.fit(brute_force.FixedBatches(x, y, 8), epochs=1, verbose=0, callbacks=[PrivacyLogger("rdp", delta=1e-5)])
    assert int(same.optimizer.dp_step.numpy()) == 3
    unrecorded = restored(schedule_a)
    unrecorded.optimizer.schedule_fingerprint.assign([0, 0])  # as from a file written before fingerprints
    with pytest.raises(RuntimeError, match="no schedule fingerprint was saved"):
        unrecorded.fit(brute_force.FixedBatches(x, y, 8), epochs=1, verbose=0)
    unrecorded.optimizer.record_schedule_fingerprint()
    unrecorded.fit(brute_force.FixedBatches(x, y, 8), epochs=1, verbose=0)
    assert int(unrecorded.optimizer.dp_step.numpy()) == 3


def test_a_resumed_run_clips_with_the_schedules_value_at_the_restored_step():
    x, y = _data()
    schedule = schedules.DPSchedule(np.array([5.0, 5.0, 0.01, 0.01]), np.zeros(4), 0.5)
    model = _private(
        DynamicDPKerasSGD(schedule=schedule, public_batch_size=True, learning_rate=1.0, allow_degenerate_noise=True)
    )
    model.fit(x, y, batch_size=8, epochs=2, verbose=0)
    path = f"{pytest.importorskip('tempfile').mkdtemp()}/model.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    before = _kernel(loaded)
    loaded.fit(x, y, batch_size=8, epochs=1, verbose=0)
    # Step 2 clips every example to C_2 = 0.01: the kernel moves by at most 8 * 0.01 / 8 in norm, and by about that
    # (every example's gradient is far larger); with C_0 = 5 at that step it moved by 0.084.
    moved = np.linalg.norm(_kernel(loaded) - before)
    assert 0.005 < moved <= 0.01 * (1 + 1e-5)


def test_noise_is_fresh_after_a_restore_and_never_follows_the_global_seed():
    x, y = _data()
    updates = []
    for _ in range(2):
        model = _private(
            DynamicDPKerasSGD(schedule=_schedule(noise=5.0), public_batch_size=True, learning_rate=1.0)
        )  # same weights
        keras.utils.set_random_seed(0)  # the global seed does not reach the DP noise
        before = _kernel(model)
        model.fit(x, y, batch_size=8, epochs=1, verbose=0)
        updates.append(_kernel(model) - before)
    assert not np.allclose(updates[0], updates[1])
    # One optimizer rewound to the same state draws new noise: its generator is not part of the state.
    model = _private(DynamicDPKerasSGD(schedule=_schedule(noise=5.0), public_batch_size=True, learning_rate=1.0))
    state = [np.asarray(v.value).copy() for v in model.variables + model.optimizer.variables]
    first = None
    for _ in range(2):
        for variable, value in zip(model.variables + model.optimizer.variables, state):
            variable.assign(value)
        model.fit(x, y, batch_size=8, epochs=1, verbose=0)
        update = _kernel(model) - state[0]
        assert first is None or not np.allclose(update, first)
        first = update


def _custom_loop_optimizer():
    optimizer = DynamicDPKerasSGD(schedule=_schedule(noise=5.0), public_batch_size=True, learning_rate=1.0)
    variable = keras.Variable(np.zeros(3, np.float32))
    optimizer.build([variable])

    def step(state):
        """One step of a custom loop from ``state``: (the updated variable, the optimizer's new state)."""
        new, new_state = optimizer.stateless_apply_clipped_sum(state, [np.zeros(3, np.float32)], 4, 4, [variable.value])
        return np.asarray(new[0]), new_state

    return optimizer, step


def _values(optimizer):
    return [variable.value for variable in optimizer.variables]


def _key_words(optimizer, state):
    return np.asarray(state[optimizer._index(optimizer._run_state)])[3:].view(np.uint32)  # pylint: disable=protected-access


def test_a_restore_through_keras_loading_draws_new_noise_at_the_same_step():
    """A custom loop steps from `new_run`'s state: since the key became a runtime input the
    variables hold none at rest, so the state read from them right after a restore (the nonce the restore gave
    before) is refused; `new_run` after the restore draws new noise at the same counter."""
    optimizer, step = _custom_loop_optimizer()
    store = {}
    optimizer.save_own_variables(store)
    state = optimizer.new_run(_values(optimizer))
    np.testing.assert_array_equal(step(state)[0], step(state)[0])  # the same state and counter: the same key
    before = step(state)[0]
    optimizer.load_own_variables(store)  # what load_model and checkpoint restores call
    assert np.all(step(_values(optimizer))[0] == 0)  # refused: no key in the restored variables
    assert not np.allclose(step(optimizer.new_run(_values(optimizer)))[0], before)


def test_a_step_handed_a_state_without_the_key_is_refused_and_the_refusal_says_what_to_call():
    """The key words are a runtime input of the step: zeros (the variables at rest, a loop that skipped `new_run`)
    would be noise from a known key. The step changes nothing and records the refusal, which names `new_run`."""
    optimizer, step = _custom_loop_optimizer()
    assert np.all(_key_words(optimizer, _values(optimizer)) == 0)
    update, state = step(_values(optimizer))
    assert np.all(update == 0) and int(optimizer.step_at(state)) == 0
    for variable, value in zip(optimizer.variables, state):
        variable.assign(value)
    with pytest.raises(RuntimeError, match=r"without its secret noise key.*optimizer\.new_run"):
        optimizer.raise_refused_step()
    assert np.all(_key_words(optimizer, _values(optimizer)) == 0)  # at rest again
    state = optimizer.new_run(_values(optimizer))
    np.testing.assert_array_equal(_key_words(optimizer, state), optimizer._noise_source.base_key)  # pylint: disable=protected-access
    update, state = step(state)
    assert np.abs(update).max() > 0 and int(optimizer.step_at(state)) == 1  # noise drawn (its size is random)


def test_the_variables_hold_no_key_after_fit_train_on_batch_or_a_refused_call():
    """What reads the variables (savers, ``get_state_tree``, a caller's copy) finds no key: make_private's sync puts
    the run state at rest after ``fit`` and ``train_on_batch``, and a call refused before its step puts back the
    state it was handed without the key."""
    x, y = _data()
    model = _private(DynamicDPKerasSGD(schedule=_schedule(num_steps=2), public_batch_size=True, learning_rate=1.0))
    optimizer = model.optimizer
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert np.all(_key_words(optimizer, _values(optimizer)) == 0)
    model.train_on_batch(x, y)
    assert np.all(_key_words(optimizer, _values(optimizer)) == 0) and int(optimizer.dp_step.numpy()) == 2
    with pytest.raises(optimizer_base.BudgetExhaustedError):
        model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert np.all(_key_words(optimizer, _values(optimizer)) == 0)


def test_a_custom_loop_on_a_step_counter_set_back_is_refused_and_changes_nothing():
    """Issue 52 on JAX's own step: every step counts itself released; a counter set by hand is refused."""
    optimizer, step = _custom_loop_optimizer()
    state = optimizer.new_run(_values(optimizer))
    for _ in range(2):
        _, state = step(state)
    assert int(optimizer.released_at(state)) == 2 == int(optimizer.step_at(state))
    for variable, value in zip(optimizer.variables, optimizer.at_rest(state)):
        variable.assign(value)
    optimizer.raise_refused_step()
    assert optimizer.released_steps == 2
    optimizer.iterations.assign(0)
    update, state = step(optimizer.new_run(_values(optimizer)))
    assert np.all(update == 0) and int(optimizer.step_at(state)) == 0 and int(optimizer.released_at(state)) == 2
    for variable, value in zip(optimizer.variables, optimizer.at_rest(state)):
        variable.assign(value)
    with pytest.raises(RuntimeError, match="is 0 but the optimizer has released 2 DP steps"):
        optimizer.raise_refused_step()


def test_the_steps_released_are_saved_and_a_file_without_them_loads_them_as_the_counter():
    x, y = _data()
    model = _private(DynamicDPKerasSGD(schedule=_schedule(), public_batch_size=True, learning_rate=0.1))
    model.fit(x, y, batch_size=8, epochs=2, verbose=0)
    path = f"{pytest.importorskip('tempfile').mkdtemp()}/model.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    assert loaded.optimizer.released_steps == 2
    loaded.optimizer.iterations.assign(0)
    with pytest.raises(RuntimeError, match="is 0 but the optimizer has released 2 DP steps"):
        loaded.fit(x, y, batch_size=8, epochs=1, verbose=0)
    optimizer = model.optimizer
    store = {}
    optimizer.save_own_variables(store)
    released = optimizer._released_steps  # pylint: disable=protected-access
    index = optimizer._index(released)  # pylint: disable=protected-access  (before the run state, never saved)
    older = [store[str(i)] for i in range(len(store)) if i != index]  # the layout before
    optimizer.iterations.assign(0)
    released.assign(7)
    optimizer.load_own_variables({str(i): value for i, value in enumerate(older)})
    assert int(optimizer.dp_step.numpy()) == 2 and optimizer.released_steps == 2 and int(released.numpy()) == -1


def test_a_noise_seed_reproduces_the_noise_and_warns_at_the_caller():
    x, y = _data()
    updates = []
    for _ in range(2):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            optimizer = DynamicDPKerasSGD(
                schedule=_schedule(noise=5.0), public_batch_size=True, learning_rate=1.0, noise_seed=11
            )
        (warning,) = [w for w in caught if issubclass(w.category, NoiseSeedWarning)]
        assert warning.filename == __file__
        model = _private(optimizer)
        before = _kernel(model)
        model.fit(x, y, batch_size=8, epochs=1, verbose=0)
        updates.append(_kernel(model) - before)
    np.testing.assert_array_equal(updates[0], updates[1])
    assert "noise_seed" not in optimizer.get_config()


def test_rescale_to_unit_norm_divides_the_sum_by_the_clip_norm_as_well():
    x, y = _data()
    deltas = []
    for rescale in (False, True):
        model = _private(
            DynamicDPKerasSGD(
                schedule=_schedule(clip=0.25, noise=0.0),
                allow_degenerate_noise=True,
                public_batch_size=True,
                learning_rate=1.0,
                rescale_to_unit_norm=rescale,
            )
        )
        before = _kernel(model)
        model.fit(x, y, batch_size=8, epochs=1, verbose=0)
        deltas.append(_kernel(model) - before)
    assert np.abs(deltas[0]).max() > 0
    np.testing.assert_allclose(deltas[1], deltas[0] / 0.25, rtol=1e-4, atol=1e-6)


NUM_EXAMPLES, P = 400, 0.05  # p N = 20 examples per batch in expectation


def _padded_batch(num_examples, num_rows):
    """The same first ``num_examples`` examples, padded with zero-weight rows to ``num_rows`` rows."""
    x = np.random.default_rng(0).normal(size=(NUM_EXAMPLES, 5)).astype("float32")[:num_rows]
    weights = (np.arange(num_rows) < num_examples).astype("float32")
    return x * weights[:, None], np.ones((num_rows, 40), "float32") * weights[:, None], weights


def _one_step_update(entry, batch, **optimizer_kwargs):
    """The change of the kernel after one DP step through ``entry`` (the noise seeded, so runs can be compared)."""
    with pytest.warns(NoiseSeedWarning):
        optimizer = DynamicDPKerasSGD(schedule=_schedule(p=P), learning_rate=1.0, noise_seed=3, **optimizer_kwargs)
    model = _private(optimizer)
    before = _kernel(model)
    with pytest.warns(batch_sizes.SamplingWarning, match="not batches returned by keras_dyndp.poisson_batches"):
        if entry == "generator":
            model.fit((batch for _ in range(1)), steps_per_epoch=1, epochs=1, shuffle=False, verbose=0)
        else:
            model.train_on_batch(*batch[:2], sample_weight=batch[2])
    return _kernel(model) - before


@pytest.mark.parametrize("entry", ["generator", "train_on_batch"])
def test_every_path_divides_by_p_n_and_checks_the_batch_size(entry):
    """Before this was fixed, an optimizer given only a schedule divided by the padded rows on these paths (the
    update's scale gave the private batch size away). Now it divides by p N: 5 examples padded to 8 or to 16 rows
    give the same update, and a batch of N examples is refused, not applied, on every path."""
    with pytest.raises(ValueError, match="needs `expected_batch_size` = p\\*N"):
        DynamicDPKerasSGD(schedule=_schedule(p=P))
    by_8, by_16 = (
        _one_step_update(entry, _padded_batch(5, rows), expected_batch_size=NUM_EXAMPLES * P) for rows in (8, 16)
    )
    assert np.abs(by_8).max() > 0.01
    np.testing.assert_allclose(by_16, by_8, rtol=1e-5, atol=1e-7)  # rows as normaliser: by_16 = by_8 / 2
    with pytest.raises(RuntimeError, match="too many examples in this batch: 400; .*The step was not applied"):
        _one_step_update(entry, _padded_batch(NUM_EXAMPLES, NUM_EXAMPLES), expected_batch_size=NUM_EXAMPLES * P)


def test_public_batch_sizes_divide_by_the_rows_and_refuse_padding_rows():
    """public_batch_size=True divides by the rows, so a batch with zero-weight (padding) rows is refused (the step
    refuses it, whichever way the batch came); a batch without them trains, divided by its rows."""
    entry = "train_on_batch"
    unpadded = _one_step_update(entry, _padded_batch(8, 8), public_batch_size=True)
    by_p_n = _one_step_update(entry, _padded_batch(8, 8), expected_batch_size=16.0)
    np.testing.assert_allclose(unpadded, 2 * by_p_n, rtol=1e-5, atol=1e-7)  # 8 rows against p N = 16
    with pytest.raises(RuntimeError, match="rows with sample weight 0 .* public_batch_size=True.*not applied"):
        _one_step_update(entry, _padded_batch(5, 8), public_batch_size=True)


@pytest.mark.filterwarnings("ignore::keras_dyndp.SamplingWarning")
def test_a_fresh_optimizer_on_a_reloaded_model_warns_that_the_schedule_restarts(tmp_path):
    x, y = _data()
    model = _private(DynamicDPKerasSGD(schedule=_schedule(), public_batch_size=True, learning_rate=0.1))
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    model.save(str(tmp_path / "model.keras"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", restarts.ScheduleRestartWarning)
        keras.models.load_model(str(tmp_path / "model.keras")).fit(x, y, batch_size=8, verbose=0)  # Resumes: silent.
    loaded = keras.models.load_model(str(tmp_path / "model.keras"))
    loaded.compile(optimizer=DynamicDPKerasSGD(schedule=_schedule(), public_batch_size=True), loss=LOSS)
    with pytest.warns(restarts.ScheduleRestartWarning, match="took 1 DP steps .* starts over"):
        loaded.fit(x, y, batch_size=8, verbose=0)


class _Batches(keras.utils.PyDataset):
    def __init__(self, batches):
        super().__init__()
        self._batches = batches

    def __len__(self):
        return len(self._batches)

    def __getitem__(self, index):
        return self._batches[index]


@pytest.mark.filterwarnings("ignore::keras_dyndp.SamplingWarning")
def test_a_refused_step_surfaces_at_the_epoch_end_and_no_later_step_of_it_is_applied():
    """The refusal is read where Keras syncs the state (the epoch's end), not after every step; the
    refused step and the rest of its epoch change nothing, so the result is the good first step's alone."""
    good, bad = _padded_batch(20, 24), _padded_batch(NUM_EXAMPLES, NUM_EXAMPLES)
    results = []
    for batches in ([good], [good, bad, good, good]):
        with pytest.warns(NoiseSeedWarning):
            optimizer = DynamicDPKerasSGD(
                schedule=_schedule(p=P), expected_batch_size=NUM_EXAMPLES * P, learning_rate=1.0, noise_seed=3
            )
        model = _private(optimizer)
        if len(batches) > 1:
            with pytest.raises(RuntimeError, match="too many examples in this batch: 400; .*not applied, nor any"):
                model.fit(_Batches(batches), epochs=1, verbose=0, shuffle=False)
        else:
            model.fit(_Batches(batches), epochs=1, verbose=0, shuffle=False)
        results.append((int(model.optimizer.dp_step.numpy()), _kernel(model)))
    assert results[0][0] == results[1][0] == 1
    np.testing.assert_array_equal(results[1][1], results[0][1])


def test_the_jitted_train_step_calls_no_host():
    """Keys, budget and batch-size checks all inside the graph (random layers and microbatches
    included): the traced step holds no callback."""
    keras.utils.set_random_seed(0)
    model = make_private(keras.Sequential([keras.Input((5,)), keras.layers.Dropout(0.5), keras.layers.Dense(3)]))
    optimizer = DynamicDPKerasSGD(schedule=_schedule(p=P), expected_batch_size=2.0, num_microbatches=2)
    model.compile(optimizer=optimizer, loss=LOSS)
    model.optimizer.build(model.trainable_variables)
    state = [[v.value for v in variables] for variables in (model.trainable_variables,
             model.non_trainable_variables, optimizer.variables, model.metrics_variables)]  # fmt: skip
    data = (np.ones((4, 5), "float32"), np.ones((4, 3), "float32"), np.ones(4, "float32"))
    text = str(jax.make_jaxpr(model.train_step)(state, data))
    assert "dot_general" in text and "random_fold_in" in text and "callback" not in text


def _seeded_step_update():
    """One DP step's update after ``keras.utils.set_random_seed(0)``, from the same weights and data each time."""
    x, y = _data()
    model = _private(DynamicDPKerasSGD(schedule=_schedule(noise=5.0), public_batch_size=True, learning_rate=1.0))
    keras.utils.set_random_seed(0)
    before = _kernel(model)
    model.train_on_batch(x, y)
    return (_kernel(model) - before).tolist()


@pytest.mark.filterwarnings("ignore::keras_dyndp.SamplingWarning")
def test_two_processes_with_the_same_global_seed_draw_different_noise():
    import json
    import os
    import subprocess
    import sys

    code = "import json, sys, test_optimizer; json.dump(test_optimizer._seeded_step_update(), sys.stdout)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(__file__), *sys.path])}
    run = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    here, there = np.asarray(_seeded_step_update()), np.asarray(json.loads(run.stdout))
    assert np.abs(here).max() > 0.5 and not np.allclose(here, there)


class _RewindOnce(keras.callbacks.Callback):
    """Records the kernel after each step and rewinds the whole state to its start after the first step."""

    def __init__(self, updates):
        super().__init__()
        self._updates, self._start = updates, None

    def on_train_batch_begin(self, batch, logs=None):
        if self._start is None:
            self._start = [np.asarray(v.value).copy() for v in self.model.variables + self.model.optimizer.variables]

    def on_train_batch_end(self, batch, logs=None):
        self._updates.append(_kernel(self.model) - self._start[0])
        if batch == 0:
            for variable, value in zip(self.model.variables + self.model.optimizer.variables, self._start):
                variable.assign(value)


def test_a_state_rewound_in_the_middle_of_an_epoch_draws_new_noise():
    x, y = (np.concatenate([part[:4], part[:4]]) for part in _data())  # two equal batches
    model = _private(DynamicDPKerasSGD(schedule=_schedule(noise=5.0), public_batch_size=True, learning_rate=1.0))
    updates = []
    model.fit(x, y, batch_size=4, epochs=1, verbose=0, shuffle=False, callbacks=[_RewindOnce(updates)])
    assert int(model.optimizer.dp_step.numpy()) == 1 and len(updates) == 2
    assert not np.allclose(updates[0], updates[1])  # the same step counter, weights and rows: only the keys differ


def test_adaptive_clipping_needs_the_count_in_a_custom_step_and_moves_the_clip_norm_with_it():
    optimizer = DynamicDPKerasSGD(
        schedule=_schedule(noise=0.0),
        public_batch_size=True,
        learning_rate=1.0,
        allow_degenerate_noise=True,
        adaptive_clipping={"target_quantile": 0.5, "learning_rate": 0.2, "count_stddev": 1e-6},
    )
    variable = keras.Variable(np.zeros(3, np.float32))
    optimizer.build([variable])
    state = optimizer.new_run(_values(optimizer))
    with pytest.raises(ValueError, match="stateless_apply_clipped_sum needs `centred_count`"):
        optimizer.stateless_apply_clipped_sum(state, [np.zeros(3, np.float32)], 4, 4, [variable.value])
    _, new_state = optimizer.stateless_apply_clipped_sum(
        state,
        [np.zeros(3, np.float32)],
        4,
        4,
        [variable.value],
        centred_count=np.float32(-2.0),  # all clipped
    )
    assert float(optimizer.clip_norm_at(new_state)) == pytest.approx(np.exp(0.2 * 0.5), rel=1e-5)
    assert float(optimizer.clip_norm_at(state)) == 1.0
