"""Tests for research.study on generated data: paired equal-budget configurations, the validation split, selection on
validation accuracy only, the test set read once per final run, resume, table and plot."""

import dataclasses
import math
import os

import numpy as np
import pytest
from absl import flags
from absl.testing import flagsaver

from keras_dyndp import cli
from keras_dyndp import datasets
from keras_dyndp import schedules
from keras_dyndp.tf_backend.keras_compat import keras
from research import results
from research import run_config
from research import study
from research import study_report
from research import trainer

# The trainers run with --seed here, for reproducible tests; a seeded run's noise seed is known, which warns by design.
pytestmark = pytest.mark.filterwarnings("ignore::keras_dyndp.core.noise_seed.NoiseSeedWarning")

FLAGS = flags.FLAGS
SPACE = study.SearchSpace(learning_rate=0.5, initial_clip=2.0)


def blobs() -> datasets.TaskData:
    """Two Gaussian blobs in 4 dimensions; the test set sits at +-100 on its first coordinate, so that a test row
    can be told from a training row."""
    rng = np.random.default_rng(0)
    y_train = rng.integers(0, 2, 300)
    x_train = (rng.normal(size=(300, 4)) + 1.5 * (2 * y_train[:, None] - 1)).astype(np.float32)
    y_test = rng.integers(0, 2, 60)
    x_test = (rng.normal(size=(60, 4)) + 1.5 * (2 * y_test[:, None] - 1)).astype(np.float32)
    x_test[:, 0] = 100.0 * np.sign(x_test[:, 0] + 1e-9)
    return datasets.TaskData(x_train, y_train, x_test, y_test, num_classes=2, description="blobs")


def blob_task() -> run_config.Task:
    return run_config.Task(
        name="blobs",
        load_data=blobs,
        build_model=lambda data: keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)]),
        epsilon=2.0,
        learning_rate=0.5,
        initial_clip=2.0,
        batch_size=30,
        epochs=1.0,
    )


def test_every_contender_gets_the_budget_paired_on_learning_rate_and_clip():
    budget = 6
    plans = {name: study.configurations(name, SPACE, budget, search_seed=3) for name in study.CONTENDERS}
    assert all(len(configs) == budget for configs in plans.values())
    for i in range(budget):
        vanilla = plans["vanilla"][i]
        for name in ("vanilla_lr_decay", "sensitivity_decay", "growing_mu", "dynamic"):
            assert (plans[name][i]["learning_rate"], plans[name][i]["initial_clip"]) == (
                vanilla["learning_rate"],
                vanilla["initial_clip"],
            )
        # The rescaled update is divided by C_t: its learning rate times 1/C_0 is dynamic's, so the first steps agree.
        rescaled, dynamic = plans["dynamic_rescaled"][i], plans["dynamic"][i]
        assert rescaled["learning_rate"] == pytest.approx(dynamic["learning_rate"] * dynamic["initial_clip"])
        assert (rescaled["rho_mu"], rescaled["rho_c"], rescaled["rescale_to_unit_norm"]) == (
            dynamic["rho_mu"],
            dynamic["rho_c"],
            True,
        )
        # Clip decay and learning-rate decay by the same ratio; schedules the other contenders do not use stay off.
        assert plans["sensitivity_decay"][i]["rho_c"] == plans["vanilla_lr_decay"][i]["lr_decay"] > 1
        assert plans["growing_mu"][i]["rho_mu"] == dynamic["rho_mu"] > 1
        assert (vanilla["rho_mu"], vanilla["rho_c"], vanilla["lr_decay"]) == (1.0, 1.0, 1.0)
        # Adaptive clipping: vanilla's configuration i clipped adaptively from its C_0; no coordinates of its own.
        assert plans["adaptive"][i] == {**vanilla, "adaptive_clipping": True}
        assert not any(plans[name][i]["adaptive_clipping"] for name in plans if name != "adaptive")
    rates = sorted(config["learning_rate"] for config in plans["vanilla"])
    clips = [config["initial_clip"] for config in plans["vanilla"]]
    inverse_decays = [1 / config["rho_c"] for config in plans["sensitivity_decay"]]
    assert 0.125 <= rates[0] and rates[-1] <= 2.0 and all(0.5 <= clip <= 8.0 for clip in clips)
    assert all(0.1 <= value <= 0.9 for value in inverse_decays)
    # Latin hypercube: one configuration in each sixth of every coordinate's range.
    strata = sorted(int(budget * math.log(rate / 0.125) / math.log(16)) for rate in rates)
    assert strata == list(range(budget))
    assert sorted(int(budget * (value - 0.1) / 0.8) for value in inverse_decays) == list(range(budget))
    assert study.configurations("dynamic", SPACE, budget, search_seed=4) != plans["dynamic"]
    adam = dataclasses.replace(SPACE, optimizer="adam")  # scale-invariant: the rescaled contender's rate is dynamic's
    assert [config["learning_rate"] for config in study.configurations("dynamic_rescaled", adam, budget, 3)] == [
        config["learning_rate"] for config in plans["dynamic"]
    ]


def test_validation_task_splits_the_training_set_and_leaves_the_test_set_out():
    data = study.validation_task(blob_task(), 0.2).load_data()
    full = blobs()
    assert (data.num_train, len(data.y_test)) == (240, 60)
    assert np.all(np.abs(data.x_test[:, 0]) < 100) and np.all(np.abs(data.x_train[:, 0]) < 100)
    rows = {tuple(row) for row in full.x_train}
    train_rows, val_rows = {tuple(row) for row in data.x_train}, {tuple(row) for row in data.x_test}
    assert train_rows | val_rows == rows and not train_rows & val_rows
    again = study.validation_task(blob_task(), 0.2).load_data()
    np.testing.assert_array_equal(again.x_test, data.x_test)  # a fixed split: every tuning run sees the same


def _fake_train(calls):
    """A stand-in for trainer.train: the "accuracy" of a run on the validation split favours the configuration with
    the smallest initial clip; on the test set, the largest (plus a seed and a rescaling term). Records what data
    each run evaluated on."""

    def train(task, config):
        data = task.load_data()
        on_test = bool(np.all(np.abs(data.x_test[:, 0]) == 100))
        calls.append(dict(on_test=on_test, config=config, x_test_rows=len(data.x_test)))
        bonus = 0.01 * config.seed + (0.02 if config.rescale_to_unit_norm else 0.0)
        accuracy = config.initial_clip / 10 + bonus if on_test else 1 / config.initial_clip
        config = config.resolved(task, data.num_train)
        schedule = schedules.DPSchedule([config.initial_clip] * 3, [config.initial_clip] * 3, 0.1)
        return results.RunResult(task.name, config, 3, 3, accuracy, 1.0, 1.0, 0.5, schedule=schedule)

    return train


def test_selection_reads_validation_accuracy_only_and_finals_read_the_test_set_once_each(tmp_path, monkeypatch):
    calls, cleared = [], []
    monkeypatch.setattr(trainer, "train", _fake_train(calls))
    # The stand-in builds no model: the session a run leaves is cleared (counted), without the full garbage
    # collection of a process that earlier tests filled (seconds per run).
    monkeypatch.setattr(keras.backend, "clear_session", lambda: cleared.append(len(calls)))
    contenders = ["vanilla", "dynamic_rescaled"]

    def make_study():
        return study.Study(
            blob_task(),
            run_config.RunConfig(verbose=0),
            str(tmp_path),
            epsilons=[1.0, 2.0],
            contenders=contenders,
            budget=4,
            space=SPACE,
            final_seeds=(1, 2),
        )

    rows = make_study().run()
    tuning, finals = calls[:16], calls[16:]
    assert len(calls) == 2 * 2 * 4 + 2 * 2 * 2 and cleared == list(range(1, 25))  # after every run
    assert not any(call["on_test"] for call in tuning) and all(call["config"].seed == 0 for call in tuning)
    assert all(call["on_test"] for call in finals)
    assert sorted(call["config"].seed for call in finals) == [1] * 4 + [2] * 4
    assert all(call["config"].accountant == "pld" for call in calls)
    for epsilon in (1.0, 2.0):
        for name in contenders:
            configs = study.configurations(name, SPACE, 4, 0)
            smallest = min(range(4), key=lambda i: configs[i]["initial_clip"])
            chosen = {
                row["config_index"]
                for row in rows
                if row["phase"] == "final" and row["contender"] == name and float(row["epsilon"]) == epsilon
            }
            assert chosen == {str(smallest)}  # validation's choice, although the test set prefers another
    # Resume: nothing left to run.
    rows_again = make_study().run()
    assert len(calls) == 24 and len(rows_again) == len(rows) == 24
    table = study_report.markdown_table(rows)
    assert table.count("| vanilla |") == 2 and table.count("| dynamic_rescaled |") == 2
    # The fake test accuracy of a final run is C_0 / 10 + seed / 100 (+ 0.02 rescaled): the seeds spread each
    # contender's accuracy, the paired difference is exactly 2 points.
    assert table.count("| +2.00 ± 0.00 |") == 2


def test_a_study_csv_without_the_adaptive_column_resumes_and_adds_the_adaptive_contender(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(trainer, "train", _fake_train(calls))
    monkeypatch.setattr(keras.backend, "clear_session", lambda: None)

    def make_study(contenders):
        return study.Study(
            blob_task(),
            run_config.RunConfig(verbose=0),
            str(tmp_path),
            epsilons=[1.0],
            contenders=contenders,
            budget=2,
            space=SPACE,
            final_seeds=(1,),
        )

    make_study(["vanilla"]).run()
    path = tmp_path / "study.csv"
    old = [{k: v for k, v in row.items() if k != "adaptive_clipping"} for row in results.read_csv_rows(str(path))]
    path.unlink()
    for row in old:  # the study.csv of an earlier version
        results.append_csv_row(str(path), row)
    rows = make_study(["vanilla", "adaptive"]).run()
    assert len(calls) == 3 + 3 and all(call["config"].adaptive_clipping for call in calls[3:])
    pairs = {(row["contender"], row["adaptive_clipping"]) for row in rows}
    assert pairs == {("vanilla", "False"), ("adaptive", "True")}  # the old rows read as fixed-clip runs
    assert "| adaptive |" in study_report.markdown_table(rows)


def test_a_real_study_on_generated_data_writes_csv_table_and_plot(tmp_path):
    run = study.Study(
        blob_task(),
        run_config.RunConfig(verbose=0),
        str(tmp_path),
        epsilons=[2.0],
        contenders=["vanilla", "sensitivity_decay"],
        budget=1,
        space=SPACE,
        final_seeds=(1,),
    )
    rows = run.run()
    assert sorted((row["phase"], row["contender"]) for row in rows) == [
        ("final", "sensitivity_decay"),
        ("final", "vanilla"),
        ("tune", "sensitivity_decay"),
        ("tune", "vanilla"),
    ]
    for row in rows:  # Each run calibrated under PLD to the target and spent in full; RDP is looser.
        assert int(row["steps"]) == int(row["total_steps"]) and row["rigorous_accountant"] == "pld"
        assert 1.98 <= float(row["epsilon_pld"]) <= 2.0 < float(row["epsilon_rdp"])
    finals = [row for row in rows if row["phase"] == "final"]
    assert all(float(row["delta"]) == pytest.approx(1 / 3000) for row in finals)
    tuned = [row for row in rows if row["phase"] == "tune"]
    assert all(float(row["delta"]) == pytest.approx(1 / 2700) for row in tuned)  # N of the 90% split
    study_report.plot(rows, str(tmp_path / "plot.png"))
    assert os.path.getsize(tmp_path / "plot.png") > 1000
    assert "sensitivity_decay" in study_report.markdown_table(rows)


@pytest.mark.parametrize(
    "override, match",
    [
        (dict(contenders=["vanilla", "bogus"]), "--contenders must be among"),
        (dict(budget=0), "--budget must be >= 1"),
        (dict(validation_fraction=0.7), r"--validation_fraction must be in \(0, 0.5\]"),
        (dict(lr_range=["4", "1"]), "--lr_range must be lo,hi"),
        (dict(inverse_ratio_range=["0.1", "1.5"]), "--inverse_ratio_range must be lo,hi"),
        (dict(clip_range=["1"]), "--clip_range takes two numbers"),
        (dict(epsilons=["-1"]), "--epsilons values must be in"),
        (dict(study_dir=None), "--study_dir is required"),
    ],
)
def test_bad_flags_are_flag_errors(override, match, tmp_path):
    settings = dict(task="digits", study_dir=str(tmp_path))
    settings.update(override)
    with flagsaver.flagsaver(**settings):
        with pytest.raises(run_config.FlagError, match=match):
            study.study_from_flags()


@pytest.mark.parametrize(
    "flag", ["--method=vanilla", "--accountant=gdp_clt", "--seed=3", "--lr_decay=2", "--adaptive_clipping"]
)
def test_flags_the_study_sets_per_run_are_refused(flag, tmp_path):
    with flagsaver.flagsaver():
        cli.parse_flags(["study.py", "--task=digits", f"--study_dir={tmp_path}", flag])
        with pytest.raises(run_config.FlagError, match=f"{flag.split('=')[0]}: set by the study for each run"):
            study.study_from_flags()


def test_flags_build_the_study():
    with flagsaver.flagsaver(task="digits", study_dir="/tmp/x", epsilons=["1", "3"], budget=7, final_seeds=["5"]):
        built = study.study_from_flags()
    assert (built.epsilons, built.budget, built.final_seeds, built.contenders) == (
        [1.0, 3.0],
        7,
        (5,),
        list(study.CONTENDERS),
    )
    assert (built.base.accountant, built.base.report_accountant) == ("pld", "pld")
    assert dataclasses.replace(built.space, lr_range=(0.25, 4.0)) == built.space
    assert built.space.optimizer == "sgd"
