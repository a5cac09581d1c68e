"""Which form gives the per-example gradient norms of a weight used as ``a_t W`` at T positions more cheaply: one
decision for the ghost rules of both backends (`keras_dyndp.tf_backend.per_example.norms`,
`keras_dyndp.jax_backend.ghost`).

Per example, the Gram ("ghost", Li et al. 2021) form costs T^2 (d_in + d_out) (a_i a_i^T and g_i g_i^T) and holds
T^2 floats; materialising G_i = a_i^T g_i costs T d_in d_out and holds d_in d_out floats (Bu et al. 2022 choose per
layer on the same shapes). Materialise when T^2 (d_in + d_out) >= d_in d_out and G_i fits `MAX_MATERIALISED`, which
bounds the batch's extra memory (measured on TensorFlow, docs/performance.md).
"""

from __future__ import annotations

MAX_MATERIALISED = 2**16
"""The largest per-example gradient (in floats) materialised for a whole batch: 256 KiB per example, 64 MiB at
batch 256."""


def use_gram(positions: int | None, fan_in: int, fan_out: int) -> bool:
    """Whether the Gram form is cheaper for T = ``positions`` (None: unknown, Gram) and a ``fan_in`` x ``fan_out``
    weight."""
    if positions is None or fan_in * fan_out > MAX_MATERIALISED:
        return True
    return positions * positions * (fan_in + fan_out) < fan_in * fan_out
