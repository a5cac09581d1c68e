"""How to get the per-example gradient norms and clipped sum of a weight used as ``a_t W`` at T positions most
cheaply: one decision for the ghost rules of both backends (`keras_dyndp.tf_backend.per_example.norms`,
`keras_dyndp.jax_backend.per_example.rules`), among three forms, by multiply-adds per example (k = d_in, c = d_out):

* `GRAM` ("ghost", Li et al. 2021): ||G_i||^2 from a_i a_i^T and g_i g_i^T, T^2 (k + c), then the clipped sum as the
  batch's weight gradient for the output gradients f_i g_i (book-keeping, Bu et al. 2023), T k c: T^2 (k + c) + T k c.
  Holds T^2 floats per example, for one layer at a time.
* `PER_EXAMPLE`: G_i = a_i^T g_i materialised, T k c, its norm and sum_i f_i G_i from it. Holds k c floats per example
  until the clip factors are known (all layers at once), so only where k c <= `MAX_MATERIALISED`.
* `PER_EXAMPLE_NORMS`: G_i materialised for its norm only and dropped, the sum by book-keeping: 2 T k c. Holds k c
  floats per example for one layer at a time: for weights above the cap where it beats the Gram form
  (k c < T (k + c)), as Bu et al. 2022 choose per layer (WideResNet-16-4's large convolutions).
"""

from __future__ import annotations

MAX_MATERIALISED = 2**16
"""The largest per-example gradient (in floats) held for a whole batch: 256 KiB per example, 64 MiB at batch 256
(docs/performance.md)."""

GRAM = "gram"
PER_EXAMPLE = "per_example"
PER_EXAMPLE_NORMS = "per_example_norms"


def form(positions: int | None, fan_in: int, fan_out: int) -> str:
    """The cheapest of `GRAM`, `PER_EXAMPLE` and `PER_EXAMPLE_NORMS` (module docstring) for T = ``positions`` and a
    ``fan_in`` x ``fan_out`` weight. T unknown while tracing (None): `PER_EXAMPLE` where G_i fits under the cap, else
    `GRAM` (the former costs T, the Gram T^2, and needs no rounding bound, whose T^2 term overclips long sequences)."""
    size = fan_in * fan_out
    if positions is None:
        return PER_EXAMPLE if size <= MAX_MATERIALISED else GRAM
    if positions * positions * (fan_in + fan_out) < size:
        return GRAM
    if size <= MAX_MATERIALISED:
        return PER_EXAMPLE
    return PER_EXAMPLE_NORMS if size < positions * (fan_in + fan_out) else GRAM


def embedding_by_table(positions: int, vocabulary: int) -> bool:
    """Whether an Embedding's ghost rule on JAX groups each example's T = ``positions`` ids by a table of each id's
    first position, B x V small integers set by one scatter (its cost grows as V), rather than by sorting them
    (T log T per example): where V <= 8 T log2 T and V <= `MAX_MATERIALISED`: there the table is the faster of the
    two on XLA's CPU (docs/performance.md)."""
    return vocabulary <= MAX_MATERIALISED and vocabulary <= 8 * positions * max(1, positions.bit_length() - 1)


FLOAT32_EPSILON = 2.0**-23
"""float32's machine epsilon, twice its unit roundoff: the rounding bounds below use it, a margin of 2 for any
rounding order, fused multiply-adds and the rounding of the bound itself."""


def rounding_coefficients(form_: str, positions, fan_in: int, fan_out: int, *, pieces: int = 1) -> tuple:
    """``(second, first)``: the exact per-example gradient norm ||G_i|| of a weight used as ``a_t W`` at T positions is
    at most sqrt(s + second S^2) + first S, s the squared norm computed in float32 in ``form_`` and S = sum_t ||a_t||
    ||g_t||; ``first`` also bounds, in units of S, how far the book-keeping sum's float32 rounding moves example i's
    contribution (Higham, ch. 3: a length-n sum is off by at most n u times the sum of its terms' magnitudes, in ANY
    order). ``positions`` may be a tensor (T unknown while tracing). The matrix products must round to float32, not
    TensorFloat-32. Why and at what price: docs/privacy.md, "Rounding, and values that are not finite".

    * `GRAM`: second = eps (k + c + T^2 + 4), k + c being (k / pieces + pieces) + c where a_i a_i^T is the sum of
      ``pieces`` partial Grams (one per kernel offset); it keeps ||G_i|| of near-cancelling positions from falling to 0.
    * `PER_EXAMPLE_NORMS` (G_i rounded, then summed by book-keeping): first = eps (T + 2).
    * `PER_EXAMPLE`: (0, 0), the very G_i whose norm is taken are summed.
    """
    if form_ == PER_EXAMPLE:
        return 0.0, 0.0
    first = FLOAT32_EPSILON * (positions + 2)
    if form_ == PER_EXAMPLE_NORMS:
        return 0.0, first
    dot_length = fan_in // pieces + pieces - 1
    return FLOAT32_EPSILON * (dot_length + fan_out + positions * positions + 5), first


def bounded_squared_norms(xp, squared, magnitude, second, first):
    """(sqrt(squared + second magnitude^2) + first magnitude)^2 (`rounding_coefficients`), ``xp`` ``tensorflow`` or
    ``jax.numpy``: an upper bound on each exact squared norm; +inf where the bracket is negative or NaN (the bound
    failed, or the example's values were not finite): such an example contributes nothing (`mechanism.clip_factors`)."""
    inner = squared + second * magnitude * magnitude
    bound = xp.sqrt(xp.where(inner >= 0, inner, float("inf"))) + first * magnitude
    return bound * bound
