"""The refusals of a DP step, decided and worded once for both backends (`StepChecks`): TensorFlow asserts each in
the step's graph (`keras_dyndp.tf_backend.optimizer`), JAX's jitted step records the first one's code until
``raise_refused_step`` (`keras_dyndp.jax_backend.optimizer`). Only operators tensors and arrays share, no imports."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from keras_dyndp.core import batch_sizes

BUDGET_EXHAUSTED = "DP budget exhausted: all"
"""How `budget_exhausted_message` begins (what a caller looks for in a TensorFlow assertion's text)."""

BUDGET_STOP = "keras_dyndp.BudgetStop"
"""The callback that ends ``fit`` at the schedule's last step, as the refusals name it."""


def budget_exhausted_parts(num_steps: int, budget_stop: str | None) -> tuple[str, str]:
    """The refusal of a step once ``num_steps`` (T) DP steps are released, before and after the released count;
    ``budget_stop`` (`BUDGET_STOP`) suggested where the budget ran out during a ``fit`` without it, else None."""
    stop = (
        ""
        if budget_stop is None
        else f" To end fit at the last step instead of this error, add {budget_stop}() to its callbacks."
    )
    return (
        f"{BUDGET_EXHAUSTED} {num_steps} steps of the DPSchedule have been released (released_steps ",
        f" of schedule.num_steps {num_steps}) and another step would exceed the accounted privacy budget, so none "
        "was applied. This schedule's budget is spent: no more training under it. A new schedule is a new budget, "
        "spent on the same data (the two runs' epsilons add up): to train further, compile the model with a new "
        "optimizer built for it. model.evaluate and model.predict take no DP step and still work." + stop,
    )


def budget_exhausted_message(released: int, num_steps: int, budget_stop: str | None) -> str:
    """The one-line refusal of a step once ``released`` >= ``num_steps`` (`budget_exhausted_parts`)."""
    before, after = budget_exhausted_parts(num_steps, budget_stop)
    return f"{before}{released}{after}"


UNRECORDED_RELEASED = -1
"""The value of an optimizer's released-steps variable before its first step, and after loading a file saved before
keras_dyndp counted released steps: the step counter's value stands for it (`released_steps`)."""


def released_steps(step: Any, recorded: Any, where: Any) -> Any:
    """The DP steps an optimizer has released: its ``recorded`` released-steps variable (of ``step``'s dtype), or its
    step counter ``step`` where that holds `UNRECORDED_RELEASED`; ``where``: the backend's (``np.where``, ...)."""
    return where(recorded < 0, step, recorded)


def counter_moved_parts() -> tuple[str, str, str]:
    """The refusal of a step counter that is not the number of DP steps released, around those two numbers."""
    return (
        "The optimizer's step counter (dp_step, Keras's optimizer.iterations) is ",
        " but the optimizer has released ",
        " DP steps (optimizer.released_steps): the counter was set by hand (e.g. optimizer.iterations.assign(0)) or "
        "restored without the rest of the optimizer. A step at it would index the schedule at the wrong step and "
        "release more steps than the schedule's epsilon accounts, so no step runs. To go on with this schedule, set "
        "the counter back: optimizer.iterations.assign(optimizer.released_steps) (the steps left are "
        "schedule.num_steps - released_steps); to resume from a checkpoint, restore the whole optimizer (its released "
        "steps are saved with the counter). Starting over needs a new optimizer, whose new budget adds to the one "
        "spent.",
    )


UNRECORDED_FINGERPRINT = (0, 0)
"""The schedule fingerprint an optimizer holds before its first step (`DPSchedule.fingerprint` is never this)."""


def restored_schedule_refusal(step: int, recorded_fingerprint: Sequence[int], schedule: Any) -> str | None:
    """Why a DP step must not run at step counter ``step`` under ``schedule``, or None when it may: a counter past 0
    restored under another fingerprint (or none) would index the wrong schedule. Step 0, nothing spent, always runs."""
    recorded = tuple(int(word) for word in recorded_fingerprint)
    if step == 0 or recorded == schedule.fingerprint:
        return None
    return schedule_mismatch_message(recorded != UNRECORDED_FINGERPRINT) + f" {step}."


def schedule_mismatch_message(recorded: bool) -> str:
    """The refusal of a restored step counter (`restored_schedule_refusal`), up to the number of steps taken."""
    if recorded:
        what = (
            "The optimizer's step counter was restored from a checkpoint written under another DP schedule (its "
            "schedule fingerprint differs from this optimizer's schedule's)"
        )
        unknown = ""
    else:
        what = (
            "The optimizer's step counter is past 0 but no schedule fingerprint was saved with it (a checkpoint "
            "written before keras_dyndp recorded one, or a counter restored or set alone), so nothing shows which "
            "schedule its steps were taken under"
        )
        unknown = (
            " If you know that it was written under this very schedule, call optimizer.record_schedule_fingerprint() "
            "after the restore."
        )
    return (
        f"{what}: continuing would index this schedule at the wrong step, and its epsilon would not be that of the "
        "steps taken, so no step runs. Restore into an optimizer built from the checkpoint's schedule (the same "
        "schedule or budget arguments), or start a new run with a fresh optimizer, knowing that the privacy "
        f"budget the checkpoint's steps spent is spent.{unknown} Steps taken (dp_step):"
    )


NO_KEY, SCHEDULE_MISMATCH, NO_FINGERPRINT, COUNTER_MOVED, BUDGET_SPENT, PADDING_ROWS, TOO_FEW, TOO_MANY = range(1, 9)
"""The refusal codes, in order of precedence (0: the step may run)."""

NUMBERS = {
    SCHEDULE_MISMATCH: ("step",),
    NO_FINGERPRINT: ("step",),
    COUNTER_MOVED: ("step", "released"),
    BUDGET_SPENT: ("released",),
    TOO_FEW: ("max_examples",),
    TOO_MANY: ("min_examples",),
}
"""The numbers each refusal's text (`StepChecks.message`) shows, in order, by name: the step counter, the DP steps
released, the batch's most or fewest examples."""


def interleave(parts: Sequence[str], numbers: Sequence[Any]) -> list:
    """``[parts[0], numbers[0], parts[1], ..., parts[-1]]``: a refusal's text around its numbers."""
    return [item for pair in zip(parts, numbers) for item in pair] + [parts[-1]]


def render(parts: Sequence[str], numbers: Sequence[int]) -> str:
    """A refusal's text on the host: ``parts`` around the int ``numbers`` (`interleave`)."""
    return "".join(map(str, interleave(parts, [int(number) for number in numbers])))


class StepChecks:
    """The refusals of one optimizer's steps under ``schedule``: past the budget, on a step counter that is not the
    steps released or comes from another schedule, of batches outside its Poisson sampling (`tf_backend.sampling_check`)
    at ``expected_batch_size`` (p N; None: unchecked), and of padding where ``normalises_by_rows`` (divides by rows)."""

    def __init__(self, schedule: Any, expected_batch_size: float | None, normalises_by_rows: bool):
        self._schedule, self._normalises_by_rows = schedule, normalises_by_rows
        # p; N, the dataset size the schedule and p N are for, and the accepted (low, high) examples per batch, or None.
        self.sampling_probability = p = schedule.sampling_probability
        self.num_examples = n = batch_sizes.implied_num_examples(expected_batch_size, p)
        self.batch_size_range = None if n is None else batch_sizes.batch_size_range(n, p)

    def schedule_mismatch(self, step: Any, recorded: Any) -> Any:
        """bool: a counter past 0 under another ``recorded`` fingerprint, or none (`restored_schedule_refusal`)."""
        own = self._schedule.fingerprint
        return (step > 0) & ~((recorded[0] == own[0]) & (recorded[1] == own[1]))

    def host_refusal(self, step: int, released: int) -> int:
        """The refusal code (`COUNTER_MOVED`, `BUDGET_SPENT`, or 0) of the next step, on the host, for a step counter
        ``step`` and ``released`` DP steps released (`released_steps`), as `failing` decides them."""
        if step != released:
            return COUNTER_MOVED
        return BUDGET_SPENT if released >= self._schedule.num_steps else 0

    def failing(self, step, recorded, released, min_examples, max_examples, num_rows, no_key=None) -> dict[int, Any]:
        """``{code: bool, True where the step must be refused}`` in order of precedence, for a step at counter
        ``step`` with the ``recorded`` schedule fingerprint and ``released`` DP steps released (`released_steps`), of
        a batch of ``num_rows`` rows holding between ``min_examples`` and ``max_examples`` examples (rows with a
        non-zero sample weight); ``no_key``: bool, the step has no secret noise key (None: not checked)."""
        checks = {} if no_key is None else {NO_KEY: no_key}
        mismatch = self.schedule_mismatch(step, recorded)
        unrecorded = (recorded[0] == 0) & (recorded[1] == 0)  # UNRECORDED_FINGERPRINT
        checks[SCHEDULE_MISMATCH], checks[NO_FINGERPRINT] = mismatch & ~unrecorded, mismatch & unrecorded
        checks[COUNTER_MOVED] = step != released
        checks[BUDGET_SPENT] = released >= self._schedule.num_steps
        if self._normalises_by_rows:
            checks[PADDING_ROWS] = max_examples < num_rows
        elif self.batch_size_range is not None:
            checks[TOO_FEW] = max_examples < self.batch_size_range[0]
            checks[TOO_MANY] = min_examples > self.batch_size_range[1]
        return checks

    def message(self, code: int, budget_stop: str | None = BUDGET_STOP) -> tuple[str, ...]:
        """Refusal ``code``'s text, in the parts around its numbers (`NUMBERS`: one part more than numbers; join them
        with `interleave`); ``budget_stop``: as `budget_exhausted_parts`."""
        if code == NO_KEY:  # JAX's (TensorFlow's key never leaves its generator)
            return (
                "The DP step was handed an optimizer state without its secret noise key (the key words of the "
                "optimizer's never-saved `dp_run_state` are zero, as in its variables at rest), and noise from a known "
                "key protects nothing. Take the state of each run of steps from `optimizer.new_run([v.value for v in "
                "optimizer.variables])`, which writes the key and a fresh run nonce into it (make_private's train "
                "function does); after the run, assign the state back and call `optimizer.raise_refused_step()`.",
            )
        if code in (SCHEDULE_MISMATCH, NO_FINGERPRINT):
            return schedule_mismatch_message(recorded=code == SCHEDULE_MISMATCH) + " ", "."
        if code == COUNTER_MOVED:
            return counter_moved_parts()
        if code == BUDGET_SPENT:
            return budget_exhausted_parts(self._schedule.num_steps, budget_stop)
        if code == PADDING_ROWS:
            return (batch_sizes.PADDING_ROWS_REFUSAL,)
        low, high = self.batch_size_range
        what = "few" if code == TOO_FEW else "many"
        return batch_sizes.out_of_range_refusal(what, self.sampling_probability, self.num_examples, low, high)


class GradientGuard:
    """Remembers the values the DP path handed out (its gradients; the schedule's pair), so the optimizer can refuse
    any others: a plain object (outside the checkpoint graph), per thread (MirroredStrategy's replicas trace apart)."""

    def __init__(self):
        self._local = threading.local()

    def issue(self, grads: Sequence[Any]) -> Sequence[Any]:
        self._local.pending = tuple(grads)
        return grads

    def check_and_clear(self, grads: Sequence[Any]) -> bool:
        pending, self._local.pending = getattr(self._local, "pending", None), None
        return pending is not None and len(pending) == len(grads) and all(g is p for g, p in zip(grads, pending))
