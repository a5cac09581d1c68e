"""Poisson-sampled batches for ``model.fit`` on the JAX backend, as the accountants assume them.

`PoissonBatches` is a ``keras.utils.PyDataset``: at every step each of the N examples joins the batch independently
with probability p (the schedule's ``sampling_probability``), drawn from a numpy generator of its own (OS entropy
unless a ``seed`` is given, never Keras's global seed). Batches are padded with rows of sample weight 0 to a fixed
``max_batch_size`` (one compiled step for every batch; padding rows add nothing to the clipped sum and are not
counted as examples by the DP optimizers' batch-size check), or to the next multiple of ``pad_to_multiple``. A
batch larger than the cap is truncated to it, with a warning: the default cap,
`keras_dyndp.batch_sizes.default_max_batch_size`, is exceeded with probability at most 1e-15 per step, and
`keras_dyndp.batch_sizes.truncation_delta` gives what a smaller cap costs in delta.

``make_private``'s ``fit`` checks what it is given: a `PoissonBatches` at another rate than the optimizer's schedule
is refused; anything else (arrays, a generator, another PyDataset) gets one `keras_dyndp.batch_sizes.SamplingWarning`.
"""

from __future__ import annotations

import secrets
from typing import Any

import jax
import keras
import numpy as np
from absl import logging

from keras_dyndp import batch_sizes
from keras_dyndp import validation


class PoissonBatches(keras.utils.PyDataset):
    """Poisson-sampled, padded batches of ``(x, y, sample_weight)`` arrays (module docstring).

    Args:
      x, y: arrays (or nested structures of arrays) with N rows.
      sample_weight: per-example weights [N] or None (ones).
      sampling_probability: p in (0, 1].
      steps_per_epoch: batches per epoch (default round(1 / p): each example once per epoch in expectation).
      max_batch_size: rows of every batch (default `batch_sizes.default_max_batch_size(N, p)`).
      pad_to_multiple: None (default) pads every batch to ``max_batch_size``: one shape, one compiled step. An
        integer m pads each batch to the next multiple of m instead (at most ``max_batch_size``): a few shapes, each
        compiled once, and far fewer padding rows to compute when ``max_batch_size`` is well above p N. The rows
        then follow the private batch size, so the step divides by the optimizer's ``expected_batch_size`` (p N),
        never by the rows: ``make_private``'s ``fit`` refuses these batches for an optimizer built with
        ``public_batch_size=True``.
      seed: None (OS entropy, for training you release) or an integer (reproducible batches, for tests).
    """

    def __init__(
        self,
        x: Any,
        y: Any,
        sample_weight: Any = None,
        *,
        sampling_probability: float,
        steps_per_epoch: int | None = None,
        max_batch_size: int | None = None,
        pad_to_multiple: int | None = None,
        seed: int | None = None,
    ):
        super().__init__()
        leaves = jax.tree_util.tree_leaves(x)
        if not leaves:
            raise ValueError("`x` must hold at least one array with one row per example. Received none.")
        self._num_examples = len(leaves[0])
        for name, value in (("x", x), ("y", y), ("sample_weight", sample_weight)):
            for leaf in jax.tree_util.tree_leaves(value):
                if len(leaf) != self._num_examples:
                    raise ValueError(
                        f"Every array of `{name}` must have N={self._num_examples} rows (those of x). "
                        f"Received one with {len(leaf)}."
                    )
        self._num_examples = validation.check_positive_int("the number of examples", self._num_examples)
        self._p = validation.check_probability(sampling_probability)
        self._steps = (
            batch_sizes.expected_steps_per_epoch(self._p)
            if steps_per_epoch is None
            else validation.check_positive_int("steps_per_epoch", steps_per_epoch)
        )
        self._cap = (
            batch_sizes.default_max_batch_size(self._num_examples, self._p)
            if max_batch_size is None
            else validation.check_positive_int("max_batch_size", max_batch_size)
        )
        self._multiple = (
            None if pad_to_multiple is None else validation.check_positive_int("pad_to_multiple", pad_to_multiple)
        )
        self._x, self._y = x, y
        self._weights = (
            np.ones(self._num_examples, np.float32)
            if sample_weight is None
            else np.asarray(sample_weight, np.float32).reshape(self._num_examples)
        )
        self._rng = np.random.default_rng(secrets.randbits(128) if seed is None else seed)

    @property
    def sampling_probability(self) -> float:
        """The Poisson rate p."""
        return self._p

    @property
    def num_examples(self) -> int:
        """N."""
        return self._num_examples

    @property
    def max_batch_size(self) -> int:
        """The rows of every batch (with `pad_to_multiple`, the most rows of a batch)."""
        return self._cap

    @property
    def pad_to_multiple(self) -> int | None:
        """None (every batch has `max_batch_size` rows) or m (each is padded to the next multiple of m)."""
        return self._multiple

    def __len__(self) -> int:
        return self._steps

    def __getitem__(self, index: int):
        del index  # Every batch is a fresh Poisson sample.
        chosen = np.flatnonzero(self._rng.random(self._num_examples) < self._p)
        if len(chosen) > self._cap:
            logging.warning(
                "Poisson batch of %d examples truncated to max_batch_size=%d; keras_dyndp.batch_sizes."
                "truncation_delta gives what the cap adds to delta.",
                len(chosen),
                self._cap,
            )
            chosen = self._rng.permutation(chosen)[: self._cap]
        num_rows = self._cap
        if self._multiple is not None:
            num_rows = min(self._cap, max(1, -(-len(chosen) // self._multiple)) * self._multiple)
        rows = np.zeros(num_rows, np.int64)
        rows[: len(chosen)] = chosen
        weights = np.zeros(num_rows, np.float32)
        weights[: len(chosen)] = self._weights[chosen]

        def gather(value):
            batch = np.asarray(value)[rows]
            batch[len(chosen) :] = 0
            return batch

        return jax.tree_util.tree_map(gather, self._x), jax.tree_util.tree_map(gather, self._y), weights
