"""Tests for the `dyndp-privacy` CLI (keras_dyndp.privacy_cli), run as a subprocess as a user would."""

import json
import os
import subprocess
import sys

import pytest
from absl import flags

from keras_dyndp import schedules

SMALL_SPEC = ["--epsilon=1.0", "--num_examples=400", "--batch_size=20", "--steps=40", "--rho_mu=2", "--rho_c=2"]


def _run(*args, cwd):
    environment = dict(os.environ, MPLBACKEND="Agg")
    return subprocess.run(
        [sys.executable, "-m", "keras_dyndp.privacy_cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=environment,
        timeout=120,
        check=False,
    )


def test_help_lists_the_commands_own_flags_and_exits_0(tmp_path):
    result = _run("--help", cwd=tmp_path)
    assert result.returncode == 0, result.stderr  # absl's own --help exits with status 1.
    for name in ("--epsilon", "--num_examples", "--schedule_json", "--accountant", "--plot_dir"):
        assert f"  {name}:" in result.stdout
    assert "Either calibrate schedules from a spec" in result.stdout


def test_spec_prints_table_and_writes_plots(tmp_path):
    result = _run(
        *SMALL_SPEC, "--accountant=gdp_clt", "--num_points=8", f"--plot_dir={tmp_path / 'plots'}", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    methods = [line.split()[0] for line in result.stdout.splitlines()[2:8]]
    assert methods == ["vanilla", "growing_mu", "sensitivity_decay", "dynamic", "zcdp", "tcdp"]
    assert "delta) = (1, 0.00025)" in result.stdout  # Default delta = 1 / (10 N).
    assert [line.split()[1] for line in result.stdout.splitlines()[2:6]] == ["gdp_clt"] * 4
    assert "zcdp: its accountant uses no amplification by subsampling" in result.stdout  # Why its z is so large.
    for name in ("epsilon_consumption.png", "accountant_comparison.png"):
        assert (tmp_path / "plots" / name).stat().st_size > 1000


def test_spec_calibrates_under_the_pld_by_default(tmp_path):
    result = _run(*SMALL_SPEC, "--method=vanilla,sensitivity_decay", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "paper's methods calibrated under pld" in result.stdout
    for line in result.stdout.splitlines()[2:4]:
        cells = line.split()  # Their own epsilon is their PLD epsilon, at the target.
        assert cells[1] == "pld" and cells[7] == cells[-1] and 0.999 <= float(cells[-1]) <= 1.0


@pytest.mark.parametrize("saved_as", ["schedule.json", "run_config.json"])
def test_schedule_json(tmp_path, saved_as):
    schedule = schedules.calibrate(
        "dynamic",
        target_epsilon=1.0,
        target_delta=1e-4,
        sampling_probability=0.05,
        num_steps=30,
        initial_clip=1.0,
        rho_mu=2.0,
        accountant="gdp_clt",
    )
    path = tmp_path / saved_as
    if saved_as == "schedule.json":
        path.write_text(schedule.to_json())
    else:  # What an example trainer writes into its --model_dir (examples/training.py, restore_or_start).
        path.write_text(json.dumps({"task": "digits", "method": "dynamic", "schedule": schedule.get_config()}))
    result = _run(f"--schedule_json={path}", "--delta=1e-4", "--accountants=gdp_clt,rdp", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    row = result.stdout.splitlines()[1].split()
    # The saved schedule says how it was calibrated: its own accountant is the GDP-CLT, at the target.
    assert row[0] == saved_as and row[1] == "gdp_clt" and row[-1] == "-"
    assert float(row[-4]) == float(row[-3]) == pytest.approx(1.0, rel=1e-3)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--epsilon=-1", "--num_examples=400", "--batch_size=20", "--steps=40"], "target_epsilon"),
        (["--epsilon=abc"], "--epsilon"),
        (SMALL_SPEC + ["--method=vanilla,adaptive"], "methods"),
        (["--schedule_json=missing.json", "--delta=1e-5"], "missing.json"),
    ],
)
def test_bad_spec_exits_2_with_one_line(tmp_path, args, message):
    result = _run(*args, cwd=tmp_path)
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("dyndp-privacy: error:") and message in lines[0]
    assert "Traceback" not in result.stderr


def test_flags_live_in_their_own_registry_beside_the_research_trainers():
    import research.run_flags  # Defines --epsilon, --method, ... on absl's global registry.
    from keras_dyndp import privacy_cli

    assert "epsilon" in privacy_cli._FLAGS  # pylint: disable=protected-access
    assert flags.FLAGS["epsilon"] is not privacy_cli._FLAGS["epsilon"]  # pylint: disable=protected-access
    del research
