"""Poisson sampling's batch sizes, in plain Python (no TensorFlow, no JAX): the steps per epoch, the cap that
padded batches are built to, the range of sizes the DP optimizers accept, the delta that truncation costs, and the
`SamplingWarning` given when training data is not known to be Poisson-sampled.

Shared by `keras_dyndp.data` (TensorFlow datasets; it re-exports these names) and the JAX backend. The argument for
`truncation_delta` is in `keras_dyndp.data`'s module docstring.
"""

from __future__ import annotations

import math

import scipy.stats

from keras_dyndp import validation


class SamplingWarning(UserWarning):
    """The batches are not known to be Poisson samples at the schedule's rate, which its epsilon assumes."""


def not_poisson_message(problem: str, sampling_probability: float, remedy: str) -> str:
    """The `SamplingWarning` text: what was seen (``problem``), what the epsilon assumes, what to do (``remedy``)."""
    return (
        f"{problem}. The epsilon reported for this schedule assumes Poisson sampling: each of the N training "
        f"examples joins each batch independently with probability p={sampling_probability:g}. Shuffled or "
        f"fixed-size batches are not covered by that analysis. {remedy}"
    )


def check_padding(pad_to_multiple: int | None, normalises_by_rows: bool) -> None:
    """Refuses batches padded to multiples (whose rows follow the private batch size) when the step would divide
    the noisy sum by the rows: the divisor would then depend on the private data and escape the accounting.

    Raises:
      ValueError: when ``pad_to_multiple`` is set and ``normalises_by_rows``.
    """
    if pad_to_multiple is not None and normalises_by_rows:
        raise ValueError(
            f"model.fit received Poisson batches padded to multiples of {pad_to_multiple} rows, but the optimizer "
            "has no expected_batch_size, so it would divide the noisy sum by the batch's rows, which then follow "
            "the private batch size. Give the optimizer expected_batch_size=p*N (the budget arguments set it), or "
            "leave pad_to_multiple None."
        )


#: Tail probability that sets `default_max_batch_size`: P[Binomial(N, p) > cap] <= this.
DEFAULT_OVERFLOW_TAIL = 1e-15

#: Tail probability on each side of `batch_size_range`.
BATCH_SIZE_TAIL = 1e-12


def expected_steps_per_epoch(sampling_probability: float) -> int:
    """Number of Poisson steps that visit each example once in expectation: ``round(1 / p)``.

    Args:
        sampling_probability: Poisson sampling rate p, in (0, 1].

    Returns:
        ``max(1, round(1 / p))``.
    """
    sampling_probability = validation.check_probability(sampling_probability)
    return max(1, round(1.0 / sampling_probability))


def default_max_batch_size(
    num_examples: int, sampling_probability: float, tail_probability: float = DEFAULT_OVERFLOW_TAIL
) -> int:
    """Smallest cap ``m >= 1`` with ``P[Binomial(N, p) > m] <= tail_probability``.

    Args:
        num_examples: Number of training examples N, >= 1.
        sampling_probability: Poisson sampling rate p, in (0, 1].
        tail_probability: Allowed per-step overflow probability, in (0, 1).

    Returns:
        The cap m (at most N). For N = 60000, p = 250 / 60000 it is 385 (mean 250, std 15.8).
    """
    num_examples = validation.check_positive_int("num_examples", num_examples)
    sampling_probability = validation.check_probability(sampling_probability)
    if not 0.0 < tail_probability < 1.0:
        raise ValueError(f"`tail_probability` must be in (0, 1). Received: tail_probability={tail_probability}.")
    binom = scipy.stats.binom(num_examples, sampling_probability)
    # Bisection on the survival function (non-increasing, sf(N) = 0); more robust than binom.isf, which returns
    # N for tails as small as 1e-18.
    low, high = 0, num_examples
    while low < high:
        middle = (low + high) // 2
        if binom.sf(middle) <= tail_probability:
            high = middle
        else:
            low = middle + 1
    return max(low, 1)


def batch_size_range(
    num_examples: int, sampling_probability: float, tail_probability: float = BATCH_SIZE_TAIL
) -> tuple[int, int]:
    """The batch sizes ``[low, high]`` that Poisson sampling leaves with probability at most the tail on each side.

    ``low`` is the largest size with ``P[Binomial(N, p) < low] <= tail_probability`` and ``high`` is
    ``default_max_batch_size(N, p, tail_probability)``, so ``P[Binomial(N, p) > high] <= tail_probability``. The DP
    optimizers refuse a batch outside it: with the default tail of 1e-12, a correctly sampled run of T steps trips
    the check with probability at most ``2e-12 T``.

    Args:
        num_examples: Number of training examples N, >= 1.
        sampling_probability: Poisson sampling rate p, in (0, 1].
        tail_probability: Allowed probability of each tail, in (0, 1).

    Returns:
        ``(low, high)``. For N = 60000, p = 250 / 60000: (147, 369); for p = 1: (N, N).
    """
    high = default_max_batch_size(num_examples, sampling_probability, tail_probability)
    binom = scipy.stats.binom(num_examples, sampling_probability)
    # Bisection for the largest low with cdf(low - 1) <= tail (cdf is non-decreasing; low = 0 always qualifies).
    low, top = 0, high
    while low < top:
        middle = (low + top + 1) // 2
        if binom.cdf(middle - 1) <= tail_probability:
            low = middle
        else:
            top = middle - 1
    return low, high


def truncation_delta(
    num_examples: int, sampling_probability: float, max_batch_size: int, num_steps: int, epsilon: float
) -> float:
    """Extra delta paid for truncating overflowing Poisson batches to ``max_batch_size`` rows.

    ``(1 + e^epsilon) * T * P[Binomial(N + 1, p) > max_batch_size]``; see the module docstring for the argument.

    Args:
        num_examples: Number of training examples N, >= 1.
        sampling_probability: Poisson sampling rate p, in (0, 1].
        max_batch_size: The cap, >= 1.
        num_steps: Number of steps T, >= 1.
        epsilon: The epsilon of the (epsilon, delta) guarantee of the exact Poisson mechanism, >= 0.

    Returns:
        The amount to add to delta.
    """
    num_examples = validation.check_positive_int("num_examples", num_examples)
    sampling_probability = validation.check_probability(sampling_probability)
    max_batch_size = validation.check_positive_int("max_batch_size", max_batch_size)
    num_steps = validation.check_positive_int("num_steps", num_steps)
    if not epsilon >= 0.0:
        raise ValueError(f"`epsilon` must be >= 0. Received: epsilon={epsilon}.")
    eta = float(scipy.stats.binom.sf(max_batch_size, num_examples + 1, sampling_probability))
    return min(1.0, (1.0 + math.exp(epsilon)) * num_steps * eta)
