"""Tests for examples/jax_digits.py: the JAX backend end to end, run as a user runs it (both ways)."""

import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("jax")
pytest.importorskip("sklearn")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULT = re.compile(
    r"dynamic: test accuracy (\S+) after (\d+) of (\d+) DP steps; epsilon at delta=\S+: PLD (\S+), RDP (\S+), "
    r"GDP-CLT (\S+) \(Keras \S+ on jax\)"
)


@pytest.mark.parametrize("command", [["-m", "examples.jax_digits"], [os.path.join("examples", "jax_digits.py")]])
def test_a_short_run_spends_the_calibrated_budget_and_learns(command):
    result = subprocess.run(
        [sys.executable, *command, "--epochs=3", "--verbose=0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        env={key: value for key, value in os.environ.items() if key != "KERAS_BACKEND"},  # it sets jax itself
    )
    assert result.returncode == 0, result.stderr[-3000:]
    match = RESULT.search(result.stdout)
    assert match, result.stdout[-2000:]
    accuracy, steps, num_steps, pld, rdp, gdp_clt = match.groups()
    assert int(steps) == int(num_steps) > 0  # BudgetStop ended the run at the schedule's last step
    assert 2.9 < float(pld) <= 3.0  # calibrated to epsilon 3 under PLD
    assert float(rdp) > float(pld) and float(gdp_clt) > 0
    assert float(accuracy) > 0.3  # 10 classes: chance is 0.1
