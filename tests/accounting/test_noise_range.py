"""Tests for keras_dyndp.accounting.noise_range: every accountant refuses unrepresentable noise before working."""

import math
import resource

import dp_accounting
import numpy as np
import pytest

from keras_dyndp.accounting import fast_pld
from keras_dyndp.accounting import fast_rdp
from keras_dyndp.accounting import noise_range
from keras_dyndp.accounting.gdp_clt_accountant import GdpCltAccountant

DELTA = 1e-5


@pytest.fixture(autouse=True)
def _memory_cap():
    """Caps this process's address space at +1 GiB, so an accountant that tries to allocate gigabytes fails here."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    current = sum(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmSize"))
    resource.setrlimit(resource.RLIMIT_AS, (current + 2**30, hard))
    yield
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@pytest.mark.parametrize("noise_multiplier", [1e-3, 1e-300, 1e300])
def test_pld_refuses_before_allocating(noise_multiplier):
    with pytest.raises(noise_range.NoiseOutOfRangeError, match=r"step 1 \(0-based\) is .*'pld' accountant accepts"):
        fast_pld.pld_epsilon(0.01, [1.0, noise_multiplier, 1.0], DELTA)
    with pytest.raises(noise_range.NoiseOutOfRangeError, match="'pld' accountant accepts"):
        fast_pld.subsampled_gaussian_pld(noise_multiplier, 0.01)


@pytest.mark.parametrize("noise_multiplier", [1e-300, 1e300])
def test_rdp_and_gdp_clt_refuse_what_under_or_overflows(noise_multiplier):
    with pytest.raises(noise_range.NoiseOutOfRangeError, match=r"step 1 \(0-based\) is .*'rdp' accountant"):
        fast_rdp.rdp_epsilon(0.01, [1.0, noise_multiplier, 1.0], DELTA)
    event = dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(noise_multiplier))
    with pytest.raises(dp_accounting.UnsupportedEventError, match=r"accepts 0 .* values in \[0.0001, 10000\]"):
        GdpCltAccountant().compose(event)


def test_range_edges_are_accepted_and_exact_values_pass():
    # 1e-3 is within the RDP's range (a huge but finite bound), below the PLD's floor.
    assert fast_rdp.rdp_epsilon(0.01, [1e-3], DELTA) > 1e5
    assert (
        GdpCltAccountant()
        .compose(dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(1e-3)))
        .get_epsilon(DELTA)
        == math.inf
    )
    floor = noise_range.pld_min_noise_multiplier(1e-3)
    assert 0.026 < floor < 0.028
    assert fast_pld.pld_epsilon(0.01, [1.0, 1e4, math.inf], DELTA) > 0
    assert fast_pld.pld_epsilon(0.01, [0.0, 1.0], DELTA) == math.inf
    # The floor follows the grid: a coarser interval admits less noise, never below MIN_NOISE_MULTIPLIER.
    assert noise_range.pld_min_noise_multiplier(1e-2) < floor < noise_range.pld_min_noise_multiplier(1e-4)
    assert noise_range.pld_min_noise_multiplier(1e6) == noise_range.MIN_NOISE_MULTIPLIER
    # The estimate behind the floor bounds the real grid, and closely (a full-batch step is the widest).
    assert noise_range.pld_grid_points(floor, 1e-3) == pytest.approx(noise_range.MAX_PLD_GRID_POINTS)
    size = fast_pld._subsampled_gaussian(0.2, 1.0, 1e-3, 1).grid_points  # pylint: disable=protected-access
    assert size <= noise_range.pld_grid_points(0.2, 1e-3) <= 1.05 * size


def test_composition_too_large_for_the_grid_is_refused():
    # Each step fits (z = 0.3, 76k points), but 2000 full-batch steps compose a privacy loss around 2000 x 5.6 nats
    # (epsilon ~ 11000), whose grid would need 2.5M points.
    with pytest.raises(noise_range.NoiseOutOfRangeError, match="needs .* grid points, more than MAX_PLD_GRID_POINTS"):
        fast_pld.pld_epsilon(1.0, np.full(2000, 0.3), DELTA)
    assert fast_pld.pld_epsilon(1.0, np.full(500, 0.3), DELTA) > 3000  # A quarter of that fits: accounted.


def test_an_optimizer_trains_only_inside_the_range_and_never_without_noise():
    inside = np.array([noise_range.MIN_NOISE_MULTIPLIER, 1.0, noise_range.MAX_NOISE_MULTIPLIER])
    noise_range.check_trained_noise_multipliers(inside, "schedule")
    for outside in (0.0, 1e-6, 9.9e-5, 1.01e4, math.inf):
        with pytest.raises(noise_range.NoiseOutOfRangeError, match=r"`schedule`: .* step 1 .*\[0.0001, 10000\]"):
            noise_range.check_trained_noise_multipliers(np.array([1.0, outside]), "schedule")
