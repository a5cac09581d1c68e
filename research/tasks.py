"""The paper's task scripts by name, for the drivers that run several trainings (`research.sweep`, `research.study`),
and the flags those drivers share: ``--task`` and ``--epsilons``.

Importing this module imports every task script, so that each one's own flags (--idx_dir, --names_dir, ...) parse on
a driver's command line and reach the task.
"""

from __future__ import annotations

import math

from absl import flags

from research import chest_xray
from research import digits
from research import fashion_mnist
from research import federated_mnist
from research import imdb
from research import mnist
from research import names
from research import run_config

TASK_MODULES = {
    module.__name__.rsplit(".", 1)[1]: module
    for module in (digits, mnist, fashion_mnist, imdb, names, chest_xray, federated_mnist)
}
TASKS = tuple(TASK_MODULES)

flags.DEFINE_enum("task", "digits", TASKS, "Task script to run.")
flags.DEFINE_list("epsilons", None, "Target epsilons (default: the task's epsilon).")

FLAGS = flags.FLAGS


def floats(name: str, values: list[str], low: float, high: float) -> list[float]:
    """The numbers of the list flag `--name`, each in (low, high]; a `run_config.FlagError` naming it otherwise."""
    try:
        numbers = [float(value) for value in values]
    except ValueError as error:
        raise run_config.FlagError(f"--{name} must be a comma-separated list of numbers: {error}") from error
    if not numbers or not all(low < number <= high for number in numbers):
        raise run_config.FlagError(f"--{name} values must be in ({low:g}, {high:g}]. Received: {values}.")
    return numbers


def epsilons_from_flag(task_epsilon: float) -> list[float]:
    """The epsilons of ``--epsilons``, each finite and > 0, or [task_epsilon] when it is unset."""
    if not FLAGS.epsilons:
        return [task_epsilon]
    epsilons = floats("epsilons", FLAGS.epsilons, 0, math.inf)
    if not all(math.isfinite(epsilon) for epsilon in epsilons):
        raise run_config.FlagError(f"--epsilons must be finite. Received: {FLAGS.epsilons}.")
    return epsilons
