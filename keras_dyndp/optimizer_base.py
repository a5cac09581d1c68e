"""The backend-neutral part of a keras_dyndp DP optimizer: its arguments, checked and resolved the same way on
every Keras backend, its schedule and its config (`DPOptimizerBase`).

`resolve` turns the constructor's arguments (a `DPSchedule` or a privacy budget, microbatches, the normaliser,
accumulation, rescaling, the base optimizer's keyword arguments) into `DPArguments`, or raises ValueError / TypeError
naming the argument and its valid range, before anything is built. It imports no TensorFlow and no JAX: the
TensorFlow optimizers (`keras_dyndp.tf_backend`) and the JAX ones (`keras_dyndp.jax_backend`) both subclass
`DPOptimizerBase`, which calls it.
"""

from __future__ import annotations

import dataclasses
import threading
import warnings
import weakref
from collections.abc import Sequence
from typing import Any

from keras_dyndp import schedules
from keras_dyndp import validation
from keras_dyndp.accounting import noise_range
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
    """The normaliser of an optimizer given a `DPSchedule`: ``expected_batch_size`` (p N), or None (each batch's
    rows) when ``public_batch_size`` is True; exactly one of them.

    The update releases the noisy sum divided by the normaliser, so the normaliser must not depend on the private
    data. Under Poisson sampling the number of examples in a batch is private, and so are the rows of a batch padded
    to a multiple of some size; p N is a public constant, and it also gives N, which the batch-size check needs. The
    rows are a safe normaliser only for batches whose size is public (fixed-size batches), which Poisson sampling's
    accounting does not cover: ``public_batch_size=True`` states that, and nothing checks the batch sizes then.
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


def _warn_if_gdp_clt_understates(schedule: schedules.DPSchedule) -> None:
    """Warns (once, at construction) when a GDP-CLT calibration's PLD epsilon exceeds its target by > 5%."""
    text = schedules.gdp_clt_understatement(schedule)
    if text is not None:
        # Attributed to the caller of the optimizer's constructor (this function, resolve_schedule, resolve, __init__).
        warnings.warn(text, schedules.GdpCltUnderstatementWarning, stacklevel=5)


def resolve_schedule(
    schedule, budget: dict, expected_batch_size, public_batch_size: bool
) -> tuple[schedules.DPSchedule, float | None]:
    """The optimizer's schedule and normaliser, from a `DPSchedule` or from budget arguments (exactly one).

    The normaliser is ``expected_batch_size`` = p N: the budget arguments' ``batch_size``, or given with the schedule
    (`schedule_normaliser`); None (each batch's rows) only with a schedule and ``public_batch_size=True``.

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
        expected_batch_size = schedule_normaliser(schedule, expected_batch_size, public_batch_size)
        _warn_if_gdp_clt_understates(schedule)
        return schedule, expected_batch_size
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
    if public_batch_size:
        raise ValueError(
            "The budget arguments account for Poisson batches of batch_size examples in expectation, whose actual "
            "sizes are private: the noisy sum is divided by expected_batch_size = batch_size. Leave "
            "public_batch_size out. Received: public_batch_size=True."
        )
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
"""Per model, the step counter (``dp_step``) of the DP optimizer it was last built with: only the counter is kept,
so that a replaced optimizer's slots are freed."""


def warn_on_schedule_restart(model: Any, optimizer: DPOptimizerBase) -> None:
    """Warns when ``optimizer``, built for ``model`` at step 0, replaces a DP optimizer that took steps on it.

    The replaced one was restored with the model (``load_model``, a checkpoint) or trained it in this process; a
    fresh one starts its schedule over, and its epsilon leaves out the earlier steps, although their budget was
    spent on the same data. Restoring the counter into the model's optimizer (docs/privacy.md, "Resuming") warns not.
    """
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
    """Refuses a schedule with a noise multiplier outside what every accountant represents, before any step.

    z_t = 0 (sigma_t = 0) releases the clipped sum in the clear, and z_t = 1e-6 leaves one step at epsilon > 1e7:
    no DP-SGD run that is worth accounting trains there, and `PrivacyLogger` could not account it.
    ``allow_degenerate_noise=True`` accepts such a schedule with a `DegenerateNoiseWarning` (for tests that measure
    the clipped sum without noise); it returns that flag.

    Raises:
      noise_range.NoiseOutOfRangeError (a ValueError): naming ``argument``, the step and the accepted range.
    """
    validation.check_bool("allow_degenerate_noise", allow_degenerate_noise)
    try:
        noise_range.check_trained_noise_multipliers(schedule.noise_multipliers, argument)
    except noise_range.NoiseOutOfRangeError as error:
        if not allow_degenerate_noise:
            raise
        # Attributed to the caller of the optimizer's constructor (this function, resolve, __init__).
        warnings.warn(
            f"allow_degenerate_noise=True: {error} This optimizer trains anyway: its updates have no meaningful "
            "differential privacy. Use it only to test.",
            DegenerateNoiseWarning,
            stacklevel=4,
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

    The optimizer records its schedule's fingerprint with the step counter at step 0 (and keeps it at every step),
    and both are saved together. A step counter past 0 indexes the schedule its steps were taken under: restored
    into an optimizer of another schedule (another fingerprint), or without any fingerprint (a checkpoint from
    before keras_dyndp recorded one, or a counter restored or set alone), it would continue on the wrong schedule
    and `PrivacyLogger` would account the steps taken under the wrong noise. Step 0 always runs: nothing is spent.
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


@dataclasses.dataclass(frozen=True)
class DPArguments:
    """A DP optimizer's checked arguments: its schedule and how it clips and normalises."""

    schedule: schedules.DPSchedule
    expected_batch_size: float | None
    public_batch_size: bool
    num_microbatches: int | None
    accumulation_steps: int
    rescale_to_unit_norm: bool
    allow_degenerate_noise: bool


def resolve(
    schedule,
    budget: dict,
    *,
    num_microbatches,
    expected_batch_size,
    public_batch_size,
    accumulation_steps,
    rescale_to_unit_norm,
    allow_degenerate_noise,
    base_kwargs: dict,
    unsupported: dict[str, str],
) -> DPArguments:
    """Checks a DP optimizer's constructor arguments and builds (or takes) its schedule.

    Args:
      schedule: a `DPSchedule`, or None when ``budget`` gives the privacy budget.
      budget: the budget arguments by name (`BUDGET_ARGUMENTS`; None where not given).
      num_microbatches, expected_batch_size, public_batch_size, accumulation_steps, rescale_to_unit_norm: as the
        optimizers take them.
      base_kwargs: the keyword arguments for the base optimizer class.
      unsupported: base-optimizer arguments the backend's DP optimizers refuse, with the reason.

    Raises:
      ValueError, TypeError: naming the argument and its valid values (`check_schedule_noise`: a noise multiplier
        outside the accountants' range).
    """
    public_batch_size = validation.check_bool("public_batch_size", public_batch_size)
    noise_argument = "schedule" if schedule is not None else "target_epsilon"
    schedule, expected_batch_size = resolve_schedule(schedule, budget, expected_batch_size, public_batch_size)
    num_microbatches = validation.check_positive_int(
        "num_microbatches", num_microbatches, none_means="one microbatch per example", exact=True
    )
    accumulation_steps = check_accumulation_steps(accumulation_steps, num_microbatches)
    rescale_to_unit_norm = validation.check_bool("rescale_to_unit_norm", rescale_to_unit_norm)
    check_base_arguments(base_kwargs, unsupported)
    allow_degenerate_noise = check_schedule_noise(schedule, noise_argument, allow_degenerate_noise)
    return DPArguments(
        schedule,
        expected_batch_size,
        public_batch_size,
        num_microbatches,
        accumulation_steps,
        rescale_to_unit_norm,
        allow_degenerate_noise,
    )


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
    its config. A backend's mixin (`keras_dyndp.tf_backend.DynamicDPOptimizerMixin` for TensorFlow,
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
        microbatches, with twice the noise at every step (`keras_dyndp.mechanism`).
      expected_batch_size: p N, the normaliser of the noisy sum: a public constant, whatever the batch holds, and
        it gives N, so every step, on every path, refuses a batch whose number of examples is far outside
        Binomial(N, p). Required with ``schedule`` (the budget arguments set it to ``batch_size``) unless
        ``public_batch_size=True``. Under a multi-replica tf.distribute strategy it is the GLOBAL batch's
        (`keras_dyndp.tf_backend.replicas`).
      public_batch_size: False (default). True, only with ``schedule`` and without ``expected_batch_size``:
        divide the noisy sum by each batch's number of rows, which you thereby state is public (fixed-size
        batches). That is outside the schedule's Poisson accounting (whose batch sizes are private), no batch size
        is checked, keras_dyndp's Poisson batches are refused, and so is a step that sees rows with sample weight
        0 (padding, which would count as rows) where the step sees the weights (`make_private`'s, JAX's).
      accumulation_steps: k >= 1 (default 1). `keras_dyndp.make_private`'s step clips each batch (the logical
        batch that p and the schedule count) in k physical batches, one after another, and adds the noise once:
        a batch k times larger than memory allows (`keras_dyndp.tf_backend.per_example.accumulation`).
      rescale_to_unit_norm: False (default) divides the noisy clipped sum by the normaliser alone; True divides
        it by the normaliser times C_t as well (`keras_dyndp.mechanism`, step 4). Post-processing: privacy unchanged.
      noise_seed: None (default) seeds the noise from OS entropy, the only choice for a model you release. An
        integer >= 0 makes the noise reproducible for tests and research, with a `NoiseSeedWarning`: whoever
        knows it can remove the noise. It is never serialised; a reloaded optimizer draws OS entropy.
      allow_degenerate_noise: False (default) refuses, at construction, a schedule with a noise multiplier
        sigma_t / C_t outside [1e-4, 1e4] (`check_schedule_noise`; sigma_t = 0 included). True trains with it, with
        a `DegenerateNoiseWarning`: for tests that measure the clipped sum without noise, never for a release.
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
        public_batch_size: bool = False,
        accumulation_steps: int = 1,
        rescale_to_unit_norm: bool = False,
        noise_seed: int | None = None,
        allow_degenerate_noise: bool = False,
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
            public_batch_size=public_batch_size,
            accumulation_steps=accumulation_steps,
            rescale_to_unit_norm=rescale_to_unit_norm,
            allow_degenerate_noise=allow_degenerate_noise,
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
        self._public_batch_size = arguments.public_batch_size
        self._allow_degenerate_noise = arguments.allow_degenerate_noise
        self._private_train_step: dict | None = None  # make_private's arguments, once it has used this optimizer.
        self._build_dp_state(noise_seed)

    def _check_backend(self) -> None:
        """Raises if the backend cannot run this optimizer here (before the base optimizer is built)."""

    def _unsupported_base_arguments(self) -> dict[str, str]:
        """Base-optimizer arguments refused on this backend, with the reason."""
        return KERAS_3_UNSUPPORTED_OPTIMIZER_ARGUMENTS

    def _build_dp_state(self, noise_seed: int | None) -> None:
        """Builds the backend's state of the mechanism: its random source, schedule tensors and checks, and
        ``self._schedule_fingerprint`` (an int32 [2] optimizer variable of zeros, saved with the step counter)."""
        raise NotImplementedError

    @property
    def schedule(self) -> schedules.DPSchedule:
        """The `DPSchedule` this optimizer follows."""
        return self._schedule

    @property
    def schedule_fingerprint(self) -> Any:
        """int32 [2] variable saved with `dp_step`: the `DPSchedule.fingerprint` of the schedule its steps were
        taken under, recorded at step 0; (0, 0) before. Every step refuses a mismatch (`restored_schedule_refusal`)."""
        return self._schedule_fingerprint

    def check_restored_schedule(self) -> None:
        """Raises RuntimeError if `dp_step` was restored from a run under another schedule (or without a
        fingerprint): `restored_schedule_refusal`. The DP step checks the same inside the step."""
        refusal = restored_schedule_refusal(
            int(self.dp_step.numpy()), self._schedule_fingerprint.numpy().tolist(), self._schedule
        )
        if refusal is not None:
            raise RuntimeError(refusal)

    def load_own_variables(self, store) -> None:
        """Keras's ``.keras`` / ``.weights.h5`` loading. A file from before the optimizer saved its schedule
        fingerprint (exactly that variable fewer, the others' shapes equal) loads with the fingerprint unrecorded,
        so that a restored step counter past 0 is refused until `record_schedule_fingerprint` (Keras itself would
        skip every optimizer variable, restarting the schedule at step 0 and spending the budget again)."""
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
        """Records this optimizer's schedule with a restored step counter that has no fingerprint (a checkpoint from
        before keras_dyndp saved one): you state that its steps were taken under this very schedule.

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

    @property
    def expected_batch_size(self) -> float | None:
        """p N, the normaliser of the noisy sum for per-example clipping; None only with `public_batch_size`."""
        return self._expected_batch_size

    @property
    def public_batch_size(self) -> bool:
        """Whether the user stated that batch sizes are public (then no batch size is checked)."""
        return self._public_batch_size

    @property
    def normalises_by_rows(self) -> bool:
        """Whether the noisy sum is divided by each batch's rows: `public_batch_size` with per-example clipping."""
        return self._public_batch_size and self._num_microbatches is None

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

    def get_config(self) -> dict:
        config = super().get_config()
        config.update(
            schedule=self._schedule.get_config(),
            num_microbatches=self._num_microbatches,
            expected_batch_size=self._expected_batch_size,
            public_batch_size=self._public_batch_size,
            accumulation_steps=self._accumulation_steps,
            rescale_to_unit_norm=self._rescale_to_unit_norm,
            allow_degenerate_noise=self._allow_degenerate_noise,
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
