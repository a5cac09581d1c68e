"""End-to-end test of examples.digits with its default flags: the README's main example must learn."""

import pathlib
import subprocess
import sys

from examples import digits
from examples import training


def test_default_dynamic_run_learns_within_budget():
    result = training.train(digits.make_task(), training.RunConfig(seed=0, verbose=0))
    assert result.config.method == "dynamic" and result.config.epsilon == 3.0
    assert result.steps == result.total_steps
    assert result.epsilon_gdp_clt <= 3.0 + 1e-9
    assert result.test_accuracy > 0.8


def test_runs_as_a_file_from_any_directory(tmp_path):
    """`python examples/digits.py` (how TF-Privacy's tutorials are run) works as well as `python -m`."""
    script = pathlib.Path(digits.__file__).resolve()
    result = subprocess.run(
        [sys.executable, str(script), "--helpshort"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        check=False,
    )
    assert "ModuleNotFoundError" not in result.stderr
    assert "--epsilon" in result.stdout and "--method" in result.stdout
