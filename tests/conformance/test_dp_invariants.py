"""The DP invariants every backend must keep, written once (as dp_accounting's accountants share one suite).

Runs on every stack: TensorFlow with Keras 3 and Keras 2, and Keras 3 on JAX (`conformance_backend` gives what
differs, through keras_dyndp's public API only). Each invariant is measured on the released update of ``fit``
after ``make_private``, with SGD at learning rate 1 without rescaling, so that the noisy clipped sum of a step is
S_t = -(w_{t+1} - w_t) * expected_batch_size. C_t and sigma_t change from step to step, so a mechanism that reads
the schedule at the wrong step fails.

1. One-example neighbour: removing one example (its sample weight set to 0, as a Poisson batch pads) moves S_t by
   at most C_t (2 C_t with microbatches); an example with a huge gradient moves it by exactly C_t.
2. Noise: the per-coordinate std of S_t on a zero gradient is sigma_t (2 sigma_t with microbatches).
3. The schedule index survives save and load; a step counter restored into another schedule's optimizer is refused.
4. Refusals: past the budget (and `BudgetStop` ends fit at T exactly), arrays, BatchNormalization, degenerate
   noise, Keras 3's default train step.
5. No loss or metric of the training batch is released unless ``training_metrics=True``.
"""

import functools
import re
import warnings

import conformance_backend as backend
import numpy as np
import pytest

import keras_dyndp
from keras_dyndp.schedules import DPSchedule

keras = backend.keras
LR = 1.0
P = 0.5
ROWS = 4
EXPECTED = P * ROWS  # p N with N = ROWS: every batch of 0..4 examples is a plausible Poisson sample.

pytestmark = pytest.mark.filterwarnings(
    # Exact batches, not Poisson samples: warned once per optimizer, by design.
    "ignore:.*The epsilon reported for this schedule assumes Poisson sampling"
)

# (path id, optimizer arguments, make_private method, sensitivity in units of C_t)
PATHS = [
    *[(f"per_example-{method}", {}, method, 1.0) for method in backend.METHODS],
    ("microbatches", {"num_microbatches": 2}, "auto", 2.0),
    ("accumulation", {"accumulation_steps": 2}, backend.METHODS[0], 1.0),
]
PATH_IDS = [path[0] for path in PATHS]
# A path's tests run on one worker (pytest-xdist), which computes its cached runs (`_runs`, `_non_finite_release`) once.
PATH_PARAMS = [pytest.param(path, id=path[0], marks=pytest.mark.xdist_group(f"path_{path[0]}")) for path in PATHS]


def _schedule(clip_norms, noise_stddevs, p=P):
    return DPSchedule(np.asarray(clip_norms, float), np.asarray(noise_stddevs, float), p)


def _optimizer(schedule, **kwargs):
    """A DP SGD optimizer; one without noise (sigma = 0) is built with the warnings it must give."""
    cls = keras_dyndp.DynamicDPKerasSGD
    kwargs = {"expected_batch_size": EXPECTED, "learning_rate": LR, **kwargs}
    if np.any(schedule.noise_stddevs == 0):
        with pytest.warns(UserWarning, match="noise_seed=0 makes the DP noise reproducible"):
            with pytest.warns(UserWarning, match=r"allow_degenerate_noise=True: .*no meaningful"):
                return cls(schedule=schedule, allow_degenerate_noise=True, noise_seed=0, **kwargs)
    return cls(schedule=schedule, **kwargs)


def _private_model(schedule, optimizer_kwargs=None, method="auto", model=None):
    model = keras_dyndp.make_private(model or backend.dense_model(), method)
    model.compile(optimizer=_optimizer(schedule, **(optimizer_kwargs or {})), loss=backend.loss())
    return model


def _data(seed=0, num_inputs=5, num_outputs=3, huge_row=None):
    """ROWS examples for `backend.dense_model`; ``huge_row``'s target is 1e3, so that its gradient has norm ~1e3
    (far above every C_t) at every step of these tests, whatever the updates before."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(ROWS, num_inputs)).astype("float32")
    y = rng.normal(size=(ROWS, num_outputs)).astype("float32")
    if huge_row is not None:
        y[huge_row] = 1e3
    return x, y


def _noisy_sums(model, batches):
    """S_t of each step, flattened: -(w_{t+1} - w_t) * expected_batch_size / lr."""
    steps = backend.weights_after_each_step(model, batches)
    return [
        np.concatenate([(b - a).ravel() for a, b in zip(after, before)]) * EXPECTED / LR
        for before, after in zip(steps, steps[1:])
    ]


def _huge_example_alone(seed=1, num_inputs=5, num_outputs=3):
    """One example whose gradient has norm ~1e3 and 3 padding rows (sample weight 0)."""
    x, y = _data(seed, num_inputs, num_outputs, huge_row=0)
    return x, y, np.array([1, 0, 0, 0], "float32")


# The steps of `_runs`: C_t grows from step 0 to 1 and shrinks from 1 to 2 (a schedule index one step behind or
# ahead is measured wrong either way); steps 3 and 4 are noisy, with sigma_3 != sigma_4.
CLIP_NORMS = [0.5, 1.5, 0.5, 1.0, 1.0, 0.5]
NOISE = [0.0, 0.0, 0.0, 0.5, 2.0, 0.0]
INPUTS, OUTPUTS = 50, 40  # 2,040 weights: their noise's std within ~2%


@functools.cache
def _runs(path_id):
    """S_t of two runs of a path from the same weights and noise seed (microbatch memberships included):
    ``full`` = [huge example alone, same, full batch, padding, padding, an ordinary example alone with sample
    weight 1e3] and ``neighbour``, which takes at step 2 the full batch without its huge-gradient row (sample
    weight 0, as a Poisson batch pads), and stops there."""
    _, optimizer_kwargs, method, _ = PATHS[PATH_IDS.index(path_id)]
    alone = _huge_example_alone(num_inputs=INPUTS, num_outputs=OUTPUTS)
    x, y = _data(num_inputs=INPUTS, num_outputs=OUTPUTS, huge_row=1)
    full = (x, y, np.ones(ROWS, "float32"))
    neighbour = (x, y, np.array([1, 0, 1, 1], "float32"))
    padding = (x, y, np.zeros(ROWS, "float32"))  # a zero gradient: S_t is the noise
    weighted = (x, y, np.array([0, 0, 1e3, 0], "float32"))

    def run(batches):
        model = backend.dense_model(INPUTS, OUTPUTS)
        return _noisy_sums(_private_model(_schedule(CLIP_NORMS, NOISE), optimizer_kwargs, method, model), batches)

    return {"full": run([alone, alone, full, padding, padding, weighted]), "neighbour": run([alone, alone, neighbour])}


@pytest.mark.parametrize("path", PATH_PARAMS)
def test_one_huge_example_moves_the_sum_by_exactly_the_clip_norm_of_its_step(path):
    """Alone in the batch (alone in its microbatch too: padding rows count in no microbatch), one huge gradient is
    clipped to C_t of the step the counter is at: ||S_t|| = C_t."""
    sums = _runs(path[0])["full"][:2]
    np.testing.assert_allclose([np.linalg.norm(total) for total in sums], CLIP_NORMS[:2], rtol=1e-4)


@pytest.mark.parametrize("path", PATH_PARAMS)
def test_removing_one_example_moves_the_clipped_sum_by_at_most_the_clip_norm_of_its_step(path):
    """At step 2 the neighbour moves S_2 by at most sensitivity * C_2 (C_1 would allow 3x more), and per example
    by C_2 exactly (its row's gradient is clipped to C_2)."""
    sensitivity = path[3]
    runs = _runs(path[0])
    np.testing.assert_array_equal(runs["full"][1], runs["neighbour"][1])  # the same weights before step 2
    move = np.linalg.norm(runs["full"][2] - runs["neighbour"][2])
    bound = sensitivity * CLIP_NORMS[2] * (1 + 1e-4)
    assert 0 < move <= bound, f"removing one example moved S_2 by {move:.6g} > {bound:.6g}"
    if sensitivity == 1.0:
        np.testing.assert_allclose(move, CLIP_NORMS[2], rtol=1e-4)


@pytest.mark.parametrize("path", PATH_PARAMS)
def test_noise_std_per_coordinate_is_sigma_t_times_the_sensitivity(path):
    """On a zero gradient (every row padding) S_t is the noise: per coordinate, mean 0 and std sensitivity *
    sigma_t, added once per step (accumulation included), at the step's own sigma_t."""
    sensitivity = path[3]
    for step in (3, 4):
        total = _runs(path[0])["full"][step]
        expected = sensitivity * NOISE[step]
        assert abs(total.mean()) < 0.1 * expected, f"step {step}: noise mean {total.mean():.4g}"
        np.testing.assert_allclose(total.std(), expected, rtol=0.08, err_msg=f"step {step}: noise std")


@pytest.mark.parametrize("path", PATH_PARAMS)
def test_a_sample_weight_cannot_scale_one_example_past_the_clip_norm(path):
    """Sample weights multiply the loss before clipping: an ordinary example with weight 1e3 alone moves S_5 by
    C_5 (sensitivity C_5 holds for any weights)."""
    np.testing.assert_allclose(np.linalg.norm(_runs(path[0])["full"][5]), CLIP_NORMS[5], rtol=1e-4)


def _clip_norm_measured(model):
    """||S_t|| of one huge-gradient example alone: C_t where the noise is tiny."""
    (total,) = _noisy_sums(model, [_huge_example_alone()])
    return float(np.linalg.norm(total))


def test_the_schedule_index_continues_after_save_and_load(tmp_path):
    """Saved after step 0 and loaded with keras.models.load_model, the model takes step 1 at C_1 and step 2 at
    sigma_2 (noise multipliers 2e-4 before, so that one huge example alone measures C_t)."""
    clip_norms, noise = [0.5, 1.5, 1.0, 1.0], [1e-4, 3e-4, 3.0, 0.5]
    model = _private_model(_schedule(clip_norms, noise), model=backend.dense_model(INPUTS, OUTPUTS))
    alone = _huge_example_alone(num_inputs=INPUTS, num_outputs=OUTPUTS)
    (total,) = _noisy_sums(model, [alone])
    np.testing.assert_allclose(np.linalg.norm(total), clip_norms[0], rtol=1e-2)
    path = str(tmp_path / "model.keras")
    model.save(path)
    restored = keras.models.load_model(path)
    assert backend.dp_step(restored) == 1
    x, y = _data(num_inputs=INPUTS, num_outputs=OUTPUTS)
    step_1, step_2 = _noisy_sums(restored, [alone, (x, y, np.zeros(ROWS, "float32"))])
    np.testing.assert_allclose(np.linalg.norm(step_1), clip_norms[1], rtol=1e-2)
    np.testing.assert_allclose(step_2.std(), noise[2], rtol=0.08)
    assert backend.dp_step(restored) == 3


def test_a_step_counter_restored_into_another_schedule_is_refused():
    clip_norms = [0.5, 1.5, 3.0]
    trained = _private_model(_schedule(clip_norms, 2e-4 * np.asarray(clip_norms)))
    _clip_norm_measured(trained)
    other = _private_model(_schedule([3.0, 0.5, 1.5], [6e-4, 1e-4, 3e-4]))
    other.optimizer.build(other.trainable_variables)
    sources, targets = (backend.optimizer_variables(m.optimizer) for m in (trained, other))
    assert [tuple(v.shape) for v in sources] == [tuple(v.shape) for v in targets]
    for source, target in zip(sources, targets):
        target.assign(np.asarray(source))
    before = backend.weights(other)
    with pytest.raises(backend.STEP_REFUSALS, match="another DP schedule .*schedule fingerprint differs"):
        _clip_norm_measured(other)
    assert backend.dp_step(other) == 1
    for old, new in zip(before, backend.weights(other)):
        np.testing.assert_array_equal(old, new)


def _poisson_like_batches(num_batches, seed=0):
    rng = np.random.default_rng(seed)
    x, y = _data(seed)
    return [(x, y, (rng.random(ROWS) < P).astype("float32")) for _ in range(num_batches)]


def _budget_error(error: BaseException, names_budget_stop: bool) -> None:
    """keras_dyndp's BudgetExhaustedError (not a top-level name: checked by type name), naming BudgetStop where it
    would have helped (a fit that ran out, not one that starts spent)."""
    assert type(error).__name__ == "BudgetExhaustedError" and isinstance(error, RuntimeError)
    assert ("keras_dyndp.BudgetStop()" in str(error)) == names_budget_stop and "3 steps" in str(error)


def test_budget_stop_ends_fit_at_the_last_step_and_fit_refuses_a_spent_schedule():
    model = _private_model(_schedule([1.0] * 3, [1.0] * 3))
    backend.fit_batches(model, _poisson_like_batches(5), callbacks=[keras_dyndp.BudgetStop()])
    assert backend.dp_step(model) == 3
    before = backend.weights(model)
    with pytest.raises(RuntimeError) as raised:
        backend.fit_batches(model, _poisson_like_batches(2))
    _budget_error(raised.value, names_budget_stop=False)
    assert backend.dp_step(model) == 3
    for old, new in zip(before, backend.weights(model)):
        np.testing.assert_array_equal(old, new)


def test_budget_stop_ends_fit_at_the_last_step_under_steps_per_execution():
    """Keras runs 2 steps per call here: the call that would cross T = 3 is shortened, not refused."""
    model = keras_dyndp.make_private(backend.dense_model())
    model.compile(optimizer=_optimizer(_schedule([1.0] * 3, [1.0] * 3)), loss=backend.loss(), steps_per_execution=2)
    backend.fit_batches(model, _poisson_like_batches(6), callbacks=[keras_dyndp.BudgetStop()])
    assert backend.dp_step(model) == 3


def test_a_step_past_the_budget_ends_fit_with_budget_exhausted_error():
    model = _private_model(_schedule([1.0] * 3, [1.0] * 3))
    with pytest.raises(RuntimeError) as raised:
        backend.fit_batches(model, _poisson_like_batches(5))
    _budget_error(raised.value, names_budget_stop=True)
    assert backend.dp_step(model) == 3


def _first_line_says(error: BaseException, problem: str, fix: str) -> None:
    """A refusal a user meets by a common mistake says what is wrong and the fix in its first line (read first in a
    traceback); why follows on the next lines."""
    first_line = str(error).splitlines()[0]
    assert problem in first_line and fix in first_line, first_line


def test_arrays_are_refused_before_the_first_step():
    model = _private_model(_schedule([1.0] * 3, [1.0] * 3))
    x, y = _data()
    before = backend.weights(model)
    with pytest.raises(ValueError, match="model.fit received arrays .*Nothing was trained") as refused:
        model.fit(x, y, batch_size=2, epochs=1, verbose=0)
    _first_line_says(refused.value, "received arrays", "train on Poisson batches instead (keras_dyndp.poisson_batches(")
    assert backend.dp_step(model) == 0
    for old, new in zip(before, backend.weights(model)):
        np.testing.assert_array_equal(old, new)


def test_a_num_examples_that_is_not_the_datas_size_is_refused_before_the_first_step():
    """The README's num_examples=60000 on a user's own rows: one line naming both numbers and the fix, before any
    step (it was an in-graph batch-size refusal, 55 lines of TensorFlow traceback, or a trained wrong epsilon)."""
    model = keras_dyndp.make_private(backend.dense_model())
    optimizer = keras_dyndp.DynamicDPKerasSGD(
        target_epsilon=2.0,
        target_delta=1e-5,
        num_examples=60000,
        batch_size=250,
        steps=3,
        method="vanilla",
        initial_clip=1.0,
        learning_rate=LR,
    )
    model.compile(optimizer=optimizer, loss=backend.loss())
    x, y = _data()
    batches = keras_dyndp.poisson_batches(x, y, sampling_probability=optimizer.schedule.sampling_probability)
    expected = rf"^num_examples=60000 was given to DynamicDPKerasSGD but the data has {ROWS} examples: pass num_exa"
    with pytest.raises(ValueError, match=expected) as refused:
        model.fit(batches, epochs=1, verbose=0)
    _first_line_says(refused.value, "the data has", "pass num_examples=len(x)")
    assert backend.dp_step(model) == 0


def test_batch_normalization_in_training_is_refused():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((5,)), keras.layers.BatchNormalization(), keras.layers.Dense(3)])
    model = _private_model(_schedule([1.0] * 3, [1.0] * 3), model=model)
    with pytest.raises(
        ValueError, match="BatchNormalization.*GroupNormalization or keras.layers.LayerNormalization"
    ) as e:
        backend.fit_batches(model, _poisson_like_batches(1))
    _first_line_says(e.value, "statistics of the whole batch", "replace it with keras.layers.GroupNormalization")
    assert backend.dp_step(model) == 0


@pytest.mark.parametrize("name", ["DynamicDPKerasSGD", "DynamicDPKerasAdam"])
def test_a_zero_noise_multiplier_is_refused_at_construction(name):
    schedule = _schedule([1.0, 1.0], [1.0, 0.0])
    with pytest.raises(ValueError, match=r"step 1 \(0-based\) is 0; .*" + re.escape("[0.0001, 10000]")):
        getattr(keras_dyndp, name)(schedule=schedule, expected_batch_size=EXPECTED)


def test_keras_default_train_step_is_refused_before_any_update():
    model = backend.dense_model()
    model.compile(optimizer=_optimizer(_schedule([1.0] * 3, [1.0] * 3)), loss=backend.loss())
    before = backend.weights(model)
    # TensorFlow: Keras 3's averaged gradient in apply_gradients, Keras 2's per-example losses in compute_gradients;
    # JAX: when fit makes Keras's step, before the state leaves the model.
    with pytest.raises(RuntimeError, match=r"Keras's own train step cannot train with a DP optimizer") as refused:
        backend.fit_batches(model, _poisson_like_batches(1))
    _first_line_says(refused.value, "Keras's own train step", "call model = keras_dyndp.make_private(model) before")
    assert refused.value.__cause__ is None  # no chained traceback of Keras internals
    for old, new in zip(before, backend.weights(model)):
        np.testing.assert_array_equal(old, new)


def test_the_epsilon_of_batches_not_known_to_be_poisson_is_logged_as_not_the_runs():
    """An epsilon logged for fixed or shuffled batches would claim what the accountant never analysed: after the
    SamplingWarning the keys say '_if_poisson' and no 'epsilon_pld' is logged; keras_dyndp's Poisson batches keep it."""
    x, y = _data()
    logged = {}
    for name in ("poisson", "fixed"):
        model = _private_model(_schedule([1.0] * 3, [1.0] * 3))
        logger = keras_dyndp.PrivacyLogger(delta=1e-5)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if name == "poisson":
                batches = keras_dyndp.poisson_batches(x, y, sampling_probability=P, max_batch_size=ROWS, seed=0)
                history = model.fit(batches, epochs=1, verbose=0, callbacks=[logger])
            else:
                history = backend.fit_batches(model, _poisson_like_batches(2), callbacks=[logger])
        warned = any(issubclass(w.category, keras_dyndp.SamplingWarning) for w in caught)
        logged[name] = (warned, sorted(key for key in history.history if key.startswith("epsilon")))
        assert (model.optimizer.unverified_sampling is None) == (name == "poisson")
    assert logged["poisson"] == (False, ["epsilon_gdp_clt", "epsilon_pld"])
    assert logged["fixed"] == (True, ["epsilon_gdp_clt_if_poisson", "epsilon_pld_if_poisson"])


@pytest.mark.parametrize("training_metrics", [False, True])
def test_no_training_loss_or_metric_is_logged_unless_asked(training_metrics):
    model = keras_dyndp.make_private(backend.dense_model(), training_metrics=training_metrics)
    model.compile(optimizer=_optimizer(_schedule([1.0] * 3, [1.0] * 3)), loss=backend.loss(), metrics=["mae"])
    logger = keras_dyndp.PrivacyLogger(delta=1e-5)
    history = backend.fit_batches(model, _poisson_like_batches(2), callbacks=[logger])
    assert "epsilon_pld_if_poisson" in history.history  # PrivacyLogger's, public (these batches are the test's own)
    released = {"loss", "mae"} & set(history.history)
    assert released == ({"loss", "mae"} if training_metrics else set())
    assert backend.dp_step(model) == 2


# Layers whose per-example norms the ghost path takes from a sum that can cancel (the Gram form's T^2 terms, a sum
# over positions, an embedding row's sum over its positions), each with an input shape and the sign pattern s of its
# positions: every kernel offset's window sums s to 0, so example 0's input M s u + r has a gradient of size |r|
# made of terms of size M (the vectorized path is exact by construction).
def _adversarial_layers():
    layers = keras.layers
    cases = {
        "dense_sequence": ((2, 64), [1, -1], lambda: layers.Dense(64)),
        "dense_long_sequence": ((8, 256), [1, -1] * 4, lambda: layers.Dense(256)),  # still the Gram form
        "dense_256_positions": ((256, 16), [1, -1] * 128, lambda: layers.Dense(16)),  # G_i materialised
        "conv1d": ((3, 32), [1, -1, 1], lambda: layers.Conv1D(32, 2)),
        "conv2d": ((3, 3, 32), [[1, -1, 1], [-1, 1, -1], [1, -1, 1]], lambda: layers.Conv2D(32, 2)),
        "depthwise_conv2d": ((3, 3, 8), [[1, -1, 1], [-1, 1, -1], [1, -1, 1]], lambda: layers.DepthwiseConv2D(2)),
        "separable_conv2d": ((3, 3, 16), [[1, -1, 1], [-1, 1, -1], [1, -1, 1]], lambda: layers.SeparableConv2D(32, 2)),
        "lstm": ((2, 32), [1, -1], lambda: layers.LSTM(16, return_sequences=True)),
        "gru": ((2, 32), [1, -1], lambda: layers.GRU(16, return_sequences=True)),
        "layer_normalization": ((2, 32), [1, -1], lambda: layers.LayerNormalization()),
        "einsum_dense": ((2, 64), [1, -1], lambda: layers.EinsumDense("abc,cd->abd", (2, 64), bias_axes="d")),
        "einsum_dense_kernel_transposed": ((2, 32), [1, -1], lambda: layers.EinsumDense("abc,dc->abd", (2, 16))),
    }
    if hasattr(layers, "GroupNormalization"):
        cases["group_normalization"] = ((3, 3, 8), [[1, -1, 1]] * 3, lambda: layers.GroupNormalization(2))
    return cases


ADVERSARIAL = _adversarial_layers()
MAGNITUDES = [1e-3, 1e3, 1e6]
ADVERSARIAL_ROWS = 32  # each one adversarial: on the old Gram form about half lost their clip
ADVERSARIAL_CLIP = 0.01
# A layer's magnitudes run on one worker, which builds and traces its model once (`_adversarial_model`).
ADVERSARIAL_LAYERS = [pytest.param(name, marks=pytest.mark.xdist_group(f"adversarial_{name}")) for name in ADVERSARIAL]


def _adversarial_batch(shape, signs, magnitude, seed=0):
    """ADVERSARIAL_ROWS examples of ``shape``, each magnitude * s u_i + r_i (u_i: a random unit direction, r_i
    standard normal), with targets far from the model's outputs (gradient norms far above the clip norm)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(ADVERSARIAL_ROWS, *shape))
    directions = rng.normal(size=(ADVERSARIAL_ROWS, shape[-1]))
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    pattern = np.asarray(signs, float)[None, ..., None]
    x += magnitude * pattern * directions.reshape(ADVERSARIAL_ROWS, *[1] * (len(shape) - 1), shape[-1])
    return x.astype("float32"), np.full((ADVERSARIAL_ROWS, 1), 1e3, "float32")


@functools.cache
def _adversarial_model(layer):
    """``(model, its initial weights)`` for ``layer``, one per layer for every magnitude's steps: each run starts
    from the initial weights, with a constant schedule and SGD without state (each step is the first one's
    neighbour), so that its DP step is built and traced once, not once per magnitude and run."""
    shape, _, make = ADVERSARIAL[layer]
    pooling = keras.layers.GlobalAveragePooling1D if len(shape) == 2 else keras.layers.GlobalAveragePooling2D
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input(shape), make(), pooling(), keras.layers.Dense(1)])
    steps = 2 * len(MAGNITUDES)
    schedule = _schedule([ADVERSARIAL_CLIP] * steps, [0.0] * steps)
    model = _private_model(schedule, {"expected_batch_size": ADVERSARIAL_ROWS * P}, model=model)
    return model, model.get_weights()


@pytest.mark.parametrize("magnitude", MAGNITUDES)
@pytest.mark.parametrize("layer", sorted(ADVERSARIAL_LAYERS, key=lambda param: param.values[0]))
def test_examples_whose_positions_cancel_in_float32_are_each_clipped_to_the_clip_norm(layer, magnitude):
    """Every per-example clipping path (ghost where the stack has a rule for the layer): examples built so that
    their gradients' terms cancel (magnitudes up to 1e6, whose float32 rounding errors are far larger than the
    gradient) each move S by at most C: the sum of 32 is at most 32 C, removing one moves it by at most C. The Gram
    form once let about half of them through unclipped (66 C on TensorFlow, NaN on JAX)."""
    shape, signs, _ = ADVERSARIAL[layer]
    x, y = _adversarial_batch(shape, signs, magnitude)
    clip, expected = ADVERSARIAL_CLIP, ADVERSARIAL_ROWS * P
    model, initial = _adversarial_model(layer)
    start = backend.dp_step(model)

    def run(weights):
        model.set_weights(initial)
        before, after = backend.weights_after_each_step(model, [(x, y, weights)])
        return np.concatenate([(b - a).ravel() for a, b in zip(after, before)]) * expected / LR

    full = run(np.ones(ADVERSARIAL_ROWS, "float32"))
    neighbour = run(np.concatenate([[0.0], np.ones(ADVERSARIAL_ROWS - 1)]).astype("float32"))
    assert backend.dp_step(model) == start + 2  # each run was one step of the same schedule
    assert np.isfinite(full).all() and np.isfinite(neighbour).all()
    total, move = np.linalg.norm(full), np.linalg.norm(full - neighbour)
    assert total <= ADVERSARIAL_ROWS * clip * (1 + 1e-4), f"{ADVERSARIAL_ROWS} examples summed to {total / clip:.4g} C"
    assert move <= clip * (1 + 1e-4), f"removing one example moved S by {move / clip:.4g} C"


@functools.cache
def _non_finite_release(path_id, value):
    """S of one step from `_non_finite_model`'s initial weights on `_data`'s rows: with feature 3 of row 0 set to
    ``value``, all rows weighted 1, or, where ``value`` is None, the neighbour: the rows as they are, row 0 a padding
    row (sample weight 0). The neighbour is the same for every value: computed once per path."""
    x, y = _data(num_inputs=INPUTS, num_outputs=OUTPUTS)
    weights = np.array([0, 1, 1, 1], "float32")
    if value is not None:
        x[0, 3], weights = value, np.ones(ROWS, "float32")
    model, initial = (_non_finite_model if path_id == "microbatches" else _shared_non_finite_model)(path_id)
    model.set_weights(initial)
    (total,) = _noisy_sums(model, [(x, y, weights)])
    return total


def _non_finite_model(path_id):
    """``(model, its initial weights)``: the path's model at a constant (0.01, 0) schedule for the steps of
    `_non_finite_release`. SGD at a constant schedule without noise has no state a step depends on, so one model (one
    trace, `_shared_non_finite_model`) serves every value of a path; microbatches take a fresh one per step, so that
    each step draws its memberships as the first step does."""
    _, optimizer_kwargs, method, _ = PATHS[PATH_IDS.index(path_id)]
    if path_id == "microbatches":
        optimizer_kwargs = {"num_microbatches": ROWS}  # all others in microbatches of their own: lost, they show
    model = _private_model(_schedule([0.01] * 5, [0.0] * 5), optimizer_kwargs, method, backend.dense_model(50, 40))
    return model, model.get_weights()


_shared_non_finite_model = functools.cache(_non_finite_model)


@pytest.mark.parametrize("value", [np.nan, np.inf, 1e30])
@pytest.mark.parametrize("path", PATH_PARAMS)
def test_an_example_that_is_not_finite_adds_nothing_and_the_release_stays_finite(path, value):
    """One example with a NaN, inf or 1e30 feature (1e30 overflows float32 in its loss) would turn every weight NaN,
    showing that it was sampled. Its gradient norm is not finite, so it adds exactly nothing: the release is its
    neighbour's (the example a padding row, sample weight 0), and finite. With microbatches its microbatch adds
    nothing, or, where the batch is differentiated together (TensorFlow's microbatch path: 0 x NaN spoils every
    microbatch, the release would lose all of them), the step is refused."""
    path_id = path[0]

    neighbour = _non_finite_release(path_id, None)
    try:
        full = _non_finite_release(path_id, value)
    except backend.STEP_REFUSALS as error:
        assert backend.BACKEND != "jax" and path_id == "microbatches", error
        assert "a gradient in this batch is not finite" in str(error)
        return
    assert np.isfinite(full).all(), f"{np.isnan(full).sum()} of {full.size} coordinates NaN"
    # Every gradient is clipped to C = 0.01, far below its norm: a microbatch's clipped sum does not depend on how
    # many rows it counts, so the example's zero gradient on JAX leaves the release exactly the neighbour's too.
    np.testing.assert_allclose(full, neighbour, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("method", backend.METHODS)
def test_a_negative_id_is_the_row_the_lookup_reads_or_is_refused(method):
    """JAX's lookup (jnp.take) reads id -1 as row N - 1: one example whose ids are -1 and N - 1 uses one row and moves
    S by at most C (counted as two rows it moved S by 1.41 C). TensorFlow's ghost rule (and its lookup on the CPU)
    refuses a negative id before the update, or, batched on its vectorized path, reads it as it reads it: at most C
    either way."""
    ids = np.tile(np.arange(8, dtype="int32") % 6, (ROWS, 1))  # the Input's dtype (JAX truncates int64, warning)
    ids[0, :2] = [-1, 5]
    y = np.full((ROWS, 1), 1e3, "float32")

    def run(weights):
        keras.utils.set_random_seed(0)
        model = keras.Sequential(
            [keras.Input((8,), dtype="int32"), keras.layers.Embedding(6, 4), keras.layers.GlobalAveragePooling1D()]
            + [keras.layers.Dense(1)]
        )
        model = _private_model(_schedule([0.01] * 2, [0.0] * 2), method=method, model=model)
        (total,) = _noisy_sums(model, [(ids, y, weights)])
        return total

    try:
        full = run(np.ones(ROWS, "float32"))
    except Exception as error:  # pylint: disable=broad-except
        refused = ("= -1 is not in [0, 6)", "received an id outside [0, 6)")  # the lookup's, the ghost rule's
        if backend.BACKEND == "jax" or not any(text in str(error) for text in refused):
            raise
        return  # TensorFlow refused it (its vectorized path's batched lookup takes it: the gradient it used)
    move = np.linalg.norm(full - run(np.array([0, 1, 1, 1], "float32")))
    assert move <= 0.01 * (1 + 1e-4), f"removing one example moved S by {move / 0.01:.4g} C"
