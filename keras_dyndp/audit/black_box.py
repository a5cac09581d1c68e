"""Black-box canary audit of a user's own training: mislabeled or out-of-distribution canaries, scored by loss. Trained
as a user trains (``make_private``, the user's optimizer, `poisson_batches`, `BudgetStop`) with m canaries included with
probability 1/2: 'mislabeled' (rows of ``x``, taken out of the training set, with a wrong label) or 'ood' (uniform noise
over ``x``'s range), scored by the final model's NEGATIVE loss. A weak attack: a correct run's bounds are far below the
claim (often 0); only a bound above it is evidence of a leak (docs/audit.md)."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from keras_dyndp import backend
from keras_dyndp.audit import bounds
from keras_dyndp.audit.white_box import CanaryAuditReport
from keras_dyndp.core import validation

__all__ = ["black_box_audit"]

CANARIES = ("mislabeled", "ood")


def _make_canaries(x: np.ndarray, y: np.ndarray, m: int, num_classes: int, canaries: str, rng: np.random.Generator):
    """(training x, training y, canary x, canary y): the training set without the canaries' rows."""
    if canaries == "mislabeled":
        order = rng.permutation(len(y))
        chosen, kept = order[:m], np.sort(order[m:])
        wrong = (y[chosen] + rng.integers(1, num_classes, size=m)) % num_classes
        return x[kept], y[kept], x[chosen], wrong.astype(y.dtype)
    low, high = float(np.min(x)), float(np.max(x))
    canary_x = rng.uniform(low, high, size=(m, *x.shape[1:])).astype(x.dtype)
    return x, y, canary_x, rng.integers(0, num_classes, size=m).astype(y.dtype)


def _checked_arguments(x, y, num_canaries, canaries: str, num_classes: int | None, epochs: int):
    """(x, y as int32, m, number of classes, epochs), or ValueError naming the bad argument."""
    validation.check_choice("canaries", canaries, CANARIES)
    x, y = np.asarray(x), np.asarray(y)
    if y.ndim != 1 or len(y) != len(x) or not np.issubdtype(y.dtype, np.integer):
        raise ValueError(f"y must be integer class labels [N] matching x's {len(x)} rows, got {y.dtype} {y.shape}")
    m = validation.check_int("num_canaries", num_canaries, 2)
    if canaries == "mislabeled" and m >= len(y):
        raise ValueError(f"'mislabeled' canaries are rows of x: num_canaries must be < N = {len(y)}, got {m}")
    k = int(np.max(y)) + 1 if num_classes is None else int(num_classes)
    validation.check_int("num_classes", k, 2)  # a canary needs a wrong label
    # JAX's default integer width.
    return x, y.astype(np.int32), m, k, validation.check_int("epochs", epochs, 1)


def _train(x, y, model_fn, optimizer_fn, loss, method, epochs, pad_to_multiple, seed):
    """The one audited run: ``model_fn()`` made private and trained on Poisson batches of ``(x, y)`` to the end of
    its schedule. Returns the model and the schedule."""
    import keras_dyndp  # pylint: disable=import-outside-toplevel

    optimizer = optimizer_fn(len(y))
    schedule = optimizer.schedule
    model = keras_dyndp.make_private(model_fn(), method)
    model.compile(optimizer=optimizer, loss=loss)
    p, steps = schedule.sampling_probability, math.ceil(schedule.num_steps / epochs)
    batches = keras_dyndp.poisson_batches(
        x, y, sampling_probability=p, steps_per_epoch=steps, pad_to_multiple=pad_to_multiple, seed=seed
    )
    model.fit(batches, epochs=epochs, verbose=0, callbacks=[keras_dyndp.BudgetStop()])
    return model, schedule


def black_box_audit(
    x,
    y,
    *,
    model_fn: Callable[[], object],
    optimizer_fn: Callable[[int], object],
    num_canaries: int = 100,
    canaries: str = "mislabeled",
    num_classes: int | None = None,
    loss=None,
    epochs: int = 1,
    delta: float = 1e-5,
    confidence: float = 0.95,
    num_guesses: int | None = None,
    method: str = "auto",
    pad_to_multiple: int | None = None,
    seed: int = 0,
) -> CanaryAuditReport:
    """Trains ``model_fn()`` once on ``(x, y)`` plus the included canaries and audits the run.

    Args:
        x: the user's inputs [N, ...].
        y: their integer class labels [N].
        model_fn: builds a fresh, uncompiled Keras model (logits out, unless ``loss`` says otherwise).
        optimizer_fn: ``optimizer_fn(num_examples)`` -> a keras_dyndp DP optimizer for that many training examples.
        num_canaries: m, an int >= 2 (< N for 'mislabeled').
        canaries: 'mislabeled' (rows of ``x`` with a wrong label) or 'ood' (uniform noise over ``x``'s range).
        num_classes: the number of classes, >= 2; default max(y) + 1.
        loss: per-example, to train and score (default: sparse cross-entropy from logits).
        epochs: Keras epochs the schedule's T steps are spread over, an int >= 1.
        delta: the delta of the claimed epsilon and of the lower bounds, in (0, 1).
        confidence: the confidence of the lower bounds, in (0, 1).
        num_guesses: as `audit_from_scores`'s.
        method: `make_private`'s method ('auto' default).
        pad_to_multiple: as `keras_dyndp.poisson_batches`'s.
        seed: the canaries, their coin flips, the Poisson batches and the tie-breaking (not the optimizer's noise).
    """
    x, y, m, k, epochs = _checked_arguments(x, y, num_canaries, canaries, num_classes, epochs)
    rng = np.random.default_rng(seed)
    train_x, train_y, canary_x, canary_y = _make_canaries(x, y, m, k, canaries, rng)
    included = rng.random(m) < 0.5
    train_x, train_y = np.concatenate([train_x, canary_x[included]]), np.concatenate([train_y, canary_y[included]])
    if loss is None:
        loss = backend.keras_module().losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    model, schedule = _train(train_x, train_y, model_fn, optimizer_fn, loss, method, epochs, pad_to_multiple, seed)

    scores = -np.asarray(loss(canary_y, model.predict(canary_x, verbose=0)), np.float64).reshape(m)
    result = bounds.audit_from_scores(
        scores[included], scores[~included], delta=delta, confidence=confidence, num_guesses=num_guesses, seed=seed
    )
    return CanaryAuditReport(claimed_epsilon=schedule.epsilon(delta, "pld"), result=result, score="loss")
