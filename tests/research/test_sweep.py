"""Tests for research.sweep: grid construction, in-process runs, resume, table and heat map."""

import math

import pytest
from absl import flags
from absl.testing import flagsaver

from keras_dyndp import schedules
from research import results
from research import run_config
from research import run_flags
from research import sweep

# The trainers run with --seed here, for reproducible tests; a seeded run's noise seed is known, which warns by design.
pytestmark = pytest.mark.filterwarnings("ignore::keras_dyndp.core.noise_seed.NoiseSeedWarning")

FLAGS = flags.FLAGS


def test_configurations_cover_each_methods_grid():
    with flagsaver.flagsaver(
        methods=["nonprivate", "vanilla", "growing_mu", "sensitivity_decay", "dynamic", "zcdp"],
        epsilons=["0.5", "2"],
        inv_rho_mus=["0.8", "0.5"],
        inv_rho_cs=["0.3"],
        seeds=["0", "1"],
    ):
        runs = sweep.configurations(task_epsilon=3.0)
    count = {method: sum(run["method"] == method for run in runs) for method in run_flags.METHODS}
    # Per seed: nonprivate 1; vanilla 1 per epsilon; growing_mu and zcdp 2, sensitivity_decay 1, dynamic 2 x 1 per
    # epsilon; tcdp not asked for.
    assert count == {
        "nonprivate": 2,
        "vanilla": 4,
        "growing_mu": 8,
        "sensitivity_decay": 4,
        "dynamic": 8,
        "zcdp": 8,
        "tcdp": 0,
    }
    assert {run["rho_mu"] for run in runs if run["method"] == "zcdp"} == {1 / 0.8, 1 / 0.5}
    dynamic = [run for run in runs if run["method"] == "dynamic"]
    assert {(run["rho_mu"], run["rho_c"]) for run in dynamic} == {(1 / 0.8, 1 / 0.3), (1 / 0.5, 1 / 0.3)}
    assert all(math.isinf(run["epsilon"]) for run in runs if run["method"] == "nonprivate")


@pytest.mark.parametrize(
    "override", [dict(inv_rho_mus=["1.5"]), dict(epsilons=["-1"]), dict(seeds=["a"]), dict(methods=["magic"])]
)
def test_bad_grids_are_flag_errors(override):
    with flagsaver.flagsaver(**override):
        with pytest.raises(run_config.FlagError):
            sweep.configurations(task_epsilon=3.0)


def test_in_process_sweep_writes_csv_table_heatmap_and_resumes(tmp_path, capsys):
    settings = dict(
        task="digits",
        methods=["vanilla", "dynamic"],
        epsilons=["2"],
        inv_rho_mus=["0.8", "0.5"],
        inv_rho_cs=["0.3"],
        seeds=["0"],
        sweep_dir=str(tmp_path),
        max_steps=2,
        verbose=0,
        epochs=1.0,
    )
    with flagsaver.flagsaver(**settings):
        sweep.sweep()
        rows = results.read_csv_rows(str(tmp_path / "results.csv"))
        assert len(rows) == 3
        sweep.sweep()  # Everything is done: nothing runs again.
    assert len(results.read_csv_rows(str(tmp_path / "results.csv"))) == 3
    assert "0 to go" in capsys.readouterr().out
    table = (tmp_path / "table.md").read_text()
    assert table.startswith("| method | ε = 2 |") and "| vanilla |" in table and "1/ρ_μ=" in table
    assert (tmp_path / "heatmap_eps2.png").stat().st_size > 1000


def test_markdown_table_mean_and_std():
    def row(method, eps, acc, seed, rho_mu=1.0):
        return dict(
            task="t",
            method=method,
            epsilon=str(eps),
            rho_mu=str(rho_mu),
            rho_c="1.0",
            seed=str(seed),
            test_accuracy=str(acc),
            epsilon_rigorous="1.5",
            rigorous_accountant="rdp",
        )

    rows = [
        row("vanilla", 1, 0.8, 0),
        row("vanilla", 1, 0.9, 1),
        row("nonprivate", "inf", 0.95, 0),
        row("growing_mu", 1, 0.5, 0, rho_mu=2.0),
        row("growing_mu", 1, 0.7, 0, rho_mu=1.25),
    ]
    table = sweep.markdown_table(rows)
    assert "| nonprivate | 95.00 ± 0.00 (n=1) |" in table
    assert "| vanilla | 85.00 ± 7.07 (n=2; RDP ε ≤ 1.50) |" in table
    assert "70.00 ± 0.00 (n=1; RDP ε ≤ 1.50; 1/ρ_μ=0.8, 1/ρ_c=1)" in table


def test_subprocess_sweep_forwards_flags(example_server, tmp_path):
    completed = example_server.run(
        "research.sweep",
        [
            "--task=digits",
            "--methods=vanilla",
            "--epsilons=2",
            "--seeds=3",
            f"--sweep_dir={tmp_path}",
            "--subprocess",
            "--max_steps=2",
            "--verbose=0",
            "--batch_size=100",
        ],
        timeout=240,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    (row,) = results.read_csv_rows(str(tmp_path / "results.csv"))
    assert (row["method"], row["seed"], row["steps"], row["batch_size"]) == ("vanilla", "3", "2", "100")


def test_accountant_is_forwarded_to_the_paper_methods_only(tmp_path):
    settings = dict(
        task="digits",
        methods=["vanilla", "zcdp"],
        epsilons=["2"],
        inv_rho_mus=["0.8"],
        seeds=["0"],
        sweep_dir=str(tmp_path),
        max_steps=1,
        verbose=0,
        epochs=1.0,
    )
    with flagsaver.flagsaver(**settings):
        FLAGS["accountant"].parse("gdp_clt")  # As if given on the sweep's command line.
        assert "--accountant=gdp_clt" in sweep._forwarded_arguments("vanilla")  # pylint: disable=protected-access
        assert "--accountant=gdp_clt" not in sweep._forwarded_arguments("zcdp")  # pylint: disable=protected-access
        # The vanilla run is calibrated under the GDP-CLT (so its optimizer warns); the zcdp run would refuse
        # --accountant=gdp_clt (a FlagError) if it were forwarded.
        with pytest.warns(schedules.GdpCltUnderstatementWarning):
            sweep.sweep()
    rows = {row["method"]: row for row in results.read_csv_rows(str(tmp_path / "results.csv"))}
    assert set(rows) == {"vanilla", "zcdp"}


def test_a_run_with_other_shared_settings_is_not_done():
    row = dict(learning_rate="0.5", initial_clip="1.0", epochs="2.0", sampling="poisson", delta="1e-05")
    assert sweep.agrees_with(row, run_config.RunConfig())  # nothing set: task defaults, not compared
    assert sweep.agrees_with(row, run_config.RunConfig(learning_rate=0.5, epochs=2))
    assert not sweep.agrees_with(row, run_config.RunConfig(learning_rate=0.25))
    assert not sweep.agrees_with(row, run_config.RunConfig(lr_decay=2.0))  # an older row: constant learning rate
    assert sweep.agrees_with({**row, "lr_decay": "2.0"}, run_config.RunConfig(lr_decay=2.0))
    assert not sweep.agrees_with(
        {**row, "rescale_to_unit_norm": "False"}, run_config.RunConfig(rescale_to_unit_norm=True)
    )
