"""Tests for keras_dyndp.core.batch_sizes: the cap, the accepted range, truncation delta, steps per epoch."""

import numpy as np
import pytest
import scipy.stats

from keras_dyndp import schedules
from keras_dyndp.core import batch_sizes


def test_default_max_batch_size_is_smallest_cap_within_tail():
    for num_examples, p in [(60000, 250 / 60000), (1797, 0.05), (10, 1.0), (1, 0.5)]:
        cap = batch_sizes.default_max_batch_size(num_examples, p)
        assert scipy.stats.binom.sf(cap, num_examples, p) <= batch_sizes.DEFAULT_OVERFLOW_TAIL
        if cap > 1:
            assert scipy.stats.binom.sf(cap - 1, num_examples, p) > batch_sizes.DEFAULT_OVERFLOW_TAIL
    assert batch_sizes.default_max_batch_size(60000, 250 / 60000) == 385
    assert batch_sizes.default_max_batch_size(60000, 250 / 60000, tail_probability=1e-9) == 350


def test_truncation_delta():
    assert batch_sizes.truncation_delta(60000, 250 / 60000, 385, 4800, 2.0) < 1e-10
    expected = (1 + np.exp(2.0)) * 4800 * scipy.stats.binom.sf(350, 60001, 250 / 60000)
    assert batch_sizes.truncation_delta(60000, 250 / 60000, 350, 4800, 2.0) == pytest.approx(expected)


def test_expected_steps_per_epoch():
    assert batch_sizes.expected_steps_per_epoch(250 / 60000) == 240
    assert batch_sizes.expected_steps_per_epoch(1.0) == 1
    assert batch_sizes.expected_steps_per_epoch(0.7) == 2
    assert batch_sizes.expected_steps_per_epoch(64 / 1437) == 23  # 22.45: rounding gave 22, 20 epochs 440 < 450 steps


@pytest.mark.parametrize("num_examples", [40, 1437, 1797, 25000, 60000, 2_400_001])
@pytest.mark.parametrize("batch_size", [1, 7, 64, 250, 256, 1000])
def test_epochs_of_expected_steps_hold_the_steps_of_a_schedule_made_from_epochs(num_examples, batch_size):
    """E epochs of fit over poisson_batches' default epoch reach the T of a schedule made from ``epochs=E`` (the
    optimizers' and calibration's `schedules.sampling_from_epochs`), and stop short of T + E."""
    if batch_size > num_examples:
        pytest.skip("no such schedule")
    for epochs in (1, 2, 3, 20, 60):
        p, total = schedules.sampling_from_epochs(num_examples, batch_size, epochs=epochs)
        steps = batch_sizes.expected_steps_per_epoch(p)
        assert total <= epochs * steps < total + epochs


@pytest.mark.parametrize("num_examples, p", [(60000, 250 / 60000), (1797, 64 / 1797), (40, 0.25), (10, 1.0)])
def test_batch_size_range_holds_all_but_the_tails(num_examples, p):
    low, high = batch_sizes.batch_size_range(num_examples, p)
    binomial = scipy.stats.binom(num_examples, p)
    tail = batch_sizes.BATCH_SIZE_TAIL
    assert binomial.cdf(low - 1) <= tail and binomial.sf(high) <= tail
    assert low == 0 or binomial.cdf(low) > tail  # the range is the tightest one
    assert high == 1 or binomial.sf(high - 1) > tail
    assert low <= num_examples * p <= high


@pytest.mark.parametrize("p", [0.0, -0.1, 1.5, float("nan")])
def test_bad_sampling_probability(p):
    with pytest.raises(ValueError, match=r"`sampling_probability` must be in \(0, 1\]"):
        batch_sizes.expected_steps_per_epoch(p)
    with pytest.raises(ValueError, match=r"`sampling_probability` must be in \(0, 1\]"):
        batch_sizes.batch_size_range(100, p)


def test_poisson_batches_are_refused_at_another_rate_or_where_the_batch_size_is_stated_public():
    batch_sizes.check_poisson_batches(0.1, 0.1 * (1 + 1e-12), False, "model.fit")
    with pytest.raises(ValueError, match="model.fit received .* public_batch_size=True.*expected_batch_size=p\\*N"):
        batch_sizes.check_poisson_batches(0.1, 0.1, True, "model.fit")
    with pytest.raises(ValueError, match=r"train_on_batch received Poisson batches sampled at p=0.2, .* at p=0.1:"):
        batch_sizes.check_poisson_batches(0.2, 0.1, False, "train_on_batch")


def test_out_of_range_refusal_names_the_count_the_range_and_what_to_do():
    prefix, advice = batch_sizes.out_of_range_refusal("many", 0.05, 400, 3, 50)
    message = f"{prefix}400{advice}"
    assert message.startswith("keras_dyndp: too many examples in this batch: 400; ")
    assert "p=0.05 from N=400 examples expects about p*N=20" in message and "between 3 and 50" in message


def test_arrays_are_refused_for_fit_unless_batch_sizes_are_stated_public():
    x = np.zeros((10, 3))
    for arrays in (x, [x, x], {"a": x}):
        assert batch_sizes.is_arrays(arrays)
        fix = r"\n    batches = keras_dyndp.poisson_batches\(x, y, sampling_probability=0.1\)\n"
        with pytest.raises(ValueError, match=rf"(?s)arrays.*p=0.1.*{fix}.*public_batch_size=True"):
            batch_sizes.check_not_arrays(arrays, 0.1, public_batch_size=False)
        batch_sizes.check_not_arrays(arrays, 0.1, public_batch_size=True)
    for other in (iter([x]), None, [], object()):  # a generator, a dataset or a PyDataset has no shape
        assert not batch_sizes.is_arrays(other)
        batch_sizes.check_not_arrays(other, 0.1, public_batch_size=False)


def test_a_data_size_other_than_the_optimizers_n_is_refused_in_one_line_naming_both_and_the_fix():
    assert batch_sizes.implied_num_examples(250.0, 250 / 60000) == 60000
    assert batch_sizes.implied_num_examples(None, 0.1) is None
    with pytest.raises(ValueError) as raised:
        batch_sizes.check_data_size(60000, 2000, "DynamicDPKerasSGD")
    message = str(raised.value)
    assert message.startswith(
        "num_examples=60000 was given to DynamicDPKerasSGD but the data has 2000 examples: pass num_examples=len(x)"
    )
    assert "\n" not in message
    for unknown_or_close in [(None, 2000), (60000, None), (2000, 2000), (59952, 60000), (60000, 60600), (3, 4)]:
        batch_sizes.check_data_size(*unknown_or_close, "DynamicDPKerasSGD")  # p to 3 digits: 250 / 0.00417 = 59952
    for too_far in [(60000, 60601), (60000, 59399), (2, 4)]:
        with pytest.raises(ValueError, match="but the data has"):
            batch_sizes.check_data_size(*too_far, "DynamicDPKerasSGD")


def _budget_schedule(target_delta=1e-5, accountant="pld"):
    """The review's run: N 40, p 0.1, 40 steps, epsilon 2 at ``target_delta``."""
    return schedules.calibrate(
        "vanilla",
        target_epsilon=2.0,
        target_delta=target_delta,
        sampling_probability=0.1,
        num_steps=40,
        initial_clip=1.0,
        accountant=accountant,
    )


def test_a_cap_whose_truncation_voids_the_target_delta_is_refused_naming_the_default_cap():
    schedule = _budget_schedule()
    default = batch_sizes.default_max_batch_size(40, 0.1)
    assert batch_sizes.overflow_probability(40, 0.1, 2) > 0.75  # the review's cap truncates 79% of the batches
    for cap, accountant in [(2, "pld"), (2, "gdp_clt"), (19, "pld")]:  # 19: 1.1e-7 added, over 1% of 1e-5
        with pytest.raises(ValueError, match=rf"max_batch_size={cap} truncates .* more than 1% of the target delta "):
            batch_sizes.check_max_batch_size(40, cap, _budget_schedule(accountant=accountant))
    with pytest.raises(ValueError, match=rf"its default cap, {default}, adds a negligible delta"):
        batch_sizes.check_max_batch_size(40, 2, schedule)
    # The default cap and any above it are accepted, with their overflow probability for the report.
    assert 0 < batch_sizes.check_max_batch_size(40, default, schedule) < 10 * batch_sizes.DEFAULT_OVERFLOW_TAIL
    assert batch_sizes.check_max_batch_size(40, 41, schedule) == 0.0
    # A cap below the default whose added delta is within the share: accepted.
    cap = 20
    added = batch_sizes.truncation_delta(40, 0.1, cap, 40, 2.0)
    assert added <= batch_sizes.TRUNCATION_DELTA_SHARE * 1e-5
    assert batch_sizes.check_max_batch_size(40, cap, schedule) == batch_sizes.overflow_probability(40, 0.1, cap)


def test_a_schedule_built_by_hand_is_held_to_a_share_of_one_over_n():
    schedule = schedules.DPSchedule(np.ones(40), np.full(40, 2.0), sampling_probability=0.1)
    with pytest.raises(ValueError, match=r"more than 1% of the target delta 0.025"):
        batch_sizes.check_max_batch_size(40, 2, schedule)


def test_added_delta_is_at_most_one_and_zero_without_overflow():
    assert batch_sizes.added_delta(0.0, 100, float("inf")) == 0.0
    assert batch_sizes.added_delta(0.3, 0, 5.0) == 0.0
    assert batch_sizes.added_delta(1e-15, 4800, 1000.0) == 1.0  # no overflow in e^epsilon
    assert batch_sizes.added_delta(1e-15, 4800, float("inf")) == 1.0
    assert batch_sizes.added_delta(1e-15, 4800, 2.0) == pytest.approx((1 + np.exp(2.0)) * 4800e-15)


def test_the_overflow_probability_counts_a_step_stopped_outside_the_accepted_range():
    low, high = batch_sizes.batch_size_range(60000, 250 / 60000)
    cap = batch_sizes.default_max_batch_size(60000, 250 / 60000)
    with_range = batch_sizes.overflow_probability(60000, 250 / 60000, cap, (low, high))
    expected = scipy.stats.binom.sf(high, 60001, 250 / 60000) + scipy.stats.binom.cdf(low - 1, 60000, 250 / 60000)
    assert with_range == pytest.approx(expected) and 0 < with_range <= 2 * batch_sizes.BATCH_SIZE_TAIL
    assert with_range > batch_sizes.overflow_probability(60000, 250 / 60000, cap)
    # A cap below the range's high: the cap truncates first, the too-many stop never fires.
    assert batch_sizes.overflow_probability(60000, 250 / 60000, 300, (low, high)) == pytest.approx(
        scipy.stats.binom.sf(300, 60001, 250 / 60000) + scipy.stats.binom.cdf(low - 1, 60000, 250 / 60000)
    )


def test_a_schedule_without_noise_states_no_guarantee_for_a_cap_to_void():
    schedule = schedules.DPSchedule(np.ones(20), np.zeros(20), sampling_probability=0.1)  # epsilon inf
    assert batch_sizes.check_max_batch_size(80, 16, schedule) == batch_sizes.overflow_probability(80, 0.1, 16)
