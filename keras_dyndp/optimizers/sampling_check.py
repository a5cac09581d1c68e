"""Ties the batches a DP optimizer trains on to the Poisson sampling its schedule is accounted for.

Every accountant here assumes that at each step each of the N training examples joins the batch independently
with probability p = `schedule.sampling_probability`. Nothing in Keras enforces it: a full-batch ``fit`` with a
schedule accounted at p = 0.01 trains, and `PrivacyLogger` reports RDP epsilon 5.39 where the truth at p = 1 is
75.2; a ``.batch(250)`` dataset trains without a word. Two checks close this.

1. At every step, in the graph, when N is known (N = ``expected_batch_size / p``, given directly or through the
   budget arguments): the number of examples in the batch must lie in `keras_dyndp.data.batch_size_range(N, p)`,
   which a Poisson batch leaves with probability at most 1e-12 on each side. Otherwise the step raises
   ``tf.errors.InvalidArgumentError`` with the count, p N, the range and what to do. What counts as an example: on
   `make_private`'s path, the rows with a non-zero sample weight (every row without sample weights). The
   optimizer's own path sees only the sample-weighted per-example losses: the number of rows bounds the count from
   above and the number of rows with a non-zero loss bounds it from below (padding rows have weight 0, hence loss
   0, but a real example may have loss 0 too). The step is refused when the upper bound is below the range or the
   lower bound above it, so a zero loss never trips the check.
   The check is a data-dependent abort. Under Poisson sampling at p, neighbouring datasets can differ in whether
   it fires only when the batch size leaves the range, with probability at most 2e-12 per step: it adds at most
   (1 + e^epsilon) T 2e-12 to delta (the argument of `keras_dyndp.data.truncation_delta`). XLA
   (``jit_compile=True``) drops assertions, so there the check does not run.
2. Once per optimizer, when its train step is traced (at every step under ``run_eagerly``): the ``x`` that
   ``model.fit`` received (`keras_dyndp.keras_context`) must be a dataset returned by
   `keras_dyndp.data.poisson_batches_from_tensors` or `keras_dyndp.data.poisson_batches`. One sampled at another
   p raises ValueError. Anything else (numpy arrays, a ``.batch()`` dataset, a generator) gets one
   `SamplingWarning` saying that the reported epsilon assumes Poisson sampling and what to do, and so does a
   custom training loop, whose data the optimizer cannot see. The warning also says when the batch sizes cannot be
   checked (no N) or are not checked (XLA).
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import tensorflow as tf

from keras_dyndp import batch_sizes
from keras_dyndp import data
from keras_dyndp import keras_context
from keras_dyndp import replicas
from keras_dyndp.batch_sizes import SamplingWarning


def count_nonzero_rows(values: tf.Tensor) -> tf.Tensor:
    """int32 number of rows (leading index) of `values` with at least one non-zero entry."""
    values = tf.convert_to_tensor(values)
    flat = tf.reshape(values, tf.stack([tf.shape(values)[0], -1]))
    return tf.reduce_sum(tf.cast(tf.reduce_any(tf.not_equal(flat, 0), axis=1), tf.int32))


class SamplingCheck:
    """The two checks of the module docstring for one optimizer; a plain object, so nothing of it is saved.

    Args:
      sampling_probability: the schedule's Poisson rate p.
      expected_batch_size: p N, or None when N is unknown (then batch sizes are not checked, and the noisy sum is
        divided by the batch's rows).
      num_microbatches: the optimizer's M, or None (per-example clipping).
    """

    def __init__(
        self, sampling_probability: float, expected_batch_size: float | None, num_microbatches: int | None = None
    ):
        self._sampling_probability = sampling_probability
        self._normalises_by_rows = expected_batch_size is None and num_microbatches is None
        if expected_batch_size is None:
            self._num_examples = None
            self._range = None
        else:
            self._num_examples = max(1, round(expected_batch_size / sampling_probability))
            self._range = data.batch_size_range(self._num_examples, sampling_probability)
        self._warned = False

    @property
    def batch_size_range(self) -> tuple[int, int] | None:
        """The accepted ``(low, high)`` number of examples per batch; None when N is unknown."""
        return self._range

    def inspect_fit_input(self, optimizer: Any) -> None:
        """Checks, in Python, what ``model.fit`` received (point 2 of the module docstring).

        Raises:
          ValueError: if ``fit`` received a keras_dyndp Poisson dataset sampled at another rate than the schedule,
            or one padded to multiples (``pad_to_multiple``) while the step divides by the batch's rows.
        """
        model = keras_context.calling_model(optimizer)
        call = None if model is None else keras_context.fit_call(model)
        p = self._sampling_probability
        if call is None:
            problem = (
                "keras_dyndp cannot see the batches of this training step (a custom training loop or train_on_batch)"
            )
        else:
            sampling = data.poisson_sampling(call.x)
            if sampling is not None:
                if not math.isclose(sampling.sampling_probability, p, rel_tol=1e-9):
                    raise ValueError(
                        f"model.fit received Poisson batches sampled at p={sampling.sampling_probability:g}, but "
                        f"the optimizer's schedule is accounted at p={p:g}: the reported epsilon would be wrong. "
                        "Sample the batches at the schedule's sampling_probability, or calibrate the schedule for "
                        "the rate you sample at."
                    )
                batch_sizes.check_padding(sampling.pad_to_multiple, self._normalises_by_rows)
                if replicas.is_multi_worker() and not sampling.same_on_every_worker:
                    raise ValueError(
                        "model.fit under a multi-worker strategy received Poisson batches whose seed each worker drew "
                        "on its own (the dataset was built outside the strategy's scope, without a seed): tf.data "
                        "gives each worker its share of ITS batches, so the global batch would join pieces of "
                        "different samples (an example could be in two) and not be the accounted Poisson sample. "
                        "Build the dataset inside strategy.scope() (the workers then agree on the seed) or pass the "
                        "same secret seed on every worker."
                    )
                return
            problem = (
                f"model.fit received x of type {type(call.x).__name__}, not a dataset returned by "
                "keras_dyndp.data.poisson_batches_from_tensors or keras_dyndp.data.poisson_batches"
            )
        if self._warned:
            return
        self._warned = True
        message = batch_sizes.not_poisson_message(
            problem,
            p,
            f"Train on keras_dyndp.data.poisson_batches_from_tensors(x, y, sampling_probability={p:g}) and pass the "
            "returned dataset to model.fit unchanged.",
        )
        if self._range is None:
            message += (
                " Batch sizes cannot be checked against the schedule either: build the optimizer with "
                "expected_batch_size = p * N."
            )
        elif model is not None and getattr(model, "jit_compile", False):
            message += " XLA (jit_compile=True) drops the per-step batch-size check."
        warnings.warn(message, SamplingWarning, stacklevel=2)

    def assertion(self, min_examples: tf.Tensor, max_examples: tf.Tensor) -> tf.Operation | None:
        """In-graph check that the batch's number of examples, known to lie in [min, max], is in the range.

        Returns None when there is nothing to wait for: N is unknown, or eager mode, where it checks at once.

        Raises:
          tf.errors.InvalidArgumentError: when `max_examples` is below the range or `min_examples` above it.
        """
        if self._range is None:
            return None
        low, high = self._range
        too_few = self._refusal(tf.cast(max_examples, tf.int64) >= low, "few", max_examples)
        with tf.control_dependencies([] if too_few is None else [too_few]):
            return self._refusal(tf.cast(min_examples, tf.int64) <= high, "many", min_examples)

    def _refusal(self, condition: tf.Tensor, what: str, count: tf.Tensor) -> tf.Operation | None:
        low, high = self._range
        p, num_examples = self._sampling_probability, self._num_examples
        prefix = f"keras_dyndp: too {what} examples in this batch: "
        advice = (
            f"; the schedule's Poisson sampling at p={p:g} from N={num_examples} examples expects about "
            f"p*N={p * num_examples:g}, and all but 2e-12 of its batches hold between {low} and {high}. The "
            "epsilon reported for this schedule would not hold. Train on "
            f"keras_dyndp.data.poisson_batches_from_tensors(x, y, sampling_probability={p:g}), or give the "
            "optimizer the expected_batch_size (p*N) of the data you train on, or calibrate the schedule for the "
            "batches you use."
        )
        if tf.executing_eagerly():
            if not bool(condition):
                raise tf.errors.InvalidArgumentError(None, None, f"{prefix}{int(count)}{advice}")
            return None
        return tf.debugging.Assert(condition, [prefix, count, advice])  # no string ops: XLA compiles it away
