"""Tests for keras_dyndp.core.validation."""

import math

import numpy as np
import pytest

from keras_dyndp.core import validation


@pytest.mark.parametrize("value", [0.0, -0.1, 1.0000001, math.nan, "x", None])
def test_bad_probability_names_argument_and_range(value):
    with pytest.raises(ValueError, match=r"`rate` must be in \(0, 1\]"):
        validation.check_probability(value, "rate")


def test_good_probability():
    assert validation.check_probability(1) == 1.0
    assert validation.check_probability(1e-9) == 1e-9


@pytest.mark.parametrize("value", [0, -3, 2.5, True, math.inf, math.nan, "7", None])
def test_bad_positive_int(value):
    with pytest.raises(ValueError, match="`steps` must be an integer >= 1"):
        validation.check_positive_int("steps", value)


def test_good_positive_int():
    assert validation.check_positive_int("steps", 3.0) == 3
    assert isinstance(validation.check_positive_int("steps", 3.0), int)


@pytest.mark.parametrize("value", [0.0, 1.0, -1e-5, 1.5, math.nan, "1e-5", None, [1e-5]])
def test_bad_delta_names_argument_and_open_range(value):
    with pytest.raises(ValueError, match=r"`target_delta` must be in \(0, 1\)\. Received: target_delta="):
        validation.check_delta(value, "target_delta")


def test_delta_with_ends_is_dp_accountings_closed_range():
    assert validation.check_delta(0, allow_ends=True) == 0.0
    assert validation.check_delta(1, allow_ends=True) == 1.0
    with pytest.raises(ValueError, match=r"`delta` must be in \[0, 1\]"):
        validation.check_delta(1.01, allow_ends=True)


def test_good_delta_is_a_float():
    value = validation.check_delta(np.float32(0.5))
    assert value == 0.5 and type(value) is float


def test_probability_with_zero():
    assert validation.check_probability(0, allow_zero=True) == 0.0
    with pytest.raises(ValueError, match=r"`sampling_probability` must be in \[0, 1\]"):
        validation.check_probability(-0.1, allow_zero=True)


@pytest.mark.parametrize("value", [0.0, -1.0, math.inf, math.nan, True, "1", None])
def test_bad_positive_float_names_argument_and_range(value):
    with pytest.raises(ValueError, match=r"`initial_clip` must be a finite number > 0\. Received: initial_clip="):
        validation.check_float("initial_clip", value)


def test_float_bounds_inclusive_infinite_and_hint():
    assert validation.check_float("rho_mu", 1, 1.0, inclusive=True) == 1.0
    assert validation.check_float("mu", math.inf, allow_inf=True) == math.inf
    with pytest.raises(ValueError, match=r"`rho_mu` must be a finite number >= 1 \(why\)\. Received: rho_mu=0\.5"):
        validation.check_float("rho_mu", 0.5, 1.0, inclusive=True, hint="why")
    with pytest.raises(ValueError, match=r"`tolerance` must be >= 0\. "):
        validation.check_float("tolerance", -1, 0.0, inclusive=True, allow_inf=True)


def test_budget():
    assert validation.check_budget(1, 1e-5) == (1.0, 1e-5)
    with pytest.raises(ValueError, match="`target_epsilon` must be a finite number > 0"):
        validation.check_budget(0, 1e-5)
    with pytest.raises(ValueError, match=r"`target_delta` must be in \(0, 1\)"):
        validation.check_budget(1, 0)


def test_positive_int_optional_and_exact():
    assert validation.check_positive_int("num_microbatches", None, none_means="one per example") is None
    with pytest.raises(ValueError, match=r"`num_microbatches` must be None \(one per example\) or an integer >= 1"):
        validation.check_positive_int("num_microbatches", 0, none_means="one per example")
    assert validation.check_positive_int("accumulation_steps", np.int64(2), exact=True) == 2
    with pytest.raises(ValueError, match="`accumulation_steps` must be an integer >= 1"):
        validation.check_positive_int("accumulation_steps", 2.0, exact=True)


@pytest.mark.parametrize("value", [1, 0, "yes", None, np.bool_(True)])
def test_bool_refuses_what_is_only_truthy(value):
    with pytest.raises(ValueError, match="`training_metrics` must be True or False. Received: training_metrics="):
        validation.check_bool("training_metrics", value)
    assert validation.check_bool("training_metrics", False) is False


def test_choice_names_the_choices():
    assert validation.check_choice("method", "auto", ["auto", "ghost"]) == "auto"
    with pytest.raises(ValueError, match=r"`method` must be one of \('auto', 'ghost'\) \(hint\)\. Received: method="):
        validation.check_choice("method", "x", ["auto", "ghost"], "hint")


def test_nonnegative_array():
    np.testing.assert_array_equal(validation.check_nonnegative_array("z", [0, math.inf]), [0.0, math.inf])
    assert validation.check_nonnegative_array("z", []).size == 0
    with pytest.raises(ValueError, match=r"`z` must be a non-empty 1-D array"):
        validation.check_nonnegative_array("z", [], allow_empty=False)
    with pytest.raises(ValueError, match=r"`z` must be a 1-D array"):
        validation.check_nonnegative_array("z", [[1.0]])
    with pytest.raises(ValueError, match=r"Every entry of `z` must be >= 0 \(inf allowed\)\. Received an entry nan"):
        validation.check_nonnegative_array("z", [1.0, math.nan])


def test_step_counts():
    np.testing.assert_array_equal(validation.check_step_counts([0, 3.0, 2], 3), [0, 3, 2])
    for bad in ([4], [-1], [[1]], ["1"], [1.5]):
        with pytest.raises(ValueError, match=r"`steps` must be a 1-D sequence of integers in \[0, 3\]"):
            validation.check_step_counts(bad, 3)
    with pytest.raises(ValueError, match=r"`steps` must be a 1-D non-decreasing sequence of integers in \[0, 3\]"):
        validation.check_step_counts([2, 1], 3, non_decreasing=True)


def test_check_int_takes_integers_in_range_only():
    assert validation.check_int("num_guesses", 3, 0, 3) == 3
    assert validation.check_int("epochs", np.int64(7), 1) == 7
    for value in (True, 2.0, "2", None, -1, 4):
        with pytest.raises(ValueError, match=r"`num_guesses` must be an integer in \[0, 3\]. Received: num_guesses="):
            validation.check_int("num_guesses", value, 0, 3)
    with pytest.raises(ValueError, match="`epochs` must be an integer >= 1"):
        validation.check_int("epochs", 0, 1)


def test_check_delta_with_zero_allowed_is_the_half_open_interval():
    assert validation.check_delta(0.0, allow_zero=True) == 0.0
    for value in (1.0, -1e-9, float("nan")):
        with pytest.raises(ValueError, match=r"`delta` must be in \[0, 1\)"):
            validation.check_delta(value, allow_zero=True)
    with pytest.raises(ValueError, match=r"`confidence` must be in \(0, 1\)"):
        validation.check_delta(1.0, "confidence")


def test_check_subset_returns_a_tuple_and_names_the_argument_and_choices():
    assert validation.check_subset("accountants", ["pld"], ("pld", "rdp")) == ("pld",)
    assert validation.check_subset("accountants", [], ("pld", "rdp")) == ()
    with pytest.raises(ValueError, match=r"`accountants` must be a non-empty subset of \('pld', 'rdp'\)"):
        validation.check_subset("accountants", [], ("pld", "rdp"), allow_empty=False)
    with pytest.raises(ValueError, match=r"Received: accountants=\('prv',\)"):
        validation.check_subset("accountants", ["prv"], ("pld", "rdp"))


def test_a_delta_of_one_over_n_or_more_is_refused_naming_one_over_n_and_the_typical_value():
    assert validation.check_delta_below_inverse_size(1e-5, 40) == 1e-5
    for delta in (0.5, 1 / 40, 0.025):
        with pytest.raises(ValueError) as refusal:
            validation.check_delta_below_inverse_size(delta, 40)
        message = str(refusal.value)
        assert message.startswith("`target_delta` must be below 1/N = 1/40 = 0.025 (N, the training set's size)")
        assert "e.g. 1/N^1.1 = 0.0173 or 1e-5" in message and message.endswith(f"Received: target_delta={delta!r}.")
    with pytest.raises(ValueError, match=r"e.g. 1/N\^1.1 = 2.51e-07\. Received"):  # 1e-5 is not below 1/N here
        validation.check_delta_below_inverse_size(1e-5, 1_000_000, "delta")
    with pytest.raises(ValueError, match=r"`target_delta` must be in \(0, 1\)"):
        validation.check_delta_below_inverse_size(0.0, 40)
