"""examples/digits.py, the README's main job: offline, quick, learns, and reports the epsilon it spent."""

import os
import pathlib
import re
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_a_short_run_learns_within_budget_and_writes_the_model_dir(run_example, tmp_path):
    accuracy, steps, total, epsilon, target, _ = run_example("digits", "--epochs=3", f"--model_dir={tmp_path}")
    assert steps == total == 34  # ceil(3 * 1437 / 128): the schedule's every step
    assert target == 3.0 and 2.9 < epsilon <= target  # calibrated to the target under PLD, not beyond it
    assert accuracy > 0.3  # 10 classes: chance is 0.1
    assert (tmp_path / "digits.weights.h5").is_file() and any((tmp_path / "logs").iterdir())


def test_runs_as_a_file_from_any_directory(tmp_path):
    """`python examples/digits.py` (how TF-Privacy's tutorials are run) works as well as `python -m`."""
    result = subprocess.run(
        [sys.executable, str(REPO / "examples" / "digits.py"), "--helpshort"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        check=False,
    )
    assert "ModuleNotFoundError" not in result.stderr
    assert "--epsilon" in result.stdout and "--method" in result.stdout


def test_a_normal_run_prints_nothing_that_looks_like_a_failure():
    """stderr holds no traceback, no error-level line and none of TensorFlow's C++ start-up chatter ("I0000 ...
    oneDNN", "E0000 ... failed call to cuInit"), which a user reads as a failure."""
    environment = {name: value for name, value in os.environ.items() if name != "TF_CPP_MIN_LOG_LEVEL"}
    result = subprocess.run(
        [sys.executable, "-m", "examples.digits", "--epochs=1", "--batch_size=700", "--verbose=0"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=environment,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "Test accuracy:" in result.stdout
    alarming = re.compile(r"Traceback|ERROR|[EF]\d{4} |I\d{4} |WARNING: All log messages before absl")
    assert not [line for line in result.stderr.splitlines() if alarming.match(line)], result.stderr


def test_method_adaptive_trains_with_adaptive_clipping_at_the_schedules_epsilon(run_example):
    """``--method=adaptive``: the vanilla schedule's noise, shared with the count; C_t adapts from --initial_clip.
    6 epochs: in 3 (34 steps) the clip norm is still adapting and the accuracy of a run ranged from 0.22 to 0.56."""
    accuracy, steps, total, epsilon, target, _ = run_example("digits", "--epochs=6", "--method=adaptive")
    assert steps == total == 68  # ceil(6 * 1437 / 128)
    assert target == 3.0 and 2.9 < epsilon <= target
    assert accuracy > 0.3
