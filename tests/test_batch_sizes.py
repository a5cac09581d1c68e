"""Tests for keras_dyndp.batch_sizes: the cap, the accepted range, truncation delta, steps per epoch."""

import numpy as np
import pytest
import scipy.stats

from keras_dyndp import batch_sizes
from keras_dyndp import schedules


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
