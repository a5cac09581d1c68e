"""Keras optimizers that run dynamic DP-SGD on TensorFlow: the mixin runs the mechanism (`keras_dyndp.core.mechanism`)
on the clipped sums ``make_private``'s step (`apply_clipped_sum`) or a custom loop (`compute_gradients`) hands it; the
base class holds the update rule (docs/architecture.md, 'The DP step, once'). `dp_step` IS Keras's `iterations`:
`apply_gradients` takes only `compute_gradients`' gradients and the whole update depends on them, so it counts DP steps.
Past T a step raises, or under XLA releases nothing (C_t = sigma_t = 0). Keras's ``clipnorm`` and ``clipvalue`` act on
the noised gradient: harmless, but not DP clipping."""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence

import tensorflow as tf
from absl import logging

from keras_dyndp import optimizer_base
from keras_dyndp.core import mechanism
from keras_dyndp.core import refusals
from keras_dyndp.core import step_checks
from keras_dyndp.keras_glue import private_model
from keras_dyndp.keras_glue import registration
from keras_dyndp.keras_glue import restarts
from keras_dyndp.tf_backend import distribution
from keras_dyndp.tf_backend import keras_compat
from keras_dyndp.tf_backend import microbatches
from keras_dyndp.tf_backend import model_checks
from keras_dyndp.tf_backend import noise_source
from keras_dyndp.tf_backend import ops
from keras_dyndp.tf_backend import sampling_check
from keras_dyndp.tf_backend import train_step


class DynamicDPOptimizerMixin(optimizer_base.DPOptimizerBase):
    """The dynamic DP-SGD part of every keras_dyndp TensorFlow optimizer (``isinstance`` tells them from others): the
    TensorFlow mechanism over `keras_dyndp.optimizer_base.DPOptimizerBase`'s arguments, checks and config. Compile the
    model with a per-example loss."""

    def _check_backend(self) -> None:
        distribution.check_distribution()

    def _unsupported_base_arguments(self) -> dict[str, str]:
        return keras_compat.UNSUPPORTED_OPTIMIZER_ARGUMENTS

    def _build_dp_state(self, noise_seed: int | None) -> None:
        self._noise_source = noise_source.NoiseSource(noise_seed)
        self._sampling_check = sampling_check.SamplingCheck(
            self._step_checks,
            self._public_batch_size,
            type(self).__name__,
            self.note_unverified_sampling,
            self.note_batch_cap,
        )
        with tf.init_scope():
            self._clip_norms_tensor = tf.constant(self._step_arrays[0], dtype=tf.float32)
            self._noise_stddevs_tensor = tf.constant(self._step_arrays[1], dtype=tf.float32)
        self._schedule_fingerprint = keras_compat.add_int32_optimizer_variable(self, "schedule_fingerprint", (2,))

        def variable(value, dtype, name):
            aggregation = tf.VariableAggregation.ONLY_FIRST_REPLICA
            return tf.Variable(value, dtype=dtype, trainable=False, name=name, aggregation=aggregation)

        # Tracked by name, not among the variables Keras lists by index in checkpoints (before the slots, it would
        # shift theirs: a checkpoint saved before it existed would not restore); `.keras` files hold it last.
        with tf.init_scope():
            self._released_steps = variable(step_checks.UNRECORDED_RELEASED, tf.int32, "released_steps")
            if self._adaptive_clipping is not None:  # saved after it (`keras_glue.saved_state`)
                clip_norm = float(self._schedule.clip_norms[0])
                self._adaptive_clip_norm = variable(clip_norm, tf.float32, "adaptive_clip_norm")

    @property
    def noise_source(self) -> noise_source.NoiseSource:
        """The optimizer's secret randomness (noise, and the random layers of make_private's step)."""
        return self._noise_source

    @property
    def sampling_check(self) -> sampling_check.SamplingCheck:
        """The checks of the batches against the schedule's Poisson sampling (`sampling_check.SamplingCheck`)."""
        return self._sampling_check

    def _released(self, step: tf.Tensor) -> tf.Tensor:
        """The DP steps released (`step_checks.released_steps`), in the dtype of the step counter ``step``."""
        recorded = tf.cast(tf.convert_to_tensor(self._released_steps), step.dtype)
        return step_checks.released_steps(step, recorded, tf.where)

    def _current_schedule_values(self) -> tuple[tf.Tensor, tf.Tensor]:
        # 0 past the budget or on a counter the step checks refuse: XLA drops the assertions.
        step = tf.convert_to_tensor(self.dp_step)
        mismatch = self._step_checks.schedule_mismatch(step, tf.convert_to_tensor(self._schedule_fingerprint))
        may_run = ~mismatch & tf.equal(step, self._released(step))
        clip_norms, noise_stddevs = self._clip_norms_tensor, self._noise_stddevs_tensor
        scale = None if self._adaptive_clip_norm is None else tf.convert_to_tensor(self._adaptive_clip_norm)
        num_steps = self._schedule.num_steps
        return mechanism.schedule_values(ops.OPS, clip_norms, noise_stddevs, step, num_steps, may_run, scale)

    def _refusals(self, min_examples, max_examples, num_rows) -> list[tf.Operation]:
        """The step's refusals (`keras_dyndp.core.step_checks`) of a batch of ``num_rows`` rows holding ``min_examples``
        to ``max_examples`` examples, assertions in their order, then the record of the schedule's fingerprint."""
        step, recorded = tf.convert_to_tensor(self.dp_step), tf.convert_to_tensor(self._schedule_fingerprint)
        released = self._released(step)
        failing = self._step_checks.failing(step, recorded, released, min_examples, max_examples, num_rows)
        values = dict(step=step, released=released, min_examples=min_examples, max_examples=max_examples)
        checks = []
        for code, refused in failing.items():
            parts = self._step_checks.message(code, budget_stop=None)  # a custom loop's (make_private's fit: its own)
            numbers = [values[name] for name in step_checks.NUMBERS.get(code, ())]
            with tf.control_dependencies(checks):
                checks += _refusal(refused, step_checks.interleave(parts, numbers))
        with tf.control_dependencies(checks):
            mismatch = failing[step_checks.SCHEDULE_MISMATCH] | failing[step_checks.NO_FINGERPRINT]
            own = tf.constant(self._schedule.fingerprint, tf.int32)
            return checks + [self._schedule_fingerprint.assign(tf.where(mismatch, recorded, own))]

    def _noised(
        self, clip: Callable, num_examples, num_rows, schedule_values=None, exact=True, centred_count=None
    ) -> list[tf.Tensor]:
        """This replica's part of the update (`mechanism.private_update`) of its sums ``clip(C)`` at (C, sigma)
        (`_read_once`), after the `_refusals` of its rows (``num_examples``, a lower bound unless ``exact``): noise on
        the first replica only, the global normaliser; ``centred_count(C)`` moves C_t (`_adapt`)."""
        self._sampling_check.check_step_input()
        adaptive = self._adaptive_clip_norm is not None
        if adaptive and centred_count is None:
            raise ValueError(
                "This optimizer clips adaptively (adaptive_clipping is set): apply_clipped_sum needs "
                "`centred_count`, the batch's sum of keras_dyndp.core.adaptive_clipping.centred_indicators of the "
                "per-example gradient norms at the step's clip norm. Received: centred_count=None."
            )
        counts = tf.stack([tf.cast(num_examples, tf.int32), tf.cast(num_rows, tf.int32)])
        examples, rows = tf.unstack(distribution.global_sum(counts))
        with tf.control_dependencies(self._refusals(examples, examples if exact else rows, rows)):
            values = self._read_once(schedule_values, self._current_schedule_values)
            clip_norm, sigma = (tf.identity(value) for value in values)
        num_microbatches = self._num_microbatches and self._num_microbatches * distribution.num_replicas()
        grads = mechanism.private_update(
            ops.OPS,
            clip(clip_norm),
            self._noise_source.generator,
            clip_norm=clip_norm,
            sigma=sigma * distribution.noise_share(),
            num_rows=rows,
            expected_batch_size=self._expected_batch_size,
            num_microbatches=num_microbatches,
            rescale_to_unit_norm=self._rescale_to_unit_norm,
            num_extra=int(adaptive),  # the count's normal, drawn with the noise
        )
        if not adaptive:
            return grads
        grads, (normal,) = grads[:-1], grads[-1:]
        with tf.control_dependencies([self._adapt(centred_count, normal, clip_norm, rows, num_microbatches)]):
            return [tf.identity(grad) for grad in grads]

    def _adapt(self, centred_count: Callable, normal, clip_norm, rows, num_microbatches) -> tf.Operation:
        """Assigns adaptive clipping's C_{t+1}: the replicas' counts ``centred_count(C_t)`` summed with the count's
        noise (the standard ``normal`` of the first replica only), over the step's global normaliser."""
        noise = self.count_noise_stddev(num_microbatches) * normal * distribution.noise_share()
        noised = distribution.global_sum(tf.cast(centred_count(clip_norm), tf.float32) + noise)
        state = tf.convert_to_tensor(self._adaptive_clip_norm)
        next_norm = self._next_clip_norm(ops.OPS, clip_norm, state, noised, rows, num_microbatches)
        return self._adaptive_clip_norm.assign(next_norm)

    def _calling_model(self):
        """The model whose train step calls (`private_model.model_compiled_with`, `registration.keras_model_calling`) or
        None; refuses Keras's train step and loss scaling outside ``make_private``."""
        model = private_model.model_compiled_with(self)
        if model is not None:
            return model
        model = registration.keras_model_calling(self, keras_compat.keras.Model)
        if model is not None:
            if keras_compat.is_keras_train_step(model):
                raise refusals.user_error(RuntimeError(refusals.keras_train_step(self.private_config)))
            if keras_compat.unwrap_optimizer(model.optimizer) is not model.optimizer:
                raise refusals.loss_scale_error(
                    "Call model = keras_dyndp.make_private(model): its train step supports mixed precision (computes "
                    "in the policy's dtype, then clips, sums and adds the noise in float32, without loss scaling)."
                )
        return model

    def compute_gradients(self, loss, var_list, tape=None):
        """Clipped, noised and normalised gradients of a per-example loss: one DP release at `dp_step`, which only
        `apply_gradients` advances; pass the (gradient, variable) pairs to it unchanged, once per call.

        Args:
          loss: per-example loss tensor [B] (or [B, ...], averaged per example), or a callable returning it.
          var_list: the variables, or a callable returning them.
          tape: the `tf.GradientTape` that recorded `loss` (required for a tensor loss).

        Raises:
          RuntimeError: when Keras 2's own train step calls it (``model.fit`` without ``make_private``).
          ValueError: if the loss is a scalar (already averaged) or `tape` is missing, or if the model mixes
            examples or stores batch statistics (`keras_dyndp.tf_backend.model_checks`) or wraps the optimizer in a
            LossScaleOptimizer outside ``make_private``.
          tf.errors.InvalidArgumentError: at run time, when the budget is spent or the batch size is far
            outside the schedule's Poisson sampling (`sampling_check`).
        """
        distribution.check_distribution()
        if self._accumulation_steps > 1:
            raise ValueError(
                f"accumulation_steps={self._accumulation_steps} splits each batch in make_private's train step; "
                "compute_gradients receives a loss already computed on the whole batch. Train with model.fit after "
                "model = keras_dyndp.make_private(model)."
            )
        model = self._calling_model()
        losses, var_list, tape = _evaluated_loss(loss, var_list, tape)
        model_checks.check_training_model(self, model, var_list)  # Once per model, while the first step is traced.
        generator = self._noise_source.generator

        norms = []

        def clip(clip_norm):
            sums, step_norms = microbatches.clipped_sum(
                tape, losses, var_list, clip_norm, self._num_microbatches, generator
            )
            norms.append(step_norms)
            return sums

        def centred_count(clip_norm):  # Rows of loss 0 are padding (a real one counted or not: its own choice).
            rows = None if self._num_microbatches else tf.not_equal(losses, 0)
            return ops.centred_count(norms[0], clip_norm, rows)

        # Zero-weight padding rows have loss 0, so the rows with a non-zero loss bound the examples from below.
        examples = sampling_check.count_nonzero_rows(losses)
        grads = self._noised(clip, examples, tf.shape(losses)[0], exact=False, centred_count=centred_count)
        self._dp_gradient_guard.issue(grads)
        return list(zip(grads, var_list))

    def minimize(self, loss, var_list, tape=None):
        """`compute_gradients` then `apply_gradients`: one DP step for custom training loops; returns `dp_step`."""
        return self.apply_gradients(self.compute_gradients(loss, var_list, tape=tape))

    def apply_gradients(self, grads_and_vars, name=None, skip_gradients_aggregation=False, **kwargs):
        """Applies the gradients returned by this optimizer's latest `compute_gradients`; RuntimeError for any
        other (ordinary gradients from a tape or Keras 3's train step would train without differential privacy)."""
        del skip_gradients_aggregation  # The DP step always sums the replicas' parts (see `distribution`).
        grads_and_vars = list(grads_and_vars)
        self._refuse_unless_issued([grad for grad, _ in grads_and_vars], "apply_gradients")
        return self._apply_private_gradients(grads_and_vars, name=name, **kwargs)

    def apply(self, grads, trainable_variables=None):
        """Keras 3's entry for gradients: refused, like `apply_gradients`, unless they come from
        `compute_gradients` (then ``trainable_variables`` must be given)."""
        grads = list(grads)
        self._refuse_unless_issued(grads, "apply")
        if trainable_variables is None:
            raise ValueError(f"{type(self).__name__}.apply needs `trainable_variables`.")
        return self._apply_private_gradients(list(zip(grads, trainable_variables)))

    def _refuse_unless_issued(self, grads: list, entry: str) -> None:
        if self._dp_gradient_guard.check_and_clear(grads):
            return
        in_train_step = registration.keras_model_calling(self, keras_compat.keras.Model) is not None
        if in_train_step and keras_compat.KERAS_MAJOR_VERSION >= 3:
            raise refusals.user_error(RuntimeError(refusals.keras_train_step(self.private_config)))
        message = refusals.foreign_gradients(
            f"{type(self).__name__}.{entry}",
            "returned by its own compute_gradients",
            "train with model.fit after model = keras_dyndp.make_private(model); a custom training loop calls this "
            "optimizer's minimize(per_example_loss, variables, tape) (or compute_gradients, then apply_gradients "
            "with its result), and per-example paths of your own call apply_clipped_sum.",
        )
        raise refusals.user_error(RuntimeError(message))

    def build(self, var_list):
        """Builds the base optimizer's variables; in ``load_model``'s ``compile_from_config``, gives the model (the
        private one compiled with this optimizer, else the one building it) back the make_private train step its config
        records (not in a ``fit``, which would skip make_private's data checks). Warns if the schedule starts over."""
        super().build(var_list)
        model_class = keras_compat.keras.Model
        model = private_model.model_compiled_with(self, var_list) or registration.keras_model_calling(self, model_class)
        if model is None:
            return
        with tf.init_scope():  # Keras 3 builds it in the traced step: the counters are read eagerly.
            restarts.warn_on_schedule_restart(model, self)
        if self.private_config is None or private_model.is_private(model):
            return
        if registration.keras_model_calling(self, model_class, caller="compile_from_config") is model:
            train_step.make_private(model, **vars(self.private_config))
            logging.info(
                "keras_dyndp: model %r was trained through make_private (its optimizer's config says "
                "so); its private train step is restored.",
                model.name,
            )

    def _apply_private_gradients(self, grads_and_vars: list, name=None, **kwargs) -> tf.Variable:
        # The base class's data-independent increment could run when the input iterator runs dry: tie it to the
        # gradients (module docstring), as the count of the steps released.
        with tf.control_dependencies([grad for grad, _ in grads_and_vars]):
            step = tf.convert_to_tensor(self.dp_step)
            released = self._released_steps.assign(tf.cast(self._released(step) + 1, tf.int32))
            with tf.control_dependencies([released]):
                return keras_compat.apply_base_update(super(), grads_and_vars, name=name, **kwargs)

    def apply_clipped_sum(
        self,
        clipped_sums: Sequence[tf.Tensor | None],
        num_examples,
        num_rows,
        trainable_variables: Sequence[tf.Variable],
        *,
        schedule_values: tuple[tf.Tensor, tf.Tensor] | None = None,
        centred_count: tf.Tensor | None = None,
    ) -> tf.Variable:
        """Noises, normalises (`keras_dyndp.core.mechanism.private_update`) and applies sums of per-example (with
        ``num_microbatches``, per-microbatch) gradients clipped to `current_clip_norm()` (`make_private`'s step clips
        them), and advances `dp_step`; the arguments of the JAX optimizers' ``stateless_apply_clipped_sum`` but for its
        state, as Keras's ``apply`` and ``stateless_apply``.

        Args:
          clipped_sums: one tensor per variable, the sum over the batch of the clipped per-example gradients
            (`None` for a variable without gradient: treated as zero and still noised).
          num_examples: rows with a non-zero sample weight (int scalar, may be a tensor), checked against the
            schedule's Poisson sampling (`sampling_check.count_nonzero_rows` of the sample weights).
          num_rows: number of rows in the batch (int scalar, may be a tensor).
          trainable_variables: the variables, in the order of `clipped_sums`.
          schedule_values: the (C_t, sigma_t) pair `current_schedule_values()` returned, which the sums were clipped
            at (the step's one read of the schedule); None (default): read here.
          centred_count: with adaptive clipping (required then), the float32 sum over the batch of
            `keras_dyndp.core.adaptive_clipping.centred_indicators` of the unclipped gradient norms at the step's C_t
            (`ops.centred_count`); its noised value moves C_t. Ignored otherwise.

        Returns `dp_step`. Raises `tf.errors.InvalidArgumentError` at run time as `compute_gradients` does.
        """
        distribution.check_distribution()
        var_list = list(trainable_variables)
        optimizer_base.check_same_length(clipped_sums, var_list)
        clipped_sums = ops.zeros_where_unconnected(clipped_sums, var_list)
        count = None if centred_count is None else lambda clip_norm: centred_count
        grads = self._noised(lambda clip_norm: clipped_sums, num_examples, num_rows, schedule_values, True, count)
        return self._apply_private_gradients(list(zip(grads, var_list)))


def _refusal(refused: tf.Tensor, message: list) -> list[tf.Operation]:
    """Raises at once in eager mode; else ``[assertion]`` to run before the step (XLA compiles it away)."""
    if not tf.executing_eagerly():
        return [tf.debugging.Assert(tf.logical_not(refused), message)]  # no string ops
    if bool(refused):
        raise tf.errors.InvalidArgumentError(
            None, None, "".join(part if isinstance(part, str) else str(int(part)) for part in message)
        )
    return []


def _evaluated_loss(loss, var_list, tape):
    """``(losses, var_list, tape)``: the per-example losses [B] (a callable loss evaluated, a loss [B, ...] averaged,
    on the tape) and the variables listed; a loss that is not per example (a scalar) refused."""
    if tape is None and not callable(loss):
        raise ValueError("`tape` is required when a tensor loss is passed. Received: tape=None.")
    if callable(loss):
        tape = tape or tf.GradientTape()
        with tape:
            if not callable(var_list):
                tape.watch(var_list)
            loss = loss()
    if callable(var_list):
        var_list = var_list()
    if loss.shape.rank is None or loss.shape.rank == 0:
        raise ValueError(
            "Dynamic DP optimizers need the per-example loss vector, but received a loss of shape "
            f"{loss.shape}. Averaging before clipping silently destroys the privacy guarantee: compile "
            f"the model with a loss built with {refusals.PER_EXAMPLE_REDUCTION}, e.g. "
            f"tf.keras.losses.SparseCategoricalCrossentropy({refusals.PER_EXAMPLE_REDUCTION})."
        )
    if loss.shape.rank > 1:
        with tape:
            loss = mechanism.per_example_losses(ops.OPS, loss)  # weighted by Keras already
    return loss, list(var_list), tape


def make_dynamic_dp_optimizer_class(base_cls: type) -> type:
    """Returns ``DynamicDPKeras<BaseName>(DynamicDPOptimizerMixin, base_cls)``, a dynamic DP-SGD optimizer class
    keeping the base update rule and arguments, registered with Keras as 'keras_dyndp>DynamicDPKeras<BaseName>'.
    Its instances take the DP arguments of `keras_dyndp.optimizer_base.DPOptimizerBase` and ``base_cls``'s own.

    Args:
      base_cls: the Keras optimizer class whose update rule the DP optimizer applies to the noisy gradient, a
        subclass of `tf.keras.optimizers.Optimizer` (e.g. ``tf.keras.optimizers.Nadam``).

    Raises:
      TypeError: unless ``base_cls`` subclasses `tf.keras.optimizers.Optimizer` (not ``optimizers.legacy``).
    """
    return optimizer_base.make_optimizer_class(
        base_cls,
        DynamicDPOptimizerMixin,
        keras_compat.keras,
        "tf.keras.optimizers.Optimizer (the Keras 2.11+ optimizer API)",
        "on TensorFlow",
    )


DynamicDPKerasSGD = make_dynamic_dp_optimizer_class(keras_compat.keras.optimizers.SGD)
DynamicDPKerasAdam = make_dynamic_dp_optimizer_class(keras_compat.keras.optimizers.Adam)
DynamicDPKerasAdagrad = make_dynamic_dp_optimizer_class(keras_compat.keras.optimizers.Adagrad)
DynamicDPKerasRMSprop = make_dynamic_dp_optimizer_class(keras_compat.keras.optimizers.RMSprop)
