"""vectorized: per-example clipping by tf.vectorized_map (or tf.map_fn where pfor fails) on any model."""

import os
import pathlib
import subprocess
import sys

import pytest

JOB = pathlib.Path(__file__).with_name("transformer_job.py")
ROOT = JOB.parents[3]  # the checkout under test, ahead of an installed keras_dyndp


@pytest.mark.parametrize("method", ["auto", "vectorized", "ghost", "jacobian"])
def test_a_transformer_trains_by_every_method_and_never_kills_the_process(method):
    """Keras 3's MultiHeadAttention and EinsumDense under tf.vectorized_map killed the process with a segmentation
    fault at batch 32: every method must train (each example clipped: the update's norm at most C = 1 times the
    steps over p N), in a process that exits cleanly."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": path}
    result = subprocess.run(
        [sys.executable, str(JOB), method], capture_output=True, text=True, env=env, timeout=300, check=False
    )
    assert result.returncode == 0, f"exit {result.returncode}: {result.stderr[-2000:]}"
    outcome, _, detail = result.stdout.strip().splitlines()[-1].partition(" ")
    assert outcome == "trained", detail  # 'ghost' and 'auto' by the EinsumDense and LayerNormalization rules
    assert 0 < float(detail) <= 32 * 1.0 / 16 * (1 + 1e-5)  # at most B C / (p N), learning rate 1
