"""White-box (gradient-space) canary audit of the real DP training pipeline, in one run.

What is audited: everything between a batch and the released weights, on the backend Keras runs on, as a user
trains: ``make_private(model)``, a `DynamicDPKerasSGD` on a `DPSchedule`, ``fit`` on `poisson_batches` with
`BudgetStop`; or one of the package's other paths (``method``, ``accumulation_steps``, a tf.distribute
``strategy``, or Keras 2's optimizer-only path with ``method=None``). m canaries are each included in the training
set independently with probability 1/2; after the run each canary is scored from the weights after every step (every
intermediate model counts as released, as the accountant assumes) and `keras_dyndp.audit.audit_from_scores` turns
the scores into lower bounds on epsilon, beside the schedule's PLD epsilon.

Why Dirac canaries: the model is one bias-free Dense layer of d_in x d_out >= m weights and the per-example loss is
``-sum(y * f(x))``. Canary c has a one-hot input e_i and target s e_j (its own weight (i, j)), so its gradient is
-s on W[i, j] and 0 elsewhere: with s above every C_t it is clipped to exactly C_t, the largest move one example may
make, and no other canary touches its coordinate. Step t's released noisy sum on that coordinate is then
S_t = b C_t + sigma_t N_t (b = 1 if the canary was sampled), a Gaussian mechanism of shift C_t / sigma_t, exactly
what the accountant charges; the auditor's statistic (``score='sum'``, sum_t (C_t / sigma_t^2) S_t, the likelihood
ratio's for p = 1) is then the best test there is, so the bound measures the implementation, not a weak attack.
``score='reused_noise'`` (the spread over t of S_t / sigma_t, 0 for an absent canary when every step's noise is the
same draw) is the test for noise repeated across steps; it needs C_t / sigma_t to vary over t or p < 1.

What the bound means: with probability >= ``confidence`` the run's true epsilon at ``delta`` is at least
``epsilon_one_run`` (and at least ``epsilon_fdp`` if its trade-off curve is Gaussian-shaped, as DP-SGD's is). A bound
ABOVE ``claimed_epsilon`` is evidence, at that confidence, that the code leaks more than it accounts; a bound below
proves nothing (see `keras_dyndp.audit`). Audit runs are for testing the pipeline: the canary data set is synthetic.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math

import numpy as np

from keras_dyndp import backend
from keras_dyndp import validation
from keras_dyndp.audit import bounds

__all__ = ["CanaryAuditReport", "white_box_audit"]

SCORES = ("sum", "reused_noise")


@dataclasses.dataclass(frozen=True)
class CanaryAuditReport:
    """One white-box audit: the schedule's claimed epsilon (PLD) at ``result.delta`` and the audit's lower bounds."""

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
    """The per-example loss -sum(y * f(x)), as a Keras loss of reduction 'none' (the optimizer's own path needs
    the loss vector; make_private's step computes it per example either way)."""
    keras = backend.keras_module()

    class DiracLoss(keras.losses.Loss):
        def call(self, y_true, y_pred):
            return -total(y_true * y_pred, axis=-1)

    return DiracLoss(reduction="none")


def _scores(trajectory: np.ndarray, schedule, score: str) -> np.ndarray:
    """Scores [m] from the canaries' weights after each step, [T + 1, m] (float64)."""
    steps = trajectory.shape[0] - 1
    sums = np.diff(trajectory, axis=0)  # S_t up to the public factor lr / n
    clip = schedule.clip_norms[:steps, None]
    sigma = schedule.noise_stddevs[:steps, None]
    if score == "sum":
        return np.sum(clip * sums / sigma**2, axis=0)
    return np.std(sums / sigma, axis=0)


def white_box_audit(
    schedule,
    *,
    num_canaries: int = 1000,
    delta: float = 1e-5,
    confidence: float = 0.95,
    score: str = "sum",
    num_guesses: int | None = None,
    gradient_norm: float | None = None,
    method: str | None = "auto",
    accumulation_steps: int = 1,
    strategy=None,
    noise_seed: int | None = None,
    seed: int = 0,
) -> CanaryAuditReport:
    """Trains once with ``num_canaries`` Dirac canaries (module docstring) under ``schedule`` and audits the run.

    Args:
        schedule: the `keras_dyndp.DPSchedule` to train with (its T steps, its sampling probability p).
        num_canaries: m, each included with probability 1/2 (coin flips from ``seed``, seen only by the scoring).
        delta, confidence: of the claimed epsilon and the lower bounds.
        score: 'sum' (the statistic of correct DP-SGD) or 'reused_noise' (module docstring).
        num_guesses: r, fixed before the run; None searches `audit_from_scores`'s grid (Bonferroni over it).
        gradient_norm: s, each canary's gradient norm; default 10 max_t C_t (clipped at every step).
        method: ``make_private``'s per-example clipping method; None trains without ``make_private``, through the
            optimizer's own per-example path (the jacobian of the loss vector under Keras 2's train step; Keras 3
            refuses it).
        accumulation_steps: the optimizer's: each batch clipped in that many physical batches, noised once.
        strategy: a TensorFlow ``tf.distribute`` strategy (e.g. ``MirroredStrategy``) whose scope the model and the
            optimizer are built and compiled in, so that ``fit`` splits every batch across its replicas; None: none.
        noise_seed: the optimizer's ``noise_seed`` (reproducible noise, for tests; None: fresh noise).
        seed: the coin flips, the Poisson batches and the tie-breaking of equal scores.
    """
    import keras_dyndp  # pylint: disable=import-outside-toplevel

    validation.check_choice("score", score, SCORES)
    keras = backend.keras_module()
    m = validation.check_int("num_canaries", num_canaries, 2)
    side = math.isqrt(m - 1) + 1  # side * side >= m weights, one per canary
    rows, cols = np.divmod(np.arange(m), side)
    s = 10.0 * float(np.max(schedule.clip_norms)) if gradient_norm is None else float(gradient_norm)
    included = np.random.default_rng(seed).random(m) < 0.5
    x = np.eye(side, dtype="float32")[rows[included]]
    y = s * np.eye(side, dtype="float32")[cols[included]]

    total = keras.ops.sum if hasattr(keras, "ops") else keras.backend.sum
    p = schedule.sampling_probability
    learning_rate = 1.0
    optimizer_kwargs = {} if noise_seed is None else {"noise_seed": noise_seed}
    with contextlib.nullcontext() if strategy is None else strategy.scope():
        dense = keras.layers.Dense(side, use_bias=False, kernel_initializer="zeros")
        model = keras.Sequential([keras.Input((side,)), dense])
        if method is not None:
            model = keras_dyndp.make_private(model, method)
        # p N of the data trained on (the optimizer checks the batches against it): one factor on every update,
        # which the scores are invariant to.
        optimizer = keras_dyndp.DynamicDPKerasSGD(
            schedule=schedule,
            expected_batch_size=p * int(included.sum()),
            learning_rate=learning_rate,
            accumulation_steps=accumulation_steps,
            **optimizer_kwargs,
        )
        model.compile(optimizer=optimizer, loss=_dirac_loss(total))
        # Under the strategy: the batches are padded to a multiple of its replicas (Keras 3 needs the first batch to
        # split evenly, keras-team/keras#19246).
        batches = keras_dyndp.poisson_batches(
            x, y, sampling_probability=p, steps_per_epoch=schedule.num_steps, seed=seed
        )

    trajectory = [dense.get_weights()[0][rows, cols]]

    class Record(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            del batch, logs  # Unused.
            trajectory.append(dense.get_weights()[0][rows, cols])

    model.fit(batches, epochs=1, verbose=0, callbacks=[keras_dyndp.BudgetStop(), Record()])
    scores = _scores(np.asarray(trajectory, np.float64), schedule, score)
    result = bounds.audit_from_scores(
        scores[included], scores[~included], delta=delta, confidence=confidence, num_guesses=num_guesses, seed=seed
    )
    return CanaryAuditReport(claimed_epsilon=schedule.epsilon(delta, "pld"), result=result, score=score)
