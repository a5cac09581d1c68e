"""Keras 3 optimizers that run dynamic DP-SGD (`keras_dyndp.core.mechanism`) on the JAX backend: refusals decided in
the step, raised by `raise_refused_step` (docs/jax.md, "Refused, and how"); `apply` refuses any other gradients."""

from __future__ import annotations

import contextlib
import functools

import jax
import jax.numpy as jnp
import keras
import numpy as np

from keras_dyndp import optimizer_base
from keras_dyndp.core import mechanism
from keras_dyndp.core import refusals
from keras_dyndp.core import step_checks
from keras_dyndp.jax_backend import distribution
from keras_dyndp.jax_backend import microbatches
from keras_dyndp.jax_backend import noise_source
from keras_dyndp.jax_backend import ops
from keras_dyndp.jax_backend import train_step
from keras_dyndp.keras_glue import private_model
from keras_dyndp.keras_glue import registration
from keras_dyndp.keras_glue import restarts

_NOT_APPLIED = " The step was not applied, nor any step after it until this error."


class JaxDPOptimizerMixin(optimizer_base.DPOptimizerBase):
    """The dynamic DP-SGD part of every keras_dyndp JAX optimizer (module docstring; arguments:
    `keras_dyndp.optimizer_base.DPOptimizerBase`)."""

    def _check_backend(self) -> None:
        if keras.backend.backend() != "jax":
            raise ValueError(
                "keras_dyndp.jax_backend's optimizers run on Keras 3's JAX backend, but Keras is running on "
                f"{keras.backend.backend()!r}. Set KERAS_BACKEND=jax before importing keras, or use "
                "keras_dyndp.DynamicDPKeras* (which picks the optimizers of the backend in use)."
            )

    def _build_dp_state(self, noise_seed: int | None) -> None:
        self._noise_source = noise_source.NoiseSource(noise_seed)
        self._clip_norms, self._noise_stddevs, _ = self._step_arrays
        self._schedule_fingerprint = self._variable("schedule_fingerprint", (2,))
        self._released_steps = self._variable("released_steps", ())
        self._released_steps.assign(step_checks.UNRECORDED_RELEASED)
        # [run nonce, the first refusal's code (0: none), its batch's number of examples, the base key's two words
        # (zeros at rest)]; never saved.
        self._run_state = self._variable("dp_run_state", (5,))
        if self._adaptive_clipping is not None:  # saved after the steps released (`keras_glue.saved_state`)
            self._adaptive_clip_norm = self._variable("adaptive_clip_norm", (), "float32", "ones")
            self._adaptive_clip_norm.assign(float(self._schedule.clip_norms[0]))

    def _check_same_release(self, description: dict) -> None:
        distribution.check_same_release(description)

    def _variable(self, name: str, shape: tuple, dtype: str = "int32", initializer: str = "zeros") -> keras.Variable:
        return self.add_variable(shape, initializer, dtype=dtype, aggregation="only_first_replica", name=name)

    @property
    def num_examples(self) -> int | None:
        """N, the dataset size the schedule and p N are for (`batch_sizes.implied_num_examples`); None when unknown."""
        return self._step_checks.num_examples

    @property
    def batch_size_range(self) -> tuple[int, int] | None:
        """The accepted ``(low, high)`` number of examples per batch; None when N is unknown."""
        return self._step_checks.batch_size_range

    def _index(self, variable: keras.Variable) -> int:
        return next(i for i, v in enumerate(self.variables) if v is variable)

    def step_at(self, optimizer_variables) -> jax.Array:
        """The step counter's value in ``optimizer_variables`` (the optimizer's state in a stateless train step)."""
        return optimizer_variables[self._index(self.iterations)]

    def released_at(self, optimizer_variables) -> jax.Array:
        """The DP steps released (`step_checks.released_steps`) in ``optimizer_variables``, in the counter's dtype."""
        step = self.step_at(optimizer_variables)
        recorded = jnp.asarray(optimizer_variables[self._index(self._released_steps)], jnp.asarray(step).dtype)
        return step_checks.released_steps(step, recorded, jnp.where)

    def schedule_values(self, step, clip_state=None) -> tuple[jax.Array, jax.Array]:
        """float32 (C, sigma) of step ``step``; both 0 once the budget is spent. The step's one read of the schedule:
        a step that clips at C passes the pair on to ``stateless_apply_clipped_sum(schedule_values=)``. With
        adaptive clipping, C is ``clip_state`` (the stored C_t; None: the variable's value) and sigma follows it."""
        adaptive = self._adaptive_clip_norm
        scale = None if adaptive is None else adaptive.value if clip_state is None else clip_state
        args = (self._clip_norms, self._noise_stddevs, step, self._schedule.num_steps, None, scale)
        return self._schedule_read.issue(mechanism.schedule_values(ops.OPS, *args))

    def schedule_values_at(self, optimizer_variables) -> tuple[jax.Array, jax.Array]:
        """`schedule_values` at the step counter (and adaptive clipping's C_t) in ``optimizer_variables``."""
        adaptive = self._adaptive_clip_norm
        clip_state = None if adaptive is None else optimizer_variables[self._index(adaptive)]
        return self.schedule_values(self.step_at(optimizer_variables), clip_state)

    def clip_norm_at(self, optimizer_variables) -> jax.Array:
        """float32 C at the step counter in ``optimizer_variables`` (0 once spent)."""
        return self.schedule_values_at(optimizer_variables)[0]

    def _current_schedule_values(self) -> tuple[jax.Array, jax.Array]:
        return self.schedule_values(self.iterations.value)

    def _step_key(self, optimizer_variables, purpose: int) -> jax.Array:
        """The step's secret key for ``purpose`` (`noise_source.step_key`), from the run state."""
        run_state = optimizer_variables[self._index(self._run_state)]
        return noise_source.step_key(run_state, self.step_at(optimizer_variables), purpose)

    def microbatch_assignment(self, optimizer_variables, num_rows: int) -> jax.Array:
        """int32 [num_rows]: each row's microbatch at the step, uniform on {0, ..., M - 1}, under a secret key."""
        key = self._step_key(optimizer_variables, noise_source.MICROBATCHES)
        return microbatches.random_assignment(key, num_rows, self._num_microbatches)

    def secret_key(self, optimizer_variables) -> jax.Array:
        """The step's secret key for its random layers' states (`keras_dyndp.jax_backend.noise_source`)."""
        return self._step_key(optimizer_variables, noise_source.LAYER_SEEDS)

    def refusal_in(
        self, optimizer_variables, *, before_a_step: bool = False, budget_stop: str | None = None
    ) -> RuntimeError | None:
        """The refusal recorded in ``optimizer_variables`` (the optimizer's state) since its run of steps began;
        with ``before_a_step``, also a counter that is not the steps released and the budget's once they have
        reached T (`step_checks.StepChecks.host_refusal`). None when there is none. Reads the values back to the host
        (it waits for the step that wrote them). ``budget_stop``: as `step_checks.budget_exhausted_parts`."""
        code, num_examples = (
            int(value) for value in np.asarray(optimizer_variables[self._index(self._run_state)])[1:3]
        )
        if not code and not before_a_step:
            return None
        step, released = int(self.step_at(optimizer_variables)), int(self.released_at(optimizer_variables))
        code = code or self._step_checks.host_refusal(step, released)
        if not code:
            return None
        values = dict(step=step, released=released, min_examples=num_examples, max_examples=num_examples)
        parts = self._step_checks.message(code, budget_stop)
        text = step_checks.render(parts, [values[name] for name in step_checks.NUMBERS.get(code, ())])
        if code == step_checks.BUDGET_SPENT:
            return optimizer_base.BudgetExhaustedError(text)
        if code in (step_checks.SCHEDULE_MISMATCH, step_checks.NO_FINGERPRINT, step_checks.COUNTER_MOVED):
            return RuntimeError(text)
        return RuntimeError(f"{text}{_NOT_APPLIED}")

    def new_run(self, optimizer_variables) -> list:
        """``optimizer_variables`` starting a new run of steps: the secret key's words, from host memory (a runtime
        input of the step), a never-used run nonce (a rewound or restored counter's keys are new), no refusal. The
        only state a step takes a key from: hand the values it returns to the step, not to a saver."""
        values = list(optimizer_variables)
        index = self._index(self._run_state)
        fresh = self._noise_source.fresh_run_state(with_key=True)
        sharding = getattr(values[index], "sharding", None)
        values[index] = jnp.asarray(fresh) if sharding is None else jax.device_put(fresh, sharding)
        return values

    def at_rest(self, optimizer_variables) -> list:
        """``optimizer_variables`` without the key: what may go back into the variables outside `raise_refused_step`
        (the run's nonce and refusal kept; an array a step has taken over stays as it is)."""
        values = list(optimizer_variables)
        index = self._index(self._run_state)
        if not values[index].is_deleted():
            values[index] = values[index].at[noise_source.KEY_WORDS].set(0)
        return values

    def raise_refused_step(self, budget_stop: str | None = None) -> None:
        """Raises RuntimeError (`BudgetExhaustedError` past the budget) if a step was refused since the last call,
        and puts the run state at rest in the variables: a never-used nonce, no refusal, no key. ``make_private``'s
        model calls it wherever Keras syncs the state back; a custom loop takes its state from `new_run` and calls this
        after each run of steps (docs/privacy.md, 'Which entry points are covered'). ``budget_stop``: as
        `step_checks.budget_exhausted_parts`."""
        refusal = self.refusal_in([variable.value for variable in self.variables], budget_stop=budget_stop)
        self._run_state.assign(self._noise_source.fresh_run_state(with_key=False))
        if refusal is not None:
            raise refusal

    @contextlib.contextmanager
    def _without_run_state(self):
        index = self._index(self._run_state)
        self._variables.pop(index)
        try:
            yield
        finally:
            self._variables.insert(index, self._run_state)

    def save_own_variables(self, store) -> None:
        """Keras's saving, without the run state (which a restore must not bring back)."""
        with self._without_run_state():
            super().save_own_variables(store)

    def load_own_variables(self, store) -> None:
        """Keras's loading, without the run state (files hold none), which it puts at rest (no key, no refusal): the
        next step takes a never-used nonce and the key from `new_run`, so a restored counter draws fresh keys."""
        with self._without_run_state():
            super().load_own_variables(store)
        self._run_state.assign(self._noise_source.fresh_run_state(with_key=False))

    def stateless_apply_clipped_sum(
        self,
        optimizer_variables,
        clipped_sums,
        num_examples,
        num_rows,
        trainable_variables,
        *,
        schedule_values=None,
        centred_count=None,
    ) -> tuple[list, list]:
        """Stateless: noises, normalises and applies sums of per-example (with ``num_microbatches``, per-microbatch)
        gradients clipped to `clip_norm_at` (`make_private`'s step clips them).

        Args:
          optimizer_variables: the optimizer's state (the list of the values of ``self.variables``).
          clipped_sums: a list, per trainable variable, the batch's sum of clipped gradients (of the microbatches
            `microbatch_assignment` drew, with ``num_microbatches``).
          num_examples: rows with a non-zero sample weight, checked against the schedule's Poisson sampling.
          num_rows: the batch's rows (the normaliser with ``public_batch_size=True``, which then refuses padding).
          trainable_variables: the list of the values of the trainable variables the optimizer was built with.
          schedule_values: the pair of float32 scalars (C, sigma) `schedule_values` returned for the step counter in
            the state, which the sums were clipped at (the step's one read of the schedule); None (default): read here.
          centred_count: with adaptive clipping (required then), the float32 sum over the batch of
            `keras_dyndp.core.adaptive_clipping.centred_indicators` of the unclipped gradient norms at the step's C;
            its noised value moves C_t. Ignored otherwise.

        Returns:
          ``(trainable_variables, optimizer_variables)`` as Keras's ``stateless_apply``; unchanged but for the
          recorded refusal when the step was refused.
        """
        optimizer_base.check_same_length(clipped_sums, trainable_variables)
        run_index = self._index(self._run_state)
        run_state = optimizer_variables[run_index]
        code = self._refusal_code(optimizer_variables, num_examples, num_rows)
        clip_norm, noise_stddev = self._read_once(schedule_values, lambda: self.schedule_values_at(optimizer_variables))
        grads = mechanism.private_update(
            ops.OPS,
            [jnp.asarray(clipped_sum, jnp.float32) for clipped_sum in clipped_sums],
            self._step_key(optimizer_variables, noise_source.NOISE),
            clip_norm=clip_norm,
            sigma=noise_stddev,
            num_rows=num_rows,
            expected_batch_size=self._expected_batch_size,
            num_microbatches=self._num_microbatches,
            rescale_to_unit_norm=self._rescale_to_unit_norm,
            num_extra=int(self._adaptive_clip_norm is not None),  # the count's normal, drawn with the noise
        )
        grads, count_normal = grads[: len(clipped_sums)], grads[len(clipped_sums) :]
        self._dp_gradient_guard.issue(grads)
        new_trainable, new_optimizer = self.stateless_apply(optimizer_variables, grads, trainable_variables)
        new_optimizer = self._released_state(
            list(new_optimizer), optimizer_variables, (centred_count, count_normal), clip_norm, num_rows
        )
        new_trainable = [jnp.where(code == 0, n, o) for n, o in zip(new_trainable, trainable_variables)]
        new_optimizer = [jnp.where(code == 0, n, o) for n, o in zip(new_optimizer, optimizer_variables)]
        newly_refused = (run_state[1] == 0) & (code != 0)
        refused_examples = jnp.where(newly_refused, jnp.asarray(num_examples, jnp.int32), run_state[2])
        new_optimizer[run_index] = run_state.at[1].set(code).at[2].set(refused_examples)
        return new_trainable, new_optimizer

    def _refusal_code(self, optimizer_variables, num_examples, num_rows) -> jax.Array:
        """int32 code of the step's refusal (`step_checks`; 0: none); once recorded, kept until `raise_refused_step`."""
        step, released = self.step_at(optimizer_variables), self.released_at(optimizer_variables)
        run_state = optimizer_variables[self._index(self._run_state)]
        recorded = optimizer_variables[self._index(self._schedule_fingerprint)]
        no_key = jnp.all(run_state[noise_source.KEY_WORDS] == 0)
        checks = self._step_checks.failing(step, recorded, released, num_examples, num_examples, num_rows, no_key)
        code = jnp.select(list(checks.values()), list(checks), 0).astype(jnp.int32)
        return jnp.where(run_state[1] != 0, run_state[1], code)

    def _released_state(self, new_optimizer: list, optimizer_variables, count, clip_norm, num_rows) -> list:
        """``new_optimizer`` (the base update's state) with what a step that runs keeps, saved with the counter: the
        schedule's fingerprint (recorded at step 0), itself counted released, adaptive clipping's C_{t+1} (of
        ``count``: the centred count and a standard normal, `_adapted`)."""
        new_optimizer[self._index(self._schedule_fingerprint)] = jnp.asarray(self._schedule.fingerprint, jnp.int32)
        released = self.released_at(optimizer_variables)
        new_optimizer[self._index(self._released_steps)] = jnp.asarray(released + 1, jnp.int32)
        if self._adaptive_clip_norm is not None:
            new_optimizer[self._index(self._adaptive_clip_norm)] = self._adapted(
                optimizer_variables, *count, clip_norm, num_rows
            )
        return new_optimizer

    def _adapted(self, optimizer_variables, centred_count, normals, clip_norm, num_rows) -> jax.Array:
        """Adaptive clipping's C_{t+1}: ``centred_count`` plus the count's noise (``normals``' one standard normal,
        drawn with the gradient's noise under the step's NOISE key)."""
        if centred_count is None:
            raise ValueError(
                "This optimizer clips adaptively (adaptive_clipping is set): stateless_apply_clipped_sum needs "
                "`centred_count`, the batch's sum of keras_dyndp.core.adaptive_clipping.centred_indicators of the "
                "per-example gradient norms at the step's clip norm. Received: centred_count=None."
            )
        noised = jnp.asarray(centred_count, jnp.float32) + self.count_noise_stddev(self._num_microbatches) * normals[0]
        state = optimizer_variables[self._index(self._adaptive_clip_norm)]
        return self._next_clip_norm(ops.OPS, clip_norm, state, noised, num_rows, self._num_microbatches)

    def build(self, var_list):
        """Builds the base optimizer's variables; in ``load_model``'s ``compile_from_config``, gives the model back the
        make_private step its config records (as TensorFlow's ``build``); warns when a model's schedule starts over."""
        super().build(var_list)
        model = private_model.model_compiled_with(self, var_list) or registration.keras_model_calling(self, keras.Model)
        if model is None:
            return
        restarts.warn_on_schedule_restart(model, self)
        if private_model.is_private(model):
            return
        restoring = registration.keras_model_calling(self, keras.Model, caller="compile_from_config") is model
        if self.private_config is not None and restoring:
            train_step.make_private(model, **vars(self.private_config))
        else:  # make_private replaces this with its own.
            model.make_train_function = functools.partial(_refuse_keras_train_step, model, self)

    def apply(self, grads, trainable_variables=None):
        """Keras 3's entry for gradients: applies only those `stateless_apply_clipped_sum` noised; RuntimeError on
        any other (e.g. Keras's default train step's, unclipped), which would train without differential privacy."""
        grads = list(grads)
        if not self._dp_gradient_guard.check_and_clear(grads):
            raise RuntimeError(
                refusals.foreign_gradients(
                    f"{type(self).__name__}.apply",
                    "its own DP step noised",
                    "call model = keras_dyndp.make_private(model) before model.fit (its train step clips per example "
                    "and noises the sum), or hand a clipped sum to stateless_apply_clipped_sum.",
                )
            )
        return super().apply(grads, trainable_variables)


def _refuse_keras_train_step(model: keras.Model, optimizer: JaxDPOptimizerMixin, force: bool = False):
    if not registration.compiled_with(model, optimizer):  # compiled anew
        del model.make_train_function
        return model.make_train_function(force)
    raise RuntimeError(refusals.keras_train_step())


def make_dynamic_dp_optimizer_class(base_cls: type) -> type:
    """Returns ``DynamicDPKeras<BaseName>(JaxDPOptimizerMixin, base_cls)``, registered as
    'keras_dyndp>DynamicDPKeras<BaseName>' (the TensorFlow classes' names: a model saved on one backend loads on the
    other). Its instances take the DP arguments of `keras_dyndp.optimizer_base.DPOptimizerBase` and ``base_cls``'s.

    Args:
      base_cls: the Keras 3 optimizer class whose update rule the DP optimizer applies to the noisy gradient, a
        subclass of ``keras.optimizers.Optimizer`` (e.g. ``keras.optimizers.Nadam``).

    Raises:
      TypeError: if ``base_cls`` is not a subclass of ``keras.optimizers.Optimizer``.
    """
    return optimizer_base.make_optimizer_class(
        base_cls, JaxDPOptimizerMixin, keras, "keras.optimizers.Optimizer", "on the JAX backend"
    )


DynamicDPKerasSGD = make_dynamic_dp_optimizer_class(keras.optimizers.SGD)
DynamicDPKerasAdam = make_dynamic_dp_optimizer_class(keras.optimizers.Adam)
DynamicDPKerasAdagrad = make_dynamic_dp_optimizer_class(keras.optimizers.Adagrad)
DynamicDPKerasRMSprop = make_dynamic_dp_optimizer_class(keras.optimizers.RMSprop)
