"""Ties the batches a DP optimizer trains on to the Poisson sampling (rate p) its schedule is accounted for, which
nothing in Keras enforces. Two checks: at every step, in the graph (`keras_dyndp.core.step_checks`; XLA drops it), the
examples (rows of non-zero weight; a custom loop's ``compute_gradients`` bounds them by the rows and the rows of
non-zero loss) must lie in `batch_size_range(N, p)`; in Python, what ``fit`` received (`SamplingCheck.check_fit_input`).
What each refuses, and why: docs/privacy.md, "Refused, and why"."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from collections.abc import Iterator
from typing import Any

import tensorflow as tf

from keras_dyndp.core import batch_sizes
from keras_dyndp.core.batch_sizes import SamplingWarning
from keras_dyndp.core.step_checks import StepChecks
from keras_dyndp.keras_glue import entry_points
from keras_dyndp.tf_backend import data
from keras_dyndp.tf_backend import distribution


def nonzero_rows(values: tf.Tensor) -> tf.Tensor:
    """bool [B]: the rows (leading index) of `values` (numbers or bools, e.g. the padding mask KerasHub's
    preprocessors give as sample weights) with at least one non-zero entry."""
    values = tf.cast(values, tf.float32)
    flat = tf.reshape(values, tf.stack([tf.shape(values)[0], -1]))
    return tf.reduce_any(tf.not_equal(flat, 0), axis=1)


def count_nonzero_rows(values: tf.Tensor) -> tf.Tensor:
    """int32 number of `nonzero_rows` of `values`."""
    return tf.reduce_sum(tf.cast(nonzero_rows(values), tf.int32))


class SamplingCheck:
    """The two checks of the module docstring for one optimizer, a plain object (nothing of it is saved), from its
    `StepChecks` (p, N and the batch-size range the step asserts), its `public_batch_size` (Poisson batches refused),
    its class name (for the refusals), its `note_unverified_sampling` and its `note_batch_cap`."""

    def __init__(
        self,
        step_checks: StepChecks,
        public_batch_size: bool,
        optimizer_name: str,
        note_unverified: Callable[[str], bool],
        note_batch_cap: Callable[[int, int], None],
    ):
        self._step_checks = step_checks
        self._public_batch_size = public_batch_size
        self._optimizer_name = optimizer_name
        self._note_unverified = note_unverified  # True the first time: the `SamplingWarning` is given then.
        self._note_batch_cap = note_batch_cap
        self._fit_checked = False

    @contextlib.contextmanager
    def handed_over(self) -> Iterator[None]:
        """``make_private``'s ``fit`` checked its data (`check_fit_input`): its steps, in any thread, add nothing."""
        self._fit_checked = True
        try:
            yield
        finally:
            self._fit_checked = False

    def check_fit_input(self, x: Any, jit_compile: bool = False) -> None:
        """Checks ``x``, what ``model.fit`` received: Poisson batches unlike the optimizer's and arrays without
        ``public_batch_size=True`` raise ValueError, other data one `SamplingWarning`; ``jit_compile``: the model's."""
        p = self._step_checks.sampling_probability
        sampling = data.poisson_sampling(x)
        if sampling is None:
            batch_sizes.check_not_arrays(x, p, self._public_batch_size)
            self.warn_once(batch_sizes.not_poisson_batches("model.fit", x), jit_compile)
            return
        batch_sizes.check_data_size(self._step_checks.num_examples, sampling.num_examples, self._optimizer_name)
        batch_sizes.check_poisson_batches(sampling.sampling_probability, p, self._public_batch_size, "model.fit")
        self._note_batch_cap(sampling.num_examples, sampling.max_batch_size)
        if distribution.is_multi_worker() and not sampling.same_on_every_worker:
            raise ValueError(
                "model.fit under a multi-worker strategy received Poisson batches whose seed each worker drew "
                "on its own (the dataset was built outside the strategy's scope, without a seed): tf.data "
                "gives each worker its share of ITS batches, so the global batch would join pieces of "
                "different samples (an example could be in two) and not be the accounted Poisson sample. "
                "Build the dataset inside strategy.scope() (the workers then agree on the seed) or pass the "
                "same secret seed on every worker."
            )

    def check_step_input(self) -> None:
        """For a step: nothing more inside `handed_over`; elsewhere the warning, once."""
        if not self._fit_checked:
            self.warn_once(entry_points.UNSEEN_BATCHES)

    def warn_once(self, problem: str, jit_compile: bool = False) -> None:
        """One `SamplingWarning` per optimizer: ``problem`` (what was seen), what the epsilon assumes, what to do."""
        if not self._note_unverified(problem):
            return
        message = batch_sizes.not_poisson_message(problem, self._step_checks.sampling_probability)
        if self._step_checks.batch_size_range is None:
            message += (
                " The optimizer was built with public_batch_size=True, so no batch size is checked and the epsilon "
                "holds only as far as your batches are Poisson samples, whose sizes are private: build it with "
                "expected_batch_size = p * N instead."
            )
        elif jit_compile:
            message += " XLA (jit_compile=True) drops the per-step batch-size check."
        warnings.warn(message, SamplingWarning, stacklevel=3)
