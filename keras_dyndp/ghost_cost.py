"""How to get the per-example gradient norms and clipped sum of a weight used as ``a_t W`` at T positions most
cheaply: one decision for the ghost rules of both backends (`keras_dyndp.tf_backend.per_example.norms`,
`keras_dyndp.jax_backend.ghost`).

Per example (multiply-adds; k = d_in, c = d_out), three forms:

* `GRAM` ("ghost", Li et al. 2021): ||G_i||^2 from a_i a_i^T and g_i g_i^T, T^2 (k + c), then the clipped sum as the
  batch's weight gradient for the output gradients f_i g_i (book-keeping, Bu et al. 2023), T k c: T^2 (k + c) + T k c.
  Holds T^2 floats per example, for one layer at a time.
* `PER_EXAMPLE`: G_i = a_i^T g_i materialised, T k c, its norm and sum_i f_i G_i from it. Holds k c floats per example
  until the clip factors are known (all layers at once), so only where k c <= `MAX_MATERIALISED`.
* `PER_EXAMPLE_NORMS`: G_i materialised for its norm only and dropped, the sum by book-keeping: 2 T k c. Holds k c
  floats per example for one layer at a time: for weights above the cap where it beats the Gram form
  (k c < T (k + c)), as Bu et al. 2022 choose per layer (WideResNet-16-4's 128-channel 3x3 convolutions at 16x16:
  1.6x fewer multiply-adds than the Gram form).
"""

from __future__ import annotations

MAX_MATERIALISED = 2**16
"""The largest per-example gradient (in floats) held for a whole batch: 256 KiB per example, 64 MiB at batch 256
(measured on TensorFlow, docs/performance.md)."""

GRAM = "gram"
PER_EXAMPLE = "per_example"
PER_EXAMPLE_NORMS = "per_example_norms"


def form(positions: int | None, fan_in: int, fan_out: int) -> str:
    """The cheapest of `GRAM`, `PER_EXAMPLE` and `PER_EXAMPLE_NORMS` (module docstring) for T = ``positions``
    (None: unknown, Gram) and a ``fan_in`` x ``fan_out`` weight."""
    if positions is None:
        return GRAM
    size = fan_in * fan_out
    if positions * positions * (fan_in + fan_out) < size:
        return GRAM
    if size <= MAX_MATERIALISED:
        return PER_EXAMPLE
    return PER_EXAMPLE_NORMS if size < positions * (fan_in + fan_out) else GRAM
