"""White-box (gradient-space) canary audit of the real DP training pipeline, in one run. Trains as a user does
(``make_private``, `DynamicDPKerasSGD`, `poisson_batches`, `BudgetStop`; or another path) with m canaries each included
with probability 1/2, scores each from the weights after every step (every intermediate model counts as released) and
bounds epsilon with `audit_from_scores`, beside the schedule's PLD epsilon. Dirac canaries: one bias-free Dense layer,
loss ``-sum(y * f(x))``; canary c (input e_i, target s e_j) has gradient -s on W[i, j] alone, clipped to exactly C_t, so
step t's noisy sum there is S_t = b C_t + sigma_t N_t (b = 1 if sampled), the Gaussian mechanism the accountant charges.
``score='sum'`` (sum_t (C_t / sigma_t^2) S_t, the likelihood ratio's for p = 1) is the best test; ``'reused_noise'``
(the spread of S_t / sigma_t, 0 for an absent canary when one noise draw is reused) tests for repeated noise and needs
C_t / sigma_t to vary or p < 1."""

from __future__ import annotations

import contextlib
import dataclasses
import math

import numpy as np

from keras_dyndp import backend
from keras_dyndp.audit import bounds
from keras_dyndp.core import validation

__all__ = ["CanaryAuditReport", "white_box_audit"]

SCORES = ("sum", "reused_noise")


@dataclasses.dataclass(frozen=True)
class CanaryAuditReport:
    """One white-box audit: the schedule's claimed epsilon (PLD) at ``result.delta`` and the audit's lower bounds.

    Attributes:
        claimed_epsilon: the schedule's epsilon under the PLD accountant at ``result.delta``, a float >= 0 or inf.
        result: the audit's `AuditResult` (`audit_from_scores`'s): m, r, the correct guesses and both lower bounds.
        score: how each canary was scored, one of ``SCORES`` ('sum' or 'reused_noise'; module docstring).
    """

    claimed_epsilon: float
    result: bounds.AuditResult
    score: str

    @property
    def epsilon_one_run(self) -> float:
        """The one-run lower bound (Steinke et al.) on the run's epsilon at ``result.delta``."""
        return self.result.epsilon_one_run

    @property
    def epsilon_fdp(self) -> float:
        """The f-DP lower bound (Mahloujifar et al.; Gaussian trade-off shape) at ``result.delta``."""
        return self.result.epsilon_fdp

    def __str__(self) -> str:
        r = self.result
        return (
            f"claimed eps {self.claimed_epsilon:.2f}, one-run bound {r.epsilon_one_run:.2f}, f-DP bound "
            f"{r.epsilon_fdp:.2f} (m={r.num_canaries}, {r.num_correct}/{r.num_guesses} correct, "
            f"confidence {r.confidence}, delta {r.delta:g}, score {self.score!r})"
        )


def _dirac_loss(total):
    """The per-example loss -sum(y * f(x)), as a Keras loss of reduction 'none'."""
    keras = backend.keras_module()

    class DiracLoss(keras.losses.Loss):
        def call(self, y_true, y_pred):
            return -total(y_true * y_pred, axis=-1)

    return DiracLoss(reduction="none")


def _scores(trajectory: np.ndarray, schedule, score: str) -> np.ndarray:
    """Scores [m] from the canaries' weights after each step, [T + 1, m] (float64)."""
    steps = trajectory.shape[0] - 1
    sums = np.diff(trajectory, axis=0)  # S_t up to the public factor lr / n
    clip, sigma = schedule.clip_norms[:steps, None], schedule.noise_stddevs[:steps, None]
    return np.sum(clip * sums / sigma**2, axis=0) if score == "sum" else np.std(sums / sigma, axis=0)


def _train_recording(schedule, x, y, weights, *, method, accumulation_steps, strategy, noise_seed, seed) -> np.ndarray:
    """Trains the one-Dense model on (x, y) as a user does and returns the canaries' `weights` (rows, cols of its
    kernel) after each step, [T + 1, m] (float64)."""
    import keras_dyndp  # pylint: disable=import-outside-toplevel

    keras = backend.keras_module()
    total = keras.ops.sum if hasattr(keras, "ops") else keras.backend.sum
    p = schedule.sampling_probability
    with contextlib.nullcontext() if strategy is None else strategy.scope():
        dense = keras.layers.Dense(x.shape[1], use_bias=False, kernel_initializer="zeros")
        model = keras.Sequential([keras.Input((x.shape[1],)), dense])
        model = keras_dyndp.make_private(model, method)
        # p N of the data trained on (the optimizer checks the batches against it): one factor on every update,
        # which the scores are invariant to.
        dp = {"expected_batch_size": p * len(x), "accumulation_steps": accumulation_steps, "noise_seed": noise_seed}
        optimizer = keras_dyndp.DynamicDPKerasSGD(schedule=schedule, learning_rate=1.0, **dp)
        model.compile(optimizer=optimizer, loss=_dirac_loss(total))
        # In the strategy's scope: padded to a multiple of its replicas.
        batches = keras_dyndp.poisson_batches(
            x, y, sampling_probability=p, steps_per_epoch=schedule.num_steps, seed=seed
        )

    trajectory = [dense.get_weights()[0][weights]]

    class Record(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            del batch, logs
            trajectory.append(dense.get_weights()[0][weights])

    model.fit(batches, epochs=1, verbose=0, callbacks=[keras_dyndp.BudgetStop(), Record()])
    return np.asarray(trajectory, np.float64)


def white_box_audit(
    schedule,
    *,
    num_canaries: int = 1000,
    delta: float = 1e-5,
    confidence: float = 0.95,
    score: str = "sum",
    num_guesses: int | None = None,
    gradient_norm: float | None = None,
    method: str = "auto",
    accumulation_steps: int = 1,
    strategy=None,
    noise_seed: int | None = None,
    seed: int = 0,
) -> CanaryAuditReport:
    """Trains once with ``num_canaries`` Dirac canaries (module docstring) under ``schedule`` and audits the run.

    Args:
        schedule: the `DPSchedule` to train under (its p, T, C_t and sigma_t); its PLD epsilon is the claim.
        num_canaries: m, the number of canaries, an int >= 2 (default 1000), each included with probability 1/2.
        delta: the delta of the claimed epsilon and of the lower bounds, in (0, 1) (default 1e-5).
        confidence: the confidence of the lower bounds, in (0, 1) (default 0.95).
        score: 'sum' (default, the likelihood-ratio test) or 'reused_noise' (a test for repeated noise; module doc).
        num_guesses: as `audit_from_scores`'s (None: its default grid).
        gradient_norm: s, each canary's gradient norm before clipping, a finite float > 0 (>= max_t C_t clips it
            to exactly C_t); None (default) for 10 max_t C_t.
        method: `make_private`'s method ('auto' default; TensorFlow's 'jacobian' audits the optimizer's own path).
        accumulation_steps: the optimizer's ``accumulation_steps`` k, an int >= 1 (default 1).
        strategy: a ``tf.distribute`` strategy to build, compile and fit in, or None (default) for none.
        noise_seed: the optimizer's ``noise_seed``: None (default, OS entropy) or an int >= 0 (tests: reproducible).
        seed: the coin flips, the Poisson batches and the tie-breaking (not the optimizer's noise), an int >= 0
            (default 0).
    """
    validation.check_choice("score", score, SCORES)
    m = validation.check_int("num_canaries", num_canaries, 2)
    side = math.isqrt(m - 1) + 1  # side * side >= m weights, one per canary
    rows, cols = np.divmod(np.arange(m), side)
    # A non-finite or non-positive norm would give the canaries no (or a non-finite) gradient: an audit that passes
    # because its canaries moved nothing.
    default = 10.0 * float(np.max(schedule.clip_norms))
    s = default if gradient_norm is None else validation.check_float("gradient_norm", gradient_norm)
    included = np.random.default_rng(seed).random(m) < 0.5
    x, y = np.eye(side, dtype="float32")[rows[included]], s * np.eye(side, dtype="float32")[cols[included]]
    training = {"accumulation_steps": accumulation_steps, "strategy": strategy, "noise_seed": noise_seed}
    trajectory = _train_recording(schedule, x, y, (rows, cols), method=method, seed=seed, **training)
    scores = _scores(trajectory, schedule, score)
    result = bounds.audit_from_scores(
        scores[included], scores[~included], delta=delta, confidence=confidence, num_guesses=num_guesses, seed=seed
    )
    return CanaryAuditReport(claimed_epsilon=schedule.epsilon(delta, "pld"), result=result, score=score)
