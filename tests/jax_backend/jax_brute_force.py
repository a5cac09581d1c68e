"""A per-example loop, the reference the JAX backend's vmapped step must equal."""

import jax
import jax.numpy as jnp
import numpy as np


def clipped_sum(model, loss_fn, x, y, clip_norm, weights=None):
    """Sum over the rows of the per-example gradients (one jax.grad per row), each clipped to ``clip_norm``."""
    trainable = [v.value for v in model.trainable_variables]
    non_trainable = [v.value for v in model.non_trainable_variables]

    def loss(values, x_row, y_row):
        y_pred, _ = model.stateless_call(values, non_trainable, x_row, training=True)
        return jnp.mean(loss_fn(y_row, y_pred))

    total = [np.zeros(v.shape, np.float64) for v in trainable]
    for i in range(len(x)):
        grads = [np.asarray(g, np.float64) for g in jax.grad(loss)(trainable, x[i : i + 1], y[i : i + 1])]
        if weights is not None:
            grads = [g * weights[i] for g in grads]
        norm = np.sqrt(sum(np.sum(g**2) for g in grads))
        factor = min(1.0, clip_norm / norm) if norm > 0 else 1.0
        total = [t + factor * g for t, g in zip(total, grads)]
    return total
