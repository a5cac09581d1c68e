"""Tests for keras_dyndp.core.step_checks: the refusals of a DP step, decided and worded once for both backends.

Each backend's tests run them through its optimizer (tests/tf_backend/test_optimizer.py, test_sampling_check.py,
tests/jax_backend/test_optimizer.py); here on NumPy values, the operators both backends share.
"""

import numpy as np
import pytest

from keras_dyndp import schedules
from keras_dyndp.core import batch_sizes
from keras_dyndp.core import step_checks

SCHEDULE = schedules.DPSchedule(np.ones(10), np.ones(10), 0.05)  # p N = 200 from N = 4000 below
OWN = np.asarray(SCHEDULE.fingerprint, np.int32)
NONE_RECORDED = np.zeros(2, np.int32)


def failing_codes(
    checks: step_checks.StepChecks, step=3, recorded=OWN, released=None, examples=200, rows=200, no_key=None
) -> list:
    released = np.int64(step if released is None else released)
    failing = checks.failing(np.int64(step), recorded, released, np.int32(examples), np.int32(examples), rows, no_key)
    return [code for code, fails in failing.items() if fails]


def test_a_batch_in_range_at_a_live_step_passes_every_check():
    checks = step_checks.StepChecks(SCHEDULE, 200.0, normalises_by_rows=False)
    low, high = checks.batch_size_range
    assert checks.num_examples == 4000 and low < 200 < high
    assert failing_codes(checks, no_key=np.bool_(False)) == []
    assert list(checks.failing(0, OWN, 0, 200, 200, 200)) == [
        step_checks.SCHEDULE_MISMATCH,
        step_checks.NO_FINGERPRINT,
        step_checks.COUNTER_MOVED,
        step_checks.BUDGET_SPENT,
        step_checks.TOO_FEW,
        step_checks.TOO_MANY,
    ]


@pytest.mark.parametrize(
    "arguments, codes",
    [
        (dict(step=10), [step_checks.BUDGET_SPENT]),
        (dict(step=0, released=10), [step_checks.COUNTER_MOVED, step_checks.BUDGET_SPENT]),  # rewound after the budget
        (dict(step=2, released=5), [step_checks.COUNTER_MOVED]),  # rewound within it: the schedule would replay
        (dict(step=9, released=5), [step_checks.COUNTER_MOVED]),  # set forward
        (dict(recorded=OWN + 1), [step_checks.SCHEDULE_MISMATCH]),
        (dict(recorded=NONE_RECORDED), [step_checks.NO_FINGERPRINT]),
        (dict(step=0, recorded=OWN + 1), []),  # step 0: nothing is spent, the fingerprint is recorded
        (dict(examples=4000, rows=4000), [step_checks.TOO_MANY]),
        (dict(examples=10, rows=400), [step_checks.TOO_FEW]),
        (dict(no_key=np.bool_(True), step=10, examples=10), [1, 5, 7]),  # in order of precedence
    ],
)
def test_each_refusal_is_decided_once(arguments, codes):
    assert failing_codes(step_checks.StepChecks(SCHEDULE, 200.0, normalises_by_rows=False), **arguments) == codes


def test_public_batch_sizes_refuse_padding_rows_and_check_no_size():
    checks = step_checks.StepChecks(SCHEDULE, None, normalises_by_rows=True)
    assert checks.num_examples is None and checks.batch_size_range is None
    assert failing_codes(checks, examples=400, rows=400) == []
    assert failing_codes(checks, examples=5, rows=8) == [step_checks.PADDING_ROWS]


def test_messages_keep_their_key_phrases():
    checks = step_checks.StepChecks(SCHEDULE, 200.0, normalises_by_rows=False)
    low, high = checks.batch_size_range
    before, after = checks.message(step_checks.TOO_MANY)
    assert f"{before}400{after}".startswith("keras_dyndp: too many examples in this batch: 400; ")
    assert f"between {low} and {high}" in after
    assert "too few examples" in checks.message(step_checks.TOO_FEW)[0]
    spent = step_checks.render(checks.message(step_checks.BUDGET_SPENT, budget_stop=None), [10])
    assert spent == step_checks.budget_exhausted_message(10, 10, None)
    assert checks.message(step_checks.PADDING_ROWS) == (batch_sizes.PADDING_ROWS_REFUSAL,)
    assert "secret noise key" in checks.message(step_checks.NO_KEY)[0]
    moved = step_checks.render(checks.message(step_checks.COUNTER_MOVED), [0, 10])
    assert moved.startswith("The optimizer's step counter (dp_step, Keras's optimizer.iterations) is 0 but the ")
    assert "has released 10 DP steps" in moved and "optimizer.iterations.assign(optimizer.released_steps)" in moved
    for code, recorded in [(step_checks.SCHEDULE_MISMATCH, OWN + 1), (step_checks.NO_FINGERPRINT, NONE_RECORDED)]:
        before, after = checks.message(code)
        assert f"{before}5{after}" == step_checks.restored_schedule_refusal(5, recorded, SCHEDULE)


def test_the_steps_released_are_recorded_or_else_the_counter():
    assert step_checks.released_steps(np.int64(4), np.int64(step_checks.UNRECORDED_RELEASED), np.where) == 4
    assert step_checks.released_steps(np.int64(0), np.int64(3), np.where) == 3
    checks = step_checks.StepChecks(SCHEDULE, 200.0, normalises_by_rows=False)
    assert [checks.host_refusal(*counts) for counts in [(3, 3), (0, 3), (10, 10), (0, 10)]] == [
        0,
        step_checks.COUNTER_MOVED,
        step_checks.BUDGET_SPENT,
        step_checks.COUNTER_MOVED,
    ]


def test_the_budget_refusal_says_how_many_steps_and_what_to_do_and_suggests_budget_stop_only_when_asked():
    """Issue 55: a second fit after the budget, with BudgetStop among its callbacks, was told to add BudgetStop."""
    plain = step_checks.budget_exhausted_message(10, 10, None)
    assert plain.startswith("DP budget exhausted: all 10 steps of the DPSchedule have been released (released_steps 10")
    assert "A new schedule is a new budget" in plain and "model.evaluate and model.predict" in plain
    assert "BudgetStop" not in plain
    hinted = step_checks.budget_exhausted_message(10, 10, step_checks.BUDGET_STOP)
    assert hinted.startswith(plain) and hinted.endswith("add keras_dyndp.BudgetStop() to its callbacks.")


def test_gradient_guard_accepts_only_the_issued_gradients_once():
    guard = step_checks.GradientGuard()
    grads = [object(), object()]
    assert not guard.check_and_clear(grads)
    guard.issue(grads)
    assert not guard.check_and_clear([grads[0], object()])  # and the issue is spent
    guard.issue(grads)
    assert guard.check_and_clear(list(grads))
    assert not guard.check_and_clear(grads)
