"""Tests for keras_dyndp.validation."""

import math

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
