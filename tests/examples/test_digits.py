"""End-to-end test of examples.digits with its default flags: the README's main example must learn."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

from examples import digits
from examples import training

# The trainers run with --seed here, for reproducible tests; a seeded run's noise seed is known, which warns by design.
pytestmark = pytest.mark.filterwarnings("ignore::keras_dyndp.noise_seed.NoiseSeedWarning")


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
    assert result.returncode == 0  # Asking for help is no failure (absl's own exit status is 1).


def test_a_normal_run_prints_nothing_that_looks_like_a_failure():
    """The README's main job, shortened: stderr holds no traceback, no error-level line and none of TensorFlow's
    C++ start-up chatter ("I0000 ... oneDNN", "E0000 ... failed call to cuInit"), which a user reads as a failure."""
    environment = {name: value for name, value in os.environ.items() if name != "TF_CPP_MIN_LOG_LEVEL"}
    result = subprocess.run(
        [sys.executable, "-m", "examples.digits", "--epochs=1", "--max_steps=2", "--verbose=0"],
        capture_output=True,
        text=True,
        cwd=pathlib.Path(digits.__file__).resolve().parents[1],
        env=environment,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "Test accuracy:" in result.stdout
    alarming = re.compile(r"Traceback|ERROR|[EF]\d{4} |I\d{4} |WARNING: All log messages before absl")
    assert not [line for line in result.stderr.splitlines() if alarming.match(line)], result.stderr
