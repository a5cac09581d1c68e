"""Does a dynamic schedule beat a tuned vanilla DP-SGD at the same rigorous epsilon? Equal tuning budgets, one command.

For one task, each epsilon of ``--epsilons`` and each contender of ``--contenders``:

1. Tuning. ``--budget`` configurations (at least 6 for the study's claims; default 6) are trained once each
   (seed ``--tune_seed``) on the training set minus a validation split (``--validation_fraction`` of it, default
   10%, a fixed random subset) and scored on that split. The test set is not loaded into these runs at all.
2. Selection: the configuration with the best validation accuracy (the first on ties; a diverged run scores -inf).
3. Final runs: the selected configuration, trained on the whole training set with each of ``--final_seeds``
   (default 1, 2, 3: not the tuning seed) and evaluated on the test set, once per run.

Contenders (`CONTENDERS`), each calibrated under the PLD accountant to the same (epsilon, delta = 1 / (10 N)):
vanilla; vanilla with a learning rate decaying by lr_0 / lr_T (`--lr_decay`, the clip decay's geometric family);
sensitivity decay; growing mu; dynamic; dynamic with the noisy sum divided by C_t (`rescale_to_unit_norm`),
which keeps the clip decay but takes away its shrinking of the step; and adaptive: vanilla's noise with the clip norm
adapted to the median per-example gradient norm from C_0 (Andrew et al. 2021 at `keras_dyndp.AdaptiveClipping`'s
defaults, the paper's; the schedule's noise multipliers are its whole cost, so its epsilon is vanilla's).

Equal budgets, paired configurations. One Latin hypercube of ``--budget`` points in [0, 1)^4 (seed
``--search_seed``) gives every contender its configurations: coordinate 0 the learning rate and 1 the initial clip
C_0 (log-uniform over ``--lr_range`` and ``--clip_range``, factors of the task's defaults), coordinates 2 and 3
the contender's own schedule parameters as inverse ratios in ``--inverse_ratio_range`` (the paper's 1/rho in
(0, 1]): 1/lr_decay (vanilla_lr_decay), 1/rho_c (sensitivity_decay), 1/rho_mu (growing_mu), 1/rho_mu and
1/rho_c (dynamic, dynamic_rescaled); adaptive has none (its i is vanilla's i, clipped adaptively). So configuration
i of every contender shares its learning rate and C_0, and sensitivity_decay's i decays the clip by the ratio by
which vanilla_lr_decay's i decays the learning rate. The
rescaled contender divides its update by C_t; under SGD its learning rate is the drawn one times C_0, so that its
first step equals dynamic's (Adam, Adagrad and RMSprop are invariant to the gradient's scale: the drawn one).

Privacy of tuning. Every run here trains on the private training data, and the selection looks at ``--budget``
of them: the model a user would release (a final run) has the epsilon of its own run only if the tuning is not
counted. Counting it, the selected run is at most (K epsilon, K delta)-DP by basic composition over K = budget
runs; private selection (Liu & Talwar, STOC 2019; Papernot & Steinke, ICLR 2022) brings the cost down to a small
multiple of epsilon when the number of candidates is itself random. The study reports the per-run epsilon, as the
literature it compares with does, and says so; all contenders pay the same tuning cost.

Outputs in ``--study_dir``: ``study.csv`` (one row per run: phase, contender, configuration, the run's results CSV
columns, its PLD and RDP epsilon; an interrupted study resumes from it: runs already in it are skipped),
``study.md`` (per epsilon and contender: test accuracy mean ± std over the final seeds, the selected
hyperparameters, PLD and RDP epsilon, wall times) and ``accuracy_vs_epsilon.png``.

    python -m research.study --task=fashion_mnist --epsilons=0.4,2 --study_dir=runs/study/fashion_mnist --verbose=0

Every other flag (``--epochs``, ``--max_steps``, ``--idx_dir``, ...) applies to every run; ``--learning_rate`` and
``--initial_clip`` move the centres of the search. The flags the study sets per run (``--method``, ``--epsilon``,
``--seed``, ``--accountant``, ...) are refused.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys

import numpy as np
import tensorflow as tf
from absl import flags
from scipy.stats import qmc

if __package__ in (None, ""):  # Run as `python research/NAME.py`: make the package `research` importable.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from keras_dyndp import cli
from keras_dyndp import datasets
from keras_dyndp.tf_backend.keras_compat import keras
from research import results
from research import run_config
from research import run_flags
from research import study_report
from research import tasks
from research import trainer
from research.contenders import CONTENDERS

flags.adopt_module_key_flags(run_flags)


_SEARCH_DIMENSIONS = 2 + max(len(contender.parameters) for contender in CONTENDERS.values())

flags.DEFINE_list("contenders", list(CONTENDERS), f"Contenders, among {list(CONTENDERS)}.")
flags.DEFINE_integer("budget", 6, "Configurations tuned per contender and epsilon (the same for all), >= 1.")
flags.DEFINE_float("validation_fraction", 0.1, "Share of the training set held out for tuning, in (0, 0.5].")
flags.DEFINE_integer("tune_seed", 0, "Seed of every tuning run.")
flags.DEFINE_list("final_seeds", ["1", "2", "3"], "Seeds of the final runs of each selected configuration.")
flags.DEFINE_integer("search_seed", 0, "Seed of the Latin hypercube of configurations.")
flags.DEFINE_list("lr_range", ["0.25", "4"], "Learning rates searched: [lo, hi] times the task's, log-uniform.")
flags.DEFINE_list("clip_range", ["0.25", "4"], "Initial clips C_0 searched: [lo, hi] times the task's, log-uniform.")
flags.DEFINE_list(
    "inverse_ratio_range",
    ["0.1", "0.9"],
    "Range of 1/rho_mu, 1/rho_c and 1/lr_decay searched, uniform, within (0, 1] (the paper's grid is 0.1-0.8).",
)
flags.DEFINE_string("study_dir", None, "Output directory (study.csv, study.md, accuracy_vs_epsilon.png). Required.")

FLAGS = flags.FLAGS


@dataclasses.dataclass(frozen=True)
class SearchSpace:
    """Where the configurations are drawn: the task's defaults and the ranges around them."""

    learning_rate: float
    initial_clip: float
    optimizer: str = "sgd"
    lr_range: tuple[float, float] = (0.25, 4.0)
    clip_range: tuple[float, float] = (0.25, 4.0)
    inverse_ratio_range: tuple[float, float] = (0.1, 0.9)


def _log_uniform(unit: float, center: float, factors: tuple[float, float]) -> float:
    low, high = center * factors[0], center * factors[1]
    return float(low * (high / low) ** unit)


def configurations(contender: str, space: SearchSpace, budget: int, search_seed: int) -> list[dict]:
    """The `budget` configurations of `contender`: `RunConfig` field values, paired across contenders (the module
    docstring)."""
    spec = CONTENDERS[contender]
    points = qmc.LatinHypercube(d=_SEARCH_DIMENSIONS, seed=search_seed).random(budget)
    low, high = space.inverse_ratio_range
    result = []
    for point in points:
        rate = _log_uniform(point[0], space.learning_rate, space.lr_range)
        clip = _log_uniform(point[1], space.initial_clip, space.clip_range)
        values = dict(
            method=spec.method,
            # SGD's step scales with the gradient, so dividing it by C_t needs a learning rate C_0 times larger for
            # the same first step; Adam, Adagrad and RMSprop normalise the gradient's scale away.
            learning_rate=rate * clip if spec.rescale_to_unit_norm and space.optimizer == "sgd" else rate,
            initial_clip=clip,
            rho_mu=1.0,
            rho_c=1.0,
            lr_decay=1.0,
            rescale_to_unit_norm=spec.rescale_to_unit_norm,
            adaptive_clipping=spec.adaptive_clipping,
        )
        for offset, name in enumerate(spec.parameters):
            values[name] = 1.0 / (low + (high - low) * float(point[2 + offset]))
        result.append(values)
    return result


def validation_task(task: run_config.Task, fraction: float) -> run_config.Task:
    """`task` with its data replaced by a split of its training set: `fraction` of it (a fixed random subset) as
    the "test" set the run evaluates on, the rest as the training set. The task's test set is not passed on."""

    def load_data() -> datasets.TaskData:
        data = task.load_data()
        order = np.random.default_rng(0).permutation(data.num_train)
        held_out = max(1, round(fraction * data.num_train))
        val, train = order[:held_out], order[held_out:]
        return datasets.TaskData(
            x_train=data.x_train[train],
            y_train=data.y_train[train],
            x_test=data.x_train[val],
            y_test=data.y_train[val],
            num_classes=data.num_classes,
            description=f"{data.description}; tuning split: {len(train)} training / {len(val)} validation examples "
            "carved from the training set (the test set is not used)",
        )

    return dataclasses.replace(task, load_data=load_data)


_CONFIG_KEY = ("learning_rate", "initial_clip", "rho_mu", "rho_c", "lr_decay")


def _key(phase: str, epsilon: float, contender: str, values: dict, seed) -> tuple:
    return (
        phase,
        float(epsilon),
        contender,
        *(round(float(values[name]), 9) for name in _CONFIG_KEY),
        str(values["rescale_to_unit_norm"]) == "True",
        # Rows of a study.csv written before the column existed clipped at fixed norms.
        str(values.get("adaptive_clipping", False)) == "True",
        str(seed),
    )


def _score(row: dict) -> float:
    accuracy = float(row["test_accuracy"])
    return accuracy if math.isfinite(accuracy) else -math.inf


def select(tuning_rows: list[dict]) -> dict:
    """The tuning row with the best validation accuracy (its `test_accuracy` column, measured on the validation
    split); the lowest configuration index on ties."""
    return max(sorted(tuning_rows, key=lambda row: int(row["config_index"])), key=_score)


@dataclasses.dataclass
class Study:
    """One study: the task, its base `RunConfig` (calibrated and reported under PLD, without a results CSV or model
    directory of its own) and the search, run phase by phase into `study_dir`."""

    task: run_config.Task
    base: run_config.RunConfig
    study_dir: str
    _: dataclasses.KW_ONLY
    epsilons: list[float]
    contenders: list[str]
    budget: int
    space: SearchSpace
    validation_fraction: float = 0.1
    tune_seed: int = 0
    final_seeds: tuple[int, ...] = (1, 2, 3)
    search_seed: int = 0

    def __post_init__(self):
        self.base = dataclasses.replace(
            self.base, accountant="pld", report_accountant="pld", results_csv=None, model_dir=None
        )
        self.csv_path = os.path.join(self.study_dir, "study.csv")

    def _run(self, phase: str, epsilon: float, contender: str, index: int, values: dict, seed: int) -> None:
        task = self.task if phase == "final" else validation_task(self.task, self.validation_fraction)
        result = trainer.train(task, dataclasses.replace(self.base, epsilon=epsilon, seed=seed, **values))
        keras.backend.clear_session()
        row = {
            "phase": phase,
            "contender": contender,
            "config_index": index,
            "validation_fraction": self.validation_fraction if phase == "tune" else 0.0,
            **result.csv_row(),
            "epsilon_pld": result.epsilon_rigorous,  # The report's: its accountant is PLD (`__post_init__`).
            "epsilon_rdp": result.schedule.epsilon(result.config.delta, accountant="rdp", steps=result.steps),
        }
        results.append_csv_row(self.csv_path, row, upgrade=True)

    def _done(self) -> dict[tuple, dict]:
        return {
            _key(row["phase"], row["epsilon"], row["contender"], row, row["seed"]): row
            for row in results.read_csv_rows(self.csv_path)
        }

    def run(self) -> list[dict]:
        """Runs what `study.csv` lacks (tuning, then the finals of the selections) and returns the study's rows."""
        os.makedirs(self.study_dir, exist_ok=True)
        plan = {name: configurations(name, self.space, self.budget, self.search_seed) for name in self.contenders}
        for epsilon in self.epsilons:
            for name, configs in plan.items():
                for index, values in enumerate(configs):
                    if _key("tune", epsilon, name, values, self.tune_seed) not in self._done():
                        print(f"study: tune eps={epsilon:g} {name} #{index}: {values}", flush=True)
                        self._run("tune", epsilon, name, index, values, self.tune_seed)
        for epsilon in self.epsilons:
            for name, configs in plan.items():
                done = self._done()
                tuned = [done[_key("tune", epsilon, name, values, self.tune_seed)] for values in configs]
                index = int(select(tuned)["config_index"])
                for seed in self.final_seeds:
                    if _key("final", epsilon, name, configs[index], seed) not in done:
                        print(f"study: final eps={epsilon:g} {name} #{index} seed {seed}", flush=True)
                        self._run("final", epsilon, name, index, configs[index], seed)
        wanted = {
            _key(phase, epsilon, name, values, seed)
            for epsilon in self.epsilons
            for name, configs in plan.items()
            for values in configs
            for phase, seeds in (("tune", [self.tune_seed]), ("final", self.final_seeds))
            for seed in seeds
        }
        return [row for key, row in self._done().items() if key in wanted]


def _range(name: str, low_bound: float, high_bound: float) -> tuple[float, float]:
    numbers = tasks.floats(name, FLAGS[name].value, -math.inf, math.inf)
    if len(numbers) != 2:
        raise run_config.FlagError(f"--{name} takes two numbers, lo,hi. Received: {FLAGS[name].value}.")
    low, high = numbers
    if not low_bound < low <= high <= high_bound:
        raise run_config.FlagError(f"--{name} must be lo,hi with {low_bound:g} < lo <= hi <= {high_bound:g}.")
    return low, high


# Training flags the study sets for each run: given on its command line they would be overridden, so they are refused.
_PER_RUN_FLAGS = (
    "method",
    "epsilon",
    "rho_mu",
    "rho_c",
    "lr_decay",
    "rescale_to_unit_norm",
    "adaptive_clipping",
    "seed",
    "accountant",
    "report_accountant",
    "results_csv",
    "model_dir",
)


def study_from_flags() -> Study:
    """The `Study` the command line asks for; bad values raise `run_config.FlagError` naming the flag."""
    if not FLAGS.study_dir:
        raise run_config.FlagError("--study_dir is required.")
    given = [f"--{name}" for name in _PER_RUN_FLAGS if FLAGS[name].present]
    if given:
        raise run_config.FlagError(
            f"{', '.join(given)}: set by the study for each run (contenders, --epsilons, --tune_seed and "
            "--final_seeds; calibration and report under PLD; results in --study_dir). Leave them out."
        )
    if not FLAGS.contenders or not set(FLAGS.contenders) <= set(CONTENDERS):
        raise run_config.FlagError(f"--contenders must be among {list(CONTENDERS)}. Received: {FLAGS.contenders}.")
    if FLAGS.budget < 1:
        raise run_config.FlagError(f"--budget must be >= 1. Received: {FLAGS.budget}.")
    if not 0 < FLAGS.validation_fraction <= 0.5:
        raise run_config.FlagError(f"--validation_fraction must be in (0, 0.5]. Received: {FLAGS.validation_fraction}.")
    task = tasks.TASK_MODULES[FLAGS.task].make_task()
    epsilons = tasks.epsilons_from_flag(task.epsilon)
    try:
        final_seeds = tuple(int(seed) for seed in FLAGS.final_seeds)
    except ValueError as error:
        raise run_config.FlagError(f"--final_seeds must be integers: {error}") from error
    space = SearchSpace(
        learning_rate=task.learning_rate if FLAGS.learning_rate is None else FLAGS.learning_rate,
        initial_clip=task.initial_clip if FLAGS.initial_clip is None else FLAGS.initial_clip,
        optimizer=task.optimizer if FLAGS.optimizer is None else FLAGS.optimizer,
        lr_range=_range("lr_range", 0, math.inf),
        clip_range=_range("clip_range", 0, math.inf),
        inverse_ratio_range=_range("inverse_ratio_range", 0, 1),
    )
    return Study(
        task,
        run_flags.config_from_flags(),
        FLAGS.study_dir,
        epsilons=epsilons,
        contenders=list(FLAGS.contenders),
        budget=FLAGS.budget,
        space=space,
        validation_fraction=FLAGS.validation_fraction,
        tune_seed=FLAGS.tune_seed,
        final_seeds=final_seeds,
        search_seed=FLAGS.search_seed,
    )


def main() -> None:
    tf.get_logger().setLevel("ERROR")
    study = study_from_flags()
    rows = study.run()
    table = study_report.markdown_table(rows)
    with open(os.path.join(study.study_dir, "study.md"), "w") as handle:
        handle.write(table)
    print(table)
    study_report.plot(rows, os.path.join(study.study_dir, "accuracy_vs_epsilon.png"))


if __name__ == "__main__":
    cli.run(main)
