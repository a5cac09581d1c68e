"""Tests for keras_dyndp.ghost_cost: the one choice between the Gram and the materialised per-example norm."""

import pytest

from keras_dyndp import ghost_cost


@pytest.mark.parametrize(
    "positions, fan_in, fan_out, gram",
    [
        (None, 4, 4, True),  # unknown positions
        (1, 4, 4, True),  # 1 * 8 < 16
        (1, 2, 2, False),  # 1 * 4 >= 4
        (2, 16, 16, True),  # 4 * 32 < 256
        (2, 4, 3, False),  # 4 * 7 >= 12
        (25, 256, 32, False),  # the paper's CNN's second convolution: 625 * 288 >= 8192
        (4, 300, 300, True),  # 90,000 floats per example > MAX_MATERIALISED
    ],
)
def test_gram_where_cheaper_or_materialising_would_not_fit(positions, fan_in, fan_out, gram):
    assert ghost_cost.use_gram(positions, fan_in, fan_out) is gram


def test_the_cap_is_what_a_batch_of_256_can_hold_in_64_mib():
    assert ghost_cost.MAX_MATERIALISED * 4 * 256 == 64 * 2**20
