"""Tests for keras_dyndp.accounting.scale_search: few evaluations, never over the target, clear failures."""

import math

import pytest

from keras_dyndp.accounting import scale_search


class _Counted:
    """epsilon(x) = scale * exp(power * x) (+ jump above `jump_at`), counting calls."""

    def __init__(self, scale=1.0, power=1.7, jump_at=None, infinite_above=None):
        self.scale, self.power, self.jump_at, self.infinite_above = scale, power, jump_at, infinite_above
        self.calls = 0

    def __call__(self, x):
        self.calls += 1
        if self.infinite_above is not None and x > self.infinite_above:
            return math.inf
        value = self.scale * math.exp(self.power * x)
        return value * 1.05 if self.jump_at is not None and x > self.jump_at else value


@pytest.mark.parametrize("start", [-3.0, 0.0, 0.4, 5.0])
def test_lands_in_the_window_below_target_with_few_evaluations(start):
    epsilon = _Counted()
    x = scale_search.largest_scale_within(epsilon, 2.0, start=start, lower=-20.0, upper=20.0)
    assert 2.0 * (1 - scale_search.DEFAULT_RTOL) <= epsilon(x) <= 2.0
    assert epsilon.calls <= 4  # The former bracket doubling + brentq to 1e-9 in x took 7 to 15 here.


def test_rough_pass_leaves_few_costly_evaluations():
    costly, rough = _Counted(), _Counted(scale=1.1)  # A pessimistic stand-in, 10% above.
    x = scale_search.largest_scale_within(costly, 2.0, start=3.0, lower=-20.0, upper=20.0, rough_epsilon_of=rough)
    assert costly(x) <= 2.0 and costly.calls <= 4


def test_jump_across_the_window_returns_the_safe_side():
    epsilon = _Counted(jump_at=math.log(1.99) / 1.7)  # epsilon jumps from 1.99 to 2.09 across the target 2.
    x = scale_search.largest_scale_within(epsilon, 2.0, start=0.0, lower=-20.0, upper=20.0)
    assert 1.98 < epsilon(x) <= 1.99 + 1e-9


def test_targets_outside_the_range_raise():
    with pytest.raises(scale_search.CalibrationError, match="cannot be reached: .* spends only epsilon = 29.96"):
        scale_search.largest_scale_within(_Counted(), 1e3, start=0.0, lower=-2.0, upper=2.0)
    with pytest.raises(scale_search.CalibrationError, match="cannot be met: .* already spends epsilon = 0.03337"):
        scale_search.largest_scale_within(_Counted(), 1e-3, start=0.0, lower=-2.0, upper=2.0)
    # Where the accountant gives up (inf) before the target is reached: the edge is located, then refused.
    with pytest.raises(scale_search.CalibrationError, match="at the edge of what the accountant can represent"):
        scale_search.largest_scale_within(_Counted(infinite_above=1.0), 1e3, start=0.0, lower=-20.0, upper=20.0)


def test_a_good_slope_guess_saves_evaluations():
    guessed, unguessed = _Counted(power=4.0), _Counted(power=4.0)
    scale_search.largest_scale_within(guessed, 2.0, start=2.0, lower=-20.0, upper=20.0, slope=4.0)
    scale_search.largest_scale_within(unguessed, 2.0, start=2.0, lower=-20.0, upper=20.0)
    assert guessed.calls == 2 < unguessed.calls


def test_step_to_safe_side_steps_until_safe_and_leaves_a_safe_value_alone():
    target = 0.1 + 0.2  # 0.30000000000000004: a hair above 0.3.
    stepped = scale_search.step_to_safe_side(target, lambda x: x <= 0.3, lambda x: math.nextafter(x, 0.0))
    assert stepped == 0.3
    assert scale_search.step_to_safe_side(0.25, lambda x: x <= 0.3, lambda x: x / 0) == 0.25
    assert scale_search.step_to_safe_side(1.0, lambda x: x >= 1.5, lambda x: x * 1.25) == 1.5625


def test_bisect_keeps_the_predicate_true_at_low_false_at_high_and_stops_at_float_precision():
    low, high = scale_search.bisect(lambda x: x * x < 2.0, 1.0, 2.0, steps=200)
    assert low * low < 2.0 <= high * high
    assert high == math.nextafter(low, math.inf)  # no float between them: stopped before 200 halvings
    low, high = scale_search.bisect(lambda x: x < 0.3, 0.0, 1.0, steps=3)
    assert (low, high) == (0.25, 0.375)
