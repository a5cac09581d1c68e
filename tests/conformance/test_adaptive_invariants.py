"""Adaptive clipping's invariants on every backend and clipping path (`keras_dyndp.core.adaptive_clipping`), measured
on the released update of ``fit`` as `test_dp_invariants` measures it (SGD at learning rate 1:
S_t = -(w_{t+1} - w_t) * expected_batch_size).

1. Step t clips at the adapted C_t (the optimizer's variable before the step): one huge example alone moves S_t by C_t.
2. C_{t+1} = C_t exp(-eta (b_t - gamma)), b_t the noised count of unclipped rows over n, plus 1/2: a padding row
   (weight 0) counts nothing, a microbatch counts its own b_j - 1/2.
3. The gradient's noise std is s z_g,t C_t, the count's s sigma_b (s = 2 with microbatches).
4. C_t is saved and restored with the model; a refused step leaves it.
"""

import functools

import conformance_backend as backend
import numpy as np
import pytest

import keras_dyndp
from keras_dyndp.core import adaptive_clipping
from keras_dyndp.schedules import DPSchedule

keras = backend.keras
P, ROWS = 0.5, 4
EXPECTED = P * ROWS
INPUTS, OUTPUTS = 50, 40
QUANTILE, RATE = 0.3, 0.2

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*The epsilon reported for this schedule assumes Poisson sampling"),
    pytest.mark.filterwarnings("ignore::keras_dyndp.optimizer_base.DegenerateNoiseWarning"),
    pytest.mark.filterwarnings("ignore::keras_dyndp.NoiseSeedWarning"),
]

# (path id, optimizer arguments, make_private method, sensitivity s)
PATHS = [
    *[(f"per_example-{method}", {}, method, 1.0) for method in backend.METHODS],
    ("microbatches", {"num_microbatches": 2}, "auto", 2.0),
    ("accumulation", {"accumulation_steps": 2}, backend.METHODS[0], 1.0),
]
PATH_PARAMS = [pytest.param(path, id=path[0], marks=pytest.mark.xdist_group(f"adaptive_{path[0]}")) for path in PATHS]


def _model(path, clip_norms, noise, count_stddev, learning_rate=RATE, **kwargs):
    _, optimizer_kwargs, method, _ = path
    options = keras_dyndp.AdaptiveClipping(QUANTILE, learning_rate, count_stddev)
    optimizer = keras_dyndp.DynamicDPKerasSGD(
        schedule=DPSchedule(np.asarray(clip_norms, float), np.asarray(noise, float), P),
        expected_batch_size=EXPECTED,
        learning_rate=1.0,
        adaptive_clipping=options,
        allow_degenerate_noise=True,
        noise_seed=0,
        **optimizer_kwargs,
        **kwargs,
    )
    model = keras_dyndp.make_private(backend.dense_model(INPUTS, OUTPUTS), method)
    model.compile(optimizer=optimizer, loss=backend.loss())
    return model


def _clip_norm(model) -> float:
    return float(np.asarray(model.optimizer.adaptive_clip_norm))


class _Record(keras.callbacks.Callback):
    def __init__(self, record):
        super().__init__()
        self._record = record

    def on_train_batch_end(self, batch, logs=None):
        self._record.append((backend.weights(self.model), _clip_norm(self.model)))


def _run(model, batches):
    """[(S_t, C_t before step t)] of each step, and C after the last."""
    record = [(backend.weights(model), _clip_norm(model))]
    backend.fit_batches(model, batches, callbacks=[_Record(record)])
    sums = [
        np.concatenate([(b - a).ravel() for a, b in zip(after, before)]) * EXPECTED
        for (before, _), (after, _) in zip(record, record[1:])
    ]
    return sums, [clip for _, clip in record]


def _alone():
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(ROWS, INPUTS)).astype("float32"), rng.normal(size=(ROWS, OUTPUTS)).astype("float32")
    y[0] = 1e3  # a gradient of norm ~1e3, far above every C_t
    return x, y, np.array([1, 0, 0, 0], "float32")


def _padding():
    x, y, _ = _alone()
    return x, y, np.zeros(ROWS, "float32")


def _fraction(path, batch) -> float:
    """b_t without noise: the unclipped fraction the step estimates, (count / n) + 1/2."""
    if path[1].get("num_microbatches"):  # the huge row's microbatch is clipped; an empty one is not
        count = 0.0 if batch[2].any() else 1.0
        return count / path[1]["num_microbatches"] + 0.5
    return -0.5 * batch[2].sum() / EXPECTED + 0.5


def _noiseless(path):
    return _noiseless_run(path[0])


@functools.cache
def _noiseless_run(path_id):
    path = next(path for path in PATHS if path[0] == path_id)
    batches = [_alone(), _alone(), _padding(), _alone()]
    model = _model(path, [0.5] * 4, [0.0] * 4, count_stddev=1e-6)
    return batches, *_run(model, batches)


@pytest.mark.parametrize("path", PATH_PARAMS)
def test_each_step_clips_at_the_adapted_clip_norm(path):
    batches, sums, clips = _noiseless(path)
    assert clips[0] == pytest.approx(0.5)
    for t in (0, 1, 3):
        np.testing.assert_allclose(np.linalg.norm(sums[t]), clips[t], rtol=1e-4, err_msg=f"step {t}")
    assert len(set(np.round(clips, 6))) > 1 or path[1].get("num_microbatches")  # it moved


@pytest.mark.parametrize("path", PATH_PARAMS)
def test_the_clip_norm_moves_geometrically_toward_the_target_quantile(path):
    batches, _, clips = _noiseless(path)
    for t, batch in enumerate(batches):
        expected = clips[t] * np.exp(-RATE * (_fraction(path, batch) - QUANTILE))
        np.testing.assert_allclose(clips[t + 1], expected, rtol=1e-5, err_msg=f"step {t}")


@pytest.mark.parametrize("path", PATH_PARAMS)
def test_the_gradient_noise_follows_the_clip_norm_and_the_count_is_noised(path):
    """30 steps on padding rows (a zero gradient): S_t is the gradient's noise, std s z_g C_t; the count's noise is
    read back from C_{t+1} / C_t: std s sigma_b."""
    sensitivity, steps, z, count_stddev = path[3], 30, 0.5, 1.0
    model = _model(path, [1.0] * steps, [z] * steps, count_stddev=count_stddev, learning_rate=0.01)
    batches = [_padding()] * steps
    sums, clips = _run(model, batches)
    z_g = adaptive_clipping.gradient_noise_multipliers(np.asarray([z]), count_stddev)[0]
    assert z_g > z
    for t in (0, steps - 1):
        np.testing.assert_allclose(sums[t].std(), sensitivity * z_g * clips[t], rtol=0.08, err_msg=f"step {t}")
    fractions = QUANTILE - np.log(np.asarray(clips[1:]) / np.asarray(clips[:-1])) / 0.01
    count = 1.0 if path[1].get("num_microbatches") else 0.0
    noises = (fractions - 0.5) * (path[1].get("num_microbatches") or EXPECTED) - count
    assert abs(noises.mean()) < 0.6 * sensitivity * count_stddev
    np.testing.assert_allclose(noises.std(), sensitivity * count_stddev, rtol=0.35)


def test_the_clip_norm_is_saved_and_restored_with_the_model(tmp_path):
    path = PATHS[0]
    model = _model(path, [0.5] * 4, [0.0] * 4, count_stddev=1e-6)
    _run(model, [_alone()])
    adapted = _clip_norm(model)
    assert adapted != pytest.approx(0.5)
    file = str(tmp_path / "model.keras")
    model.save(file)
    restored = keras.models.load_model(file)
    assert _clip_norm(restored) == adapted
    assert restored.optimizer.adaptive_clipping == model.optimizer.adaptive_clipping
    sums, clips = _run(restored, [_alone()])
    np.testing.assert_allclose(np.linalg.norm(sums[0]), adapted, rtol=1e-4)
    assert backend.dp_step(restored) == 2


def test_a_refused_step_leaves_the_clip_norm():
    model = _model(PATHS[0], [0.5] * 2, [0.0] * 2, count_stddev=1e-6)
    with pytest.raises(backend.STEP_REFUSALS):
        _run(model, [_alone()] * 3)
    assert backend.dp_step(model) == 2
    after_two = _clip_norm(model)
    with pytest.raises(backend.STEP_REFUSALS):
        _run(model, [_alone()])
    assert _clip_norm(model) == after_two


def test_bad_options_are_refused_before_any_step():
    with pytest.raises(ValueError, match="`target_quantile` must be in \\(0, 1\\)"):
        keras_dyndp.AdaptiveClipping(target_quantile=1.0)
    with pytest.raises(ValueError, match="`count_stddev` must exceed half the schedule's largest noise multiplier"):
        _model(PATHS[0], [1.0] * 2, [4.0] * 2, count_stddev=1.0)


def _count(path, clips) -> float:
    """The step's count of unclipped rows read back from C_1 / C_0 (noise 1e-6): n (b - 1/2)."""
    fraction = QUANTILE - np.log(clips[1] / clips[0]) / RATE
    return (fraction - 0.5) * (path[1].get("num_microbatches") or EXPECTED)


@pytest.mark.parametrize("path", PATH_PARAMS)
def test_removing_one_example_moves_the_count_by_at_most_half_the_sensitivity(path):
    """The full batch against its neighbour without the huge-gradient row (weight 0, as a Poisson batch pads), from
    the same weights and noise seed: the count moves by at most s / 2 (per example: exactly 1/2)."""
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(ROWS, INPUTS)).astype("float32"), 0.01 * rng.normal(size=(ROWS, OUTPUTS)).astype("float32")
    y[1] = 1e3
    counts = []
    for weights in ([1, 1, 1, 1], [1, 0, 1, 1]):
        model = _model(path, [50.0] * 2, [0.0] * 2, count_stddev=1e-6)
        _, clips = _run(model, [(x, y, np.asarray(weights, "float32"))])
        counts.append(_count(path, clips))
    move = abs(counts[0] - counts[1])
    assert move <= path[3] / 2 + 1e-3, counts
    if not path[1].get("num_microbatches"):
        assert move == pytest.approx(0.5, abs=1e-3), counts
