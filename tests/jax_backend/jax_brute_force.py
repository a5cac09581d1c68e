"""A per-example loop, the reference the JAX backend's vmapped step must equal, and batches in order for fit."""

import jax
import jax.numpy as jnp
import keras
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


class FixedBatches(keras.utils.PyDataset):
    """Batches of ``batch_size`` rows in order, as fit cuts arrays, which it refuses for an optimizer with
    ``expected_batch_size``; a PyDataset is taken (with a SamplingWarning) and its batch sizes checked."""

    def __init__(self, x, y, batch_size, sample_weight=None):
        super().__init__()
        self._rows = (x, y) if sample_weight is None else (x, y, sample_weight)
        self._batch_size = batch_size

    def __len__(self):
        return -(-len(self._rows[0]) // self._batch_size)

    def __getitem__(self, index):
        return tuple(part[index * self._batch_size : (index + 1) * self._batch_size] for part in self._rows)
