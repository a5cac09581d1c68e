"""The refusals of a DP step, decided and worded once for both backends (`StepChecks`): TensorFlow asserts each in
the step's graph (`keras_dyndp.tf_backend.optimizer`), JAX's jitted step records the first one's code until
``raise_refused_step`` (`keras_dyndp.jax_backend.optimizer`). Only operators tensors and arrays share: no TensorFlow or
JAX import here."""

from __future__ import annotations

from typing import Any

from keras_dyndp import batch_sizes
from keras_dyndp import optimizer_base

NO_KEY, SCHEDULE_MISMATCH, NO_FINGERPRINT, BUDGET_SPENT, PADDING_ROWS, TOO_FEW, TOO_MANY = range(1, 8)
"""The refusal codes, in order of precedence (0: the step may run)."""


class StepChecks:
    """The refusals of one optimizer's steps: past the budget, on another schedule's step counter, and of batches
    outside the schedule's Poisson sampling (`keras_dyndp.tf_backend.sampling_check` says why).

    Args:
      schedule: the optimizer's `keras_dyndp.schedules.DPSchedule`.
      expected_batch_size: p N, or None with ``public_batch_size`` (then no batch size is checked).
      normalises_by_rows: the step divides by the rows, so rows of sample weight 0 (padding) are refused.
    """

    def __init__(self, schedule: Any, expected_batch_size: float | None, normalises_by_rows: bool):
        self._schedule = schedule
        self._normalises_by_rows = normalises_by_rows
        # p; N, the dataset size the schedule and p N are for, and the accepted (low, high) examples per batch, or None.
        self.sampling_probability = p = schedule.sampling_probability
        self.num_examples = n = batch_sizes.implied_num_examples(expected_batch_size, p)
        self.batch_size_range = None if n is None else batch_sizes.batch_size_range(n, p)

    def schedule_mismatch(self, step: Any, recorded: Any) -> Any:
        """bool: a step counter past 0 under another schedule's ``recorded`` fingerprint, or none
        (`keras_dyndp.optimizer_base.restored_schedule_refusal`'s rule)."""
        own = self._schedule.fingerprint
        return (step > 0) & ~((recorded[0] == own[0]) & (recorded[1] == own[1]))

    def failing(self, step, recorded, min_examples, max_examples, num_rows, no_key=None) -> dict[int, Any]:
        """``{code: bool, True where the step must be refused}`` in order of precedence, for a step at counter
        ``step`` with the ``recorded`` schedule fingerprint, of a batch of ``num_rows`` rows holding between
        ``min_examples`` and ``max_examples`` examples (rows with a non-zero sample weight); ``no_key``: bool, the
        step has no secret noise key (None: not checked)."""
        checks = {} if no_key is None else {NO_KEY: no_key}
        mismatch = self.schedule_mismatch(step, recorded)
        unrecorded = (recorded[0] == 0) & (recorded[1] == 0)  # optimizer_base.UNRECORDED_FINGERPRINT
        checks[SCHEDULE_MISMATCH], checks[NO_FINGERPRINT] = mismatch & ~unrecorded, mismatch & unrecorded
        checks[BUDGET_SPENT] = step >= self._schedule.num_steps
        if self._normalises_by_rows:
            checks[PADDING_ROWS] = max_examples < num_rows
        elif self.batch_size_range is not None:
            checks[TOO_FEW] = max_examples < self.batch_size_range[0]
            checks[TOO_MANY] = min_examples > self.batch_size_range[1]
        return checks

    def message(self, code: int) -> tuple[str, str]:
        """Refusal ``code``'s text, before and after its number: the steps taken (`SCHEDULE_MISMATCH`,
        `NO_FINGERPRINT`), the examples counted (`TOO_FEW`, `TOO_MANY`), else none (nothing after)."""
        if code == NO_KEY:  # JAX's (TensorFlow's key never leaves its generator)
            return (
                "The DP step was handed an optimizer state without its secret noise key (the key words of the "
                "optimizer's never-saved `dp_run_state` are zero, as in its variables at rest), and noise from a known "
                "key protects nothing. Take the state of each run of steps from `optimizer.new_run([v.value for v in "
                "optimizer.variables])`, which writes the key and a fresh run nonce into it (make_private's train "
                "function does); after the run, assign the state back and call `optimizer.raise_refused_step()`."
            ), ""
        if code in (SCHEDULE_MISMATCH, NO_FINGERPRINT):
            return optimizer_base.schedule_mismatch_message(recorded=code == SCHEDULE_MISMATCH) + " ", "."
        if code == BUDGET_SPENT:
            return optimizer_base.budget_exhausted_message(self._schedule.num_steps, "keras_dyndp.BudgetStop"), ""
        if code == PADDING_ROWS:
            return batch_sizes.PADDING_ROWS_REFUSAL, ""
        low, high = self.batch_size_range
        what = "few" if code == TOO_FEW else "many"
        return batch_sizes.out_of_range_refusal(what, self.sampling_probability, self.num_examples, low, high)
