"""`poisson_batches`: the training batches the accountants assume, for ``fit`` on either backend.

Every accountant in this package (GDP-CLT, RDP, PLD) assumes *Poisson subsampling*: at each step every training
example joins the batch independently with probability ``p``, so the batch size is Binomial(N, p) and changes from
step to step. Shuffle-and-slice batching, the usual Keras habit, has no tight analysis under these accountants
(tensorflow/privacy #483).

Keras wants fixed shapes, so each batch is padded to ``max_batch_size`` rows of zeros with sample weight 0, which
add nothing to a clipped-gradient sum; ``pad_to_multiple=m`` pads to the next multiple of m instead (at most the
cap): a few shapes, each compiled once, and far fewer padding rows. The rows then follow the private batch size, so
the step must never normalise by them: the DP optimizers divide by the expected batch size p N, and one built with
``public_batch_size=True`` refuses these batches.

Overflow: when more than ``max_batch_size`` examples are selected, a uniformly random ``max_batch_size`` of them
are kept, with a warning (``overflow='truncate'``), or the step fails (``overflow='raise'``). Either way this is
not free post-processing: adding one example can push another out (a swap, sensitivity 2C), so the run is
(epsilon, delta + (1 + e^epsilon) T eta)-DP with ``eta = P[Binomial(N + 1, p) > cap]``
(`keras_dyndp.batch_sizes.truncation_delta`). The default cap (`keras_dyndp.batch_sizes.default_max_batch_size`)
makes eta <= 1e-15, negligible next to the usual delta (4e-11 for T = 4800, epsilon = 2); with a hand-picked
small cap, add `truncation_delta` to the reported delta.

Randomness: ``seed=None`` (the default, and the only choice for a model you release) draws the sampling seed from
the OS, whatever Keras's global seed; every epoch draws fresh batches. An integer seed makes the batches
reproducible, for tests and research; never resume a run with the seed it started with.

This module holds the arguments, their checks and defaults; each backend materialises the batches:
`keras_dyndp.tf_backend.data` as a ``tf.data.Dataset``, `keras_dyndp.jax_backend.data` as a
``keras.utils.PyDataset``.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

import numpy as np

from keras_dyndp import backend
from keras_dyndp import batch_sizes
from keras_dyndp import validation

__all__ = ["PoissonSampling", "poisson_batches"]


OVERFLOW_POLICIES = ("truncate", "raise")


@dataclasses.dataclass(frozen=True)
class PoissonSampling:
    """How `poisson_batches` samples: N examples at rate p, batches padded to ``max_batch_size`` rows (or to the next
    multiple of ``pad_to_multiple``, at most that); ``same_on_every_worker`` (TensorFlow): its seed was given, or
    agreed by the workers of a multi-worker strategy."""

    num_examples: int
    sampling_probability: float
    max_batch_size: int
    same_on_every_worker: bool = True
    pad_to_multiple: int | None = None


@dataclasses.dataclass(frozen=True)
class SamplerArguments:
    """`poisson_batches`' arguments, checked; what a backend's materialiser receives."""

    sampling_probability: float
    steps_per_epoch: int
    max_batch_size: int | None
    pad_to_multiple: int | None
    overflow: str
    seed: int | None

    def cap(self, num_examples: int, multiple_of: int = 1) -> int:
        """``max_batch_size``, or the default cap for N examples rounded up to a multiple of ``multiple_of``."""
        if self.max_batch_size is not None:
            return self.max_batch_size
        default = batch_sizes.default_max_batch_size(num_examples, self.sampling_probability)
        return -(-default // multiple_of) * multiple_of


def poisson_batches(
    x: Any,
    y: Any = None,
    sample_weight: Any = None,
    *,
    sampling_probability: float,
    steps_per_epoch: int | None = None,
    max_batch_size: int | None = None,
    pad_to_multiple: int | None = None,
    overflow: str = "truncate",
    seed: int | None = None,
    num_examples: int | None = None,
) -> Any:
    """Poisson-sampled, padded batches ``(x, y, sample_weight)`` for ``model.fit`` (module docstring).

    Typical use, one Keras epoch = ``round(1 / p)`` steps, fresh samples every epoch::

        model.fit(keras_dyndp.poisson_batches(x_train, y_train, sampling_probability=p), epochs=epochs)

    Pass the result to ``fit`` unchanged: the DP optimizers check that it samples at their schedule's p.

    Args:
        x: Features: an array or a nest (dict, tuple) of arrays, all with N rows. On TensorFlow also a finite,
            unbatched ``tf.data.Dataset`` of ``(x, y)`` or ``(x, y, sample_weight)`` elements with fixed shapes,
            read once into memory (then ``y`` and ``sample_weight`` stay None).
        y: Labels: an array or a nest of arrays with N rows, or None.
        sample_weight: Optional per-example weights, shape [N]; default 1. Padding rows get weight 0.
        sampling_probability: Poisson sampling rate p, in (0, 1]: the schedule's ``sampling_probability``.
        steps_per_epoch: Batches per epoch (iteration), >= 1; default ``round(1 / p)``.
        max_batch_size: Rows of every batch, >= 1; default `keras_dyndp.batch_sizes.default_max_batch_size(N, p)`
            (on TensorFlow rounded up to a multiple of a tf.distribute strategy's replicas).
        pad_to_multiple: None (default): every batch has ``max_batch_size`` rows, one compiled step. An integer
            m >= 1: each batch holds the selected examples first, then padding up to the next multiple of m (at
            least m rows, at most ``max_batch_size``; on TensorFlow m is rounded up to a multiple of the replicas).
        overflow: 'truncate' (keep a uniformly random ``max_batch_size`` of the selected examples, with a warning) or
            'raise' (the step fails).
        seed: None (default): drawn from OS entropy. An integer: reproducible batches, for tests and research.
        num_examples: For a ``tf.data.Dataset`` ``x``, its number of elements N, checked; None counts them.

    Returns:
        On TensorFlow a finite ``tf.data.Dataset`` of ``steps_per_epoch`` batches; on JAX a
        ``keras.utils.PyDataset`` of as many. ``sample_weight`` is float32.

    Raises:
        ValueError: On an invalid argument, naming it and its valid range.
    """
    arguments = check_arguments(sampling_probability, steps_per_epoch, max_batch_size, pad_to_multiple, overflow, seed)
    if num_examples is not None:
        num_examples = validation.check_positive_int("num_examples", num_examples)
    data = importlib.import_module(f"keras_dyndp.{'jax' if backend.keras_backend() == 'jax' else 'tf'}_backend.data")
    return data.make_poisson_batches(x, y, sample_weight, arguments, num_examples)


def check_arguments(
    sampling_probability: float,
    steps_per_epoch: int | None = None,
    max_batch_size: int | None = None,
    pad_to_multiple: int | None = None,
    overflow: str = "truncate",
    seed: int | None = None,
) -> SamplerArguments:
    """`poisson_batches`' arguments checked, with the default ``steps_per_epoch``.

    Raises:
        ValueError: On an invalid argument, naming it and its valid range.
    """
    validation.check_choice("overflow", overflow, OVERFLOW_POLICIES)
    p = validation.check_probability(sampling_probability)
    return SamplerArguments(
        sampling_probability=p,
        steps_per_epoch=(
            batch_sizes.expected_steps_per_epoch(p)
            if steps_per_epoch is None
            else validation.check_positive_int("steps_per_epoch", steps_per_epoch)
        ),
        max_batch_size=None
        if max_batch_size is None
        else validation.check_positive_int("max_batch_size", max_batch_size),
        pad_to_multiple=(
            None if pad_to_multiple is None else validation.check_positive_int("pad_to_multiple", pad_to_multiple)
        ),
        overflow=overflow,
        seed=validation.check_int("seed", seed, 0, none_means="OS entropy"),
    )


def check_rows(x: Any, y: Any, sample_weight: Any, num_examples: int | None = None) -> int:
    """N, the rows of every array in ``x`` and ``y`` and of ``sample_weight`` (shape [N] or [N, 1]), checked.

    Raises:
        ValueError: if an array has no leading example dimension, N < 1, the rows differ or are not
            ``num_examples`` (when given).
    """
    shapes = [tuple(np.shape(leaf)) for leaf in batch_sizes.leaves(x) + batch_sizes.leaves(y)]
    if not shapes or any(not shape for shape in shapes):
        raise ValueError("`x` and `y` must be arrays (or nests of arrays) with a leading example dimension.")
    num_rows = shapes[0][0]
    if num_rows < 1:
        raise ValueError(f"`x` must hold at least 1 example (N >= 1). Received: N={num_rows}.")
    if num_examples is not None and num_rows != num_examples:
        raise ValueError(f"`x` must have num_examples={num_examples} rows. Received: {num_rows} rows.")
    if any(shape[0] != num_rows for shape in shapes):
        raise ValueError(
            f"All arrays in `x` and `y` must have the same number of rows. Received: {[s[0] for s in shapes]}."
        )
    if sample_weight is not None and tuple(np.shape(sample_weight)) not in ((num_rows,), (num_rows, 1)):
        raise ValueError(
            f"`sample_weight` must have shape ({num_rows},). Received: shape={tuple(np.shape(sample_weight))}."
        )
    return int(num_rows)
