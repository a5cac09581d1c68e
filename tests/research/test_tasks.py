"""Tests for research.tasks: the task table and the drivers' shared --epsilons parsing."""

import math

import pytest
from absl.testing import flagsaver

from research import run_config
from research import tasks


def test_every_task_script_is_in_the_table_under_its_module_name():
    assert tasks.TASKS == ("digits", "mnist", "fashion_mnist", "imdb", "names", "chest_xray", "federated_mnist")
    assert all(module.__name__ == f"research.{name}" for name, module in tasks.TASK_MODULES.items())
    assert all(callable(module.make_task) for module in tasks.TASK_MODULES.values())


def test_floats_parses_a_list_flag_within_its_range():
    assert tasks.floats("inv_rho_mus", ["0.5", "1"], 0, 1) == [0.5, 1.0]
    with pytest.raises(run_config.FlagError, match=r"--inv_rho_mus values must be in \(0, 1\]"):
        tasks.floats("inv_rho_mus", ["0"], 0, 1)
    with pytest.raises(run_config.FlagError, match="--x must be a comma-separated list of numbers"):
        tasks.floats("x", ["a"], 0, 1)
    with pytest.raises(run_config.FlagError, match="--x values must be in"):
        tasks.floats("x", [], 0, 1)


def test_epsilons_default_to_the_task_and_must_be_finite_and_positive():
    with flagsaver.flagsaver(epsilons=None):
        assert tasks.epsilons_from_flag(3.0) == [3.0]
    with flagsaver.flagsaver(epsilons=["0.4", "2"]):
        assert tasks.epsilons_from_flag(3.0) == [0.4, 2.0]
    with flagsaver.flagsaver(epsilons=["inf"]):
        with pytest.raises(run_config.FlagError, match="--epsilons must be finite"):
            tasks.epsilons_from_flag(3.0)
    with flagsaver.flagsaver(epsilons=["-1"]):
        with pytest.raises(run_config.FlagError, match="--epsilons values must be in"):
            tasks.epsilons_from_flag(math.inf)
