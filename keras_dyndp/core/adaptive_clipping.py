"""Adaptive clipping, written once for every backend: the clip norm C_t follows a target quantile of the per-example
gradient norms (Andrew et al., NeurIPS 2021, Alg. 1 with the geometric update), while the noise multiplier follows the
schedule. The gradient sum and the centred count of unclipped examples together cost the schedule's z_t, the gradient's
own multiplier being z_g,t > z_t (`gradient_noise_multipliers`; the proof: docs/privacy.md, "Adaptive clipping").
``ops``: `keras_dyndp.core.mechanism`'s primitives plus ``exp``. Reference: https://arxiv.org/abs/1905.03871."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from keras_dyndp.core import validation

MIN_CLIP_NORM, MAX_CLIP_NORM = 1e-30, 1e30
"""C_t is kept in this range (float32: 0 would stop the run, inf would make the noise inf)."""


@dataclasses.dataclass(frozen=True)
class AdaptiveClipping:
    """The options of adaptive clipping (an optimizer's ``adaptive_clipping`` argument; docs/usage.md).

    Args:
      target_quantile: gamma, the fraction of per-example gradient norms C_t should sit above, in (0, 1) (default 0.5).
      learning_rate: eta of the geometric update C_{t+1} = C_t exp(-eta (b_t - gamma)), a float > 0 (default 0.2).
      count_stddev: sigma_b, the std of the noise on the count of unclipped examples, in examples, a float > 0
        with 2 sigma_b above every noise multiplier of the schedule. None (default): n / 20, n the expected batch
        size p N (or the number of microbatches), the paper's choice. The smaller sigma_b, the larger the
        gradient's own noise multiplier z_g (`gradient_noise_multipliers`; docs/usage.md).
    """

    target_quantile: float = 0.5
    learning_rate: float = 0.2
    count_stddev: float | None = None

    def __post_init__(self):
        quantile = validation.check_float("target_quantile", self.target_quantile)
        if quantile >= 1.0:
            raise ValueError(
                f"`target_quantile` must be in (0, 1) (the fraction of gradient norms below C_t). Received: "
                f"target_quantile={self.target_quantile!r}."
            )
        object.__setattr__(self, "target_quantile", quantile)
        object.__setattr__(self, "learning_rate", validation.check_float("learning_rate", self.learning_rate))
        if self.count_stddev is not None:
            stddev = validation.check_float("count_stddev", self.count_stddev, hint="in examples")
            object.__setattr__(self, "count_stddev", stddev)

    def get_config(self) -> dict:
        """The options as a dict of floats (None for the default ``count_stddev``), as the constructor takes them."""
        return dataclasses.asdict(self)


def resolve(value: Any) -> AdaptiveClipping | None:
    """An optimizer's ``adaptive_clipping`` argument as `AdaptiveClipping`: None (off), an `AdaptiveClipping`, True
    (the defaults) or a dict of its options (a saved config). TypeError otherwise."""
    if value is None or value is False:
        return None
    if value is True:
        return AdaptiveClipping()
    if isinstance(value, AdaptiveClipping):
        return value
    if isinstance(value, dict):
        return AdaptiveClipping(**value)
    raise TypeError(
        "`adaptive_clipping` must be None, True, a keras_dyndp.AdaptiveClipping or a dict of its options. Received: "
        f"adaptive_clipping={value!r}."
    )


def config_of(options: AdaptiveClipping | None) -> dict | None:
    """What an optimizer's config holds for its ``adaptive_clipping``: the options' dict, or None."""
    return None if options is None else options.get_config()


def count_stddev(options: AdaptiveClipping, normaliser: float | None) -> float:
    """sigma_b: ``options.count_stddev``, else ``normaliser`` / 20 (n, the count's expected number of rows).
    ValueError when neither is known (``public_batch_size`` without a count_stddev)."""
    if options.count_stddev is not None:
        return options.count_stddev
    if normaliser is None:
        raise ValueError(
            "Adaptive clipping with `public_batch_size=True` needs `count_stddev` (the std of the noise on the count "
            "of unclipped examples, e.g. your batch size / 20): the expected batch size is unknown. Received: "
            "AdaptiveClipping(count_stddev=None)."
        )
    return float(normaliser) / 20.0


def gradient_noise_multipliers(
    noise_multipliers: np.ndarray, stddev: float, default_from: float | None = None
) -> np.ndarray:
    """z_g,t = (z_t^-2 - (2 sigma_b)^-2)^(-1/2) [T], the gradient's noise multipliers that, with the count's noise
    ``stddev`` = sigma_b, cost the schedule's ``noise_multipliers`` z_t (docs/privacy.md). ValueError unless 2 sigma_b
    > every z_t (else the count costs more); ``default_from``: n of a default sigma_b = n / 20, for the message."""
    z = np.asarray(noise_multipliers, np.float64)
    if not 2.0 * stddev > z.max():
        raise ValueError(
            f"`count_stddev` must exceed half the schedule's largest noise multiplier, {z.max() / 2:.6g} (the count "
            "of unclipped examples and the gradient share each step's privacy cost; 2 count_stddev = the largest "
            "multiplier leaves nothing for the gradient). Give a larger count_stddev or more noise. Received: "
            f"count_stddev={stddev!r}"
            + ("." if default_from is None else f" (the default: n / 20 with n = {default_from:g} expected rows).")
        )
    with np.errstate(divide="ignore"):  # z = 0 (no noise, tests only: allow_degenerate_noise) gives z_g = 0
        return (z**-2 - (2.0 * stddev) ** -2) ** -0.5


def step_arrays(schedule: Any, options: AdaptiveClipping | None, normaliser: float | None) -> tuple:
    """``(clip_norms, noise_stddevs, sigma_b)``, float32 arrays [T] the step reads (C_t, sigma_t) from and the count's
    noise std, for a `keras_dyndp.schedules.DPSchedule` ``schedule``: its own arrays and None; with adaptive clipping
    (1, z_g,t), to be scaled by the adapted C_t, and sigma_b (`count_stddev` of ``normaliser``)."""
    if options is None:
        return np.asarray(schedule.clip_norms, np.float32), np.asarray(schedule.noise_stddevs, np.float32), None
    stddev = count_stddev(options, normaliser)
    default_from = normaliser if options.count_stddev is None else None
    multipliers = gradient_noise_multipliers(schedule.noise_multipliers, stddev, default_from)
    return np.ones(schedule.num_steps, np.float32), multipliers.astype(np.float32), stddev


def centred_indicators(ops: Any, norms: Any, clip_norm: Any, rows: Any) -> Any:
    """float32 per row: +1/2 where its gradient ``norms`` are finite and at most ``clip_norm`` (unclipped), -1/2
    where not, 0 where the bool ``rows`` is False (a padding row, weight 0). Their sum is the count released."""
    norms = ops.cast(norms, "float32")
    unclipped = ops.is_finite(norms) & (norms <= ops.cast(clip_norm, "float32"))
    half = ops.cast(0.5, "float32")
    return ops.where(rows, ops.where(unclipped, half, -half), ops.cast(0.0, "float32"))


def next_clip_norm(
    ops: Any, clip_norm: Any, clip_state: Any, noised: Any, *, normaliser: Any, options: AdaptiveClipping
) -> Any:
    """C_{t+1} = C_t exp(-eta (b_t - gamma)), b_t = ``noised`` / ``normaliser`` n + 1/2: ``noised`` is the sum of
    `centred_indicators` over the batch (every replica's) plus N(0, (s sigma_b)^2), s = 1 (2 with microbatches).
    ``clip_state`` (C_t as stored) is kept where the step released nothing (``clip_norm``, C_t as the step read it,
    is 0: a refused step, past the budget); the result stays in [MIN_CLIP_NORM, MAX_CLIP_NORM]."""
    fraction = ops.cast(noised, "float32") / ops.cast(normaliser, "float32") + 0.5
    factor = ops.exp(ops.cast(-options.learning_rate, "float32") * (fraction - options.target_quantile))
    updated = ops.minimum(ops.maximum(clip_state * factor, MIN_CLIP_NORM), MAX_CLIP_NORM)
    return ops.where(clip_norm > 0, updated, clip_state)
