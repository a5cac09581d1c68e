"""Tests for research.trainer (through research.digits): RunConfig, fit loop, resume, results CSV, privacy summary,
error exits."""

import contextlib
import csv
import dataclasses
import functools
import io
import math
import os

import pytest
import tensorflow as tf
from absl import flags

import keras_dyndp
from keras_dyndp import cli
from keras_dyndp import datasets
from keras_dyndp import privacy_report
from keras_dyndp import schedules
from research import batches
from research import digits
from research import results
from research import run_config
from research import run_flags
from research import trainer

# The trainers run with --seed here, for reproducible tests; a seeded run's noise seed is known, which warns by design.
pytestmark = [
    pytest.mark.xdist_group("research_trainer"),  # its module fixtures run once (tests/conftest.py)
    pytest.mark.filterwarnings("ignore::keras_dyndp.core.noise_seed.NoiseSeedWarning"),
]

FLAGS = flags.FLAGS
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _train(**overrides) -> results.RunResult:
    settings = dict(seed=0, verbose=0, epochs=2.0, batch_size=64)
    settings.update(overrides)
    return trainer.train(digits.make_task(), run_config.RunConfig(**settings))


def _record_seeds(monkeypatch) -> tuple[list, list]:
    """Makes the trainer's DP optimizer and batches record their noise and batch seeds in the two lists returned."""
    noise_seeds, batch_seeds = [], []
    plain_cls, dp_cls = trainer.OPTIMIZERS["sgd"]

    def recording_dp_cls(**kwargs):
        noise_seeds.append(kwargs["noise_seed"])
        return dp_cls(**kwargs)

    real_train_batches = batches.train_batches

    def recording_train_batches(config, data, p, seed, num_steps, **kwargs):
        batch_seeds.append(seed)
        return real_train_batches(config, data, p, seed, num_steps, **kwargs)

    monkeypatch.setitem(trainer.OPTIMIZERS, "sgd", (plain_cls, recording_dp_cls))
    monkeypatch.setattr(batches, "train_batches", recording_train_batches)
    return noise_seeds, batch_seeds


@pytest.fixture(name="train_once", scope="module")
def fixture_train_once(tmp_path_factory):
    """``train_once(**overrides)`` -> (result, stdout, overrides): `_train` once per module for each set of
    overrides, for the tests that read different things off the same run. ``model_dir=True`` or
    ``results_csv=True`` becomes a path in a fresh folder (in the overrides returned)."""

    @functools.cache
    def train(**overrides):
        for name in ("model_dir", "results_csv"):
            if overrides.get(name) is True:
                overrides[name] = str(tmp_path_factory.mktemp("run") / name)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            result = _train(**overrides)
        return result, out.getvalue(), overrides

    return train


@pytest.fixture(name="resumed_run", scope="module")
def fixture_resumed_run(tmp_path_factory):
    """A run stopped at step 3 and resumed to step 7 in one model_dir, with the noise and batch seeds each run's
    optimizer and batches got: (first result, resumed result, the resumed run's stdout, model_dir, noise seeds,
    batch seeds)."""
    model_dir = str(tmp_path_factory.mktemp("resumed") / "run")
    out = io.StringIO()
    with pytest.MonkeyPatch.context() as monkeypatch:
        noise_seeds, batch_seeds = _record_seeds(monkeypatch)
        first = _train(model_dir=model_dir, max_steps=3)
        logs_after_the_first_run = os.listdir(os.path.join(model_dir, "logs"))
        with contextlib.redirect_stdout(out):
            resumed = _train(model_dir=model_dir, max_steps=7)  # resumed at step 3
    return first, logs_after_the_first_run, resumed, out.getvalue(), model_dir, noise_seeds, batch_seeds


def test_short_dynamic_run_reports_privacy_and_appends_csv(tmp_path, capsys):
    csv_path = str(tmp_path / "results.csv")
    first = _train(max_steps=4, results_csv=csv_path)
    second = _train(max_steps=4, results_csv=csv_path, method="vanilla")
    out = capsys.readouterr().out
    assert "GDP-CLT" in out and "PLD (rigorous upper bound)" in out and "Test accuracy" in out
    assert first.steps == 4 and first.total_steps == math.ceil(2 * 1437 / 64)
    # Four steps spend only part of the budget; the rigorous bound is above the CLT approximation.
    assert 0 < first.epsilon_gdp_clt < 3.0 and first.epsilon_rigorous > first.epsilon_gdp_clt
    assert first.config.delta == pytest.approx(1 / 14370)
    with open(csv_path) as handle:
        rows = list(csv.DictReader(handle))
    assert [row["method"] for row in rows] == ["dynamic", "vanilla"]
    assert rows[0]["task"] == "digits" and int(rows[0]["steps"]) == 4
    assert float(rows[1]["test_accuracy"]) == pytest.approx(second.test_accuracy)
    assert set(rows[0]) >= {"epsilon", "delta", "seed", "test_accuracy", "epsilon_gdp_clt", "epsilon_rigorous"}


def test_results_csv_keeps_its_flat_columns(train_once):
    """The CSV row flattens the run's config and measurements into flat columns, those of earlier versions first,
    so a sweep resumes from an old results.csv."""
    result, _, overrides = train_once(method="nonprivate", max_steps=5, results_csv=True)
    with open(overrides["results_csv"]) as handle:
        (row,) = list(csv.DictReader(handle))
    assert (
        list(row)
        == (
            "task method epsilon delta rho_mu rho_c initial_clip learning_rate batch_size epochs sampling seed "
            "lr_decay rescale_to_unit_norm adaptive_clipping steps total_steps test_accuracy epsilon_gdp_clt "
            "epsilon_rigorous rigorous_accountant wall_time_s"
        ).split()
    )
    assert (row["task"], row["method"], row["epsilon"], row["rigorous_accountant"]) == (
        "digits",
        "nonprivate",
        "inf",
        "none",
    )
    assert math.isinf(result.config.epsilon) and row["batch_size"] == "64" and row["steps"] == "5"


def test_learning_rate_decays_geometrically_over_the_run_like_the_clip():
    config = run_config.RunConfig(learning_rate=0.8, lr_decay=4.0)
    rate = trainer.learning_rate(config, num_steps=10)
    assert [float(rate(k)) for k in (-1, 4, 9)] == pytest.approx([0.8, 0.4, 0.2])  # lr_t at the counter's k = t - 1
    clips = schedules.calibrate(
        "sensitivity_decay",
        target_epsilon=1.0,
        target_delta=1e-5,
        sampling_probability=0.01,
        num_steps=10,
        initial_clip=0.8,
        rho_c=4.0,
    ).clip_norms
    assert [float(rate(k)) for k in range(10)] == pytest.approx(list(clips))  # the clip decay's family and index
    assert trainer.learning_rate(run_config.RunConfig(learning_rate=0.8), num_steps=10) == 0.8


def test_lr_decay_and_rescaling_reach_the_optimizer(tmp_path):
    config = run_config.RunConfig(
        learning_rate=0.5, lr_decay=2.0, rescale_to_unit_norm=True, optimizer="sgd", batch_size=64
    ).resolved(digits.make_task(), 1437)
    schedule, _, num_steps = trainer.make_schedule(config, 1437)
    optimizer = trainer.make_optimizer(config, schedule, num_steps)
    assert optimizer.rescale_to_unit_norm
    assert float(optimizer.learning_rate) == pytest.approx(0.5 * 2.0 ** (-1 / num_steps))
    result = _train(max_steps=2, lr_decay=2.0, rescale_to_unit_norm=True, results_csv=str(tmp_path / "r.csv"))
    assert result.steps == 2 and result.config.lr_decay == 2.0
    with open(tmp_path / "r.csv") as handle:
        (row,) = list(csv.DictReader(handle))
    assert (row["lr_decay"], row["rescale_to_unit_norm"]) == ("2.0", "True")


def test_adaptive_clipping_reaches_the_optimizer_and_the_results_csv(tmp_path):
    config = run_config.RunConfig(method="vanilla", adaptive_clipping=True, batch_size=64)
    config = config.resolved(digits.make_task(), 1437)
    schedule, _, num_steps = trainer.make_schedule(config, 1437)
    optimizer = trainer.make_optimizer(config, schedule, num_steps)
    # keras_dyndp.AdaptiveClipping's defaults, the paper's: the median, learning rate 0.2, count noise n / 20.
    assert optimizer.adaptive_clipping == keras_dyndp.AdaptiveClipping()
    plain = trainer.make_optimizer(dataclasses.replace(config, adaptive_clipping=False), schedule, num_steps)
    assert plain.adaptive_clipping is None
    result = _train(method="vanilla", max_steps=2, adaptive_clipping=True, results_csv=str(tmp_path / "r.csv"))
    assert result.steps == 2 and result.config.adaptive_clipping
    with open(tmp_path / "r.csv") as handle:
        (row,) = list(csv.DictReader(handle))
    assert (row["method"], row["adaptive_clipping"]) == ("vanilla", "True")
    with pytest.raises(run_config.FlagError, match="--adaptive_clipping applies to the DP methods"):
        _train(method="nonprivate", adaptive_clipping=True)


def test_full_budget_run_spends_the_target_under_the_pld_by_default(capsys):
    assert (FLAGS["accountant"].default, FLAGS["report_accountant"].default) == ("pld", "pld")
    result = _train(epochs=1.0, batch_size=256, epsilon=2.0, method="sensitivity_decay")
    assert result.steps == result.total_steps == math.ceil(1437 / 256)
    assert result.rigorous_accountant == "pld" and 1.998 <= result.epsilon_rigorous <= 2.0
    assert result.config.accountant == "pld" and run_config.RunConfig().report_accountant == "pld"
    assert result.epsilon_gdp_clt < 1.5  # 6 steps at p = 0.18: far from the CLT's regime.
    assert "budget calibrated under pld: target epsilon 2" in capsys.readouterr().out


def test_gdp_clt_budget_reproduces_the_paper_and_warns():
    with pytest.warns(schedules.GdpCltUnderstatementWarning, match="under the GDP-CLT"):
        result = _train(epochs=1.0, batch_size=256, epsilon=2.0, method="sensitivity_decay", accountant="gdp_clt")
    assert result.epsilon_gdp_clt == pytest.approx(2.0, rel=1e-9) and result.epsilon_rigorous > 2.1


@pytest.mark.parametrize("method", ["zcdp", "tcdp"])
def test_baseline_methods_spend_their_own_budget(method, capsys):
    result = _train(epochs=1.0, batch_size=128, epsilon=2.0, method=method)
    own = float(capsys.readouterr().out.split(f"{method} (the baseline's own accountant): ")[1].split()[0])
    assert result.steps == result.total_steps and own == pytest.approx(2.0, abs=1e-4)
    # Both baselines account more loosely than RDP: the rigorous epsilon of the same noise is lower.
    assert result.epsilon_rigorous < own and result.config.rho_mu == 1.25
    with pytest.raises(run_config.FlagError, match=f"--method={method} is calibrated by its own accountant"):
        _train(method=method, accountant="rdp", max_steps=1)


def test_tcdp_outside_its_subsampling_theorem_is_a_flag_error():
    # p = 256 / 1437 = 0.18: Bun et al.'s theorem needs a sampling fraction <= 0.1.
    with pytest.raises(run_config.FlagError, match=r"`sampling_probability` must be <= 0.1 for the tCDP baseline"):
        _train(epochs=1.0, batch_size=256, method="tcdp")


def test_shuffled_batches_are_flagged_as_approximate(capsys):
    with pytest.warns(UserWarning, match="not batches returned by keras_dyndp.poisson_batches"):
        result = _train(sampling="shuffle", max_steps=2)
    assert result.steps == 2 and result.config.sampling == "shuffle"
    assert "these epsilons assume Poisson sampling and are approximate" in capsys.readouterr().out


def test_nonprivate_run(train_once):
    result, _, _ = train_once(method="nonprivate", max_steps=5, results_csv=True)
    assert result.steps == 5 and math.isinf(result.epsilon_gdp_clt) and result.config.sampling == "shuffle"


def test_resume_restores_the_step_counter_and_refuses_another_schedule(resumed_run):
    first, logs_after_the_first_run, resumed, out, model_dir, _, _ = resumed_run
    assert first.steps == 3
    assert os.path.exists(os.path.join(model_dir, "run_config.json"))
    assert logs_after_the_first_run
    assert resumed.steps == 7
    assert f"Resumed from {model_dir} at step 3 of 45." in out
    # A finished run is not trained further: rerunning only evaluates and reports.
    assert _train(model_dir=model_dir, max_steps=7).steps == 7
    with pytest.raises(run_config.FlagError, match="different DP schedule"):
        _train(model_dir=model_dir, epsilon=1.0)
    with pytest.raises(run_config.FlagError, match="method"):
        _train(model_dir=model_dir, method="nonprivate")
    # The same schedule clipped adaptively is another mechanism: its C_t are not the saved run's clip norms.
    with pytest.raises(run_config.FlagError, match="holds a run with --adaptive_clipping=False, not True"):
        _train(model_dir=model_dir, max_steps=7, adaptive_clipping=True)


def test_model_dir_gets_the_privacy_curve_at_the_epoch_ends(tmp_path, capsys, monkeypatch):
    plot, calls = privacy_report.plot_run_privacy, []

    def spy(*args, **kwargs):
        calls.append((args, kwargs))
        return plot(*args, **kwargs)

    monkeypatch.setattr(privacy_report, "plot_run_privacy", spy)
    model_dir = str(tmp_path / "run")
    assert _train(model_dir=model_dir, batch_size=512, epochs=3.0).steps == 9  # 3 epochs of 3 steps
    path = os.path.join(model_dir, "privacy_curve.png")
    assert f"Privacy curve: {path}" in capsys.readouterr().out
    with open(path, "rb") as handle:
        assert handle.read(8) == b"\x89PNG\r\n\x1a\n"
    assert os.path.getsize(path) > 1000
    ((args, kwargs),) = calls
    assert list(args[3]) == [3, 6, 9] and kwargs["accountant"] == "pld"


def test_batch_size_larger_than_data_is_a_flag_error():
    with pytest.raises(run_config.FlagError, match="--batch_size must be <= N = 1437"):
        _train(batch_size=2000)


def test_missing_data_exits_2_with_one_line(capsys):
    def task():
        def load():
            raise datasets.DataNotFoundError("nothing in /nowhere. Get it with: magic.")

        return run_config.Task(
            name="x",
            load_data=load,
            build_model=digits.build_model,
            epsilon=1.0,
            learning_rate=0.1,
            initial_clip=1.0,
            batch_size=10,
            epochs=1,
        )

    with pytest.raises(SystemExit) as exit_info:
        cli.main_for(lambda: trainer.train(task(), run_flags.config_from_flags()))(["x.py"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip() == "x.py: error: nothing in /nowhere. Get it with: magic."


def _tensorboard_tags(model_dir: str) -> set[str]:
    tags = set()
    for root, _, files in os.walk(os.path.join(model_dir, "logs")):
        for name in files:
            for event in tf.compat.v1.train.summary_iterator(os.path.join(root, name)):
                tags.update(value.tag for value in event.summary.value)
    return tags


@pytest.mark.parametrize("per_example", ["fast", "jacobian"])
def test_training_batch_metrics_only_with_the_flag(per_example, train_once, tmp_path, capsys):
    quiet, out, overrides = train_once(per_example=per_example, batch_size=16, max_steps=2, verbose=2, model_dir=True)
    assert quiet.steps == 2 and " - loss: " not in out and " - accuracy: " not in out
    assert "training batches: no loss or metric computed" in out
    tags = _tensorboard_tags(overrides["model_dir"])
    assert "privacy/epsilon_gdp_clt" in tags and not {"epoch_loss", "epoch_accuracy"} & tags
    _train(
        per_example=per_example,
        batch_size=16,
        max_steps=2,
        verbose=2,
        model_dir=str(tmp_path / "b"),
        training_metrics=True,
    )
    out = capsys.readouterr().out
    assert " - loss: " in out and " - accuracy: " in out and "OUTSIDE the DP guarantee" in out
    assert {"epoch_loss", "epoch_accuracy"} <= _tensorboard_tags(str(tmp_path / "b"))


def test_generic_jacobian_path_runs(train_once):
    result, _, _ = train_once(per_example="jacobian", batch_size=16, max_steps=2, verbose=2, model_dir=True)
    assert result.steps == 2 and result.epsilon_gdp_clt > 0


def test_seeded_resume_draws_fresh_noise_and_batches_through_their_own_seeds(resumed_run, monkeypatch):
    *_, noise_seeds, batch_seeds = resumed_run  # the stopped run's, then the resumed run's
    unseeded_noise_seeds, unseeded_batch_seeds = _record_seeds(monkeypatch)
    _train(max_steps=1, seed=None)
    noise_seeds, batch_seeds = noise_seeds + unseeded_noise_seeds, batch_seeds + unseeded_batch_seeds
    assert noise_seeds[2] is None and batch_seeds[2] is None  # no --seed: OS entropy for both
    seeds = noise_seeds[:2] + batch_seeds[:2]
    assert None not in seeds and len(set(seeds)) == 4  # per resume point, and noise apart from batches
    assert noise_seeds[1] == batches.derived_seed(0, 3, batches.NOISE_STREAM)  # reproducible from --seed


def test_progress_bar_shows_the_steps_a_cut_epoch_takes(capsys):
    _train(max_steps=30, verbose=1)  # 45 Poisson steps in 2 epochs (N 1437, batch 64): 23, then 7 of 22
    out = capsys.readouterr().out
    assert "45 steps = 2 Keras epochs of 22-23 steps" in out and "stopping after step 30" in out
    assert "Epoch 1/2" in out and "Epoch 1/1" not in out and "Epoch 3/" not in out  # one count across fit calls
    last_epoch = out.split("Epoch 2/2")[1]
    assert "7/7" in last_epoch and "/22" not in last_epoch
