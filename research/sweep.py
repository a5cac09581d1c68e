"""Grid sweep over the paper's 1/rho_mu, 1/rho_c, epsilons and seeds: results CSV, Table-1 markdown, Fig. 4 heat map.

The paper sweeps 1/rho_c, 1/rho_mu in {0.1, ..., 0.8} (Sec. 4) and reports the mean of repeated runs (Table 1)
and the accuracy over the grid (Fig. 4). For each epsilon in ``--epsilons``, each method in ``--methods`` and each
seed in ``--seeds`` this script trains the task of ``--task`` once per grid point that the method uses (dynamic:
all (1/rho_mu, 1/rho_c) pairs; growing_mu, and zcdp and tcdp (noise decay z_0 / z_T = rho_mu): the 1/rho_mu values;
sensitivity_decay: the 1/rho_c values; vanilla and nonprivate: one run), then writes into ``--sweep_dir``:

* ``results.csv``: one row per run (`research.results.RunResult.csv_row`). Runs already in it (same task,
  method, epsilon, rho_mu, rho_c, seed, and the values the command line sets for every run: learning rate, C_0,
  --lr_decay, ...) are skipped, so an interrupted sweep continues where it stopped;
* ``table.md``: accuracy mean +- std over seeds per method and epsilon, with the rigorous epsilon; for methods with
  a grid, the best grid point (by mean accuracy) and its 1/rho values;
* ``heatmap_eps<epsilon>.png``: mean accuracy of the dynamic method over the (1/rho_mu, 1/rho_c) grid.

Every other flag given on the command line (``--epochs``, ``--max_steps``, ``--idx_dir``, ...) applies to every
run, except ``--accountant`` (the calibration accountant of the paper's methods), which the baselines zcdp and tcdp
do not take: they are calibrated by their own. ``--accountant=gdp_clt`` reproduces the paper's calibration. Runs go
in-process by default (`research.trainer.train` with the flags' `RunConfig` and the grid point); ``--subprocess``
starts ``python -m research.<task>`` for each (isolated, and a failing run does not stop the sweep).

    python -m research.sweep --task=digits --epsilons=1,3 --seeds=0,1 --methods=vanilla,dynamic \\
        --sweep_dir=/tmp/digits_sweep
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import statistics
import subprocess
import sys

import tensorflow as tf
from absl import flags

if __package__ in (None, ""):  # Run as `python research/NAME.py`: make the package `research` importable.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from keras_dyndp import cli
from keras_dyndp import schedules
from keras_dyndp.tf_backend.keras_compat import keras
from research import results
from research import run_config
from research import run_flags
from research import tasks
from research import trainer

flags.adopt_module_key_flags(run_flags)  # --helpshort lists the shared training flags too.

PAPER_GRID = ["0.1", "0.2", "0.3", "0.4", "0.5", "0.6", "0.7", "0.8"]

flags.DEFINE_list("methods", ["dynamic"], f"Methods to run, among {run_flags.METHODS}.")
flags.DEFINE_list("inv_rho_mus", PAPER_GRID, "Grid of 1/rho_mu values, each in (0, 1].")
flags.DEFINE_list("inv_rho_cs", PAPER_GRID, "Grid of 1/rho_c values, each in (0, 1].")
flags.DEFINE_list("seeds", ["0", "1"], "Seeds (integers); each grid point runs once per seed.")
flags.DEFINE_string("sweep_dir", None, "Output directory (results.csv, table.md, heat maps). Required.")
flags.DEFINE_bool("subprocess", False, "Run each configuration as a `python -m research.<task>` subprocess.")

FLAGS = flags.FLAGS

# Flags the sweep sets per run (never forwarded from its own command line).
_PER_RUN_FLAGS = ("method", "epsilon", "rho_mu", "rho_c", "seed", "results_csv", "model_dir")
_SWEEP_FLAGS = ("task", "methods", "epsilons", "inv_rho_mus", "inv_rho_cs", "seeds", "sweep_dir", "subprocess")


def configurations(task_epsilon: float) -> list[dict]:
    """Every run of the sweep as the per-run flag values (method, epsilon, rho_mu, rho_c, seed)."""
    for method in FLAGS.methods:
        if method not in run_flags.METHODS:
            raise run_config.FlagError(f"--methods: {method!r} is not one of {run_flags.METHODS}.")
    epsilons = tasks.epsilons_from_flag(task_epsilon)
    inv_mus = tasks.floats("inv_rho_mus", FLAGS.inv_rho_mus, 0, 1)
    inv_cs = tasks.floats("inv_rho_cs", FLAGS.inv_rho_cs, 0, 1)
    try:
        seeds = [int(seed) for seed in FLAGS.seeds]
    except ValueError as error:
        raise run_config.FlagError(f"--seeds must be integers: {error}") from error
    mu_grid = [(m, 1.0) for m in inv_mus]
    grids = {
        "dynamic": list(itertools.product(inv_mus, inv_cs)),
        "growing_mu": mu_grid,
        "zcdp": mu_grid,
        "tcdp": mu_grid,
        "sensitivity_decay": [(1.0, c) for c in inv_cs],
    }
    runs = []
    for method in FLAGS.methods:
        for epsilon in [math.inf] if method == "nonprivate" else epsilons:
            for (inv_mu, inv_c), seed in itertools.product(grids.get(method, [(1.0, 1.0)]), seeds):
                runs.append(dict(method=method, epsilon=epsilon, rho_mu=1 / inv_mu, rho_c=1 / inv_c, seed=seed))
    return runs


def _key(task: str, run: dict) -> tuple:
    return (
        task,
        run["method"],
        float(run["epsilon"]),
        round(float(run["rho_mu"]), 9),
        round(float(run["rho_c"]), 9),
        str(run["seed"]),
    )


# RunConfig fields that the sweep's command line sets for all its runs and the results CSV records: a row counts as a
# done run only where it agrees with them (a rerun with another --learning_rate or --lr_decay is not "done").
_SHARED_COLUMNS = tuple(name for name in results.CSV_CONFIG_COLUMNS if name not in _PER_RUN_FLAGS)


def agrees_with(row: dict, base: run_config.RunConfig) -> bool:
    """Whether a results-CSV `row` was run with the values that `base` sets (fields left None, the task's defaults,
    are not compared; a column missing from an older file holds the field's default)."""
    for name in _SHARED_COLUMNS:
        wanted = getattr(base, name)
        if wanted is None:
            continue
        recorded = row.get(name, str(run_config.RUN_CONFIG_DEFAULTS[name]))
        if isinstance(wanted, (bool, str)):
            if recorded != str(wanted):
                return False
        elif not math.isclose(float(recorded), float(wanted), rel_tol=1e-9):
            return False
    return True


def _not_for(method: str) -> tuple[str, ...]:
    """Flags of the sweep's command line that do not apply to `method`: --accountant is the calibration accountant
    of the paper's methods; the baselines (zcdp, tcdp) are calibrated by their own and refuse it."""
    return ("accountant",) if method in schedules.BASELINES else ()


def _forwarded_arguments(method: str) -> list[str]:
    skipped = _PER_RUN_FLAGS + _SWEEP_FLAGS + _not_for(method)
    return [FLAGS[name].serialize() for name in FLAGS if FLAGS[name].present and name not in skipped]


def _run_in_process(module, base: run_config.RunConfig, run: dict, results_csv: str) -> None:
    """Trains one grid point: `base` (the flags' config) with the run's values, its CSV row in `results_csv`.

    Like the subprocess runs it gets no --model_dir (one directory cannot hold several runs), and the flags that do
    not apply to its method go back to their defaults (None in the config)."""
    config = dataclasses.replace(
        base, **run, results_csv=results_csv, model_dir=None, **dict.fromkeys(_not_for(run["method"]))
    )
    trainer.train(module.make_task(), config)
    keras.backend.clear_session()


def _run_subprocess(run: dict, results_csv: str) -> None:
    arguments = [
        f"--method={run['method']}",
        f"--rho_mu={run['rho_mu']!r}",
        f"--rho_c={run['rho_c']!r}",
        f"--seed={run['seed']}",
        f"--results_csv={results_csv}",
    ]
    if run["method"] != "nonprivate":
        arguments.append(f"--epsilon={run['epsilon']!r}")
    command = [sys.executable, "-m", f"research.{FLAGS.task}"] + arguments + _forwarded_arguments(run["method"])
    completed = subprocess.run(command, check=False)
    if completed.returncode != 0:
        print(f"sweep: run failed (exit {completed.returncode}): {' '.join(command)}", file=sys.stderr)


def _mean_std(values: list[float]) -> str:
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{100 * statistics.fmean(values):.2f} ± {100 * std:.2f}"


def _grouped(rows: list[dict]) -> dict[tuple, list[dict]]:
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        key = (row["method"], float(row["epsilon"]), float(row["rho_mu"]), float(row["rho_c"]))
        groups.setdefault(key, []).append(row)
    return groups


def markdown_table(rows: list[dict]) -> str:
    """Table-1 style markdown: accuracy (%) mean ± std over seeds, best grid point per method and epsilon."""
    groups = _grouped(rows)
    epsilons = sorted({key[1] for key in groups if math.isfinite(key[1])})
    methods = [method for method in run_flags.METHODS if any(key[0] == method for key in groups)]
    columns = [f"ε = {eps:g}" for eps in epsilons] or ["accuracy (%)"]
    lines = ["| method | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for method in methods:
        if method == "nonprivate":
            accuracies = [float(r["test_accuracy"]) for key, g in groups.items() if key[0] == method for r in g]
            lines.append(f"| nonprivate | {_mean_std(accuracies)} (n={len(accuracies)})" + " |" * len(columns))
            continue
        cells = []
        for eps in epsilons:
            candidates = [
                (statistics.fmean(float(r["test_accuracy"]) for r in g), key, g)
                for key, g in groups.items()
                if key[0] == method and key[1] == eps
            ]
            if not candidates:
                cells.append("-")
                continue
            _, key, best = max(candidates, key=lambda item: item[0])
            accuracies = [float(r["test_accuracy"]) for r in best]
            rigorous = max(float(r["epsilon_rigorous"]) for r in best)
            grid = f"; 1/ρ_μ={1 / key[2]:.2g}, 1/ρ_c={1 / key[3]:.2g}" if method != "vanilla" else ""
            cells.append(
                f"{_mean_std(accuracies)} (n={len(accuracies)}; {best[0]['rigorous_accountant'].upper()} "
                f"ε ≤ {rigorous:.2f}{grid})"
            )
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot_heatmaps(rows: list[dict], sweep_dir: str) -> list[str]:
    """Fig. 4 style heat maps of the dynamic method's mean accuracy over (1/rho_mu, 1/rho_c), one per epsilon."""
    from matplotlib import figure

    groups = _grouped([row for row in rows if row["method"] == "dynamic"])
    paths = []
    for eps in sorted({key[1] for key in groups}):
        inv_mus = sorted({round(1 / key[2], 6) for key in groups if key[1] == eps})
        inv_cs = sorted({round(1 / key[3], 6) for key in groups if key[1] == eps})
        grid = [[math.nan] * len(inv_mus) for _ in inv_cs]
        for (_, key_eps, rho_mu, rho_c), group in groups.items():
            if key_eps == eps:
                grid[inv_cs.index(round(1 / rho_c, 6))][inv_mus.index(round(1 / rho_mu, 6))] = 100 * statistics.fmean(
                    float(r["test_accuracy"]) for r in group
                )
        fig = figure.Figure(figsize=(max(5.0, 1.5 + 0.7 * len(inv_mus)), max(3.0, 1.0 + 0.6 * len(inv_cs))))
        axes = fig.add_subplot()
        image = axes.imshow(grid, origin="lower", cmap="viridis", aspect="auto")
        axes.set_xticks(range(len(inv_mus)), [f"{v:g}" for v in inv_mus])
        axes.set_yticks(range(len(inv_cs)), [f"{v:g}" for v in inv_cs])
        axes.set_xlabel("1/ρ_μ")
        axes.set_ylabel("1/ρ_c")
        axes.set_title(f"{rows[0]['task']}: dynamic DP-SGD accuracy (%), ε = {eps:g}", fontsize=9)
        for row_index, row in enumerate(grid):
            for col_index, value in enumerate(row):
                if not math.isnan(value):
                    axes.text(col_index, row_index, f"{value:.1f}", ha="center", va="center", fontsize=7, color="white")
        fig.colorbar(image, ax=axes)
        fig.tight_layout()
        path = os.path.join(sweep_dir, f"heatmap_eps{eps:g}.png")
        fig.savefig(path, dpi=120)
        paths.append(path)
    return paths


def sweep() -> None:
    """Runs the missing configurations, then writes the table and the heat maps."""
    if not FLAGS.sweep_dir:
        raise run_config.FlagError("--sweep_dir is required.")
    module = tasks.TASK_MODULES[FLAGS.task]
    runs = configurations(module.make_task().epsilon)
    os.makedirs(FLAGS.sweep_dir, exist_ok=True)
    results_csv = os.path.join(FLAGS.sweep_dir, "results.csv")
    base = run_flags.config_from_flags()
    done = {_key(row["task"], row) for row in results.read_csv_rows(results_csv) if agrees_with(row, base)}
    todo = [run for run in runs if _key(FLAGS.task, run) not in done]
    print(f"sweep: {len(runs)} runs, {len(runs) - len(todo)} already in {results_csv}, {len(todo)} to go")
    for index, run in enumerate(todo, 1):
        print(f"sweep: run {index}/{len(todo)}: {run}", flush=True)
        if FLAGS.subprocess:
            _run_subprocess(run, results_csv)
        else:
            _run_in_process(module, base, run, results_csv)
    wanted = {_key(FLAGS.task, run) for run in runs}
    rows = [
        row for row in results.read_csv_rows(results_csv) if _key(row["task"], row) in wanted and agrees_with(row, base)
    ]
    table = markdown_table(rows)
    with open(os.path.join(FLAGS.sweep_dir, "table.md"), "w") as handle:
        handle.write(table)
    print(table)
    for path in plot_heatmaps(rows, FLAGS.sweep_dir):
        print(f"sweep: wrote {path}")


def main() -> None:
    tf.get_logger().setLevel("ERROR")  # Retracing notices: each run builds a new model in this process.
    sweep()


if __name__ == "__main__":
    cli.run(main)
