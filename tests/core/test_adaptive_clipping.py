"""Tests of keras_dyndp.core.adaptive_clipping over a numpy primitive set (no TensorFlow, no JAX): the options and
their checks, the split of each step's noise multiplier between the gradient and the count, the centred count and
the geometric update of the clip norm."""

import math
import types

import numpy as np
import pytest

from keras_dyndp.core import adaptive_clipping as adaptive
from keras_dyndp.schedules import DPSchedule

OPS = types.SimpleNamespace(
    where=np.where,
    minimum=lambda x, y: np.minimum(x, y, dtype=np.asarray(x).dtype),  # Python scalars are weak, as in TF and JAX
    maximum=lambda x, y: np.maximum(x, y, dtype=np.asarray(x).dtype),
    cast=lambda x, dtype: np.asarray(x, dtype),
    is_finite=np.isfinite,
    exp=np.exp,
)


@pytest.mark.parametrize(
    "name, value",
    [("target_quantile", v) for v in (0.0, 1.0, -0.1, 1.5, math.nan, math.inf, True, "0.5", None)]
    + [("learning_rate", v) for v in (0.0, -0.2, math.nan, math.inf, "0.2", None)]
    + [("count_stddev", v) for v in (0.0, -1.0, math.nan, math.inf, "1")],
)
def test_each_option_out_of_range_raises_naming_it(name, value):
    with pytest.raises(ValueError, match=rf"`{name}` must .* Received: {name}="):
        adaptive.AdaptiveClipping(**{name: value})


def test_options_in_range_are_kept_as_floats():
    options = adaptive.AdaptiveClipping(target_quantile=np.float32(0.25), learning_rate=1, count_stddev=np.int64(3))
    assert options.get_config() == {"target_quantile": 0.25, "learning_rate": 1.0, "count_stddev": 3.0}
    assert all(type(value) is float for value in options.get_config().values())
    assert adaptive.AdaptiveClipping().get_config() == {
        "target_quantile": 0.5,
        "learning_rate": 0.2,
        "count_stddev": None,
    }


def test_resolve_turns_the_optimizer_argument_into_options():
    options = adaptive.AdaptiveClipping(target_quantile=0.7, count_stddev=2.0)
    assert adaptive.resolve(None) is None
    assert adaptive.resolve(False) is None
    assert adaptive.resolve(True) == adaptive.AdaptiveClipping()
    assert adaptive.resolve(options) is options
    assert adaptive.resolve({"target_quantile": 0.7, "count_stddev": 2.0}) == options
    assert adaptive.resolve(adaptive.config_of(options)) == options  # a saved config round-trips
    assert adaptive.config_of(None) is None


@pytest.mark.parametrize("value", [1, 0, 0.5, "yes", [0.5], (0.5, 0.2)])
def test_resolve_refuses_anything_else_naming_the_argument(value):
    with pytest.raises(TypeError, match=r"`adaptive_clipping` must be None, True, .* Received: adaptive_clipping="):
        adaptive.resolve(value)


def test_resolve_checks_a_dict_of_options():
    with pytest.raises(ValueError, match="`learning_rate`"):
        adaptive.resolve({"learning_rate": 0.0})
    with pytest.raises(TypeError):
        adaptive.resolve({"unknown_option": 1.0})


def test_count_stddev_defaults_to_one_twentieth_of_the_normaliser():
    assert adaptive.count_stddev(adaptive.AdaptiveClipping(), 250.0) == 12.5
    assert adaptive.count_stddev(adaptive.AdaptiveClipping(), 4) == 0.2  # microbatches: M / 20
    assert adaptive.count_stddev(adaptive.AdaptiveClipping(count_stddev=3.0), 250.0) == 3.0
    assert adaptive.count_stddev(adaptive.AdaptiveClipping(count_stddev=3.0), None) == 3.0


def test_count_stddev_without_a_normaliser_is_refused_naming_what_to_give():
    with pytest.raises(ValueError, match=r"`public_batch_size=True` needs `count_stddev`.*count_stddev=None"):
        adaptive.count_stddev(adaptive.AdaptiveClipping(), None)


@pytest.mark.parametrize("stddev", [0.6, 1.0, 12.5, 1e4])
def test_gradient_and_count_multipliers_recombine_into_the_schedules(stddev):
    z = np.array([1.1, 1.0, 0.9, 0.7, 1.19])
    gradient = adaptive.gradient_noise_multipliers(z, stddev)
    assert gradient.shape == z.shape and gradient.dtype == np.float64
    assert np.all(gradient > z)  # the gradient gets more noise than the schedule's total
    np.testing.assert_allclose((gradient**-2 + (2 * stddev) ** -2) ** -0.5, z, rtol=1e-12)


def test_a_count_that_would_cost_the_whole_step_is_refused_naming_count_stddev():
    z = np.array([1.0, 2.0, 1.5])
    with pytest.raises(ValueError, match=r"`count_stddev` must exceed .* 1 .*Received: count_stddev=1.0"):
        adaptive.gradient_noise_multipliers(z, 1.0)  # 2 sigma_b = max z: nothing left for the gradient
    with pytest.raises(ValueError, match="`count_stddev`"):
        adaptive.gradient_noise_multipliers(z, 0.5)
    assert np.all(np.isfinite(adaptive.gradient_noise_multipliers(z, 1.0001)))


def test_step_arrays_are_the_schedules_without_adaptive_clipping():
    schedule = DPSchedule([2.0, 1.5, 1.0], [2.0, 3.0, 1.5], 0.01)
    clip, noise, stddev = adaptive.step_arrays(schedule, None, 100.0)
    assert stddev is None and clip.dtype == noise.dtype == np.float32
    np.testing.assert_array_equal(clip, [2.0, 1.5, 1.0])
    np.testing.assert_array_equal(noise, [2.0, 3.0, 1.5])


def test_step_arrays_with_adaptive_clipping_are_unit_clip_and_the_gradients_multipliers():
    schedule = DPSchedule([2.0, 1.5, 1.0], [2.0, 3.0, 1.5], 0.01)  # z = 1, 2, 1.5
    clip, noise, stddev = adaptive.step_arrays(schedule, adaptive.AdaptiveClipping(), 100.0)
    assert stddev == 5.0 and clip.dtype == noise.dtype == np.float32
    np.testing.assert_array_equal(clip, [1.0, 1.0, 1.0])
    np.testing.assert_allclose(noise, adaptive.gradient_noise_multipliers([1.0, 2.0, 1.5], 5.0), rtol=1e-7)
    with pytest.raises(ValueError, match="`count_stddev`"):
        adaptive.step_arrays(schedule, adaptive.AdaptiveClipping(), None)
    with pytest.raises(ValueError, match="`count_stddev` must exceed"):
        adaptive.step_arrays(schedule, adaptive.AdaptiveClipping(), 20.0)  # sigma_b = 1, 2 sigma_b = max z


def test_centred_indicators_are_plus_half_unclipped_minus_half_clipped_zero_on_padding():
    norms = np.array([0.0, 0.5, 1.0, 1.0001, 7.0, np.nan, np.inf, -np.inf, 0.3], np.float32)
    rows = np.array([True] * 8 + [False])
    indicators = adaptive.centred_indicators(OPS, norms, np.float32(1.0), rows)
    assert indicators.dtype == np.float32
    np.testing.assert_array_equal(indicators, [0.5, 0.5, 0.5, -0.5, -0.5, -0.5, -0.5, -0.5, 0.0])


@pytest.mark.parametrize("norm", [0.0, 0.2, 1.0, 3.0, 1e38, np.nan, np.inf])
def test_one_row_moves_the_count_by_exactly_half_whatever_its_norm(norm):
    """Add/remove-one: with the row (rows True) or without it (rows False, or absent), the sums differ by 1/2."""
    base = np.random.default_rng(0).lognormal(0.0, 1.0, 31).astype(np.float32)
    norms = np.append(base, np.float32(norm))
    with_row = adaptive.centred_indicators(OPS, norms, np.float32(1.0), np.ones(32, bool)).sum()
    padded = adaptive.centred_indicators(OPS, norms, np.float32(1.0), np.arange(32) < 31).sum()
    absent = adaptive.centred_indicators(OPS, base, np.float32(1.0), np.ones(31, bool)).sum()
    assert padded == absent
    assert abs(with_row - absent) == 0.5


def _next(clip_state, noised, normaliser, options, clip_norm=None):
    """`next_clip_norm` on float32 arrays of one element (numpy 1.x would promote float32 scalars with a Python float
    to float64; TensorFlow, JAX and numpy 2 keep float32), as a float32 scalar."""
    clip_state = np.full(1, clip_state, np.float32)
    clip_norm = clip_state if clip_norm is None else np.full(1, clip_norm, np.float32)
    noised, normaliser = np.full(1, noised, np.float32), np.full(1, normaliser, np.float32)
    return adaptive.next_clip_norm(OPS, clip_norm, clip_state, noised, normaliser=normaliser, options=options)[0]


def test_next_clip_norm_is_the_geometric_update():
    options = adaptive.AdaptiveClipping(target_quantile=0.7, learning_rate=0.3)
    updated = _next(2.0, 3.0, 10.0, options)  # b = 3 / 10 + 1/2 = 0.8
    assert updated.dtype == np.float32
    np.testing.assert_allclose(updated, 2.0 * math.exp(-0.3 * (0.8 - 0.7)), rtol=1e-6)
    np.testing.assert_allclose(_next(2.0, -2.0, 10.0, options), 2.0 * math.exp(-0.3 * (0.3 - 0.7)), rtol=1e-6)
    assert _next(2.0, 2.0, 10.0, options) == np.float32(2.0)  # b = gamma: C stays


def test_next_clip_norm_keeps_the_stored_norm_when_the_step_released_nothing():
    options = adaptive.AdaptiveClipping()
    assert _next(2.5, 40.0, 10.0, options, clip_norm=0.0) == np.float32(2.5)
    assert _next(2.5, -40.0, 10.0, options, clip_norm=0.0) == np.float32(2.5)


def test_next_clip_norm_stays_within_its_range():
    options = adaptive.AdaptiveClipping(learning_rate=1.0)
    with np.errstate(over="ignore"):
        assert _next(1.0, -1e6, 1.0, options) == np.float32(adaptive.MAX_CLIP_NORM)  # factor inf
        assert _next(1e30, -5.0, 1.0, options) == np.float32(adaptive.MAX_CLIP_NORM)
    assert _next(1.0, 1e6, 1.0, options) == np.float32(adaptive.MIN_CLIP_NORM)  # factor 0
    assert _next(1e-30, 5.0, 1.0, options) == np.float32(adaptive.MIN_CLIP_NORM)


@pytest.mark.parametrize("quantile", [0.1, 0.5, 0.9])
def test_without_noise_all_unclipped_shrinks_and_all_clipped_grows(quantile):
    options = adaptive.AdaptiveClipping(target_quantile=quantile)
    norms = np.array([0.1, 0.2, 0.3, 0.4], np.float32)
    for clip, moves in ((1.0, np.less), (0.05, np.greater)):
        count = adaptive.centred_indicators(OPS, norms, np.float32(clip), np.ones(4, bool)).sum()
        assert moves(_next(clip, count, 4.0, options), np.float32(clip))


@pytest.mark.parametrize("quantile", [0.2, 0.5, 0.8])
def test_the_clip_norm_follows_the_target_quantile_of_fixed_norms(quantile):
    """Algorithm 1 on Poisson batches (p = 0.1 of N = 2000 fixed lognormal norms, sigma_b = pN / 20 the default):
    from C_0 = 100, far above every norm, C_t settles where a fraction `quantile` of the norms lie below it."""
    rng = np.random.default_rng(7)
    norms = rng.lognormal(0.0, 0.5, 2000).astype(np.float32)
    options, normaliser = adaptive.AdaptiveClipping(target_quantile=quantile), 0.1 * norms.size
    stddev = adaptive.count_stddev(options, normaliser)
    clip, fractions = np.float32(100.0), []
    for _ in range(600):
        rows = rng.random(norms.size) < 0.1
        noised = adaptive.centred_indicators(OPS, norms, clip, rows).sum() + stddev * rng.standard_normal()
        clip = _next(clip, noised, normaliser, options)
        fractions.append(np.mean(norms <= clip))
    assert abs(np.mean(fractions[-200:]) - quantile) < 0.02
    assert abs(fractions[-1] - quantile) < 0.06
