"""vectorized: per-example clipping by tf.vectorized_map (or tf.map_fn where pfor fails) on any model."""

import os
import pathlib

import forked_runs
import pytest

JOB = pathlib.Path(__file__).with_name("transformer_job.py")
ROOT = JOB.parents[3]  # the checkout under test, ahead of an installed keras_dyndp
METHODS = ["auto", "vectorized", "ghost", "jacobian"]


@pytest.fixture(name="runs", scope="module")
def fixture_runs(tmp_path_factory, worker_id):
    """``python transformer_job.py METHOD`` for every method, each in its own child process forked after TensorFlow's
    import (tests/forked_runs.py, once per session): method -> its ``CompletedProcess``."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": path}
    command_lines = [(str(JOB), [method]) for method in METHODS]
    completed = forked_runs.run_once(
        tmp_path_factory,
        worker_id,
        "transformer_job",
        "tensorflow",
        command_lines,
        cwd=ROOT,
        env=env,
        timeout=300 * len(METHODS),
    )
    return dict(zip(METHODS, completed))


@pytest.mark.parametrize("method", METHODS)
def test_a_transformer_trains_by_every_method_and_never_kills_the_process(runs, method):
    """Keras 3's MultiHeadAttention and EinsumDense under tf.vectorized_map killed the process with a segmentation
    fault at batch 32: every method must train (each example clipped: the update's norm at most C = 1 times the
    steps over p N), in a process that exits cleanly (each method its own process)."""
    result = runs[method]
    assert result.returncode == 0, f"exit {result.returncode}: {result.stderr[-2000:]}"
    outcome, _, detail = result.stdout.strip().splitlines()[-1].partition(" ")
    assert outcome == "trained", detail  # 'ghost' and 'auto' by the EinsumDense and LayerNormalization rules
    assert 0 < float(detail) <= 32 * 1.0 / 16 * (1 + 1e-5)  # at most B C / (p N), learning rate 1
