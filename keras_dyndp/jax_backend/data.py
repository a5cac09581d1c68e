"""Poisson-sampled batches as a ``keras.utils.PyDataset`` (`keras_dyndp.poisson_batches` on JAX).
`keras_dyndp.data.sampling` holds the arguments, checks and privacy argument. Each batch is drawn from a numpy generator
of its own (OS entropy unless a ``seed`` is given, never Keras's global seed), the selected rows first, then rows of
zeros with sample weight 0. Under several processes (`distribution`) every process draws the same global batch from
process 0's seed and yields its share. Data read on demand (`keras_dyndp.data.sources`): from numbered draws
(`_read_batch`)."""

from __future__ import annotations

import secrets
from typing import Any

import jax
import keras
import numpy as np
from absl import logging

from keras_dyndp.data import sampling
from keras_dyndp.data import sources
from keras_dyndp.jax_backend import distribution


def _of_sampling(name: str, doc: str) -> property:
    return property(lambda self: getattr(self.sampling, name), doc=doc)


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
        self._rows = x if isinstance(x, sources.Rows) else None
        if self._rows is not None:
            # Threads read ahead while the step runs (JAX releases the GIL); under several processes one reader, so
            # that every process numbers the same draws in the same order (each file read is parallel still).
            self.workers = 1 if distribution.several() else 2
        num_examples = self._rows.num_examples if self._rows else sampling.check_rows(x, y, sample_weight)
        distribution.check_rows("max_batch_size", arguments.max_batch_size)
        distribution.check_rows("pad_to_multiple", arguments.pad_to_multiple)
        cap = arguments.cap(num_examples, distribution.rows_multiple())
        given = {name: getattr(arguments, name) for name in ("pad_to_multiple", "seed", "start_step")}
        self.sampling = sampling.PoissonSampling(num_examples, arguments.sampling_probability, cap, **given)
        self._steps, self._overflow = arguments.steps_per_epoch, arguments.overflow
        self._x, self._y = x, y
        seed = arguments.stream_seed
        seed = distribution.agreed_random_bits(128, secrets.randbits) if seed is None else seed
        if self._rows is not None:
            distribution.check_same_source(self._rows)
            self.draws = sources.DrawCounter(seed)
            return
        weights = np.ones(num_examples) if sample_weight is None else sample_weight
        self._weights = np.asarray(weights, np.float32)
        if self._weights.shape == (num_examples, 1):  # one per example; else [N], or per loss entry [N, L, ...]
            self._weights = self._weights[:, 0]
        distribution.check_same_data([*jax.tree_util.tree_leaves((x, y)), self._weights])
        self._rng = np.random.default_rng(seed)

    sampling_probability = _of_sampling("sampling_probability", "The Poisson rate p.")
    num_examples = _of_sampling("num_examples", "N.")
    max_batch_size = _of_sampling("max_batch_size", "The rows of every batch (with `pad_to_multiple`, the most rows).")
    pad_to_multiple = _of_sampling("pad_to_multiple", "None (`max_batch_size` rows) or m (padded to multiples of m).")
    seed = _of_sampling("seed", "The ``seed`` given (None: OS entropy).")
    start_step = _of_sampling("start_step", "The first batch's optimizer step (with ``seed``, the sampler's state).")

    def __len__(self) -> int:
        return self._steps

    def __getitem__(self, index: int):
        del index  # Every batch is a fresh Poisson sample.
        if self._rows is not None:
            return self._read_batch()
        cap = self.max_batch_size
        chosen = np.flatnonzero(self._rng.random(self.num_examples) < self.sampling_probability)
        if len(chosen) > cap:
            self._check_overflow(len(chosen))
            chosen = self._rng.permutation(chosen)[:cap]
        rows = np.pad(chosen, (0, self._num_rows(len(chosen)) - len(chosen)))

        def gather(value):  # the rows chosen, then zeros (of weight 0)
            batch = np.asarray(value)[rows]
            batch[len(chosen) :] = 0
            return batch

        batch = jax.tree_util.tree_map(gather, (self._x, self._y, self._weights))
        return jax.tree_util.tree_map(distribution.local_rows, batch)

    def _num_rows(self, num_selected: int) -> int:
        """The rows of a batch of ``num_selected`` examples: the cap, or the next multiple up to it."""
        cap, multiple = self.max_batch_size, self.pad_to_multiple
        return cap if multiple is None else min(cap, max(1, -(-num_selected // multiple)) * multiple)

    def _check_overflow(self, num_selected: int) -> None:
        """More than the cap selected: RuntimeError ('raise') or a warning ('truncate')."""
        cap = self.max_batch_size
        if self._overflow == "raise":
            raise RuntimeError(
                f"keras_dyndp.poisson_batches: Poisson batch of {num_selected} examples larger than "
                f"max_batch_size={cap} (overflow='raise')."
            )
        logging.warning(
            "keras_dyndp.poisson_batches: Poisson batch of %d examples truncated to max_batch_size=%d; "
            "keras_dyndp.core.batch_sizes.truncation_delta gives what the cap adds to delta.",
            num_selected,
            cap,
        )

    def _read_batch(self):
        """A batch of data read on demand: k ~ Binomial(N, p) and a uniform k-subset from the next draw's generator
        (O(k), `keras_dyndp.data.sources.draw`), its rows read in increasing index order, then padding. Under several
        processes each reads only its share: the rows of the global batch at its positions (`distribution.share`)."""
        if distribution.several() and (self.workers > 1 or self.use_multiprocessing):
            raise ValueError(
                "keras_dyndp.poisson_batches in several processes reads data read on demand with one reader "
                f"(workers=1): with workers={self.workers} the processes could number their draws differently and "
                "feed an example twice. Leave `workers` as poisson_batches set it."
            )
        cap = self.max_batch_size
        rng = self.draws.next_generator()
        num_selected, chosen = sources.draw(rng, self.num_examples, self.sampling_probability, cap)
        if num_selected > cap:
            self._check_overflow(num_selected)
        share = distribution.share(self._num_rows(num_selected))
        return self._rows.batch(chosen[share.start : share.stop], len(share))


def check_resume(x: Any, optimizer: Any) -> None:
    """`keras_dyndp.data.sampling.check_resume` of what ``fit`` received (only `PoissonBatches` are checked)."""
    sampling.check_resume(x, x.sampling if isinstance(x, PoissonBatches) else None, optimizer)


def make_poisson_batches(
    x: Any, y: Any, sample_weight: Any, arguments: sampling.SamplerArguments, num_examples: int | None
) -> PoissonBatches:
    """`keras_dyndp.poisson_batches` on JAX (``x`` may be data read on demand, `keras_dyndp.data.sources.Rows`)."""
    if not isinstance(x, sources.Rows):
        sampling.check_rows(x, y, sample_weight, num_examples)
    return PoissonBatches(x, y, sample_weight, arguments)
