"""Tests of keras_dyndp.jax_backend.per_example.accumulation: a batch in k physical batches, its sums added."""

import pytest

jax = pytest.importorskip("jax")
keras = pytest.importorskip("keras")
if keras.backend.backend() != "jax":
    pytest.skip("Keras is not running on JAX (set KERAS_BACKEND=jax)", allow_module_level=True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from keras_dyndp.jax_backend.per_example import accumulation  # noqa: E402


def _physical_batch(batch):
    """Sums of the rows' squares weighted by the rows' weights (padding rows add nothing); as outputs the predictions
    (the rows doubled), one non-trainable value and the losses (the rows' sums)."""
    x, weights = batch
    sums = [jnp.sum(weights[:, None] * x**2, axis=0), jnp.sum(weights)]
    return sums, (2 * x, [jnp.sum(x)], jnp.sum(x, axis=1))


def test_k_physical_batches_add_up_to_the_one_pass_sums_and_keep_the_rows_in_order():
    x = jnp.asarray(np.arange(14, dtype=np.float32).reshape(7, 2))
    batch = (x, jnp.ones(7, jnp.float32))
    whole, (y_pred, _, losses), first = accumulation.accumulated(_physical_batch, batch, 7, 1, [(2,), ()])
    assert first(y_pred) is y_pred
    for k in (2, 3):  # 7 rows in k physical batches, padded with rows of weight 0
        sums, (k_pred, non_trainable, k_losses), first = accumulation.accumulated(
            _physical_batch, batch, 7, k, [(2,), ()]
        )
        for total, expected in zip(sums, whole):
            np.testing.assert_allclose(np.asarray(total), np.asarray(expected), rtol=1e-6)
        np.testing.assert_array_equal(np.asarray(k_pred), np.asarray(y_pred))
        np.testing.assert_array_equal(np.asarray(k_losses), np.asarray(losses))
        assert float(first(non_trainable[0])) == float(jnp.sum(x[: -(-7 // k)]))  # the first physical batch's
