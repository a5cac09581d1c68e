"""Tests for research.run_flags: each flag read into its RunConfig field, bad values one line and exit status 2."""

import pytest
from absl.testing import flagsaver

from keras_dyndp import cli
from research import digits
from research import run_config
from research import run_flags


def test_config_from_flags_reads_each_flag_into_its_field():
    with flagsaver.flagsaver():
        cli.parse_flags(
            ["digits.py", "--method=zcdp", "--epochs=2", "--max_steps=3", "--verbose=0", "--training_metrics"]
        )
        config = run_flags.config_from_flags()
        assert config == run_config.RunConfig(method="zcdp", epochs=2.0, max_steps=3, verbose=0, training_metrics=True)
        # An --accountant left at its default is the method's own; one given is refused for a baseline.
        assert config.resolved(digits.make_task(), 1437).accountant == "zcdp"
        cli.parse_flags(["digits.py", "--method=zcdp", "--accountant=pld"])
        config = run_flags.config_from_flags()
    with pytest.raises(run_config.FlagError, match="--method=zcdp is calibrated by its own accountant"):
        config.resolved(digits.make_task(), 1437)


@pytest.mark.parametrize(
    "argument",
    [
        "--epsilon=-1",
        "--delta=1.5",
        "--rho_mu=0.5",
        "--lr_decay=0.5",
        "--method=bogus",
        "--sampling=random",
        "--batch_size=0",
    ],
)
def test_bad_flag_exits_2_with_one_line(argument, capsys):
    with flagsaver.flagsaver():
        with pytest.raises(SystemExit) as exit_info:
            cli.parse_flags(["digits.py", argument])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("digits.py: error: flag " + argument.split("=")[0])


def test_command_line_error_has_no_traceback(example_server):
    completed = example_server.run("research.digits", ["--rho_c=0.3"], timeout=120)
    assert completed.returncode == 2
    assert "Traceback" not in completed.stderr
    assert completed.stderr.strip().splitlines()[-1] == (
        "digits.py: error: flag --rho_c=0.3: --rho_c must be >= 1 (the paper's 1/rho_c is in (0, 1])."
    )
