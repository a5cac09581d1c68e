"""examples/audit.py at tiny scale: the table is printed, every bound is at most its claim, the plot is written."""

import re

_ROW = re.compile(r"^((?:white|black)-box/eps=\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\S+)$", re.M)


def test_the_audit_example_prints_its_table_and_plot(example_server, tmp_path):
    png = tmp_path / "audit.png"
    flags = ["--epsilons=2", "--num_canaries=100", "--white_box_steps=4", "--black_box_canaries=20", "--epochs=1"]
    result = example_server.run("examples.audit", [*flags, f"--plot={png}"], timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "claimed eps (PLD)" in result.stdout and "f-DP bound" in result.stdout, result.stdout
    rows = _ROW.findall(result.stdout)
    assert [row[0] for row in rows] == ["white-box/eps=2", "black-box/eps=2"], result.stdout
    for _, claimed, one_run, fdp, m, guesses, correct, confidence in rows:
        assert abs(float(claimed) - 2.0) < 0.02
        assert 0.0 <= float(one_run) <= float(claimed) and 0.0 <= float(fdp) <= float(claimed)
        assert int(correct) <= int(guesses) <= int(m) and float(confidence) == 0.95
    assert png.stat().st_size > 1000
