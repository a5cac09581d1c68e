"""Microbatches on the JAX backend: the clipped sum of M random microbatch gradients, from per-example gradients.

The mechanism (rows drawn uniformly into microbatches per step under a secret key, sensitivity 2 C) is
`keras_dyndp.core.mechanism`'s. A microbatch's loss is linear in its rows' losses, so from the per-example gradients g_i
microbatch j's gradient is G_j = sum_{a_i = j} g_i / n_j (n_j: its rows with a non-zero loss), one contraction, and
the clipped sum sum_j f_j G_j, f_j = min(1, C / ||G_j||), another, with the coefficient f_{a_i} / n_{a_i} of row i.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from keras_dyndp.core import mechanism
from keras_dyndp.jax_backend import ops
from keras_dyndp.rules import layer_rules


def random_assignment(key: jax.Array, num_rows: int, num_microbatches: int) -> jax.Array:
    """int32 [num_rows]: each row's microbatch, i.i.d. uniform on {0, ..., num_microbatches - 1} under ``key``."""
    return jax.random.randint(key, (num_rows,), 0, num_microbatches, dtype=jnp.int32)


def clipped_sum(
    grads: list[jax.Array], losses: jax.Array, assignment: jax.Array, num_microbatches: int, clip_norm: jax.Array
) -> tuple[list[jax.Array], jax.Array]:
    """Per variable, the float32 sum_j clip(G_j, C) (module docstring), and the unclipped norms ||G_j|| [M], from the
    per-example ``grads`` [B, ...] of the weighted ``losses`` [B] (0 for padding), each row's microbatch
    ``assignment`` (`random_assignment`) and C = ``clip_norm``."""
    num_rows = assignment.shape[0]
    membership = jax.nn.one_hot(assignment, num_microbatches, dtype=jnp.float32)  # [B, M]
    counts = jnp.maximum(membership.T @ (losses != 0).astype(jnp.float32), 1.0)  # [M]
    row_coefficients = membership / counts  # [B, M]: 1 / n_j on row i's microbatch j, else 0
    flat = [jnp.reshape(g.astype(jnp.float32), (num_rows, -1)) for g in grads]
    # A row whose gradient is not finite joins its microbatch as a zero gradient (0 x NaN would spoil every G_j).
    finite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(g), axis=1) for g in flat]), axis=0).astype(jnp.float32)
    flat = [layer_rules.kept_rows(g, finite) for g in flat]
    squared_norms = sum(jnp.sum((row_coefficients.T @ g) ** 2, axis=1) for g in flat)  # [M]
    norms = mechanism.norms_from_squares(ops.OPS, squared_norms)
    coefficients = row_coefficients @ mechanism.clip_factors(ops.OPS, norms, clip_norm)  # [B]: f_{a_i} / n_{a_i}
    return [jnp.tensordot(coefficients, g, axes=1).reshape(grad.shape[1:]) for g, grad in zip(flat, grads)], norms
