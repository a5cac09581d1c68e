"""Every JAX test at full float32 matmul precision: JAX's default on a GPU (TF32, a 10-bit mantissa) moved
gradients by up to 3.3e-3 relative on an H100, beyond the 1e-4 at which tests compare with float64 loops."""

import pytest

try:
    import jax
except ImportError:  # Not collected without JAX (tests/conftest.py); nothing to set.
    jax = None


@pytest.fixture(autouse=True)
def _highest_matmul_precision():
    if jax is None:
        yield
        return
    with jax.default_matmul_precision("highest"):
        yield
