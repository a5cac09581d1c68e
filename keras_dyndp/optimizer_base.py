"""The backend-neutral part of every DP optimizer (`DPOptimizerBase`): its arguments, checked once at construction
(ValueError / TypeError naming the argument and its range), its schedule, its refusals and its config. Imports no
TensorFlow and no JAX: the optimizers of `keras_dyndp.tf_backend` and `keras_dyndp.jax_backend` subclass it."""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

import numpy as np

from keras_dyndp import schedules
from keras_dyndp.accounting import noise_range
from keras_dyndp.core import adaptive_clipping as adaptive
from keras_dyndp.core import batch_sizes
from keras_dyndp.core import mechanism
from keras_dyndp.core import step_checks
from keras_dyndp.core import validation
from keras_dyndp.core.refusals import BudgetExhaustedError  # noqa: F401  (re-exported: keras_dyndp names it)
from keras_dyndp.keras_glue.private_model import PrivateConfig
from keras_dyndp.keras_glue.saved_state import SavedDPState
from keras_dyndp.schedules.budget import BUDGET_ARGUMENTS
from keras_dyndp.schedules.budget import resolve_schedule

KERAS_3_UNSUPPORTED_OPTIMIZER_ARGUMENTS: dict[str, str] = {
    "gradient_accumulation_steps": "each micro-step would be a DP step with its own noise, and the counter "
    "would count updates, not DP steps; use `accumulation_steps`, which clips a batch in that many physical "
    "batches and adds the noise once",
    "loss_scale_factor": "it rescales the already noised update; keras_dyndp computes the per-example gradients itself",
}
"""Keras 3 base-optimizer arguments a DP optimizer refuses (when not None), with the reason."""


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


def check_base_arguments(kwargs: dict, unsupported: dict[str, str]) -> None:
    """Refuses the base-optimizer arguments in ``unsupported`` (name: reason) that ``kwargs`` sets."""
    for name, reason in unsupported.items():
        if kwargs.get(name) is not None:
            raise ValueError(
                f"Dynamic DP optimizers do not support `{name}`: {reason}. Received: {name}={kwargs[name]!r}."
            )


class DegenerateNoiseWarning(UserWarning):
    """An optimizer trains with noise multipliers outside the accountants' range (``allow_degenerate_noise=True``)."""


def check_schedule_noise(schedule: schedules.DPSchedule, argument: str, allow_degenerate_noise) -> bool:
    """Refuses (`NoiseOutOfRangeError` naming ``argument``, the step and the range), before any step, a schedule with a
    noise multiplier outside what every accountant represents (z_t = 0 releases the clipped sum in the clear), unless
    ``allow_degenerate_noise`` (returned): then a `DegenerateNoiseWarning`, for tests without noise."""
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


def check_same_length(clipped_sums: Sequence[Any], trainable_variables: Sequence[Any]) -> None:
    """``apply_clipped_sum``'s refusal of one sum per variable mismatched."""
    if len(clipped_sums) != len(trainable_variables):
        raise ValueError(
            "`clipped_sums` and `trainable_variables` must have the same length. "
            f"Received: {len(clipped_sums)} and {len(trainable_variables)}."
        )


def budget_spent_line(steps: int, num_steps: int) -> str:
    """What `BudgetStop` prints when it ends ``fit`` at the schedule's last step (a normal end)."""
    return f"BudgetStop: the privacy budget is spent ({steps} of the schedule's {num_steps} DP steps); training ended."


def _attribute(name: str, doc: str) -> property:
    return property(lambda self: getattr(self, name), doc=doc)


_SETTINGS = tuple(
    "num_microbatches expected_batch_size public_batch_size accumulation_steps rescale_to_unit_norm "
    "allow_degenerate_noise".split()
)
"""The checked arguments an optimizer keeps as ``_<name>`` and saves in its config."""


class DPOptimizerBase(SavedDPState):
    """The arguments, checks, schedule and config every DP optimizer shares, on every backend.

    `keras_dyndp.DynamicDPKerasSGD` (Adam, Adagrad, RMSprop) is ``DynamicDPKeras<Base>(<backend mixin>,
    keras.optimizers.<Base>)``: the backend's mixin subclasses this class and builds the mechanism in
    `_build_dp_state`; the Keras optimizer keeps its update rule.

    Step k of T (the paper's t = k + 1) clips every per-example gradient to L2 norm C_t, adds Gaussian noise of
    standard deviation sigma_t to their sum, divides by the expected batch size p N and applies the base update.
    mu_t = C_t / sigma_t is the step's privacy cost (the noise multiplier is 1 / mu_t). Give either ``schedule`` or
    the budget arguments (``target_epsilon`` to ``accountant``), from which the optimizer calibrates its schedule so
    that the T steps spend exactly the target (`keras_dyndp.calibrate`). Du et al., "Dynamic Differential-Privacy
    Preserving SGD" (arXiv:2111.00173), Alg. 1 and 2.

    Args:
      schedule: instead of the budget arguments, a `DPSchedule` (C_t and sigma_t of every step, and p:
        `keras_dyndp.calibrate`, `DPSchedule.from_json`, ...) with ``expected_batch_size`` (or
        ``public_batch_size``), or a `keras_dyndp.schedules.PrivacyBudget`. Default None.
      target_epsilon: epsilon of the whole run (every step, every intermediate model released), a finite float > 0.
      target_delta: delta of the whole run, in (0, 1 / num_examples) (the paper: 1 / (10 N)).
      num_examples: N, the number of training examples (``len(x)`` of the data given to
        `keras_dyndp.poisson_batches`), an int >= 1. With ``batch_size`` it sets the sampling rate p = batch_size
        / N, and with ``epochs`` the number of steps T.
      batch_size: the EXPECTED batch size p N of Poisson sampling, an int in [1, N]: each example joins each batch
        with probability p, so batches vary in size around it. Also the normaliser of the noisy sum.
      epochs: passes over the data, a float > 0: T = ceil(epochs * N / batch_size) steps; this or ``steps``, not both.
      steps: T, the number of DP steps the budget covers, an int >= 1 (instead of ``epochs``). A step past T is
        refused (`BudgetExhaustedError`); `keras_dyndp.BudgetStop` ends ``fit`` there.
      method: the schedule's shape, one of `keras_dyndp.schedules.METHODS` or `BASELINES`:
        'vanilla' (constant C_t = C_0 and mu_t = mu_0: DP-SGD of Abadi et al. 2016);
        'growing_mu' (Alg. 1: mu_t = rho_mu^(t/T) mu_0, constant clip: less noise as training goes on);
        'sensitivity_decay' (C_t = rho_c^(-t/T) C_0 and sigma_t = C_t / mu_0: clip and noise shrink together);
        'dynamic' (Alg. 2, both: C_t = rho_c^(-t/T) C_0, sigma_t = (C_0 / mu_0) (rho_mu rho_c)^(-t/T));
        'zcdp', 'tcdp' (the paper's noise-decay baselines of Table 1, each calibrated by its own accountant:
        constant clip C_0, noise multiplier decaying by rho_mu over the run; ``rho_c`` and ``accountant`` unused).
      initial_clip: C_0, the L2 norm each per-example gradient is clipped to at the first step (in the units of
        the gradient of the per-example loss), a finite float > 0; every step's under a constant clip.
      rho_mu: mu_T / mu_0, how much the per-step privacy cost grows from the first step to the last, a float >= 1
        (1: constant); used by 'growing_mu' and 'dynamic' (and by 'zcdp' / 'tcdp' as their noise decay z_0 / z_T).
        Default None, which is 1. The paper's grid is 1 / rho_mu in {0.1, ..., 0.8} (docs/usage.md).
      rho_c: C_0 / C_T, how much the clipping norm decays from the first step to the last, a float >= 1 (1:
        constant); used by 'sensitivity_decay' and 'dynamic'. Default None, which is 1. The paper's grid is
        1 / rho_c in {0.1, ..., 0.8}.
      accountant: how epsilon is computed for the calibration, 'pld' (default None; rigorous, the tightest),
        'rdp' (rigorous, looser) or 'gdp_clt' (the paper's approximation, which can understate epsilon: warned,
        `GdpCltUnderstatementWarning`, when the PLD epsilon exceeds the target by more than 5%).
      num_microbatches: None (default) clips every example on its own; an int M >= 1 puts each row of a batch in
        one of M random microbatches, clips each microbatch's gradient and divides by M (TF-Privacy's
        microbatches), with twice the noise (one example moves its microbatch's clipped gradient by up to 2 C_t).
      expected_batch_size: p N, the public constant the noisy sum is divided by, a float > 0; it also lets every
        step refuse a batch size far outside Binomial(N, p). Required with ``schedule`` unless
        ``public_batch_size``; with the budget arguments it is ``batch_size`` (leave it out). Several replicas:
        the global batch's.
      public_batch_size: True (with ``schedule`` only) divides by each batch's number of rows instead, which you
        state is public (fixed-size batches, outside the Poisson accounting): no batch-size check; Poisson batches
        and rows of sample weight 0 are refused. Default False.
      accumulation_steps: k, an int >= 1 (default 1): `make_private`'s step clips each batch in k physical batches
        and adds the noise once (a logical batch larger than memory). Not with ``num_microbatches``.
      rescale_to_unit_norm: True divides the noisy sum by C_t as well (per-example gradients rescaled to norm at
        most 1, as De et al. 2022; the same release post-processed, so privacy is unchanged). Default False.
      noise_seed: None (default): the noise's seed comes from OS entropy, never saved (the only choice for a
        release); an int >= 0 (tests only, never serialised) makes the noise reproducible, with a
        `NoiseSeedWarning`: whoever knows the seed can remove the noise.
      allow_degenerate_noise: True trains with noise multipliers outside [1e-4, 1e4] (no meaningful privacy),
        with a `DegenerateNoiseWarning`: for tests only. Default False: refused.
      adaptive_clipping: None (default): the clip norms are the schedule's. A `keras_dyndp.AdaptiveClipping` (or
        True, its defaults; or a dict of its options): C_t starts at the schedule's C_0 and follows a target
        quantile of the per-example gradient norms, estimated from a noised count of unclipped examples (Andrew et
        al. 2021); the schedule's noise multipliers z_t are each step's total cost, shared by the gradient and the
        count (`keras_dyndp.core.adaptive_clipping`), so epsilon is the schedule's.
      **kwargs: the Keras optimizer's own arguments (``learning_rate``, ``momentum``, ``name``, ...). Keras 3's
        ``gradient_accumulation_steps`` and ``loss_scale_factor`` are refused (use ``accumulation_steps``).

    Raises:
      ValueError: an argument out of its range (naming it and the range), both or neither of ``schedule`` and the
        budget arguments, a budget argument missing, ``public_batch_size`` with the budget arguments, noise
        multipliers outside the accountants' range (`keras_dyndp.accounting.noise_range.NoiseOutOfRangeError`),
        a refused Keras argument, or a backend or distribution strategy that cannot run the optimizer.
      TypeError: ``schedule`` neither a `DPSchedule` nor a `PrivacyBudget`, or an argument of the wrong type.
      CalibrationError: no noise scale meets the target with noise multipliers the accountant accepts.
    """

    def __init__(
        self,
        *,
        schedule: schedules.DPSchedule | schedules.PrivacyBudget | None = None,
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
        adaptive_clipping: adaptive.AdaptiveClipping | dict | bool | None = None,
        **kwargs,
    ):
        arguments = locals()
        budget = {name: arguments[name] for name in BUDGET_ARGUMENTS}
        public_batch_size = validation.check_bool("public_batch_size", public_batch_size)
        noise_argument = "schedule" if schedule is not None else "target_epsilon"
        schedule, expected_batch_size = resolve_schedule(schedule, budget, expected_batch_size, public_batch_size)
        _warn_on_understatement(schedule)
        num_microbatches = validation.check_positive_int(
            "num_microbatches", num_microbatches, none_means="one microbatch per example", exact=True
        )
        accumulation_steps = check_accumulation_steps(accumulation_steps, num_microbatches)
        rescale_to_unit_norm = validation.check_bool("rescale_to_unit_norm", rescale_to_unit_norm)
        check_base_arguments(kwargs, self._unsupported_base_arguments())
        allow_degenerate_noise = check_schedule_noise(schedule, noise_argument, allow_degenerate_noise)
        options = adaptive.resolve(adaptive_clipping)
        step_arrays = adaptive.step_arrays(schedule, options, num_microbatches or expected_batch_size)
        self._check_backend()
        settings = {name: value for name, value in locals().items() if name in _SETTINGS}
        base_arguments = {name: value for name, value in kwargs.items() if name != "name"}  # a name is a label
        release = {"class": f"{type(self).__module__}.{type(self).__qualname__}", "schedule": schedule.get_config()}
        self._check_same_release(
            release | settings | base_arguments | {"adaptive_clipping": adaptive.config_of(options)}
        )
        kwargs.setdefault("name", type(self).__name__)
        super().__init__(**kwargs)
        self._schedule, self._adaptive_clipping, self._step_arrays = schedule, options, step_arrays
        for name, value in settings.items():  # As `get_config` reads them.
            setattr(self, f"_{name}", value)
        self.private_config: PrivateConfig | None = None  # make_private's options, once it has used this optimizer.
        self._unverified_sampling: str | None = None
        self._overflow_probability: float | None = None
        self._dp_gradient_guard = step_checks.GradientGuard()
        self._schedule_read = step_checks.GradientGuard()  # the (C_t, sigma_t) pair last read, for `_read_once`
        self._step_checks = step_checks.StepChecks(schedule, expected_batch_size, self.normalises_by_rows)
        self._build_dp_state(noise_seed)

    def note_unverified_sampling(self, problem: str) -> bool:
        """Records that this optimizer trains on batches not known to be Poisson samples at the schedule's rate
        (``problem``: what was seen, as the `SamplingWarning` says it). Returns True the first time (the caller warns
        then: once per optimizer); `PrivacyLogger` marks the epsilon it logs from then on as not covering the run."""
        first = self._unverified_sampling is None
        if first:
            self._unverified_sampling = problem
        return first

    def note_batch_cap(self, num_examples: int, max_batch_size: int) -> None:
        """Checks the cap of ``fit``'s Poisson batches before the first step (`batch_sizes.check_max_batch_size`) and
        records its chance of overflowing a step (the largest of the run's caps) for `PrivacyLogger`'s total delta."""
        size_range = self._step_checks.batch_size_range
        overflow = batch_sizes.check_max_batch_size(num_examples, max_batch_size, self._schedule, size_range)
        self._overflow_probability = max(self._overflow_probability or 0.0, overflow)

    def _check_backend(self) -> None:
        """Raises if the backend cannot run this optimizer here (before the base optimizer is built)."""

    def _check_same_release(self, description: dict) -> None:
        """Raises if the processes that train one model build their optimizers unlike (JAX's compare ``description``,
        what determines the release by name, across processes: `jax_backend.distribution.check_same_release`)."""

    def _unsupported_base_arguments(self) -> dict[str, str]:
        """Base-optimizer arguments refused on this backend, with the reason."""
        return KERAS_3_UNSUPPORTED_OPTIMIZER_ARGUMENTS

    def _build_dp_state(self, noise_seed: int | None) -> None:
        """Builds the backend's mechanism state: its random source, schedule tensors and checks, and the int32 variables
        ``_schedule_fingerprint`` [2] (zeros) and ``_released_steps`` (`UNRECORDED_RELEASED`), saved with `dp_step`."""
        raise NotImplementedError

    schedule = _attribute("_schedule", "The `DPSchedule` this optimizer follows.")
    dp_step = _attribute(
        "iterations",
        "Keras's `iterations` variable: the index of the next DP step. A step runs only where it equals "
        "`released_steps` (a counter set by hand is refused).",
    )
    schedule_fingerprint = _attribute(
        "_schedule_fingerprint",
        "int32 [2] variable saved with `dp_step`: the `DPSchedule.fingerprint` its steps were taken under, recorded "
        "at step 0; (0, 0) before. Every step refuses a mismatch (`step_checks.restored_schedule_refusal`).",
    )
    expected_batch_size = _attribute("_expected_batch_size", "p N, the normaliser; None only with `public_batch_size`.")
    public_batch_size = _attribute("_public_batch_size", "Whether batch sizes are stated public.")
    accumulation_steps = _attribute("_accumulation_steps", "Physical batches `make_private`'s step clips a batch in.")
    rescale_to_unit_norm = _attribute("_rescale_to_unit_norm", "Whether the noisy sum is divided by C_t as well.")
    num_microbatches = _attribute("_num_microbatches", "Microbatches per batch; None means one per example.")
    unverified_sampling = _attribute(
        "_unverified_sampling",
        "What showed that the batches were not known to be Poisson samples at the schedule's rate (the "
        "`SamplingWarning`'s problem), or None: the schedule's epsilon assumes them, so it does not cover such a run.",
    )

    @property
    def released_steps(self) -> int:
        """The DP steps this optimizer has released, whatever its step counter says (read on the host), which the budget
        and `PrivacyLogger` count; saved with the counter, which stands for it in a file saved before it was."""
        step = int(self.dp_step.numpy())
        return int(step_checks.released_steps(np.int64(step), np.int64(self._released_steps.numpy()), np.where))

    overflow_probability = _attribute(
        "_overflow_probability",
        "eta, the chance that a step's Poisson batch overflows the cap of the batches `fit` was given or leaves the "
        "step's accepted range (`keras_dyndp.core.batch_sizes.overflow_probability`; the largest of the run's; None "
        "before any): these truncations and stops add (1 + e^epsilon) T eta to delta (`batch_sizes.added_delta`).",
    )

    def current_clip_norm(self) -> Any:
        """float32 scalar C at `dp_step` (0 once the budget is spent; on TensorFlow also on another schedule's step
        counter); the backend's ``_current_schedule_values`` gives (C, sigma)."""
        return self._current_schedule_values()[0]

    def current_schedule_values(self) -> tuple[Any, Any]:
        """float32 scalars (C_t, sigma_t) at `dp_step` (0 as `current_clip_norm`): the step's one read of the
        schedule. A step that clips its sums at C_t passes the pair on to ``apply_clipped_sum(schedule_values=)``."""
        return self._schedule_read.issue(self._current_schedule_values())

    def _read_once(self, schedule_values: tuple[Any, Any] | None, read: Callable) -> tuple[Any, Any]:
        """``schedule_values``, the pair the latest read of the schedule handed out (ValueError for another: a stale
        or made-up pair would set the noise), or ``read()`` when None."""
        if schedule_values is not None and not self._schedule_read.check_and_clear(schedule_values):
            raise ValueError(
                "schedule_values must be None (read here) or the (C_t, sigma_t) pair this optimizer's latest read of "
                "the schedule returned (current_schedule_values(); on JAX schedule_values(step)), passed on once. "
                f"Received another pair: {schedule_values!r}."
            )
        return read() if schedule_values is None else schedule_values

    adaptive_clipping = _attribute("_adaptive_clipping", "The `AdaptiveClipping` options, or None (schedule's C_t).")
    adaptive_clip_norm = _attribute("_adaptive_clip_norm", "float32 variable: adaptive clipping's C_t (else None).")

    def count_noise_stddev(self, num_microbatches: int | None) -> float:
        """The std of adaptive clipping's noise on the count: sigma_b times the sensitivity (2 with microbatches)."""
        return mechanism.sensitivity(num_microbatches) * self._step_arrays[2]

    def _next_clip_norm(self, ops: Any, clip_norm: Any, clip_state, noised: Any, num_rows, num_microbatches) -> Any:
        """Adaptive clipping's C_{t+1} (`keras_dyndp.core.adaptive_clipping`) from the step's read ``clip_norm``, the
        stored C_t ``clip_state`` and its ``noised`` count (all replicas', with the noise of std
        `count_noise_stddev`) over the gradient's normaliser (``num_rows``, ``num_microbatches``: all replicas')."""
        fixed = {"clip_norm": 1.0, "rescale_to_unit_norm": False, "expected_batch_size": self._expected_batch_size}
        n = mechanism.normaliser(ops, num_rows=num_rows, num_microbatches=num_microbatches, **fixed)
        options = self._adaptive_clipping
        return adaptive.next_clip_norm(ops, clip_norm, clip_state, noised, normaliser=n, options=options)

    def current_noise_stddev(self) -> Any:
        """float32 scalar sigma at `dp_step`, the std of the noise on the clipped sum (0 as `current_clip_norm`)."""
        return self._current_schedule_values()[1]

    @property
    def normalises_by_rows(self) -> bool:
        """Whether the noisy sum is divided by each batch's rows: `public_batch_size` with per-example clipping."""
        return self._public_batch_size and self._num_microbatches is None

    def check_restored_schedule(self) -> None:
        """Raises RuntimeError if `dp_step` was restored from a run under another schedule (or without a
        fingerprint): `restored_schedule_refusal`, as the DP step checks inside the step."""
        refusal = step_checks.restored_schedule_refusal(
            int(self.dp_step.numpy()), self._schedule_fingerprint.numpy().tolist(), self._schedule
        )
        if refusal is not None:
            raise RuntimeError(refusal)

    def record_schedule_fingerprint(self) -> None:
        """States that a restored counter without a fingerprint (an older checkpoint) counts steps of this schedule.

        Raises:
          RuntimeError: if a fingerprint of another schedule is recorded (it cannot be overwritten).
        """
        recorded = tuple(self._schedule_fingerprint.numpy().tolist())
        if recorded not in (step_checks.UNRECORDED_FINGERPRINT, self._schedule.fingerprint):
            raise RuntimeError(step_checks.schedule_mismatch_message(recorded=True) + f" {int(self.dp_step.numpy())}.")
        self._schedule_fingerprint.assign(list(self._schedule.fingerprint))

    def host_refusal(self, budget_stop: str | None) -> RuntimeError | None:
        """The refusal of the next step the host can tell, as the step's checks decide it (`StepChecks.host_refusal`):
        `BudgetExhaustedError` once `released_steps` reached T (suggesting the callback ``budget_stop``, or None),
        RuntimeError when `dp_step` is not `released_steps` (`step_checks.counter_moved_parts`), else None."""
        step, released = int(self.dp_step.numpy()), self.released_steps
        code = self._step_checks.host_refusal(step, released)
        if code == step_checks.BUDGET_SPENT:
            num_steps = self._schedule.num_steps
            return BudgetExhaustedError(step_checks.budget_exhausted_message(released, num_steps, budget_stop))
        if code:
            return RuntimeError(step_checks.render(step_checks.counter_moved_parts(), [step, released]))
        return None

    def check_budget_left(self, budget_stop: str | None) -> None:
        """Raises `host_refusal` (on the host, before any step is traced) if there is one."""
        refusal = self.host_refusal(budget_stop)
        if refusal is not None:
            raise refusal

    def get_config(self) -> dict:
        config = super().get_config()
        config.update(schedule=self._schedule.get_config(), **{name: getattr(self, f"_{name}") for name in _SETTINGS})
        config.update(adaptive_clipping=adaptive.config_of(self._adaptive_clipping))
        private = None if self.private_config is None else dict(vars(self.private_config))
        config.update(private_train_step=private)
        return config

    @classmethod
    def from_config(cls, config: dict, custom_objects=None):
        config = dict(config)
        if isinstance(config.get("schedule"), dict):
            config["schedule"] = schedules.DPSchedule.from_config(config["schedule"])
        private_config = PrivateConfig.from_config(config.pop("private_train_step", None))
        optimizer = super().from_config(config, custom_objects=custom_objects)
        optimizer.private_config = private_config
        return optimizer


def _warn_on_understatement(schedule: schedules.DPSchedule) -> None:
    """Warns (`GdpCltUnderstatementWarning`, at the constructor's caller) when the PLD epsilon of a schedule calibrated
    to a GDP-CLT target exceeds it by more than 5%."""
    understatement = schedules.gdp_clt_understatement(schedule)
    if understatement is not None:
        warnings.warn(understatement, schedules.GdpCltUnderstatementWarning, stacklevel=3)


def make_optimizer_class(base_cls: type, mixin: type, keras_module: Any, required: str, on: str) -> type:
    """``DynamicDPKeras<BaseName>(mixin, base_cls)``, in the package of ``mixin``'s module, registered with
    ``keras_module`` as 'keras_dyndp>DynamicDPKeras<BaseName>' (one name on both backends: a model saved on one loads
    on the other). Its docstring is ``base_cls`` trained ``on`` the backend, then `DPOptimizerBase`'s arguments, for
    ``help()``. TypeError unless ``base_cls`` subclasses ``keras_module.optimizers.Optimizer`` (named ``required``)."""
    if not (isinstance(base_cls, type) and issubclass(base_cls, keras_module.optimizers.Optimizer)):
        raise TypeError(f"`base_cls` must be a subclass of {required}. Received: base_cls={base_cls!r}.")
    class_name = f"DynamicDPKeras{base_cls.__name__}"
    doc = inspect.cleandoc(DPOptimizerBase.__doc__ or "")
    arguments = doc[doc.find("Args:") :] if "Args:" in doc else ""
    summary = (
        f"`{base_cls.__module__}.{base_cls.__name__}` trained with dynamic DP-SGD {on}: its update rule and keyword "
        "arguments, and the DP arguments below (`keras_dyndp.optimizer_base.DPOptimizerBase`)."
    )
    namespace = {
        "__doc__": f"{summary}\n\n{arguments}".strip(),
        "__module__": mixin.__module__.rsplit(".", 1)[0],
        "__qualname__": class_name,
    }
    dp_class = type(class_name, (mixin, base_cls), namespace)
    return keras_module.saving.register_keras_serializable(package="keras_dyndp", name=class_name)(dp_class)
