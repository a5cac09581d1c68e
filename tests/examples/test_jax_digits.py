"""examples/jax_digits.py where JAX is missing (the TensorFlow stacks): one line that says what to install, no
traceback. Its runs on JAX are tested in tests/jax_backend/test_jax_digits_example.py."""

import importlib.util
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.skipif(importlib.util.find_spec("jax") is not None, reason="JAX is installed: the example runs")
@pytest.mark.parametrize("argument", ["--help", "--epochs=1"])
def test_without_jax_it_says_what_to_install_in_one_line(argument):
    completed = subprocess.run(
        [sys.executable, os.path.join("examples", "jax_digits.py"), argument],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert completed.returncode == 2
    assert "Traceback" not in completed.stderr
    (line,) = completed.stderr.strip().splitlines()
    assert line.startswith("jax_digits.py: error: this example runs Keras on JAX, which this Python")
    assert "install the [jax] extra (pip install -e '.[jax,examples]'" in line
