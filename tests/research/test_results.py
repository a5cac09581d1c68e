"""Tests for research.results: the results CSV of a run, and of runs of earlier versions."""

import csv
import math

import pytest

from research import digits
from research import results
from research import run_config


def test_results_csv_of_an_earlier_version_gets_the_new_columns_before_a_row_is_appended(tmp_path):
    path = tmp_path / "results.csv"
    old_columns = "task method epsilon delta rho_mu rho_c initial_clip learning_rate batch_size epochs sampling seed "
    old_columns += "steps total_steps test_accuracy epsilon_gdp_clt epsilon_rigorous rigorous_accountant wall_time_s"
    old_row = "digits vanilla 1.0 1e-05 1.0 1.0 1.0 0.5 64 2.0 poisson 0 3 46 0.5 0.9 1.1 pld 3.0"
    path.write_text(",".join(old_columns.split()) + "\n" + ",".join(old_row.split()) + "\n")
    config = run_config.RunConfig(method="nonprivate", lr_decay=2.0).resolved(digits.make_task(), 1437)
    result = results.RunResult("digits", config, 1, 23, 0.5, math.inf, math.inf, 1.0)
    results.append_results_csv(str(path), result)
    with open(path) as handle:
        old, new = list(csv.DictReader(handle))
    assert (old["lr_decay"], old["rescale_to_unit_norm"], old["learning_rate"]) == ("1.0", "False", "0.5")
    assert (old["adaptive_clipping"], new["adaptive_clipping"]) == ("False", "False")
    assert (new["lr_decay"], new["method"]) == ("2.0", "nonprivate")
    assert list(old) == list(new) == list(result.csv_row())
    path.write_text("task,other\ndigits,1\n")
    with pytest.raises(run_config.FlagError, match="columns this program does not write"):
        results.append_results_csv(str(path), result)
