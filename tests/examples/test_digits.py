"""End-to-end test of examples.digits with its default flags: the README's main example must learn."""

from absl.testing import flagsaver

from examples import digits
from examples import training


def test_default_dynamic_run_learns_within_budget():
    with flagsaver.flagsaver(seed=0, verbose=0):
        result = training.train(digits.make_task())
    assert result.method == "dynamic" and result.epsilon == 3.0
    assert result.steps == result.total_steps
    assert result.epsilon_gdp_clt <= 3.0 + 1e-9
    assert result.test_accuracy > 0.8
