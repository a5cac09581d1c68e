"""Tests for keras_dyndp.validation."""

import math

import numpy as np
import pytest

from keras_dyndp import validation


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
