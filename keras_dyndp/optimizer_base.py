"""The backend-neutral part of a keras_dyndp DP optimizer: its arguments, checked and resolved the same way on
every Keras backend, its schedule and its config (`DPOptimizerBase`).

`resolve` turns the constructor's arguments (a `DPSchedule` or a privacy budget, microbatches, the normaliser,
accumulation, rescaling, the base optimizer's keyword arguments) into `DPArguments`, or raises ValueError / TypeError
naming the argument and its valid range, before anything is built. It imports no TensorFlow and no JAX: the
TensorFlow optimizers (`keras_dyndp.optimizers`) and the JAX ones (`keras_dyndp.jax_backend`) both subclass
`DPOptimizerBase`, which calls it.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import threading
import warnings
from collections.abc import Sequence
from typing import Any

from keras_dyndp import schedules
from keras_dyndp.accounting import registry

KERAS_3_UNSUPPORTED_OPTIMIZER_ARGUMENTS: dict[str, str] = {
    "gradient_accumulation_steps": "each micro-step would be a DP step with its own noise, and the counter "
    "would count updates, not DP steps; use `accumulation_steps`, which clips a batch in that many physical "
    "batches and adds the noise once",
    "loss_scale_factor": "it rescales the already noised update; keras_dyndp computes the per-example gradients itself",
}
"""Keras 3 base-optimizer arguments a DP optimizer refuses (when not None), with the reason."""

BUDGET_ARGUMENTS = (
    "target_epsilon",
    "target_delta",
    "num_examples",
    "batch_size",
    "epochs",
    "steps",
    "method",
    "initial_clip",
    "rho_mu",
    "rho_c",
    "accountant",
)


def check_num_microbatches(num_microbatches) -> int | None:
    if num_microbatches is None:
        return None
    is_integer = isinstance(num_microbatches, numbers.Integral) and not isinstance(num_microbatches, bool)
    if not is_integer or num_microbatches < 1:
        raise ValueError(
            "`num_microbatches` must be None (one microbatch per example) or an integer >= 1. "
            f"Received: num_microbatches={num_microbatches!r}."
        )
    return int(num_microbatches)


def check_accumulation_steps(accumulation_steps, num_microbatches: int | None) -> int:
    is_integer = isinstance(accumulation_steps, numbers.Integral) and not isinstance(accumulation_steps, bool)
    if not is_integer or accumulation_steps < 1:
        raise ValueError(
            "`accumulation_steps` must be an integer >= 1 (the number of physical batches each batch is clipped in). "
            f"Received: accumulation_steps={accumulation_steps!r}."
        )
    if accumulation_steps > 1 and num_microbatches is not None:
        raise ValueError(
            "`accumulation_steps` > 1 splits a batch of examples, each clipped on its own; microbatches are clipped "
            "as a whole and cannot be split. Use one of them. Received: "
            f"accumulation_steps={accumulation_steps}, num_microbatches={num_microbatches}."
        )
    return int(accumulation_steps)


def check_private_train_step(private_train_step) -> dict | None:
    if private_train_step is None:
        return None
    if not isinstance(private_train_step, dict) or set(private_train_step) != {"method", "training_metrics"}:
        raise ValueError(
            "`private_train_step` must be None or a dict with keys 'method' and 'training_metrics' (make_private's "
            f"arguments). Received: private_train_step={private_train_step!r}."
        )
    return dict(private_train_step)


def check_expected_batch_size(expected_batch_size) -> float | None:
    if expected_batch_size is None:
        return None
    if (
        isinstance(expected_batch_size, bool)
        or not isinstance(expected_batch_size, numbers.Real)
        or not math.isfinite(expected_batch_size)
        or expected_batch_size <= 0
    ):
        raise ValueError(
            "`expected_batch_size` must be None (normalise by the actual batch size) or a finite number > 0. "
            f"Received: expected_batch_size={expected_batch_size!r}."
        )
    return float(expected_batch_size)


def _warn_if_gdp_clt_understates(schedule: schedules.DPSchedule) -> None:
    """Warns (once, at construction) when a GDP-CLT calibration's PLD epsilon exceeds its target by > 5%."""
    text = schedules.gdp_clt_understatement(schedule)
    if text is not None:
        # Attributed to the caller of the optimizer's constructor (this function, resolve_schedule, resolve, __init__).
        warnings.warn(text, schedules.GdpCltUnderstatementWarning, stacklevel=5)


def resolve_schedule(schedule, budget: dict, expected_batch_size) -> tuple[schedules.DPSchedule, float | None]:
    """The optimizer's schedule and normaliser, from a `DPSchedule` or from budget arguments (exactly one).

    Budget arguments are calibrated under `accountant` (default 'pld', rigorous). Either way a schedule that was
    calibrated under the GDP-CLT gets one `GdpCltUnderstatementWarning` if its PLD epsilon is > 1.05 x its target.
    """
    given = [name for name in BUDGET_ARGUMENTS if budget[name] is not None]
    if schedule is not None:
        if given:
            raise ValueError(
                "Give either `schedule` or the budget arguments, not both. "
                f"Received: schedule={schedule!r} and {', '.join(given)}."
            )
        if not isinstance(schedule, schedules.DPSchedule):
            raise TypeError(
                "`schedule` must be a keras_dyndp.schedules.DPSchedule. "
                f"Received: schedule={schedule!r} of type {type(schedule).__name__}."
            )
        _warn_if_gdp_clt_understates(schedule)
        return schedule, check_expected_batch_size(expected_batch_size)
    if not given:
        raise ValueError(
            "Give either `schedule` (a DPSchedule) or the budget arguments target_epsilon, target_delta, "
            "num_examples, batch_size, epochs or steps, method and initial_clip. Received neither."
        )
    missing = [
        name
        for name in ("target_epsilon", "target_delta", "num_examples", "batch_size", "method", "initial_clip")
        if budget[name] is None
    ]
    if missing:
        raise ValueError(
            f"Building the schedule from a budget needs {', '.join(missing)} as well. "
            f"Received only: {', '.join(given)}."
        )
    batch_size = budget["batch_size"]
    if expected_batch_size is not None and expected_batch_size != batch_size:
        raise ValueError(
            "With budget arguments `expected_batch_size` is `batch_size`; leave it out or make them equal. "
            f"Received: expected_batch_size={expected_batch_size}, batch_size={batch_size}."
        )
    sampling_probability, num_steps = schedules.sampling_from_epochs(
        budget["num_examples"], batch_size, epochs=budget["epochs"], steps=budget["steps"]
    )
    schedule = schedules.calibrate(
        budget["method"],
        target_epsilon=budget["target_epsilon"],
        target_delta=budget["target_delta"],
        sampling_probability=sampling_probability,
        num_steps=num_steps,
        initial_clip=budget["initial_clip"],
        rho_mu=1.0 if budget["rho_mu"] is None else budget["rho_mu"],
        rho_c=1.0 if budget["rho_c"] is None else budget["rho_c"],
        accountant=registry.DEFAULT_ACCOUNTANT if budget["accountant"] is None else budget["accountant"],
    )
    _warn_if_gdp_clt_understates(schedule)
    return schedule, check_expected_batch_size(batch_size)


def check_rescale_to_unit_norm(rescale_to_unit_norm) -> bool:
    if not isinstance(rescale_to_unit_norm, bool):
        raise ValueError(
            f"`rescale_to_unit_norm` must be True or False. Received: rescale_to_unit_norm={rescale_to_unit_norm!r}."
        )
    return rescale_to_unit_norm


def check_base_arguments(kwargs: dict, unsupported: dict[str, str]) -> None:
    """Refuses the base-optimizer arguments in ``unsupported`` (name: reason) that ``kwargs`` sets."""
    for name, reason in unsupported.items():
        if kwargs.get(name) is not None:
            raise ValueError(
                f"Dynamic DP optimizers do not support `{name}`: {reason}. Received: {name}={kwargs[name]!r}."
            )


@dataclasses.dataclass(frozen=True)
class DPArguments:
    """A DP optimizer's checked arguments: its schedule and how it clips and normalises."""

    schedule: schedules.DPSchedule
    expected_batch_size: float | None
    num_microbatches: int | None
    accumulation_steps: int
    rescale_to_unit_norm: bool


def resolve(
    schedule,
    budget: dict,
    *,
    num_microbatches,
    expected_batch_size,
    accumulation_steps,
    rescale_to_unit_norm,
    base_kwargs: dict,
    unsupported: dict[str, str],
) -> DPArguments:
    """Checks a DP optimizer's constructor arguments and builds (or takes) its schedule.

    Args:
      schedule: a `DPSchedule`, or None when ``budget`` gives the privacy budget.
      budget: the budget arguments by name (`BUDGET_ARGUMENTS`; None where not given).
      num_microbatches, expected_batch_size, accumulation_steps, rescale_to_unit_norm: as the optimizers take them.
      base_kwargs: the keyword arguments for the base optimizer class.
      unsupported: base-optimizer arguments the backend's DP optimizers refuse, with the reason.

    Raises:
      ValueError, TypeError: naming the argument and its valid values.
    """
    schedule, expected_batch_size = resolve_schedule(schedule, budget, expected_batch_size)
    num_microbatches = check_num_microbatches(num_microbatches)
    accumulation_steps = check_accumulation_steps(accumulation_steps, num_microbatches)
    rescale_to_unit_norm = check_rescale_to_unit_norm(rescale_to_unit_norm)
    check_base_arguments(base_kwargs, unsupported)
    return DPArguments(schedule, expected_batch_size, num_microbatches, accumulation_steps, rescale_to_unit_norm)


class GradientGuard:
    """Remembers the gradients the DP path produced, so the optimizer's apply can refuse any others.

    A plain Python object (not a tracked list) so the optimizer's checkpoint graph is not affected. Per thread:
    MirroredStrategy traces each replica's step in a thread of its own, between compute_gradients and
    apply_gradients of the same replica.
    """

    def __init__(self):
        self._local = threading.local()

    def issue(self, grads: Sequence[Any]) -> None:
        self._local.pending = tuple(grads)

    def check_and_clear(self, grads: Sequence[Any]) -> bool:
        pending, self._local.pending = getattr(self._local, "pending", None), None
        return pending is not None and len(pending) == len(grads) and all(g is p for g, p in zip(grads, pending))


class DPOptimizerBase:
    """The backend-neutral part of every keras_dyndp DP optimizer: its arguments, their checks, its schedule and
    its config. A backend's mixin (`keras_dyndp.optimizers.DynamicDPOptimizerMixin` for TensorFlow,
    `keras_dyndp.jax_backend.optimizer.JaxDPOptimizerMixin` for JAX) subclasses it and adds the mechanism in
    `_build_dp_state`; ``class DynamicDPKerasSGD(<backend mixin>, keras.optimizers.SGD)``.

    Args:
      schedule: the `DPSchedule` to follow (exclusive with the budget arguments).
      target_epsilon, target_delta: the budget (epsilon > 0, delta in (0, 1)).
      num_examples: training set size N.
      batch_size: expected batch size; the sampling probability is batch_size / N and it becomes
        `expected_batch_size`.
      epochs, steps: the run length, exactly one of them.
      method: 'vanilla', 'growing_mu', 'sensitivity_decay' or 'dynamic'.
      initial_clip: C_0 > 0.
      rho_mu, rho_c: the schedule's growth of mu and decay of C over the run (>= 1; default 1).
      accountant: accountant the budget is met under: 'pld' (default; rigorous and tight), 'rdp' (rigorous)
        or 'gdp_clt' (the paper's approximation, which can understate epsilon: a `GdpCltUnderstatementWarning`
        gives the PLD epsilon when it exceeds the target by more than 5%).
      num_microbatches: None (default) clips every example; an integer M >= 1 clips the means of M random
        microbatches, with twice the noise at every step (see the module docstring).
      expected_batch_size: p N, the normaliser of the noisy sum (None: the actual number of rows). With it, a
        batch whose number of examples is far outside Binomial(N, p) is refused. Under a multi-replica
        tf.distribute strategy it is the GLOBAL batch's (`keras_dyndp.replicas`).
      accumulation_steps: k >= 1 (default 1). `keras_dyndp.make_private`'s step clips each batch (the logical
        batch that p and the schedule count) in k physical batches, one after another, and adds the noise once:
        a batch k times larger than memory allows (`keras_dyndp.per_example.accumulation`).
      rescale_to_unit_norm: False (default) divides the noisy clipped sum by the normaliser alone; True divides
        it by the normaliser times C_t as well (the module docstring, step 4). Post-processing: privacy unchanged.
      noise_seed: None (default) seeds the noise from OS entropy, the only choice for a model you release. An
        integer >= 0 makes the noise reproducible for tests and research, with a `NoiseSeedWarning`: whoever
        knows it can remove the noise. It is never serialised; a reloaded optimizer draws OS entropy.
      **kwargs: arguments of the base optimizer class (learning_rate, ...), keyword only.
    """

    def __init__(
        self,
        *,
        schedule: schedules.DPSchedule | None = None,
        target_epsilon: float | None = None,
        target_delta: float | None = None,
        num_examples: int | None = None,
        batch_size: int | None = None,
        epochs: float | None = None,
        steps: int | None = None,
        method: str | None = None,
        initial_clip: float | None = None,
        rho_mu: float | None = None,
        rho_c: float | None = None,
        accountant: str | None = None,
        num_microbatches: int | None = None,
        expected_batch_size: float | None = None,
        accumulation_steps: int = 1,
        rescale_to_unit_norm: bool = False,
        noise_seed: int | None = None,
        **kwargs,
    ):
        budget = dict(
            target_epsilon=target_epsilon,
            target_delta=target_delta,
            num_examples=num_examples,
            batch_size=batch_size,
            epochs=epochs,
            steps=steps,
            method=method,
            initial_clip=initial_clip,
            rho_mu=rho_mu,
            rho_c=rho_c,
            accountant=accountant,
        )
        arguments = resolve(
            schedule,
            budget,
            num_microbatches=num_microbatches,
            expected_batch_size=expected_batch_size,
            accumulation_steps=accumulation_steps,
            rescale_to_unit_norm=rescale_to_unit_norm,
            base_kwargs=kwargs,
            unsupported=self._unsupported_base_arguments(),
        )
        self._check_backend()
        kwargs.setdefault("name", type(self).__name__)
        super().__init__(**kwargs)
        self._schedule = arguments.schedule
        self._num_microbatches = arguments.num_microbatches
        self._accumulation_steps = arguments.accumulation_steps
        self._rescale_to_unit_norm = arguments.rescale_to_unit_norm
        self._expected_batch_size = arguments.expected_batch_size
        self._private_train_step: dict | None = None  # make_private's arguments, once it has used this optimizer.
        self._build_dp_state(noise_seed)

    def _check_backend(self) -> None:
        """Raises if the backend cannot run this optimizer here (before the base optimizer is built)."""

    def _unsupported_base_arguments(self) -> dict[str, str]:
        """Base-optimizer arguments refused on this backend, with the reason."""
        return KERAS_3_UNSUPPORTED_OPTIMIZER_ARGUMENTS

    def _build_dp_state(self, noise_seed: int | None) -> None:
        """Builds the backend's state of the mechanism: its random source, schedule tensors and checks."""
        raise NotImplementedError

    @property
    def schedule(self) -> schedules.DPSchedule:
        """The `DPSchedule` this optimizer follows."""
        return self._schedule

    @property
    def expected_batch_size(self) -> float | None:
        """Normaliser of the noisy sum for per-example clipping; None means the actual batch size."""
        return self._expected_batch_size

    @property
    def accumulation_steps(self) -> int:
        """Number of physical batches `make_private`'s step clips each batch in (1: the whole batch at once)."""
        return self._accumulation_steps

    @property
    def rescale_to_unit_norm(self) -> bool:
        """Whether the noisy clipped sum is divided by C_t as well as by the normaliser."""
        return self._rescale_to_unit_norm

    @property
    def num_microbatches(self) -> int | None:
        """Number of microbatches per batch; None means one per example."""
        return self._num_microbatches

    @property
    def sensitivity_in_clip_norms(self) -> float:
        """How far one example can move the clipped sum, in units of C_t; the noise's std is this times sigma_t.

        1 for per-example clipping; 2 with microbatches, whatever the batch size: one example moves one clipped
        microbatch gradient, from one vector of norm <= C_t to another (`keras_dyndp.optimizers.microbatches`).
        """
        return 1.0 if self._num_microbatches is None else 2.0

    def get_config(self) -> dict:
        config = super().get_config()
        config.update(
            schedule=self._schedule.get_config(),
            num_microbatches=self._num_microbatches,
            expected_batch_size=self._expected_batch_size,
            accumulation_steps=self._accumulation_steps,
            rescale_to_unit_norm=self._rescale_to_unit_norm,
            private_train_step=None if self._private_train_step is None else dict(self._private_train_step),
        )
        return config

    @classmethod
    def from_config(cls, config: dict, custom_objects=None):
        config = dict(config)
        if isinstance(config.get("schedule"), dict):
            config["schedule"] = schedules.DPSchedule.from_config(config["schedule"])
        private_train_step = check_private_train_step(config.pop("private_train_step", None))
        optimizer = super().from_config(config, custom_objects=custom_objects)
        optimizer._private_train_step = private_train_step  # pylint: disable=protected-access
        return optimizer
