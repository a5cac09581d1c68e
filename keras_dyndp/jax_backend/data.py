"""Poisson-sampled batches as a ``keras.utils.PyDataset`` (`keras_dyndp.poisson_batches` on JAX).

`keras_dyndp.sampling` holds the arguments, checks and privacy argument; at every step each of the N examples joins
the batch independently with probability p, drawn from a numpy generator of its own (OS entropy unless a ``seed`` is
given, never Keras's global seed), the selected rows first, then rows of zeros with sample weight 0. Under several
processes (`processes`) every process draws the same global batch from process 0's seed and yields its share.
"""

from __future__ import annotations

import secrets
from typing import Any

import jax
import keras
import numpy as np
from absl import logging

from keras_dyndp import sampling
from keras_dyndp.jax_backend import processes


class PoissonBatches(keras.utils.PyDataset):
    """Poisson-sampled, padded ``(x, y, sample_weight)`` batches: `keras_dyndp.poisson_batches` on JAX (its
    arguments). ``PoissonBatches(x, y, sampling_probability=p, ...)`` is the former constructor, kept for callers."""

    def __init__(
        self,
        x: Any,
        y: Any = None,
        sample_weight: Any = None,
        arguments: sampling.SamplerArguments | None = None,
        **sampler_arguments: Any,
    ):
        super().__init__()
        arguments = arguments or sampling.check_arguments(**sampler_arguments)
        num_examples = sampling.check_rows(x, y, sample_weight)
        processes.check_rows("max_batch_size", arguments.max_batch_size)
        processes.check_rows("pad_to_multiple", arguments.pad_to_multiple)
        cap = arguments.cap(num_examples, processes.rows_multiple())
        self.sampling = sampling.PoissonSampling(
            num_examples, arguments.sampling_probability, cap, True, arguments.pad_to_multiple
        )
        self._steps, self._overflow = arguments.steps_per_epoch, arguments.overflow
        self._x, self._y = x, y
        weights = np.ones(num_examples) if sample_weight is None else sample_weight
        self._weights = np.asarray(weights, np.float32).reshape(num_examples)
        processes.check_same_data([*jax.tree_util.tree_leaves((x, y)), self._weights])
        seed = processes.agreed_random_bits(128, secrets.randbits) if arguments.seed is None else arguments.seed
        self._rng = np.random.default_rng(seed)

    @property
    def sampling_probability(self) -> float:
        """The Poisson rate p."""
        return self.sampling.sampling_probability

    @property
    def num_examples(self) -> int:
        """N."""
        return self.sampling.num_examples

    @property
    def max_batch_size(self) -> int:
        """The rows of every batch (with `pad_to_multiple`, the most rows of a batch)."""
        return self.sampling.max_batch_size

    @property
    def pad_to_multiple(self) -> int | None:
        """None (every batch has `max_batch_size` rows) or m (each is padded to the next multiple of m)."""
        return self.sampling.pad_to_multiple

    def __len__(self) -> int:
        return self._steps

    def __getitem__(self, index: int):
        del index  # Every batch is a fresh Poisson sample.
        cap, multiple = self.max_batch_size, self.pad_to_multiple
        chosen = np.flatnonzero(self._rng.random(self.num_examples) < self.sampling_probability)
        if len(chosen) > cap:
            if self._overflow == "raise":
                raise RuntimeError(
                    f"keras_dyndp.poisson_batches: Poisson batch of {len(chosen)} examples larger than "
                    f"max_batch_size={cap} (overflow='raise')."
                )
            logging.warning(
                "keras_dyndp.poisson_batches: Poisson batch of %d examples truncated to max_batch_size=%d; "
                "keras_dyndp.batch_sizes.truncation_delta gives what the cap adds to delta.",
                len(chosen),
                cap,
            )
            chosen = self._rng.permutation(chosen)[:cap]
        num_rows = cap if multiple is None else min(cap, max(1, -(-len(chosen) // multiple)) * multiple)
        rows = np.zeros(num_rows, np.int64)
        rows[: len(chosen)] = chosen
        weights = np.zeros(num_rows, np.float32)
        weights[: len(chosen)] = self._weights[chosen]

        def gather(value):
            batch = np.asarray(value)[rows]
            batch[len(chosen) :] = 0
            return batch

        batch = jax.tree_util.tree_map(gather, self._x), jax.tree_util.tree_map(gather, self._y), weights
        return jax.tree_util.tree_map(processes.local_rows, batch)


def make_poisson_batches(
    x: Any, y: Any, sample_weight: Any, arguments: sampling.SamplerArguments, num_examples: int | None
) -> PoissonBatches:
    """`keras_dyndp.poisson_batches` on JAX."""
    sampling.check_rows(x, y, sample_weight, num_examples)
    return PoissonBatches(x, y, sample_weight, arguments)
