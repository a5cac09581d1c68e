"""Tests for keras_dyndp.rules.ghost_cost: the one choice of form for a bilinear weight's per-example norms and sum."""

import numpy as np
import pytest

from keras_dyndp.rules import ghost_cost

GRAM, PER_EXAMPLE, NORMS = ghost_cost.GRAM, ghost_cost.PER_EXAMPLE, ghost_cost.PER_EXAMPLE_NORMS


@pytest.mark.parametrize(
    "positions, fan_in, fan_out, form",
    [
        (None, 4, 4, PER_EXAMPLE),  # unknown positions: linear in T, exact
        (None, 300, 300, GRAM),  # unknown positions, G_i too large to hold
        (1, 4, 4, GRAM),  # 1 * 8 < 16
        (1, 2, 2, PER_EXAMPLE),  # 1 * 4 >= 4
        (2, 16, 16, GRAM),  # 4 * 32 < 256
        (2, 4, 3, PER_EXAMPLE),  # 4 * 7 >= 12
        (25, 256, 32, PER_EXAMPLE),  # the paper's CNN's second convolution: 625 * 288 >= 8192
        (4, 300, 300, GRAM),  # 90,000 floats per example > MAX_MATERIALISED, and 16 * 600 < 90,000
        (160, 300, 300, NORMS),  # too large to hold; 90,000 < 160 * 600 (2 T k c beats T^2 (k + c) + T k c)
        (256, 1152, 128, NORMS),  # WideResNet-16-4's 3x3 convolutions at 16x16, 128 channels
        (64, 2304, 256, GRAM),  # ... at 8x8, 256 channels: 589,824 >= 64 * 2560
        (1024, 576, 64, PER_EXAMPLE),  # ... at 32x32, 64 channels: 36,864 floats fit
    ],
)
def test_the_cheapest_form_that_fits(positions, fan_in, fan_out, form):
    assert ghost_cost.form(positions, fan_in, fan_out) == form


@pytest.mark.parametrize("positions", [1, 2, 3, 10, 100, 1000])
@pytest.mark.parametrize("fan_in, fan_out", [(1, 1), (3, 700), (64, 64), (300, 300), (2304, 256), (4096, 4096)])
def test_the_form_chosen_costs_no_more_than_another_that_fits(positions, fan_in, fan_out):
    size, t = fan_in * fan_out, positions
    cost = {GRAM: t * t * (fan_in + fan_out) + t * size, PER_EXAMPLE: t * size + size, NORMS: 2 * t * size}
    fits = [GRAM, NORMS] + ([PER_EXAMPLE] if size <= ghost_cost.MAX_MATERIALISED else [])
    chosen = ghost_cost.form(positions, fan_in, fan_out)
    assert chosen in fits
    assert cost[chosen] <= min(cost[form] for form in fits)


def test_the_cap_is_what_a_batch_of_256_can_hold_in_64_mib():
    assert ghost_cost.MAX_MATERIALISED * 4 * 256 == 64 * 2**20


def test_rounding_coefficients_per_form():
    assert ghost_cost.rounding_coefficients(PER_EXAMPLE, 5, 3, 4) == (0.0, 0.0)
    eps = ghost_cost.FLOAT32_EPSILON
    assert ghost_cost.rounding_coefficients(NORMS, 160, 300, 300) == (0.0, eps * 162)
    assert ghost_cost.rounding_coefficients(GRAM, 4, 300, 200) == (eps * (300 + 200 + 16 + 5), eps * 6)
    # Partial Grams per kernel offset: dot products of k / pieces terms, then the pieces summed.
    assert ghost_cost.rounding_coefficients(GRAM, 4, 9 * 256, 512, pieces=9)[0] == eps * (256 + 8 + 512 + 16 + 5)


def test_the_float32_gram_form_with_its_bound_never_falls_below_the_exact_norm():
    """Near-cancelling positions in numpy float32 (the Gram form's arithmetic, pairwise sums): the computed sum
    alone falls far below the exact squared norm, or below 0; with the bound it never does."""
    rng = np.random.default_rng(0)
    k, c, positions, rows = 64, 32, 2, 200
    direction = rng.normal(size=(rows, 1, k))
    a = 1e4 * np.concatenate([direction, -direction], axis=1) + rng.normal(size=(rows, positions, k))
    g = np.repeat(rng.normal(size=(rows, 1, c)), positions, axis=1)
    a32, g32 = a.astype(np.float32), g.astype(np.float32)
    exact = np.sum(np.einsum("btk,btc->bkc", a32.astype(np.float64), g32.astype(np.float64)) ** 2, axis=(1, 2))
    gram = np.sum(np.einsum("btk,bsk->bts", a32, a32) * np.einsum("btc,bsc->bts", g32, g32), axis=(1, 2))
    assert np.mean(gram < exact) > 0.2  # the attack: float32 loses many of them
    magnitude = np.sum(np.linalg.norm(a32, axis=2) * np.linalg.norm(g32, axis=2), axis=1)
    second, first = ghost_cost.rounding_coefficients(GRAM, positions, k, c)
    bounded = ghost_cost.bounded_squared_norms(np, gram.astype(np.float64), magnitude, second, first)
    assert np.all(bounded >= exact)


def test_a_negative_or_nan_square_is_infinite_never_zero():
    squared = np.array([-1.0, np.nan, 4.0])
    bounded = ghost_cost.bounded_squared_norms(np, squared, np.zeros(3), 0.0, 0.0)
    np.testing.assert_array_equal(bounded, [np.inf, np.inf, 4.0])
