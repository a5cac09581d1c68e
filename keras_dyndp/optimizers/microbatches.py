"""Microbatches whose membership no other example can influence, and the proof of their sensitivity.

With `num_microbatches` = M the optimizers clip the gradients of M microbatch losses instead of B per-example
ones (fewer jacobian rows). Placing rows in microbatches BY POSITION is unsound: Poisson batches are ordered by
random keys with zero-weight padding mixed in, so adding one example shifts other examples into other microbatches
and changes several clipped microbatch gradients at once (a constructed neighbour moved the clipped sum by 4 C while
doubled noise covers 2 C). Here membership is drawn per row and per step:

* every row i draws its microbatch a_i uniformly from {0, ..., M - 1}, independently of the other rows, of its
  position and of the data, from the optimizer's noise generator (`noise_source`), fresh at every step;
* microbatch j's loss is L_j = (sum over rows i with a_i = j of l_i) / max(1, n_j), where l_i is the weighted
  per-example loss and n_j the number of rows of microbatch j whose loss is non-zero. The denominator depends only
  on microbatch j's own rows; a zero-weight padding row has l_i = 0 and gradient 0 (its weight multiplies both),
  so it changes neither the sum nor n_j, wherever it lands;
* the step releases S = sum_j clip(grad L_j, C) + N(0, (2 sigma)^2 I), with 2 sigma on EVERY step: a noise scale
  chosen from the batch size would itself depend on the data, and random membership can put two examples together
  even when B <= M.

Sensitivity: for neighbours D' = D + {x} (add-or-remove-one), ||S(D) - S(D')|| <= 2 C before noise, under a
coupling of the memberships. Proof: draw once the microbatch of every example of D' and of every padding row. The
draws are i.i.d. uniform and independent of positions, so however the pipeline orders the rows of either batch
and wherever it puts the padding, each batch's membership has exactly its own law: this is a coupling. Under it,
every microbatch j != a_x holds the same real examples in both batches and the same L_j up to zero terms, hence
the same clipped gradient. Microbatch a_x changes from clip(g) to clip(g'), both of norm <= C, so the sums differ
by at most 2 C (C if a_x held no other example). Privacy: for a fixed membership A (and a fixed Poisson sample),
the pair of output laws is a pair of Gaussians N(s, 4 sigma^2 I) and N(s + v, 4 sigma^2 I) with ||v|| <= 2 C, which
is dominated by N(0, 1) versus N(C / sigma, 1), the pair the schedule's `GaussianDpEvent(sigma / C)` accounts
for. The released law is the mixture over A (and over the sample) of such pairs, even though v may depend on the
rest of the batch; the hockey-stick divergence E_{e^eps} and the Renyi divergences' exp((alpha - 1) D_alpha) are
jointly convex, so the mixture is at most as distinguishable as the worst pair for every eps and alpha. Each step
is therefore dominated by `PoissonSampledDpEvent(p, GaussianDpEvent(sigma / C))`, exactly what is accounted, and
its PLD and RDP bounds hold. The membership need not be secret for this; it only must not depend on the data.

Microbatches cost twice the noise of per-example clipping (`num_microbatches=None`) for the same accounting; use
them only when the per-example jacobian is too slow, and prefer `keras_dyndp.make_private` then.
"""

from __future__ import annotations

import tensorflow as tf


def random_assignment(num_rows: tf.Tensor | int, num_microbatches: int, generator: tf.random.Generator) -> tf.Tensor:
    """Microbatch of each row: i.i.d. uniform on {0, ..., num_microbatches - 1}, int32 [num_rows].

    Args:
      num_rows: number of rows B of the batch (int or int32 scalar tensor).
      num_microbatches: M >= 1.
      generator: the optimizer's noise generator; each call advances it.
    """
    return generator.uniform(tf.reshape(num_rows, [1]), minval=0, maxval=num_microbatches, dtype=tf.int32)


def microbatch_losses(per_example_losses: tf.Tensor, assignment: tf.Tensor, num_microbatches: int) -> tf.Tensor:
    """Loss of each microbatch: the sum of its rows' losses over the number of its rows with a non-zero loss.

    Args:
      per_example_losses: float tensor [B], the (sample-weighted) per-example losses; padding rows are 0.
      assignment: int32 tensor [B] of microbatch indices in [0, num_microbatches).
      num_microbatches: M >= 1.

    Returns:
      Tensor [M] of the dtype of `per_example_losses`; an empty microbatch has loss 0.
    """
    membership = tf.one_hot(assignment, num_microbatches, dtype=per_example_losses.dtype)  # [B, M]
    sums = tf.linalg.matvec(membership, per_example_losses, transpose_a=True)
    real_rows = tf.stop_gradient(tf.cast(tf.not_equal(per_example_losses, 0), per_example_losses.dtype))
    counts = tf.linalg.matvec(membership, real_rows, transpose_a=True)
    return sums / tf.maximum(counts, 1)
