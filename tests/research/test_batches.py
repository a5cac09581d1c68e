"""Tests for research.batches: the fit calls and Keras epochs that take a run's steps."""

import types

import pytest

from research import batches


@pytest.mark.parametrize(
    "start, stop, lengths, expected",
    [
        (0, 337, [12] * 7 + [11] * 23, [(0, 7, 12), (7, 30, 11)]),  # the digits demo: 337 steps in 30 epochs
        (100, 337, [12] * 7 + [11] * 23, [(8, 9, 6), (9, 30, 11)]),  # resumed inside epoch 8 (steps 95-105)
        (0, 60, [240], [(0, 1, 60)]),  # --max_steps inside the first epoch
        (22, 44, [22, 22], [(1, 2, 22)]),
        (1, 23, [12, 11, 11], [(0, 2, 11)]),  # a cut first epoch of 11 steps shares its call with a full one of 11
        (5, 5, [11], []),
    ],
)
def test_epoch_segments_cover_the_steps_with_true_epoch_lengths(start, stop, lengths, expected):
    segments = batches.epoch_segments(start, stop, lengths)
    assert segments == expected
    assert sum((epochs - initial) * steps for initial, epochs, steps in segments) == stop - start


@pytest.mark.parametrize(
    "sampling, epochs, num_steps, expected",
    [
        ("poisson", 30.0, 337, [12] * 7 + [11] * 23),  # the digits demo: N 1437, batch 128
        ("poisson", 0.3, 3, [3]),
        ("poisson", 2.0, 1, [1]),  # fewer steps than epochs: no empty epoch
        ("shuffled", 2.0, 45, [15, 15, 15]),  # a shuffled pass holds at most N // B = 22 batches
    ],
)
def test_epoch_lengths_count_the_epochs_the_flag_asks_for(sampling, epochs, num_steps, expected):
    config = types.SimpleNamespace(sampling=sampling, epochs=epochs, batch_size=64)
    lengths = batches.epoch_lengths(config, num_steps, 1437)
    assert lengths == expected and sum(lengths) == num_steps
