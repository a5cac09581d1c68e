"""The backend-neutral part of every DP optimizer (`DPOptimizerBase`): its arguments, checked once at construction
(ValueError / TypeError naming the argument and its range), its schedule, its refusals and its config. Imports no
TensorFlow and no JAX: the optimizers of `keras_dyndp.tf_backend` and `keras_dyndp.jax_backend` subclass it.
"""

from __future__ import annotations

import threading
import warnings
import weakref
from collections.abc import Sequence
from typing import Any

from keras_dyndp import schedules
from keras_dyndp import validation
from keras_dyndp.accounting import noise_range

KERAS_3_UNSUPPORTED_OPTIMIZER_ARGUMENTS: dict[str, str] = {
    "gradient_accumulation_steps": "each micro-step would be a DP step with its own noise, and the counter "
    "would count updates, not DP steps; use `accumulation_steps`, which clips a batch in that many physical "
    "batches and adds the noise once",
    "loss_scale_factor": "it rescales the already noised update; keras_dyndp computes the per-example gradients itself",
}
"""Keras 3 base-optimizer arguments a DP optimizer refuses (when not None), with the reason."""

BUDGET_ARGUMENTS = tuple(
    "target_epsilon target_delta num_examples batch_size epochs steps method initial_clip rho_mu rho_c "
    "accountant".split()
)
_REQUIRED_BUDGET_ARGUMENTS = ("target_epsilon", "target_delta", "num_examples", "batch_size", "method", "initial_clip")


def check_accumulation_steps(accumulation_steps, num_microbatches: int | None) -> int:
    accumulation_steps = validation.check_positive_int(
        "accumulation_steps", accumulation_steps, "the number of physical batches each batch is clipped in", exact=True
    )
    if accumulation_steps > 1 and num_microbatches is not None:
        raise ValueError(
            "`accumulation_steps` > 1 splits a batch of examples, each clipped on its own; microbatches are clipped "
            "as a whole and cannot be split. Use one of them. Received: "
            f"accumulation_steps={accumulation_steps}, num_microbatches={num_microbatches}."
        )
    return accumulation_steps


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
    return validation.check_float(
        "expected_batch_size", expected_batch_size, hint="p*N, the expected number of examples per batch"
    )


def schedule_normaliser(schedule: schedules.DPSchedule, expected_batch_size, public_batch_size: bool) -> float | None:
    """The normaliser given a `DPSchedule`: ``expected_batch_size`` (p N), or None (each batch's rows) with
    ``public_batch_size``; exactly one of them.

    The noisy sum is divided by it, so it must not depend on the private data: under Poisson sampling a batch's
    size is private, and so are a padded batch's rows; p N is public, and gives the N the batch-size check needs.
    Rows are safe only for fixed-size batches (outside Poisson accounting): ``public_batch_size=True`` states that.
    """
    expected_batch_size = check_expected_batch_size(expected_batch_size)
    if public_batch_size and expected_batch_size is not None:
        raise ValueError(
            "Give either `expected_batch_size` (p*N: divide the noisy sum by that public constant and check each "
            "batch's size against Poisson sampling) or public_batch_size=True (divide it by each batch's rows, "
            f"which you state are public), not both. Received: expected_batch_size={expected_batch_size:g}, "
            "public_batch_size=True."
        )
    if not public_batch_size and expected_batch_size is None:
        p = schedule.sampling_probability
        raise ValueError(
            "An optimizer built from a `schedule` needs `expected_batch_size` = p*N (here p*N = "
            f"{p:g} * the number of training examples): the noisy sum is divided by it. Dividing by each batch's "
            "rows instead would release the private Poisson batch size with every update (padded batches follow "
            "it too), and without N no batch size can be checked against the schedule's sampling. Only if your "
            "batches have a fixed, public size (not Poisson sampling, so outside the schedule's accounting) pass "
            "public_batch_size=True instead. Received: expected_batch_size=None."
        )
    return expected_batch_size


def resolve_schedule(
    schedule, budget: dict, expected_batch_size, public_batch_size: bool
) -> tuple[schedules.DPSchedule, float | None]:
    """The optimizer's schedule and normaliser: a `DPSchedule` given, or the budget arguments' (exactly one).

    Budget arguments are a `schedules.PrivacyBudget` (calibrated under ``accountant``, default 'pld'), and their
    normaliser is ``batch_size``.
    """
    given = {name: value for name, value in budget.items() if value is not None}
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
        return schedule, schedule_normaliser(schedule, expected_batch_size, public_batch_size)
    if not given:
        raise ValueError(
            "Give either `schedule` (a DPSchedule) or the budget arguments target_epsilon, target_delta, "
            "num_examples, batch_size, epochs or steps, method and initial_clip. Received neither."
        )
    missing = [name for name in _REQUIRED_BUDGET_ARGUMENTS if name not in given]
    if missing:
        raise ValueError(
            f"Building the schedule from a budget needs {', '.join(missing)} as well. "
            f"Received only: {', '.join(given)}."
        )
    if public_batch_size:
        raise ValueError(
            "The budget arguments account for Poisson batches of batch_size examples in expectation, whose actual "
            "sizes are private: the noisy sum is divided by expected_batch_size = batch_size. Leave "
            "public_batch_size out. Received: public_batch_size=True."
        )
    if expected_batch_size is not None and expected_batch_size != given["batch_size"]:
        raise ValueError(
            "With budget arguments `expected_batch_size` is `batch_size`; leave it out or make them equal. "
            f"Received: expected_batch_size={expected_batch_size}, batch_size={given['batch_size']}."
        )
    return schedules.PrivacyBudget(**given).calibrate(), check_expected_batch_size(given["batch_size"])


def check_base_arguments(kwargs: dict, unsupported: dict[str, str]) -> None:
    """Refuses the base-optimizer arguments in ``unsupported`` (name: reason) that ``kwargs`` sets."""
    for name, reason in unsupported.items():
        if kwargs.get(name) is not None:
            raise ValueError(
                f"Dynamic DP optimizers do not support `{name}`: {reason}. Received: {name}={kwargs[name]!r}."
            )


class ScheduleRestartWarning(UserWarning):
    """A model that took DP steps under one DP optimizer trains under another, whose schedule starts at step 0."""


_DP_STEP_OF_MODEL: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""Per model, the ``dp_step`` of the DP optimizer it was last built with (only the counter: the slots are freed)."""


def warn_on_schedule_restart(model: Any, optimizer: DPOptimizerBase) -> None:
    """Warns when ``optimizer``, at step 0, replaces a DP optimizer that took steps on ``model`` (restored with it,
    or trained in this process): the new schedule starts over, and its epsilon leaves out the earlier steps."""
    previous = _DP_STEP_OF_MODEL.get(model)
    _DP_STEP_OF_MODEL[model] = optimizer.dp_step
    if previous is None or previous is optimizer.dp_step:
        return
    steps = int(previous.numpy())
    if steps == 0 or int(optimizer.dp_step.numpy()) != 0:
        return
    warnings.warn(
        f"Model {model.name!r} took {steps} DP steps under its previous DP optimizer (restored by load_model or a "
        f"checkpoint, or trained in this process) and now trains under a new {type(optimizer).__name__} at "
        f"dp_step 0: its schedule starts over, and the epsilon it reports leaves out those {steps} steps, whose "
        "budget was spent on the same data (the two runs' epsilons add up). To resume, keep the restored "
        "optimizer (load_model restores it with its counter: do not compile the model again) or restore the "
        "counter into this one from a checkpoint; to train a second run on purpose, account for both runs.",
        ScheduleRestartWarning,
        stacklevel=3,
    )


class DegenerateNoiseWarning(UserWarning):
    """An optimizer trains with noise multipliers outside the accountants' range (``allow_degenerate_noise=True``)."""


def check_schedule_noise(schedule: schedules.DPSchedule, argument: str, allow_degenerate_noise) -> bool:
    """Refuses, before any step, a schedule with a noise multiplier outside what every accountant represents
    (z_t = 0 releases the clipped sum in the clear; z_t = 1e-6 gives one step epsilon > 1e7), unless
    ``allow_degenerate_noise`` (returned): then a `DegenerateNoiseWarning`, for tests without noise.

    Raises:
      noise_range.NoiseOutOfRangeError (a ValueError): naming ``argument``, the step and the accepted range.
    """
    validation.check_bool("allow_degenerate_noise", allow_degenerate_noise)
    try:
        noise_range.check_trained_noise_multipliers(schedule.noise_multipliers, argument)
    except noise_range.NoiseOutOfRangeError as error:
        if not allow_degenerate_noise:
            raise
        warnings.warn(  # Attributed to the caller of the optimizer's constructor.
            f"allow_degenerate_noise=True: {error} This optimizer trains anyway: its updates have no meaningful "
            "differential privacy. Use it only to test.",
            DegenerateNoiseWarning,
            stacklevel=3,
        )
    return allow_degenerate_noise


class BudgetExhaustedError(RuntimeError):
    """A DP step past the schedule's T steps was refused: the accounted epsilon covers only T (nothing applied)."""


BUDGET_EXHAUSTED = "DP budget exhausted: all"
"""How `budget_exhausted_message` begins (what a caller looks for in a TensorFlow assertion's text)."""


def budget_exhausted_message(num_steps: int, budget_stop: str) -> str:
    """The one-line refusal of a step past the schedule's ``num_steps``; ``budget_stop``: the backend's callback."""
    return (
        f"{BUDGET_EXHAUSTED} {num_steps} steps of the DPSchedule have been taken (dp_step >= schedule.num_steps) "
        "and another step would exceed the accounted privacy budget, so none was applied. Add "
        f"{budget_stop}() to the callbacks of fit to end training at the last step, or calibrate a longer schedule."
    )


def budget_spent_line(steps: int, num_steps: int) -> str:
    """What `BudgetStop` prints when it ends ``fit`` at the schedule's last step (a normal end)."""
    return f"BudgetStop: the privacy budget is spent ({steps} of the schedule's {num_steps} DP steps); training ended."


UNRECORDED_FINGERPRINT = (0, 0)
"""The schedule fingerprint an optimizer holds before its first step (`DPSchedule.fingerprint` is never this)."""


def restored_schedule_refusal(
    step: int, recorded_fingerprint: Sequence[int], schedule: schedules.DPSchedule
) -> str | None:
    """Why a DP step must not run at step counter ``step`` under ``schedule``, or None when it may.

    The fingerprint of the schedule is recorded at step 0 and saved with the counter. A counter past 0 restored
    under another fingerprint (or none) would index the wrong schedule, and `PrivacyLogger` would account steps
    taken under other noise. Step 0 always runs: nothing is spent.
    """
    recorded = tuple(int(word) for word in recorded_fingerprint)
    if step == 0 or recorded == schedule.fingerprint:
        return None
    return schedule_mismatch_message(recorded != UNRECORDED_FINGERPRINT) + f" {step}."


def schedule_mismatch_message(recorded: bool) -> str:
    """The refusal of a restored step counter (`restored_schedule_refusal`), up to the number of steps taken."""
    if recorded:
        what = (
            "The optimizer's step counter was restored from a checkpoint written under another DP schedule (its "
            "schedule fingerprint differs from this optimizer's schedule's)"
        )
        unknown = ""
    else:
        what = (
            "The optimizer's step counter is past 0 but no schedule fingerprint was saved with it (a checkpoint "
            "written before keras_dyndp recorded one, or a counter restored or set alone), so nothing shows which "
            "schedule its steps were taken under"
        )
        unknown = (
            " If you know that it was written under this very schedule, call optimizer.record_schedule_fingerprint() "
            "after the restore."
        )
    return (
        f"{what}: continuing would index this schedule at the wrong step, and its epsilon would not be that of the "
        "steps taken, so no step runs. Restore into an optimizer built from the checkpoint's schedule (the same "
        "schedule or budget arguments), or start a new run with a fresh optimizer, knowing that the privacy "
        f"budget the checkpoint's steps spent is spent.{unknown} Steps taken (dp_step):"
    )


class GradientGuard:
    """Remembers the gradients the DP path produced, so the optimizer's apply can refuse any others. A plain object
    (the checkpoint graph is unaffected), per thread (MirroredStrategy traces each replica in its own thread)."""

    def __init__(self):
        self._local = threading.local()

    def issue(self, grads: Sequence[Any]) -> None:
        self._local.pending = tuple(grads)

    def check_and_clear(self, grads: Sequence[Any]) -> bool:
        pending, self._local.pending = getattr(self._local, "pending", None), None
        return pending is not None and len(pending) == len(grads) and all(g is p for g, p in zip(grads, pending))


def _attribute(name: str, doc: str) -> property:
    return property(lambda self: getattr(self, name), doc=doc)


_SETTINGS = tuple(
    "num_microbatches expected_batch_size public_batch_size accumulation_steps rescale_to_unit_norm "
    "allow_degenerate_noise".split()
)
"""The checked arguments an optimizer keeps as ``_<name>`` and saves in its config."""


class DPOptimizerBase:
    """The backend-neutral part of every DP optimizer. A backend's mixin (`keras_dyndp.tf_backend.
    DynamicDPOptimizerMixin`, `keras_dyndp.jax_backend.optimizer.JaxDPOptimizerMixin`) subclasses it and builds the
    mechanism in `_build_dp_state`: ``class DynamicDPKerasSGD(<backend mixin>, keras.optimizers.SGD)``.

    Args:
      schedule: the `DPSchedule` to follow; or the budget arguments target_epsilon, target_delta, num_examples (N),
        batch_size (p N), epochs or steps, method, initial_clip (C_0), rho_mu, rho_c (>= 1; default 1), accountant
        ('pld' default, 'rdp', or 'gdp_clt', which warns when its PLD epsilon exceeds the target by > 5%).
      num_microbatches: None clips every example; M >= 1 clips M random microbatches, with twice the noise.
      expected_batch_size: p N, the public normaliser, which also lets every step refuse a batch size far outside
        Binomial(N, p); required with ``schedule`` unless ``public_batch_size``. Multi-replica: the global batch's.
      public_batch_size: True (``schedule`` only) divides by each batch's rows, stated public (fixed-size batches,
        outside the Poisson accounting): no size check; Poisson batches and rows of sample weight 0 are refused.
      accumulation_steps: k >= 1 physical batches per batch in `make_private`'s step, noise added once.
      rescale_to_unit_norm: True divides by C_t as well (`keras_dyndp.mechanism`, step 4).
      noise_seed: None: OS entropy (the only choice for a release); an integer >= 0 (tests): reproducible, with a
        `NoiseSeedWarning`. Never serialised.
      allow_degenerate_noise: True trains with noise multipliers outside [1e-4, 1e4], with a
        `DegenerateNoiseWarning`: for tests only.
      **kwargs: the base optimizer's arguments (learning_rate, ...).
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
        public_batch_size: bool = False,
        accumulation_steps: int = 1,
        rescale_to_unit_norm: bool = False,
        noise_seed: int | None = None,
        allow_degenerate_noise: bool = False,
        **kwargs,
    ):
        arguments = locals()
        budget = {name: arguments[name] for name in BUDGET_ARGUMENTS}
        public_batch_size = validation.check_bool("public_batch_size", public_batch_size)
        noise_argument = "schedule" if schedule is not None else "target_epsilon"
        schedule, expected_batch_size = resolve_schedule(schedule, budget, expected_batch_size, public_batch_size)
        understatement = schedules.gdp_clt_understatement(schedule)  # PLD epsilon > 1.05 x a GDP-CLT target
        if understatement is not None:
            warnings.warn(understatement, schedules.GdpCltUnderstatementWarning, stacklevel=2)
        num_microbatches = validation.check_positive_int(
            "num_microbatches", num_microbatches, none_means="one microbatch per example", exact=True
        )
        accumulation_steps = check_accumulation_steps(accumulation_steps, num_microbatches)
        rescale_to_unit_norm = validation.check_bool("rescale_to_unit_norm", rescale_to_unit_norm)
        check_base_arguments(kwargs, self._unsupported_base_arguments())
        allow_degenerate_noise = check_schedule_noise(schedule, noise_argument, allow_degenerate_noise)
        self._check_backend()
        settings = {name: value for name, value in locals().items() if name in _SETTINGS}
        base_arguments = {name: value for name, value in kwargs.items() if name != "name"}  # a name is a label
        self._check_same_release(
            {"class": f"{type(self).__module__}.{type(self).__qualname__}", "schedule": schedule.get_config()}
            | settings
            | base_arguments
        )
        kwargs.setdefault("name", type(self).__name__)
        super().__init__(**kwargs)
        self._schedule = schedule
        self._num_microbatches = num_microbatches
        self._expected_batch_size = expected_batch_size
        self._public_batch_size = public_batch_size
        self._accumulation_steps = accumulation_steps
        self._rescale_to_unit_norm = rescale_to_unit_norm
        self._allow_degenerate_noise = allow_degenerate_noise
        self._private_train_step: dict | None = None  # make_private's arguments, once it has used this optimizer.
        self._build_dp_state(noise_seed)

    def _check_backend(self) -> None:
        """Raises if the backend cannot run this optimizer here (before the base optimizer is built)."""

    def _check_same_release(self, description: dict) -> None:
        """Raises if the processes that train one model build their optimizers unlike; the JAX optimizers compare
        them across ``jax.distributed`` processes (`keras_dyndp.jax_backend.processes.check_same_release`).

        Called before the base optimizer is built (whose variables several processes replicate) with what
        determines the release, by name: the class, the schedule's config (its C_t, sigma_t, p and calibration),
        the checked DP settings and the base optimizer's arguments as given (the learning rate, ...)."""

    def _unsupported_base_arguments(self) -> dict[str, str]:
        """Base-optimizer arguments refused on this backend, with the reason."""
        return KERAS_3_UNSUPPORTED_OPTIMIZER_ARGUMENTS

    def _build_dp_state(self, noise_seed: int | None) -> None:
        """Builds the backend's state of the mechanism: its random source, schedule tensors and checks, and
        ``self._schedule_fingerprint`` (an int32 [2] optimizer variable of zeros, saved with the step counter)."""
        raise NotImplementedError

    schedule = _attribute("_schedule", "The `DPSchedule` this optimizer follows.")
    schedule_fingerprint = _attribute(
        "_schedule_fingerprint",
        "int32 [2] variable saved with `dp_step`: the `DPSchedule.fingerprint` its steps were taken under, recorded "
        "at step 0; (0, 0) before. Every step refuses a mismatch (`restored_schedule_refusal`).",
    )
    expected_batch_size = _attribute("_expected_batch_size", "p N, the normaliser; None only with `public_batch_size`.")
    public_batch_size = _attribute("_public_batch_size", "Whether batch sizes are stated public.")
    accumulation_steps = _attribute("_accumulation_steps", "Physical batches `make_private`'s step clips a batch in.")
    rescale_to_unit_norm = _attribute("_rescale_to_unit_norm", "Whether the noisy sum is divided by C_t as well.")
    num_microbatches = _attribute("_num_microbatches", "Microbatches per batch; None means one per example.")

    @property
    def normalises_by_rows(self) -> bool:
        """Whether the noisy sum is divided by each batch's rows: `public_batch_size` with per-example clipping."""
        return self._public_batch_size and self._num_microbatches is None

    def check_restored_schedule(self) -> None:
        """Raises RuntimeError if `dp_step` was restored from a run under another schedule (or without a
        fingerprint): `restored_schedule_refusal`, as the DP step checks inside the step."""
        refusal = restored_schedule_refusal(
            int(self.dp_step.numpy()), self._schedule_fingerprint.numpy().tolist(), self._schedule
        )
        if refusal is not None:
            raise RuntimeError(refusal)

    def load_own_variables(self, store) -> None:
        """Keras's ``.keras`` / ``.weights.h5`` loading. A file saved before the schedule fingerprint existed (that
        variable fewer, the other shapes equal) loads with it unrecorded, so a counter past 0 is refused until
        `record_schedule_fingerprint` (Keras would skip every variable and restart the schedule at step 0)."""
        older = [variable for variable in self.variables if variable is not self._schedule_fingerprint]
        if len(store.keys()) == len(older) and all(
            tuple(store[str(i)].shape) == tuple(variable.shape) for i, variable in enumerate(older)
        ):
            for i, variable in enumerate(older):
                variable.assign(store[str(i)])
            self._schedule_fingerprint.assign(list(UNRECORDED_FINGERPRINT))
            return
        super().load_own_variables(store)

    def record_schedule_fingerprint(self) -> None:
        """States that a restored counter without a fingerprint (an older checkpoint) counts steps of this schedule.

        Raises:
          RuntimeError: if a fingerprint of another schedule is recorded (it cannot be overwritten).
        """
        recorded = tuple(self._schedule_fingerprint.numpy().tolist())
        if recorded not in (UNRECORDED_FINGERPRINT, self._schedule.fingerprint):
            raise RuntimeError(schedule_mismatch_message(recorded=True) + f" {int(self.dp_step.numpy())}.")
        self._schedule_fingerprint.assign(list(self._schedule.fingerprint))

    def check_budget_left(self, budget_stop: str) -> None:
        """Refuses, on the host, to start training on a spent schedule (before any step is traced).

        Raises:
          BudgetExhaustedError: when ``dp_step`` has reached the schedule's T; ``budget_stop`` names the callback.
        """
        if int(self.dp_step.numpy()) >= self._schedule.num_steps:
            raise BudgetExhaustedError(budget_exhausted_message(self._schedule.num_steps, budget_stop))

    def get_config(self) -> dict:
        config = super().get_config()
        config.update(schedule=self._schedule.get_config(), **{name: getattr(self, f"_{name}") for name in _SETTINGS})
        config.update(private_train_step=None if self._private_train_step is None else dict(self._private_train_step))
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
