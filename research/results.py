"""What a research run measured (`RunResult`), its row of the results CSV, and its privacy curve."""

from __future__ import annotations

import csv
import dataclasses
import itertools
import os
from typing import Any

from keras_dyndp import privacy_report
from keras_dyndp import schedules
from research import run_config

# The config fields written to the results CSV, in its column order. Files of earlier versions lack the last three;
# `append_results_csv` adds them (with their defaults) before appending.
CSV_CONFIG_COLUMNS = (
    "method",
    "epsilon",
    "delta",
    "rho_mu",
    "rho_c",
    "initial_clip",
    "learning_rate",
    "batch_size",
    "epochs",
    "sampling",
    "seed",
    "lr_decay",
    "rescale_to_unit_norm",
    "adaptive_clipping",
)


@dataclasses.dataclass(frozen=True)
class RunResult:
    """What `train` measured, with the task's name, the resolved `RunConfig` and the `DPSchedule` (None: nonprivate)
    of the run."""

    task: str
    config: run_config.RunConfig
    steps: int
    total_steps: int
    test_accuracy: float
    epsilon_gdp_clt: float
    epsilon_rigorous: float
    wall_time_s: float
    schedule: schedules.DPSchedule | None = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def rigorous_accountant(self) -> str:
        """The accountant of `epsilon_rigorous` ('none' for a nonprivate run)."""
        return self.config.report_accountant if self.config.private else "none"

    def csv_row(self) -> dict[str, Any]:
        """The flat row of the results CSV: task, the config's `CSV_CONFIG_COLUMNS`, then what was measured."""
        return {
            "task": self.task,
            **{name: getattr(self.config, name) for name in CSV_CONFIG_COLUMNS},
            "steps": self.steps,
            "total_steps": self.total_steps,
            "test_accuracy": self.test_accuracy,
            "epsilon_gdp_clt": self.epsilon_gdp_clt,
            "epsilon_rigorous": self.epsilon_rigorous,
            "rigorous_accountant": self.rigorous_accountant,
            "wall_time_s": self.wall_time_s,
        }


def write_privacy_curve(
    config: run_config.RunConfig, schedule: schedules.DPSchedule, lengths: list[int], steps: int, task_name: str
) -> str:
    """Writes ``<model_dir>/privacy_curve.png`` and returns its path: the epsilon of the run's first k steps under
    the reported accountant at each epoch end up to the `steps` taken (a point per epoch, not per step, keeps the
    accountant fast), above the clip norm and noise std of those steps (`privacy_report.plot_run_privacy`)."""
    epoch_ends = [end for end in itertools.accumulate(lengths) if end < steps] + [steps]
    return privacy_report.plot_run_privacy(
        os.path.join(config.model_dir, "privacy_curve.png"),
        schedule,
        config.delta,
        epoch_ends,
        accountant=config.report_accountant,
        title=f"{task_name}, {config.method}: epsilon after the first k of {steps} steps",
    )


def append_results_csv(path: str, result: RunResult) -> None:
    """Appends `result.csv_row()` to the CSV at `path` (`append_csv_row` with ``upgrade=True``).

    Raises:
      FlagError: if the file's header has columns this version does not write (another program's CSV).
    """
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    append_csv_row(path, result.csv_row(), upgrade=True)


def _upgrade_header(path: str, columns: list[str]) -> None:
    """Rewrites the CSV at `path` with the header `columns` when its own lacks some of them, filling its rows' new
    columns with the `RunConfig` defaults those runs had (constant learning rate, no rescaling, a fixed clip)."""
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        old_rows, header = list(reader), list(reader.fieldnames or [])
    if set(header) - set(columns):
        raise run_config.FlagError(
            f"--results_csv={path} has columns this program does not write ({sorted(set(header) - set(columns))}); "
            "use another file."
        )
    if header != columns:
        with open(path, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=columns)
            writer.writeheader()
            writer.writerows(
                {name: old.get(name, run_config.RUN_CONFIG_DEFAULTS.get(name)) for name in columns} for old in old_rows
            )


def read_csv_rows(path: str) -> list[dict[str, str]]:
    """The rows of the CSV file at `path` as dicts (empty when it does not exist)."""
    if not os.path.exists(path):
        return []
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def append_csv_row(path: str, row: dict[str, Any], upgrade: bool = False) -> None:
    """Appends `row` to the CSV file at `path`, writing its keys as the header of a new or empty file.

    Args:
      path: the CSV file.
      row: column name -> value, in the file's column order.
      upgrade: a file of an earlier version, whose header lacks some of `row`'s columns (config columns added since),
        is first rewritten with them (`_upgrade_header`). Off: the header is taken as `row`'s keys.

    Raises:
      FlagError: with `upgrade`, if the file's header has columns `row` lacks (another program's CSV).
    """
    new = not os.path.exists(path) or os.path.getsize(path) == 0
    if upgrade and not new:
        _upgrade_header(path, list(row))
    with open(path, "a", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(row))
        if new:
            writer.writeheader()
        writer.writerow(row)
