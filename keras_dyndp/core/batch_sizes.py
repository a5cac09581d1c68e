"""Poisson batch sizes in plain Python (for `data.sampling` and both backends): steps per epoch, padded batches' cap,
the sizes the DP optimizers accept, truncation's delta, and the refusals of data not known to be Poisson-sampled."""

from __future__ import annotations

import bisect
import functools
import math
from typing import Any

import scipy.stats

from keras_dyndp.core import validation


class SamplingWarning(UserWarning):
    """The batches are not known to be Poisson samples at the schedule's rate, which its epsilon assumes."""


def not_poisson_batches(caller: str, x: Any) -> str:
    """What `not_poisson_message` says was seen when ``caller`` received ``x``."""
    return f"{caller} received x of type {type(x).__name__}, not batches returned by keras_dyndp.poisson_batches"


def not_poisson_message(problem: str, sampling_probability: float) -> str:
    """The `SamplingWarning` text: what was seen (``problem``), what the epsilon assumes, and what to do."""
    p = sampling_probability
    return (
        f"{problem}. The epsilon reported for this schedule assumes Poisson sampling: each of the N training "
        f"examples joins each batch independently with probability p={p:g}. Shuffled or fixed-size batches are "
        "not covered by that analysis. Train on "
        f"keras_dyndp.poisson_batches(x, y, sampling_probability={p:g}) and pass the returned batches to model.fit "
        "unchanged."
    )


def check_poisson_batches(batches_p: float, sampling_probability: float, public_batch_size: bool, caller: str) -> None:
    """Raises ValueError, naming ``caller``, for keras_dyndp's Poisson batches sampled at another rate than the
    schedule's (a wrong epsilon) or given to an optimizer with public batch sizes (its rows follow the private size)."""
    p = sampling_probability
    if not math.isclose(batches_p, p, rel_tol=1e-9):
        raise ValueError(
            f"{caller} received Poisson batches sampled at p={batches_p:g}, but the optimizer's schedule is "
            f"accounted at p={p:g}: the reported epsilon would be wrong. Sample the batches at the schedule's "
            "sampling_probability, or calibrate the schedule for the rate you sample at."
        )
    if public_batch_size:
        raise ValueError(
            f"{caller} received keras_dyndp Poisson batches, whose sizes are private, but the optimizer was built "
            "with public_batch_size=True, which divides the noisy sum by each batch's rows (with pad_to_multiple "
            "they follow the private batch size). Build the optimizer with expected_batch_size=p*N instead."
        )


def implied_num_examples(expected_batch_size: float | None, sampling_probability: float) -> int | None:
    """N, the dataset size an optimizer's schedule and normaliser p N are for: ``expected_batch_size / p``, rounded
    (the budget arguments' ``num_examples``); None without ``expected_batch_size`` (``public_batch_size=True``)."""
    return None if expected_batch_size is None else max(1, round(expected_batch_size / sampling_probability))


DATA_SIZE_TOLERANCE = 0.01
"""`check_data_size` accepts data within this fraction of the optimizer's N: a schedule's p given to a few digits
implies N (``expected_batch_size / p``) only that closely, and N enters only the normaliser p N (the accountants use p
and T), so a small difference rescales the update by as much; data of another size altogether is a mistake."""


def check_data_size(num_examples: int | None, data_size: int | None, optimizer_name: str) -> None:
    """Raises ValueError, before the first step, when ``fit``'s data has ``data_size`` examples but the optimizer
    ``optimizer_name`` is for ``num_examples`` (`implied_num_examples`), beyond `DATA_SIZE_TOLERANCE`; else nothing."""
    if num_examples is None or data_size is None:
        return
    if abs(data_size - num_examples) <= max(1, DATA_SIZE_TOLERANCE * num_examples):
        return
    raise ValueError(
        f"num_examples={num_examples} was given to {optimizer_name} but the data has {data_size} examples: pass "
        "num_examples=len(x) (the privacy accounting needs the true dataset size; an optimizer built from a schedule "
        "takes expected_batch_size=p*len(x)). Nothing was trained."
    )


def leaves(value: Any) -> list:
    """The arrays of a nest of lists, tuples and dicts (None: none)."""
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [leaf for item in value for leaf in leaves(item)]
    return [] if value is None else [value]


def is_arrays(x: Any) -> bool:
    """Whether ``fit``'s ``x`` is arrays (numpy, tensors, or a list or dict of them), which Keras cuts itself into
    shuffled batches of ``batch_size`` rows; not a dataset, a generator or a ``PyDataset``, which have no shape."""
    arrays = leaves(x)
    return bool(arrays) and all(hasattr(leaf, "shape") for leaf in arrays)


def check_not_arrays(x: Any, sampling_probability: float, public_batch_size: bool) -> None:
    """Raises ValueError if ``fit`` received arrays (`is_arrays`), unless the optimizer has ``public_batch_size``: Keras
    cuts them into fixed-size batches, never the Poisson sample the epsilon assumes (the short last one stops it)."""
    if public_batch_size or not is_arrays(x):
        return
    raise ValueError(
        f"model.fit received arrays (x of type {type(x).__name__}): train on Poisson batches instead "
        f"(keras_dyndp.poisson_batches(x, y, sampling_probability={sampling_probability:g})). Nothing was trained.\n"
        "Keras cuts arrays into shuffled batches of batch_size rows: not the Poisson sampling at "
        f"p={sampling_probability:g} that the optimizer's epsilon is accounted for (and a last, shorter batch would "
        f"be refused mid-run). Train on Poisson batches:\n    batches = keras_dyndp.poisson_batches(x, y, "
        f"sampling_probability={sampling_probability:g})\n    model.fit(batches, epochs=...)\nor, for "
        "fixed-size batches outside the Poisson accounting, build the optimizer with public_batch_size=True instead "
        "of expected_batch_size."
    )


PADDING_ROWS_REFUSAL = (
    "keras_dyndp: this batch has rows with sample weight 0 (padding), but the optimizer was built with "
    "public_batch_size=True, which divides the noisy sum by the rows: rows padded to follow the number of examples "
    "would release it. Train on batches without padding rows, or build the optimizer with expected_batch_size=p*N "
    "(then the rows do not matter)."
)
"""Why a step that divides by the rows refuses a batch with zero-weight rows (both backends)."""


def out_of_range_refusal(
    what: str, sampling_probability: float, num_examples: int, low: int, high: int
) -> tuple[str, str]:
    """The refusal of too ``what`` ('few' or 'many') examples, outside ``[low, high]`` (`batch_size_range`), as the
    text before and after that number (the TensorFlow step prints it from the graph)."""
    p = sampling_probability
    return (
        f"keras_dyndp: too {what} examples in this batch: ",
        f"; the schedule's Poisson sampling at p={p:g} from N={num_examples} examples expects about "
        f"p*N={p * num_examples:g}, and all but {2 * BATCH_SIZE_TAIL:g} of its batches hold between {low} and "
        f"{high}. The epsilon reported for this schedule would not hold. Train on Poisson batches at the schedule's "
        "rate (keras_dyndp.poisson_batches; rows with sample weight 0 are padding), or give the optimizer the "
        "expected_batch_size (p*N) of the data you train on, or calibrate the schedule for the batches you use.",
    )


#: Tail probability that sets `default_max_batch_size`: P[Binomial(N, p) > cap] <= this.
DEFAULT_OVERFLOW_TAIL = 1e-15

#: Tail probability on each side of `batch_size_range`: the stop outside it adds (1 + e^eps) T 2 tail to delta.
BATCH_SIZE_TAIL = 1e-15


def expected_steps_per_epoch(sampling_probability: float) -> int:
    """The fewest Poisson steps that visit each example once in expectation, the least s with s p >= 1 (to 1e-12: p =
    250 / 60000 gives 240), so that ``fit(epochs=E)`` with `BudgetStop` spends a schedule made from ``epochs=E``."""
    sampling_probability = validation.check_probability(sampling_probability)
    steps = max(1, math.floor(1.0 / sampling_probability))
    while steps * sampling_probability < 1.0 - 1e-12:
        steps += 1
    return steps


@functools.lru_cache(maxsize=256)  # pure, and read by every fit's check of the cap
def default_max_batch_size(
    num_examples: int, sampling_probability: float, tail_probability: float = DEFAULT_OVERFLOW_TAIL
) -> int:
    """Smallest cap ``m >= 1`` with ``P[Binomial(N, p) > m] <= tail_probability`` (N >= 1, p in (0, 1], tail in
    (0, 1)). For N = 60000, p = 250 / 60000 it is 385 (mean 250, std 15.8)."""
    num_examples = validation.check_positive_int("num_examples", num_examples)
    sampling_probability = validation.check_probability(sampling_probability)
    validation.check_delta(tail_probability, "tail_probability")  # (0, 1), as a delta
    binom = scipy.stats.binom(num_examples, sampling_probability)
    # Bisection on the survival function (non-increasing, sf(N) = 0): binom.isf returns N for tails like 1e-18.
    return max(bisect.bisect_left(range(num_examples), True, key=lambda m: binom.sf(m) <= tail_probability), 1)


@functools.lru_cache(maxsize=256)
def batch_size_range(
    num_examples: int, sampling_probability: float, tail_probability: float = BATCH_SIZE_TAIL
) -> tuple[int, int]:
    """The batch sizes ``(low, high)`` that Poisson sampling leaves with probability at most the tail on each side:
    the largest ``low`` with ``P[Binomial(N, p) < low] <= tail`` and ``high = default_max_batch_size(N, p, tail)``.
    The DP optimizers refuse a batch outside it. For N = 60000, p = 250 / 60000: (135, 385); for p = 1: (N, N)."""
    high = default_max_batch_size(num_examples, sampling_probability, tail_probability)
    binom = scipy.stats.binom(num_examples, sampling_probability)
    # The largest low with cdf(low - 1) <= tail is the first k with cdf(k) > tail (cdf is non-decreasing).
    return bisect.bisect_left(range(high), True, key=lambda k: binom.cdf(k) > tail_probability), high


def overflow_probability(
    num_examples: int, sampling_probability: float, max_batch_size: int, size_range: tuple[int, int] | None = None
) -> float:
    """eta in [0, 1], the chance that one step releases other than the exact Poisson mechanism would, on the larger or
    smaller of two neighbouring datasets (N + 1 and N >= 1 examples): its batch overflows ``max_batch_size``,
    ``P[Binomial(N + 1, p) > cap]``; with ``size_range`` (`batch_size_range`'s ``(low, high)``) also that its examples
    leave the range and training stops: ``P[Binomial(N + 1, p) > min(cap, high)] + P[Binomial(N, p) < low]``."""
    num_examples = validation.check_positive_int("num_examples", num_examples)
    sampling_probability = validation.check_probability(sampling_probability)
    max_batch_size = validation.check_positive_int("max_batch_size", max_batch_size)
    low, high = size_range or (0, max_batch_size)
    above = scipy.stats.binom.sf(min(max_batch_size, high), num_examples + 1, sampling_probability)
    below = scipy.stats.binom.cdf(low - 1, num_examples, sampling_probability) if low > 0 else 0.0
    return min(1.0, float(above + below))


def added_delta(overflow: float, num_steps: int, epsilon: float) -> float:
    """``min(1, (1 + e^epsilon) * T * eta)`` (0 when no step can overflow): the delta that truncating (or refusing)
    overflowing batches adds to the ``epsilon`` (>= 0, inf allowed) of the exact Poisson mechanism over T =
    ``num_steps`` >= 0 steps, each overflowing with probability ``overflow`` = eta in [0, 1] (docs/privacy.md)."""
    if overflow == 0.0 or num_steps == 0:
        return 0.0
    epsilon = validation.check_float("epsilon", epsilon, 0.0, inclusive=True, allow_inf=True)
    if epsilon > math.log(1.0 / (num_steps * overflow)):  # (1 + e^epsilon) T eta > 1: no overflow in e^epsilon
        return 1.0
    return min(1.0, (1.0 + math.exp(epsilon)) * num_steps * overflow)


def truncation_delta(
    num_examples: int, sampling_probability: float, max_batch_size: int, num_steps: int, epsilon: float
) -> float:
    """Extra delta paid for truncating overflowing Poisson batches to ``max_batch_size`` rows over T = ``num_steps``
    at the exact Poisson mechanism's epsilon: `added_delta` of `overflow_probability`."""
    num_steps = validation.check_positive_int("num_steps", num_steps)
    overflow = overflow_probability(num_examples, sampling_probability, max_batch_size)
    return added_delta(overflow, num_steps, epsilon)


TRUNCATION_DELTA_SHARE = 0.01
"""`check_max_batch_size` refuses a cap whose `added_delta` over the schedule exceeds this share of the target delta,
so the delta the run reports (`PrivacyLogger`'s ``delta_total``) stays within 1% of the calibrated one."""


def check_max_batch_size(
    num_examples: int, max_batch_size: int, schedule: Any, size_range: tuple[int, int] | None = None
) -> float:
    """The `overflow_probability` eta of Poisson batches of ``num_examples`` capped at ``max_batch_size`` for
    ``schedule`` and the DP step's ``size_range`` (None: none), before the first step. ValueError for a cap below
    `default_max_batch_size` refused by `TRUNCATION_DELTA_SHARE` (of 1 / N for a schedule built by hand)."""
    p = schedule.sampling_probability
    overflow = overflow_probability(num_examples, p, max_batch_size, size_range)
    default = default_max_batch_size(num_examples, p)
    if overflow == 0.0 or max_batch_size >= default:
        return overflow
    calibration = schedule.calibration
    delta = calibration.target_delta if calibration is not None else 1.0 / num_examples
    epsilon = schedule.epsilon(delta, accountant="pld")  # rigorous; computed only for a cap below the default
    added = added_delta(overflow, schedule.num_steps, epsilon)
    if added <= TRUNCATION_DELTA_SHARE * delta or math.isinf(epsilon):  # inf: no guarantee stated to void
        return overflow
    raise ValueError(
        f"max_batch_size={max_batch_size} truncates {overflow:.3g} of the batches (N={num_examples}, p={p:g}), "
        f"which adds {added:.3g} to delta over the schedule's {schedule.num_steps} steps (truncation delta "
        f"(1 + e^epsilon) T P[batch > cap], epsilon={epsilon:.4g}): more than {TRUNCATION_DELTA_SHARE:.0%} of the "
        f"target delta {delta:.3g}, so the epsilon reported at that delta would not hold. Leave max_batch_size out "
        f"of keras_dyndp.poisson_batches (its default cap, {default}, adds a negligible delta) or pass a cap of at "
        f"least {default}. Nothing was trained."
    )
