"""``model = keras_dyndp.make_private(model)`` on Keras 3's JAX backend: per-example clipping in ``model.fit``.

Keras's JAX train step differentiates the batch's mean loss and hands the optimizer one averaged gradient, where no
example can be clipped (the DP optimizers refuse it). ``make_private`` gives the model a stateless ``train_step``
that computes one gradient per example with ``jax.vmap`` of ``jax.grad`` of the example's loss (the model's
``stateless_call`` on a batch of one; tapped kernels by their rules instead, below), clips each to the global norm
C_t that the optimizer's schedule gives at its step counter, sums them, and hands the sums to the optimizer's
``stateless_apply_clipped_sum``, which adds the noise once, normalises and applies
(`keras_dyndp.jax_backend.optimizer`). Each example runs alone on every path (taps, microbatches and physical batches
all vmap that batch of one; the traces of the whole batch that check the model read only shapes), so no layer can
mix examples: a Lambda adding the batch mean moves the clipped sum by C. Method, per layer: ``'auto'`` (=
``'ghost'``) differentiates, instead of the kernels of Dense, Conv1D, Conv2D, DepthwiseConv2D and Embedding layers,
their outputs, and clips those kernels from each example's layer input and output gradient
(`keras_dyndp.jax_backend.taps`, `keras_dyndp.jax_backend.ghost`: no per-example kernel gradient); every other
variable (biases, normalisation layers' scales, layers without a rule, a tapped layer's kernel used twice or read
elsewhere) keeps its per-example gradient. ``'vectorized'`` taps only Embedding tables.

With the optimizer's ``accumulation_steps`` = k the batch (the logical one: the Poisson sample the schedule
accounts) is clipped in k physical batches of ceil(B / k) rows, one after another (``jax.lax.scan``), their clipped
sums added; the noise comes once and the step counter advances once, as on TensorFlow
(`keras_dyndp.tf_backend.per_example.accumulation`). With ``num_microbatches`` = M the per-example gradients are
combined into M random microbatch gradients before clipping (`keras_dyndp.jax_backend.microbatches`); Embedding tables
keep the vmap path then.

State. Non-trainable variables that the training-mode call writes with a value computed from the batch (batch
statistics: BatchNormalization's moving averages, or any custom layer's, a random-generator state included) would
leave the step without noise: they are refused when the step is traced (`model_checks`, ValueError naming the
variable and its layer), before any update. Random-generator states (``SeedGenerator``, used by Dropout and
augmentation layers) are not drawn from Keras's seed inside the step: ``keras.utils.set_random_seed``, which users
publish, would make every example's dropout mask a public function of its row (deleting a row shifted every later
row's mask: 2.96 C). Each step takes a secret key from the optimizer (`keras_dyndp.jax_backend.optimizer`)
and every example's states are drawn from it alone, the same for every row (as on TensorFlow,
`keras_dyndp.tf_backend.per_example.randomness`): one secret dropout mask per step, never released and independent of
the rows' positions, so removing an example moves no other example's gradient. The states the model keeps advance from
their public values as one example's call advances them in Keras. A variable written from those secret draws (a stored
mask) is refused too.

Sampling: ``fit`` on `keras_dyndp.poisson_batches` at another rate than the schedule's is refused,
and so are arrays (fixed-size batches) unless the optimizer has ``public_batch_size=True``; anything else gets one
`SamplingWarning` (the epsilon assumes Poisson sampling).

A step the optimizer refuses (the budget is spent, or the batch's number of examples is far outside the
schedule's Poisson sampling) changes nothing, nor does any later step, and ``fit`` raises RuntimeError with the
reason at that epoch's end at the latest, the model's state intact (``make_private`` gives ``fit`` a callback for
it); past the budget it is one `keras_dyndp.optimizer_base.BudgetExhaustedError`, raised before the first step when
the budget is already spent.

By default the step computes no loss or metric on the training batch and logs only ``dp_step`` (public);
``training_metrics=True`` opts in to the loss and metrics of the training batch, computed from the per-example
losses and outputs without noise (outside the DP guarantee). Refused as on TensorFlow: an optimizer
that is not a keras_dyndp JAX DP optimizer (a LossScaleOptimizer included), a loss reduced over the batch, several
losses, regularisation losses, trainable BatchNormalization, a ``keras.distribution`` across several processes.

Devices. Under a ``keras.distribution`` (``DataParallel``, ``ModelParallel``) in one process, Keras jits the same
step over sharded arrays; JAX keeps its global meaning (one program over the whole batch), so the step releases
what one device would release for the batch: per-example clipping of every example, the noise drawn once per step
(one key) and added once to the global sum, every replica holding the same noisy update.
"""

from __future__ import annotations

import contextlib
import inspect
import types
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import keras

from keras_dyndp import batch_sizes
from keras_dyndp import mechanism
from keras_dyndp import optimizer_base
from keras_dyndp import refusals
from keras_dyndp import validation
from keras_dyndp.jax_backend import data
from keras_dyndp.jax_backend import ghost
from keras_dyndp.jax_backend import microbatches
from keras_dyndp.jax_backend import model_checks
from keras_dyndp.jax_backend import ops
from keras_dyndp.jax_backend import taps

METHODS = ("auto", "ghost", "vectorized")


def _dp_optimizer(model: keras.Model) -> optimizer_base.DPOptimizerBase:
    optimizer = getattr(model, "optimizer", None)
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        raise refusals.loss_scale_error(
            "make_private on JAX does not bypass it yet: use 'mixed_bfloat16' (no loss scaling) or float32."
        )
    if not isinstance(optimizer, optimizer_base.DPOptimizerBase):
        raise refusals.not_dp_optimizer_error(optimizer, "JAX")
    return optimizer


def _per_example_loss_fn(model: keras.Model) -> Callable[[Any, Any], Any]:
    return refusals.per_example_loss_fn(model.loss, keras, lambda loss: loss.reduction in (None, "none"))


def _check_model(model: keras.Model) -> None:
    if keras.distribution.distribution() is not None and jax.process_count() > 1:
        raise ValueError(
            "make_private on JAX runs a keras.distribution within one process only: each of the "
            f"{jax.process_count()} processes would draw its own noise for what must be one noisy step. Train in "
            "one process (all its local devices can share the batch with keras.distribution.DataParallel)."
        )
    model_checks.check_layers(model)
    regularised = [layer.name for layer in model._flatten_layers() if _has_regularizer(layer)]  # pylint: disable=protected-access
    if regularised:
        raise refusals.regularization_error(f"layers {regularised} have regularizers")


def _has_regularizer(layer: keras.layers.Layer) -> bool:
    return getattr(layer, "activity_regularizer", None) is not None or any(
        getattr(variable, "regularizer", None) is not None for variable in layer.weights
    )


def _seed_states(model: keras.Model) -> list[bool]:
    """For each non-trainable variable of ``model``, whether it is a random-generator (SeedGenerator) state."""
    states = {
        id(generator.state)
        for layer in model._flatten_layers()  # pylint: disable=protected-access
        for generator in getattr(layer, "_seed_generators", ())
    }
    return [id(variable) in states for variable in model.non_trainable_variables]


def _secret_seed_state(step_key: jax.Array, position: int, public_state: jax.Array) -> jax.Array:
    """The state random-generator variable ``position`` holds in the step, for every row alike: drawn from the
    step's secret key (never from Keras's seed, which users publish, and never released) and from nothing about the
    row, so deleting a row changes no other row's draws."""
    key = jax.random.fold_in(step_key, position)
    return jax.random.bits(key, public_state.shape, jnp.uint32).astype(public_state.dtype)


def _advanced_seed_states(model: keras.Model, trainable, non_trainable, x, is_seed_state) -> list:
    """``non_trainable`` with the random-generator states advanced as one example's training-mode call advances
    them in Keras, from their public values (the step's per-example states are secret and stay inside it): the
    call on a row of zeros (a seed state written from the data is refused before, `model_checks`), of which jit
    keeps only the states' arithmetic."""
    if not any(is_seed_state):
        return non_trainable
    row = jax.tree_util.tree_map(lambda value: jnp.zeros((1, *value.shape[1:]), value.dtype), x)
    _, written = model.stateless_call(trainable, non_trainable, row, training=True)
    return [new if seed else old for new, old, seed in zip(written, non_trainable, is_seed_state)]


def _batch_size(x: Any) -> int:
    return next(leaf for leaf in jax.tree_util.tree_leaves(x) if leaf is not None).shape[0]


def _private_train_step_arguments(model: keras.Model) -> dict:
    """make_private's arguments for ``model``, as the optimizer records them (in its config) for load_model."""
    return {
        "method": model._keras_dyndp_method,  # pylint: disable=protected-access
        "training_metrics": model._keras_dyndp_training_metrics,  # pylint: disable=protected-access
    }


def is_private(model: keras.Model) -> bool:
    """Whether ``model`` has make_private's train step."""
    return getattr(getattr(model, "train_step", None), "__func__", None) is _private_train_step


def _per_example_fn(model: keras.Model, loss_fn, trainable_variables, tapped, is_seed_state) -> Callable:
    """``(non_trainable, step_key, x, y, weights) -> (grads, tap_rows, y_pred, new_non_trainable, losses)``:
    per example (``jax.vmap``), the gradients of the weighted loss (tapped kernels excluded), each tapped layer's
    inputs and output gradients (`taps`), the outputs, the non-trainable values the call wrote (None for the
    random-generator states, whose per-example values are secret, `_secret_seed_state`) and the weighted losses."""
    kernels = {index for _, index, _ in tapped.values()}
    differentiated = [i for i in range(len(trainable_variables)) if i not in kernels]

    def example_loss(diff_trainable, taps_values, non_trainable, step_key, x_i, y_i, weight):
        trainable = list(trainable_variables)  # the tapped kernels (not differentiated) come from here
        for position, value in zip(differentiated, diff_trainable):
            trainable[position] = value
        non_trainable = [
            _secret_seed_state(step_key, position, value) if seed else value
            for position, (value, seed) in enumerate(zip(non_trainable, is_seed_state))
        ]
        add_batch_axis = lambda value: None if value is None else value[None]  # noqa: E731
        with taps.session(taps_values) as trace:
            y_pred, non_trainable, added_losses = model.stateless_call(
                trainable, non_trainable, jax.tree_util.tree_map(add_batch_axis, x_i), training=True, return_losses=True
            )
        if added_losses:
            raise refusals.regularization_error(f"{len(added_losses)} losses added in the model's call")
        losses = loss_fn(jax.tree_util.tree_map(add_batch_axis, y_i), y_pred)  # A batch of one: any shape is its own.
        loss = jnp.mean(jnp.asarray(losses, jnp.float32)) * weight
        inputs = {key: trace.inputs[key] for key in taps_values}
        non_trainable = [None if seed else value for value, seed in zip(non_trainable, is_seed_state)]
        return loss, (jax.tree_util.tree_map(lambda value: value[0], y_pred), non_trainable, loss, inputs)

    per_example = jax.vmap(
        jax.grad(example_loss, argnums=(0, 1), has_aux=True),
        in_axes=(None, 0, None, None, 0, 0, 0),
        out_axes=(0, (0, None, 0, 0)),
    )

    def fn(non_trainable, step_key, x, y, weights):
        num_rows = weights.shape[0]
        zeros = {key: jnp.zeros((num_rows, *shape), jnp.float32) for key, (*_, shape) in tapped.items()}
        diff_trainable = [trainable_variables[i] for i in differentiated]

        def run(key):
            return per_example(diff_trainable, zeros, non_trainable, key, x, y, weights)

        with _refuse_writes_from_random_draws(model):
            (grads, tap_grads), (y_pred, new_non_trainable, losses, inputs) = run(step_key)
            if step_key is not None:
                # Two keys at once, traced only: a stored value that follows the step's secret key is batched.
                jax.eval_shape(jax.vmap(lambda key: run(key)[1][1], out_axes=None), jax.random.split(step_key, 2))
        all_grads = [None] * len(trainable_variables)
        for position, g in zip(differentiated, grads):
            all_grads[position] = g
        tap_rows = {key: (inputs[key], tap_grads[key]) for key in tapped}
        return all_grads, tap_rows, y_pred, new_non_trainable, losses

    return fn


@contextlib.contextmanager
def _refuse_writes_from_random_draws(model: keras.Model):
    """Turns vmap's refusal of a batched output where none is expected (the non-trainable values the call writes,
    other than the random-generator states) into the refusal of state that leaves the step without noise: such a
    value followed an example (`model_checks` refused the data-derived writes before) or the step's secret random
    draws, which must not be released either."""
    try:
        yield
    except ValueError as error:
        if "out_axes" not in str(error):
            raise
        raise refusals.batch_state_error(
            model.name,
            "a non-trainable variable",
            "its random draws in the DP step (the secret states of its random generators)",
        ) from error


def _clipped_sum_per_example(grads, tap_rows, clip_norm, tapped, trainable_variables, num_rows: int) -> list:
    """sum_i clip(g_i, C) per variable, from `_per_example_fn`'s gradients and the tapped layers' rules (`ghost`)."""
    squared_norms = jnp.zeros([num_rows], jnp.float32)
    for g in grads:
        if g is not None:
            squared_norms = squared_norms + jnp.sum(jnp.reshape(g.astype(jnp.float32), (num_rows, -1)) ** 2, axis=1)
    rules = {key: (layer, ghost.RULES[type(layer)], index) for key, (layer, index, _) in tapped.items()}
    for key, (layer, rule, _) in rules.items():
        squared_norms = squared_norms + rule.squared_norms(layer, *tap_rows[key])
    factors = mechanism.clip_factors(ops.OPS, jnp.sqrt(squared_norms), clip_norm)
    sums = [None if g is None else jnp.tensordot(factors, g.astype(jnp.float32), axes=1) for g in grads]
    for key, (layer, rule, index) in rules.items():
        sums[index] = ghost.clipped_sum(rule, layer, trainable_variables[index], *tap_rows[key], factors)
    return sums


def _in_physical_batches(
    physical_batch: Callable, batch: tuple, num_rows: int, num_physical_batches: int, sum_shapes: list
) -> tuple[list, Any]:
    """``physical_batch`` on the whole batch, k = ``num_physical_batches`` physical batches at a time, summed.

    ``physical_batch(batch) -> (sums, outputs)``, with float32 ``sums`` of ``sum_shapes``; ``batch`` is a tuple of
    arrays (or pytrees of them) whose leading axis is the rows. The rows are padded with zeros to k * ceil(B / k)
    (``batch``'s weights then give padding rows weight 0: they add nothing) and the k physical batches run one after
    another (``jax.lax.scan``), so the peak memory is one physical batch's. Returns the summed ``sums`` and the
    ``outputs`` stacked over the physical batches ([k, ceil(B / k), ...] for those with a row axis).
    """
    size = -(-num_rows // num_physical_batches)
    padding = num_physical_batches * size - num_rows

    def split(value):  # tree_map skips None leaves (no y, no sample weight)
        value = jnp.pad(value, [(0, padding)] + [(0, 0)] * (value.ndim - 1))
        return value.reshape(num_physical_batches, size, *value.shape[1:])

    def body(carry, chunk):
        sums, outputs = physical_batch(chunk)
        return [total + value for total, value in zip(carry, sums)], outputs

    init = [jnp.zeros(shape, jnp.float32) for shape in sum_shapes]
    sums, outputs = jax.lax.scan(body, init, jax.tree_util.tree_map(split, batch))
    return sums, outputs


def _private_train_step(self: keras.Model, state, data):
    trainable_variables, non_trainable_variables, optimizer_variables, metrics_variables = state
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    optimizer = _dp_optimizer(self)
    optimizer._private_train_step = _private_train_step_arguments(self)  # pylint: disable=protected-access
    loss_fn = _per_example_loss_fn(self)
    _check_model(self)
    model_checks.check_model(self, x, (trainable_variables, non_trainable_variables))  # random-generator states too
    num_rows = _batch_size(x)
    weights = jnp.ones([num_rows], jnp.float32) if sample_weight is None else jnp.reshape(sample_weight, [num_rows])
    is_seed_state = _seed_states(self)
    clip_norm = optimizer.clip_norm_at(optimizer_variables)
    num_microbatches = optimizer.num_microbatches
    # Microbatch gradients mix examples, which the taps' per-example norms do not: no taps there.
    method = self._keras_dyndp_method  # pylint: disable=protected-access
    classes = (keras.layers.Embedding,) if method == "vectorized" else tuple(ghost.RULES)
    tapped = {} if num_microbatches else taps.tappable(self, trainable_variables, non_trainable_variables, x, classes)
    per_example = _per_example_fn(self, loss_fn, trainable_variables, tapped, is_seed_state)

    # Once per step, for the random layers' states (every example of every physical batch draws the same).
    step_key = optimizer.secret_key(optimizer_variables) if any(is_seed_state) else None

    def physical_batch(batch):
        grads, tap_rows, y_pred, new_non_trainable, losses = per_example(non_trainable_variables, step_key, *batch)
        if num_microbatches:
            assignment = optimizer.microbatch_assignment(optimizer_variables, losses.shape[0])
            sums = microbatches.clipped_sum(grads, losses, assignment, num_microbatches, clip_norm)
        else:
            sums = _clipped_sum_per_example(grads, tap_rows, clip_norm, tapped, trainable_variables, losses.shape[0])
        return sums, (y_pred, new_non_trainable, losses)

    batch = (x, y, weights)
    num_physical_batches = optimizer.accumulation_steps
    if num_physical_batches == 1 or num_rows <= 1:
        clipped_sums, (y_pred, new_non_trainable, losses) = physical_batch(batch)
        first = lambda value: value  # noqa: E731
    else:
        clipped_sums, (y_pred, new_non_trainable, losses) = _in_physical_batches(
            physical_batch, batch, num_rows, num_physical_batches, [v.shape for v in trainable_variables]
        )
        rows = lambda value: value.reshape(-1, *value.shape[2:])[:num_rows]  # noqa: E731
        y_pred, losses = jax.tree_util.tree_map(rows, (y_pred, losses))
        first = lambda value: value[0]  # noqa: E731
    num_examples = jnp.sum(weights != 0)
    advanced = _advanced_seed_states(self, trainable_variables, non_trainable_variables, x, is_seed_state)
    trainable_variables, optimizer_variables = optimizer.stateless_apply_clipped_sum(
        optimizer_variables, clipped_sums, num_examples, num_rows, trainable_variables
    )
    non_trainable_variables = [
        new if seed else first(value) for value, new, seed in zip(new_non_trainable, advanced, is_seed_state)
    ]
    if self._keras_dyndp_training_metrics:  # pylint: disable=protected-access
        logs, metrics_variables = self._update_metrics_variables(  # pylint: disable=protected-access
            metrics_variables, jnp.sum(losses) / max(num_rows, 1), x, y, y_pred, sample_weight
        )
    else:
        logs = {"dp_step": optimizer.step_at(optimizer_variables)}
    return logs, (trainable_variables, non_trainable_variables, optimizer_variables, metrics_variables)


class _RefusedStepCheck(keras.callbacks.Callback):
    """Calls the optimizer's `raise_refused_step` only where Keras has synced the state anyway: before a step that
    reads it back from the variables (each epoch's first, or one after a callback synced, maybe restored, it: new
    keys) and at each epoch's end, where a refused step surfaces at the latest."""

    def on_train_batch_begin(self, batch, logs=None):
        del batch, logs  # Unused.
        if getattr(self._model, "_jax_state_synced", True):  # pylint: disable=protected-access
            _dp_optimizer(self._model).raise_refused_step()  # pylint: disable=protected-access

    def on_epoch_end(self, epoch, logs=None):
        del epoch, logs  # Unused.
        _dp_optimizer(self.model).raise_refused_step()


class _FirstStepGuard(keras.callbacks.Callback):
    """Keeps the state's values over ``fit``'s first step, whose trace raises the refusals found there.

    Keras's JAX ``fit`` empties the model's and optimizer's variables when it hands their values to the first step;
    when tracing that step raises, nothing puts them back, and the model would be left without weights. This keeps
    references to the values (no copies) until the first step has run, so `restore` can put them back.
    """

    def __init__(self):
        super().__init__()
        self._saved: list | None = None
        self._done = False

    def on_train_batch_begin(self, batch, logs=None):
        del batch, logs  # Unused.
        if not self._done and self._saved is None:
            model = self._model  # pylint: disable=protected-access  (self.model would sync the state)
            variables = [*model.variables, *model.optimizer.variables, *model.metrics_variables]
            self._saved = [(variable, variable.value) for variable in variables]

    def on_train_batch_end(self, batch, logs=None):
        del batch, logs  # Unused.
        self._saved, self._done = None, True

    def restore(self) -> None:
        """Puts back the values held before the first step (nothing once it has run)."""
        for variable, value in self._saved or ():
            if not value.is_deleted():  # A step that ran took them over (donated buffers): nothing to restore.
                variable.assign(value)
        self._saved = None


_FIT_SIGNATURE = inspect.signature(keras.Model.fit)


def _check_sampling(model: keras.Model, x: Any, caller: str = "model.fit") -> None:
    """Refuses Poisson batches at another rate than the schedule's, or for an optimizer with ``public_batch_size``,
    and arrays for ``fit`` without it (`batch_sizes.check_not_arrays`); warns (once per optimizer) on other data."""
    optimizer = getattr(model, "optimizer", None)
    if not isinstance(optimizer, optimizer_base.DPOptimizerBase):
        return  # The train step refuses it, naming what to use.
    p = optimizer.schedule.sampling_probability
    if isinstance(x, data.PoissonBatches):
        batch_sizes.check_poisson_batches(x.sampling_probability, p, optimizer.public_batch_size, caller)
        return
    if caller == "model.fit":  # train_on_batch takes one batch, which may be the user's own Poisson sample
        batch_sizes.check_not_arrays(x, p, optimizer.public_batch_size)
    if optimizer._warned_sampling:  # pylint: disable=protected-access
        return
    optimizer._warned_sampling = True  # pylint: disable=protected-access
    warnings.warn(
        batch_sizes.not_poisson_message(batch_sizes.not_poisson_batches(caller, x), p),
        batch_sizes.SamplingWarning,
        stacklevel=3,
    )


def _private_fit(self: keras.Model, *args, **kwargs):
    """``Model.fit`` with `_RefusedStepCheck` added to the callbacks and the model's weights kept when the first
    step's trace raises (`_FirstStepGuard`); checks the data's sampling and the budget left, and refuses what Keras
    would fail on first. A step refused past the budget ends it in one `BudgetExhaustedError`, without Keras's
    traceback."""
    _check_model(self)  # Keras's own first trace fails to add a regulariser's scalar to a per-example loss.
    bound = _FIT_SIGNATURE.bind(self, *args, **kwargs)
    _check_sampling(self, bound.arguments.get("x"))
    if isinstance(self.optimizer, optimizer_base.DPOptimizerBase):
        self.optimizer.check_budget_left("keras_dyndp.BudgetStop")
    guard = _FirstStepGuard()
    # The guard first: it lets go of the values as soon as the first step has run (and donated them).
    bound.arguments["callbacks"] = [guard, *(bound.arguments.get("callbacks") or []), _RefusedStepCheck()]
    try:
        return keras.Model.fit(*bound.args, **bound.kwargs)
    except optimizer_base.BudgetExhaustedError as error:
        guard.restore()
        raise optimizer_base.BudgetExhaustedError(str(error)) from None
    except Exception:
        guard.restore()
        raise


def _private_train_on_batch(self: keras.Model, *args, **kwargs):
    """``Model.train_on_batch`` after the sampling check, between two `raise_refused_step` (new keys before, the
    step's refusal after; the state is in the model then)."""
    _check_sampling(self, args[0] if args else kwargs.get("x"), "model.train_on_batch")
    _dp_optimizer(self).raise_refused_step()
    logs = keras.Model.train_on_batch(self, *args, **kwargs)
    _dp_optimizer(self).raise_refused_step()
    return logs


def _private_make_train_function(self: keras.Model, force: bool = False):
    """Keras's ``make_train_function``, with a new train-step object whenever it builds a new train function.

    JAX caches a jitted function's traces by the function object, and a trace holds the Python objects it was
    traced with: after ``compile`` with another DP optimizer, the rebuilt ``jit(self.train_step)`` replayed the first
    optimizer's trace (its schedule, noise source and refusals: the update followed the old clip norm, 1.06 where
    the new schedule allows 0.0014) while the new optimizer's counter advanced.
    """
    if force or self.train_function is None:
        self.train_step = types.MethodType(_private_train_step, self)
    return type(self).make_train_function(self, force)


def make_private(model: keras.Model, method: str = "auto", *, training_metrics: bool = False) -> keras.Model:
    """Gives ``model`` a JAX train step that clips per example and applies through the DP optimizer.

    The same model object is returned (its ``train_step`` is replaced on the instance). Compile it, before or after,
    with a `keras_dyndp.jax_backend` DP optimizer and a per-example loss (``reduction="none"``).

    Args:
        model: a Keras model (Sequential, functional or subclassed) without trainable batch normalisation.
        method: ``'auto'`` or ``'ghost'`` (the same: the layers' kernels clipped from their taps where a rule
            covers them, the rest by ``jax.vmap``) or ``'vectorized'`` (per-example gradients, Embedding taps).
        training_metrics: False (the default) computes no loss or metric on the training batch and logs only
            ``dp_step`` (public; validation metrics as usual). True opts in to the compiled loss and metrics of the
            training batch, computed WITHOUT noise and released outside the DP guarantee (one outlier moved the
            logged epoch loss from 0.205 to 0.977).

    Returns:
        ``model``.

    Raises:
        ValueError: on a ``method`` other than these, a ``training_metrics`` that is not a bool or
            a model that is not a ``keras.Model``; when the first step is traced, on what the module docstring
            lists.
    """
    if not isinstance(model, keras.Model):
        raise refusals.not_a_model_error(model)
    validation.check_choice("method", method, METHODS)
    validation.check_bool("training_metrics", training_metrics)
    model._keras_dyndp_method = method  # pylint: disable=protected-access
    model._keras_dyndp_training_metrics = training_metrics  # pylint: disable=protected-access
    model.train_step = types.MethodType(_private_train_step, model)
    model.make_train_function = types.MethodType(_private_make_train_function, model)
    model.fit = types.MethodType(_private_fit, model)
    model.train_on_batch = types.MethodType(_private_train_on_batch, model)
    model.train_function = None
    if getattr(model, "optimizer", None) is not None:
        _dp_optimizer(model)._private_train_step = _private_train_step_arguments(model)  # pylint: disable=protected-access
    return model
