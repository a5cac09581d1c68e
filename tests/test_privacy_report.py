"""Tests for keras_dyndp.privacy_report: table rows, formatting, cumulative curves and plots."""

import numpy as np
import pytest

from keras_dyndp import privacy_report
from keras_dyndp import schedules
from keras_dyndp.accounting import fast_pld
from keras_dyndp.accounting import fast_rdp
from keras_dyndp.core import batch_sizes

pytestmark = pytest.mark.xdist_group("privacy_report")  # its module fixtures run once (tests/conftest.py)

SPEC = dict(target_epsilon=1.0, target_delta=1e-4, sampling_probability=0.05, num_steps=60, initial_clip=1.5)


def _build(methods, **kwargs):
    return {method: schedules.calibrate(method, **SPEC, **kwargs) for method in methods}


@pytest.fixture(scope="module")
def rows():
    """The paper's calibration (GDP-CLT), beside the baselines."""
    built = _build(schedules.ALL_METHODS, rho_mu=1 / 0.5, rho_c=1 / 0.3, accountant="gdp_clt")
    return built, privacy_report.report_rows(built, SPEC["target_delta"])


def test_rows_contents(rows):
    built, report = rows
    assert [row.method for row in report] == list(schedules.ALL_METHODS)
    for row in report:
        schedule = built[row.method]
        assert row.num_steps == 60
        assert row.first_noise_multiplier == schedule.noise_multipliers[0]
        assert row.last_noise_multiplier == schedule.noise_multipliers[-1]
        assert row.first_clip_norm == schedule.clip_norms[0] and row.last_clip_norm == schedule.clip_norms[-1]
        assert row.epsilon_own <= SPEC["target_epsilon"]
        assert row.epsilon_own == pytest.approx(SPEC["target_epsilon"], rel=1e-6)
        assert row.epsilons["rdp"] == pytest.approx(fast_rdp.rdp_epsilon(0.05, schedule.noise_multipliers, 1e-4))
        assert row.epsilons["pld"] == fast_pld.pld_epsilon(0.05, schedule.noise_multipliers, 1e-4)
    by_method = {row.method: row for row in report}
    for method in schedules.METHODS:
        assert by_method[method].calibrated_by == "gdp_clt"
        assert by_method[method].epsilons["gdp_clt"] == pytest.approx(1.0, rel=1e-9)
        # Rigorous accountants disagree with the CLT; PLD is the tighter of the two.
        assert by_method[method].epsilons["pld"] < by_method[method].epsilons["rdp"]
    assert by_method["sensitivity_decay"].last_clip_norm == pytest.approx(1.5 * 0.3)
    assert by_method["zcdp"].calibrated_by == "zcdp" and by_method["tcdp"].calibrated_by == "tcdp"
    # zCDP without amplification needs far more noise, so every other accountant reports far less than target.
    assert by_method["zcdp"].epsilons["rdp"] < 0.2


def test_format_table(rows):
    _, report = rows
    table = privacy_report.format_table(report)
    lines = table.splitlines()
    assert len(lines) == 1 + len(schedules.ALL_METHODS)
    assert lines[0].split() == [
        "method",
        "calibrated_by",
        "T",
        "z_first",
        "z_last",
        "C_first",
        "C_last",
        "eps_own",
        "eps_gdp_clt",
        "eps_rdp",
        "eps_pld",
    ]
    assert lines[1].split()[0] == "vanilla" and lines[-1].split()[:2] == ["tcdp", "tcdp"]
    partial = privacy_report.report_rows(
        {"mine": schedules.DPSchedule([1.0, 1.0], [2.0, 1.0], 0.1)}, 1e-5, accountants=["gdp_clt"]
    )
    assert set(partial[0].epsilons) == {"gdp_clt"}
    assert privacy_report.format_table(partial).splitlines()[1].split()[-2:] == ["-", "-"]


def test_default_calibration_is_pld_and_is_the_own_accountant():
    built = _build(["vanilla", "sensitivity_decay"], rho_c=2.0)
    for row in privacy_report.report_rows(built, SPEC["target_delta"]):
        assert row.calibrated_by == "pld" and row.epsilon_own == row.epsilons["pld"]
        assert 0.999 <= row.epsilons["pld"] <= 1.0 and row.epsilons["gdp_clt"] < 1.0
    by_hand = schedules.DPSchedule([1.0, 1.0], [2.0, 1.0], 0.1)
    (row,) = privacy_report.report_rows({"mine": by_hand}, 1e-5)
    assert row.calibrated_by == "-" and row.epsilon_own is None


def test_curves_are_cumulative():
    schedule = schedules.calibrate("dynamic", **SPEC, rho_mu=2.0, rho_c=2.0, accountant="gdp_clt")
    steps, curves = privacy_report.epsilon_curves(schedule, 1e-4, num_points=7)
    assert steps.size == 7 and steps[0] == 1 and steps[-1] == 60 and np.all(np.diff(steps) > 0)
    for name, values in curves.items():
        assert np.all(np.diff(values) > 0), name
    assert curves["gdp_clt"][-1] == pytest.approx(schedule.epsilon(1e-4, "gdp_clt"), rel=1e-9)
    assert curves["gdp_clt"][2] == pytest.approx(schedule.epsilon(1e-4, "gdp_clt", steps=int(steps[2])), rel=1e-9)
    assert curves["rdp"][-1] == pytest.approx(fast_rdp.rdp_epsilon(0.05, schedule.noise_multipliers, 1e-4))


def test_plots_write_png(tmp_path):
    first = privacy_report.plot_epsilon_consumption(
        str(tmp_path / "consumption.png"),
        target_epsilon=1.0,
        target_delta=1e-4,
        sampling_probability=0.05,
        num_steps=40,
        num_points=10,
        rho_mus=(1.0,),
    )  # PLD, constant noise.
    schedule = schedules.calibrate("dynamic", **SPEC, rho_mu=2.0, rho_c=2.0, accountant="gdp_clt")
    second = privacy_report.plot_accountant_comparison(str(tmp_path / "comparison.png"), schedule, 1e-4, num_points=10)
    for path in (first, second):
        with open(path, "rb") as handle:
            assert handle.read(8) == b"\x89PNG\r\n\x1a\n"


def test_bad_arguments():
    schedule = schedules.DPSchedule([1.0], [1.0], 0.1)
    with pytest.raises(ValueError, match="accountants"):
        privacy_report.report_rows({"x": schedule}, 1e-5, accountants=["moments"])
    with pytest.raises(ValueError, match="delta"):
        privacy_report.epsilon_curves(schedule, 0.0)
    with pytest.raises(ValueError, match="num_points"):
        privacy_report.curve_steps(10, 0)


def test_run_privacy_plot_writes_a_png_of_the_steps_taken(tmp_path):
    schedule = schedules.calibrate("dynamic", **SPEC, rho_mu=2.0, rho_c=2.0)
    path = privacy_report.plot_run_privacy(str(tmp_path / "privacy.png"), schedule, 1e-4, steps=[20, 40, 45])
    with open(path, "rb") as handle:
        assert handle.read(8) == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "privacy.png").stat().st_size > 1000
    for steps in ([], [0, 10], [61]):
        with pytest.raises(ValueError, match=r"`steps` must hold step counts in \[1, T = 60\]"):
            privacy_report.plot_run_privacy(str(tmp_path / "bad.png"), schedule, 1e-4, steps=steps)


def test_run_summary_states_the_steps_taken_their_epsilons_and_the_budget():
    schedule = schedules.calibrate("dynamic", **SPEC, rho_mu=1.25, rho_c=1 / 0.3)
    summary = privacy_report.run_summary(schedule, SPEC["target_delta"], 30, method="dynamic", privacy_unit="client")
    assert summary.epsilon_gdp_clt == schedule.epsilon(SPEC["target_delta"], accountant="gdp_clt", steps=30)
    assert summary.epsilon_rigorous == schedule.epsilon(SPEC["target_delta"], accountant="pld", steps=30)
    assert summary.rigorous_accountant == "pld" and str(summary) == summary.text
    lines = summary.text.splitlines()
    assert lines[0] == "Privacy report (dynamic, per client, add-or-remove-one adjacency):"
    assert "steps taken 30 of the schedule's 60" in lines[1]
    assert f"PLD (rigorous upper bound): {summary.epsilon_rigorous:.4f}" in summary.text
    assert "budget calibrated under pld: target epsilon 1" in summary.text  # from the schedule's calibration
    assert "training batches: no loss or metric computed" in summary.text and "NOTE" not in summary.text


def test_run_summary_flags_what_the_epsilons_do_not_cover():
    schedule = schedules.calibrate("vanilla", **SPEC)
    text = privacy_report.run_summary(
        schedule,
        1e-4,
        60,
        method="vanilla",
        accountant="rdp",
        sampling="shuffle",
        training_metrics=True,
        seed=3,
        notes=["the vocabulary was learnt from the private data."],
    ).text
    assert "RDP (rigorous upper bound)" in text and "OUTSIDE the DP guarantee" in text
    assert "NOTE: shuffled batches; these epsilons assume Poisson sampling" in text
    assert "NOTE: seed 3 fixes the sampling and noise; do not release this model." in text
    assert text.endswith("NOTE: the vocabulary was learnt from the private data.")


def test_run_summary_of_a_baseline_adds_its_own_accountant_and_of_no_schedule_says_so():
    schedule = schedules.calibrate("tcdp", **SPEC, rho_mu=1.25)
    text = privacy_report.run_summary(
        schedule, 1e-4, 60, method="tcdp", calibrated_under="tcdp", target_epsilon=1.0
    ).text
    assert "tcdp (the baseline's own accountant): " in text and "fixed-size batches" in text
    assert "budget calibrated under tcdp: target epsilon 1" in text
    none = privacy_report.run_summary(None, 1e-4, 5, method="nonprivate")
    assert none.text == "Privacy: none (nonprivate: no DP guarantee)." and np.isinf(none.epsilon_rigorous)


def test_run_summary_states_the_total_delta_with_the_cap_s_and_a_delta_other_than_the_target():
    schedule = schedules.calibrate("vanilla", **SPEC)
    delta = SPEC["target_delta"]
    plain = privacy_report.run_summary(schedule, delta, 60, method="vanilla")
    assert plain.delta_total == delta
    assert f"  epsilon at delta = {delta:.3g}:" in plain.text and "NOT" not in plain.text
    overflow = batch_sizes.overflow_probability(1000, SPEC["sampling_probability"], 70)  # N 1000: 50 expected
    capped = privacy_report.run_summary(schedule, delta, 60, method="vanilla", overflow_probability=overflow)
    added = batch_sizes.added_delta(overflow, 60, max(capped.epsilon_gdp_clt, capped.epsilon_rigorous))
    assert added > 0 and capped.delta_total == pytest.approx(delta + added, rel=1e-12)
    expected = f"epsilon at delta = {delta:.3g} + {added:.3g} (the batches' cap, max_batch_size) = {delta + added:.3g}:"
    assert expected in capped.text
    other = privacy_report.run_summary(schedule, 1e-2, 60, method="vanilla")
    assert f"epsilon at delta = 0.01 (NOT the budget's target delta {delta:.3g}):" in other.text


def test_run_summary_of_adaptive_clipping_names_c_0_and_the_shared_noise_multipliers():
    schedule = schedules.calibrate("vanilla", **SPEC)
    text = str(privacy_report.run_summary(schedule, SPEC["target_delta"], 30, method="adaptive"))
    z = schedule.noise_multipliers[0]
    assert f"adapted from C_0 = {schedule.clip_norms[0]:.4g} (adaptive clipping)" in text
    assert f"noise multiplier z_t {z:.4g} -> {z:.4g}, shared by the gradient and the count" in text
    assert "sigma_t" not in text.splitlines()[2]
