"""Keras 3 optimizers that run dynamic DP-SGD on the JAX backend: the mechanism of `keras_dyndp.mechanism`.

`make_dynamic_dp_optimizer_class(base_cls)` returns ``DynamicDPKeras<Base>(JaxDPOptimizerMixin, base_cls)``;
`DynamicDPKerasSGD`, `DynamicDPKerasAdam`, `DynamicDPKerasAdagrad` and `DynamicDPKerasRMSprop` are its public
instances, with the arguments, checks and config of `keras_dyndp.optimizer_base.DPOptimizerBase`. Step k is Keras's
``iterations`` variable, read inside the jitted step from the optimizer's state:

1. `keras_dyndp.jax_backend.make_private`'s train step hands `stateless_apply_clipped_sum` the batch's sum of
   per-example (or microbatch, `keras_dyndp.jax_backend.microbatches`) gradients clipped to C_k (`clip_norm_at`);
2. one host callback per step checks the step against the budget, the step counter against the schedule it was
   saved with (`keras_dyndp.optimizer_base.restored_schedule_refusal`) and the batch's number of examples against
   the schedule's Poisson sampling, and returns a fresh key from the optimizer's own
   `keras_dyndp.jax_backend.noise.NoiseSource`. A refused step changes nothing (the variables and the counter keep
   their values, whatever the data) and `raise_refused_step`, which ``make_private``'s ``fit`` calls after every
   batch, raises RuntimeError with the reason;
3. the noise and the normaliser (`keras_dyndp.mechanism.private_update`) make the update, which Keras's
   ``stateless_apply`` hands to the base optimizer's update rule, advancing ``iterations``.

Gradients that did not come out of step 3 (Keras's default train step) are refused by `apply`, naming ``make_private``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import keras
import numpy as np
from jax.experimental import io_callback

from keras_dyndp import batch_sizes
from keras_dyndp import keras_context
from keras_dyndp import mechanism
from keras_dyndp import optimizer_base
from keras_dyndp import refusals
from keras_dyndp.jax_backend import microbatches
from keras_dyndp.jax_backend import noise
from keras_dyndp.jax_backend import ops
from keras_dyndp.jax_backend import train_step


class JaxDPOptimizerMixin(optimizer_base.DPOptimizerBase):
    """The dynamic DP-SGD part of every keras_dyndp optimizer on Keras 3's JAX backend (module docstring).

    ``isinstance(optimizer, JaxDPOptimizerMixin)`` tells a keras_dyndp JAX DP optimizer from any other. Arguments:
    `keras_dyndp.optimizer_base.DPOptimizerBase`.
    """

    def _check_backend(self) -> None:
        if keras.backend.backend() != "jax":
            raise ValueError(
                "keras_dyndp.jax_backend's optimizers run on Keras 3's JAX backend, but Keras is running on "
                f"{keras.backend.backend()!r}. Set KERAS_BACKEND=jax before importing keras, or use "
                "keras_dyndp.DynamicDPKeras* (which picks the optimizers of the backend in use)."
            )

    def _build_dp_state(self, noise_seed: int | None) -> None:
        self._dp_gradient_guard = optimizer_base.GradientGuard()
        self._warned_sampling = False  # make_private's fit warns once when the data is not Poisson-sampled.
        # Attributed to the caller of the optimizer's constructor (NoiseSource, this method, DPOptimizerBase).
        self._noise_source = noise.NoiseSource(noise_seed, stacklevel=4)
        self._clip_norms = np.asarray(self._schedule.clip_norms, np.float32)
        self._noise_stddevs = np.asarray(self._schedule.noise_stddevs, np.float32)
        if self._expected_batch_size is None:
            self._num_examples = self._batch_size_range = None
        else:
            p = self._schedule.sampling_probability
            self._num_examples = max(1, round(self._expected_batch_size / p))
            self._batch_size_range = batch_sizes.batch_size_range(self._num_examples, p)
        self._refusal: RuntimeError | None = None  # The first refused step's error, until raise_refused_step.
        self._schedule_fingerprint = self.add_variable(
            shape=(2,),
            initializer="zeros",
            dtype="int32",
            aggregation="only_first_replica",
            name="schedule_fingerprint",
        )

    @property
    def dp_step(self) -> keras.Variable:
        """int variable: DP steps taken so far, the index of the next step (Keras's `iterations`)."""
        return self.iterations

    @property
    def batch_size_range(self) -> tuple[int, int] | None:
        """The accepted ``(low, high)`` number of examples per batch; None when N is unknown."""
        return self._batch_size_range

    def _iterations_index(self) -> int:
        return next(i for i, variable in enumerate(self.variables) if variable is self.iterations)

    def _fingerprint_index(self) -> int:
        return next(i for i, variable in enumerate(self.variables) if variable is self._schedule_fingerprint)

    def step_at(self, optimizer_variables) -> jax.Array:
        """The step counter's value in ``optimizer_variables`` (the optimizer's state in a stateless train step)."""
        return optimizer_variables[self._iterations_index()]

    def schedule_values(self, step) -> tuple[jax.Array, jax.Array]:
        """float32 (C, sigma) of step ``step``; both 0 once the budget is spent."""
        return mechanism.schedule_values(ops.OPS, self._clip_norms, self._noise_stddevs, step, self._schedule.num_steps)

    def clip_norm_at(self, optimizer_variables) -> jax.Array:
        """float32 C at the step counter in ``optimizer_variables`` (0 once spent)."""
        return self.schedule_values(self.step_at(optimizer_variables))[0]

    def current_clip_norm(self) -> jax.Array:
        """float32 C at `dp_step` (0 once the budget is spent)."""
        return self.schedule_values(self.iterations.value)[0]

    def current_noise_stddev(self) -> jax.Array:
        """float32 sigma at `dp_step`, the std of the noise on the clipped sum (0 once spent)."""
        return self.schedule_values(self.iterations.value)[1]

    def _host_step(
        self, step: np.ndarray, num_examples: np.ndarray, num_rows: np.ndarray, recorded_fingerprint: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """On the host, once per step: a fresh key's data, and whether the step may run (False records why)."""
        mismatch = optimizer_base.restored_schedule_refusal(int(step), recorded_fingerprint.tolist(), self._schedule)
        refusal = RuntimeError(mismatch) if mismatch else self._refusal_of(int(step), int(num_examples), int(num_rows))
        if refusal is not None and self._refusal is None:
            self._refusal = refusal
        return self._noise_source.draw_key_data(), np.asarray(refusal is None)

    def _refusal_of(self, step: int, num_examples: int, num_rows: int) -> RuntimeError | None:
        num_steps = self._schedule.num_steps
        if step >= num_steps:
            return optimizer_base.BudgetExhaustedError(
                optimizer_base.budget_exhausted_message(num_steps, "keras_dyndp.BudgetStop")
            )
        not_applied = " The step was not applied."
        if self.normalises_by_rows:
            return None if num_examples == num_rows else RuntimeError(batch_sizes.PADDING_ROWS_REFUSAL + not_applied)
        if self._batch_size_range is None:
            return None
        low, high = self._batch_size_range
        if low <= num_examples <= high:
            return None
        prefix, advice = batch_sizes.out_of_range_refusal(
            "few" if num_examples < low else "many", self._schedule.sampling_probability, self._num_examples, low, high
        )
        return RuntimeError(f"{prefix}{num_examples}{advice}{not_applied}")

    def raise_refused_step(self) -> None:
        """Raises RuntimeError (`BudgetExhaustedError` past the budget) if a step was refused since the last call
        (then it was not applied).

        A refusal cannot raise inside the jitted step without losing the model's state, which ``fit`` holds
        outside the model while it trains; the step is then a no-op instead, and ``make_private``'s ``fit`` calls
        this after every batch (with the state synced back). A custom loop calling `stateless_apply_clipped_sum`
        should call it after each step.
        """
        refusal, self._refusal = self._refusal, None
        if refusal is not None:
            raise refusal

    def microbatch_assignment(self, num_rows: int) -> jax.Array:
        """int32 [num_rows]: each row's microbatch for this step, uniform on {0, ..., M - 1}, from a fresh key of
        the noise source (inside a jitted step, through a host callback): never from the data or the row order."""
        return microbatches.random_assignment(self.secret_key(), num_rows, self._num_microbatches)

    def secret_key(self) -> jax.Array:
        """A fresh JAX key of the noise source (inside a jitted step, through a host callback): known to no one and
        never saved, for the step's randomness that must not follow a public seed (module `noise`)."""
        return self._noise_source.jax_key()

    def _private_update(
        self, clipped_sums: list, step, num_examples, num_rows, recorded_fingerprint
    ) -> tuple[list, jax.Array]:
        clip_norm, noise_stddev = self.schedule_values(step)
        key_data, allowed = io_callback(
            self._host_step,
            (jax.ShapeDtypeStruct((2,), jnp.uint32), jax.ShapeDtypeStruct((), jnp.bool_)),
            step,
            num_examples,
            num_rows,
            recorded_fingerprint,
            ordered=False,
        )
        grads = mechanism.private_update(
            ops.OPS,
            [jnp.asarray(clipped_sum, jnp.float32) for clipped_sum in clipped_sums],
            jax.random.wrap_key_data(key_data, impl="threefry2x32"),
            clip_norm=clip_norm,
            sigma=noise_stddev,
            num_rows=num_rows,
            expected_batch_size=self._expected_batch_size,
            num_microbatches=self._num_microbatches,
            rescale_to_unit_norm=self._rescale_to_unit_norm,
        )
        return grads, allowed

    def stateless_apply_clipped_sum(
        self, optimizer_variables: list, clipped_sums: list, num_examples, num_rows, trainable_variables: list
    ) -> tuple[list, list]:
        """Noises, normalises and applies sums of per-example (with ``num_microbatches``, per-microbatch) gradients
        clipped to `clip_norm_at`; stateless.

        For per-example clipping done outside the optimizer (`keras_dyndp.jax_backend.make_private`'s step).

        Args:
          optimizer_variables: the optimizer's state (values of ``self.variables``).
          clipped_sums: one array per trainable variable, the batch's sum of clipped per-example gradients (with
            ``num_microbatches``, of the clipped gradients of the microbatches `microbatch_assignment` drew).
          num_examples: the batch's number of examples (rows with a non-zero sample weight), checked against the
            schedule's Poisson sampling.
          num_rows: the batch's number of rows (the normaliser with ``public_batch_size=True``, which then refuses
            a batch with fewer examples than rows).
          trainable_variables: the values of the trainable variables the optimizer was built with.

        Returns:
          ``(trainable_variables, optimizer_variables)`` after the step, as Keras's ``stateless_apply``; both
          unchanged when the step was refused (`raise_refused_step` then raises).
        """
        if len(clipped_sums) != len(trainable_variables):
            raise ValueError(
                "`clipped_sums` and `trainable_variables` must have the same length. "
                f"Received: {len(clipped_sums)} and {len(trainable_variables)}."
            )
        fingerprint_index = self._fingerprint_index()
        grads, allowed = self._private_update(
            list(clipped_sums),
            self.step_at(optimizer_variables),
            num_examples,
            num_rows,
            optimizer_variables[fingerprint_index],
        )
        self._dp_gradient_guard.issue(grads)
        new_trainable, new_optimizer = self.stateless_apply(optimizer_variables, grads, trainable_variables)
        # A step that runs keeps (at step 0: records) the schedule's fingerprint, saved with the counter.
        new_optimizer = list(new_optimizer)
        new_optimizer[fingerprint_index] = jnp.asarray(self._schedule.fingerprint, jnp.int32)
        keep = lambda new, old: [jnp.where(allowed, n, o) for n, o in zip(new, old)]  # noqa: E731
        return keep(new_trainable, trainable_variables), keep(new_optimizer, optimizer_variables)

    def build(self, var_list):
        """Builds the base optimizer's variables; restores make_private on a model reloaded with this optimizer.

        ``load_model`` rebuilds the optimizer from its config, which records make_private's arguments when it was
        trained through it, and builds it while compiling the model: the model found on the call stack then gets
        that train step back, before any ``fit`` can run Keras's default one. Built by ``fit`` for a model without
        make_private's step, it raises ValueError naming make_private. Built at step 0 for a model whose previous DP
        optimizer took steps, it warns that the schedule starts over (`optimizer_base.warn_on_schedule_restart`).
        """
        super().build(var_list)
        model = keras_context.calling_model(self, keras.Model)
        if model is None:
            return
        optimizer_base.warn_on_schedule_restart(model, self)
        if train_step.is_private(model):
            return
        if self._private_train_step is not None:
            train_step.make_private(model, **self._private_train_step)
        elif keras_context.fit_call(model) is not None:
            raise ValueError(
                f"model.fit is training model {model.name!r} with {type(self).__name__}. " + refusals.keras_train_step()
            )

    def apply(self, grads, trainable_variables=None):
        """Keras 3's entry for gradients: applies only those `stateless_apply_clipped_sum` noised.

        Raises:
          RuntimeError: on any other gradients, e.g. from Keras's default train step (the gradient of the
            batch's mean loss, which no clipping has bounded): they would train without differential privacy.
        """
        grads = list(grads)
        if not self._dp_gradient_guard.check_and_clear(grads):
            raise RuntimeError(
                refusals.foreign_gradients(f"{type(self).__name__}.apply", "its own DP step noised")
                + refusals.keras_train_step(self._private_train_step)
            )
        return super().apply(grads, trainable_variables)


def make_dynamic_dp_optimizer_class(base_cls: type) -> type:
    """Returns ``DynamicDPKeras<BaseName>(JaxDPOptimizerMixin, base_cls)``, registered for Keras serialization as
    'keras_dyndp>DynamicDPKeras<BaseName>' (the TensorFlow classes' names: a model saved on one backend loads on
    the other with the optimizer of that backend).

    Raises:
      TypeError: if `base_cls` is not a subclass of ``keras.optimizers.Optimizer``.
    """
    if not (isinstance(base_cls, type) and issubclass(base_cls, keras.optimizers.Optimizer)):
        raise TypeError(
            f"`base_cls` must be a subclass of keras.optimizers.Optimizer. Received: base_cls={base_cls!r}."
        )
    class_name = f"DynamicDPKeras{base_cls.__name__}"
    namespace = {
        "__doc__": f"`{base_cls.__module__}.{base_cls.__name__}` trained with dynamic DP-SGD on the JAX backend.\n\n"
        "See `keras_dyndp.optimizer_base.DPOptimizerBase` for its arguments; other keyword arguments go to "
        f"`{base_cls.__name__}`.",
        "__module__": "keras_dyndp.jax_backend",
        "__qualname__": class_name,
    }
    dp_class = type(class_name, (JaxDPOptimizerMixin, base_cls), namespace)
    return keras.saving.register_keras_serializable(package="keras_dyndp", name=class_name)(dp_class)


DynamicDPKerasSGD = make_dynamic_dp_optimizer_class(keras.optimizers.SGD)
DynamicDPKerasAdam = make_dynamic_dp_optimizer_class(keras.optimizers.Adam)
DynamicDPKerasAdagrad = make_dynamic_dp_optimizer_class(keras.optimizers.Adagrad)
DynamicDPKerasRMSprop = make_dynamic_dp_optimizer_class(keras.optimizers.RMSprop)
