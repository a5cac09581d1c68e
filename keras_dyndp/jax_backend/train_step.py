"""``model = keras_dyndp.make_private(model)`` on Keras 3's JAX backend: per-example clipping in ``model.fit``, whose
own step sees only the batch's mean loss. The stateless ``train_step`` runs each example alone (``jax.vmap`` of
``stateless_call`` on a batch of one, on every path, so no layer can mix examples), clips (from the taps of
`per_example.taps` where a rule covers a variable), sums and hands the sums to ``stateless_apply_clipped_sum``. How,
and what it refuses: docs/jax.md; docs/privacy.md, "Refused, and why" and "Which entry points are covered, and how"."""

from __future__ import annotations

import contextlib
import inspect
import operator
import types
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import keras

from keras_dyndp import optimizer_base
from keras_dyndp.core import batch_sizes
from keras_dyndp.core import mechanism
from keras_dyndp.core import refusals
from keras_dyndp.core import step_checks
from keras_dyndp.jax_backend import data
from keras_dyndp.jax_backend import distribution
from keras_dyndp.jax_backend import microbatches
from keras_dyndp.jax_backend import model_checks
from keras_dyndp.jax_backend import ops
from keras_dyndp.jax_backend.per_example import accumulation
from keras_dyndp.jax_backend.per_example import taps
from keras_dyndp.keras_glue import entry_points
from keras_dyndp.keras_glue import private_model
from keras_dyndp.rules import layer_rules
from keras_dyndp.rules import registry
from keras_dyndp.rules import sublayers

METHODS = ("auto", "ghost", "vectorized")


def _unwrap_optimizer(optimizer):
    """``optimizer``; a loss-scale wrapper refused."""
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        raise refusals.loss_scale_error(
            "make_private on JAX does not bypass it yet: use 'mixed_bfloat16' (no loss scaling) or float32."
        )
    return optimizer


_CHECKED: weakref.WeakSet = weakref.WeakSet()  # the models within a call that checked them (`_checked`)


def _check_model(model: keras.Model) -> None:
    """make_private's refusals of the model, but once per call of ``fit`` or of a train function (`_checked`)."""
    if model in _CHECKED:
        return
    distribution.check_distribution()
    model_checks.check_layers(model)
    regularised = [
        layer.name
        for layer in sublayers.layers(model)
        if getattr(layer, "activity_regularizer", None) is not None
        or any(getattr(variable, "regularizer", None) is not None for variable in layer.weights)
    ]
    if regularised:
        raise refusals.regularization_error(f"layers {regularised} have regularizers")


@contextlib.contextmanager
def _checked(model: keras.Model, check: bool = True):
    """`_check_model` (unless ``check`` is False: ``make_train_function`` ran it), then nothing more within."""
    outer = model in _CHECKED
    if check:
        _check_model(model)
    _CHECKED.add(model)
    try:
        yield
    finally:
        if not outer:
            _CHECKED.discard(model)


def _seed_states(model: keras.Model) -> list[bool]:
    """For each non-trainable variable of ``model``, whether it is a random-generator (SeedGenerator) state."""
    # Keras lists a layer's SeedGenerators only in its private `_seed_generators`; no public API names them.
    states = {
        id(generator.state) for layer in sublayers.layers(model) for generator in getattr(layer, "_seed_generators", ())
    }
    return [id(variable) in states for variable in model.non_trainable_variables]


def _secret_seed_state(step_key: jax.Array, position: int, public_state: jax.Array) -> jax.Array:
    """Random-generator state ``position`` in the step, the same for every row: from the secret step key alone (never
    released), so deleting a row changes no other row's draws."""
    key = jax.random.fold_in(step_key, position)
    return jax.random.bits(key, public_state.shape, jnp.uint32).astype(public_state.dtype)


def _advanced_seed_states(model: keras.Model, trainable, non_trainable, x, is_seed_state) -> list:
    """``non_trainable`` with the random-generator states advanced from their public values as one example's call
    advances them (the secret per-example states stay in the step): a call on a row of zeros, of which jit keeps only
    the states' arithmetic (a state written from the data was refused, `model_checks`)."""
    if not any(is_seed_state):
        return non_trainable
    row = jax.tree_util.tree_map(lambda value: jnp.zeros((1, *value.shape[1:]), value.dtype), x)
    _, written = model.stateless_call(trainable, non_trainable, row, training=True)
    return [new if seed else old for new, old, seed in zip(written, non_trainable, is_seed_state)]


def _per_example_fn(model: keras.Model, loss_fn, trainable_variables, tapped, is_seed_state) -> Callable:
    """``(non_trainable, step_key, x, y, weights) -> (grads, tap_rows, y_pred, new_non_trainable, losses)`` per
    example (``jax.vmap``); ``grads`` None for the variables the taps cover, ``tap_rows`` each tapped layer's inputs
    and output gradients, ``new_non_trainable`` the values written (None for the secret seed states)."""
    covered = {index for _, indices, _ in tapped.values() for index in indices}
    differentiated = [i for i in range(len(trainable_variables)) if i not in covered]

    def example_loss(diff_trainable, taps_values, non_trainable, step_key, x_i, y_i, weight):
        given = dict(zip(differentiated, diff_trainable))  # the covered variables (not differentiated): the step's
        trainable = [given.get(position, value) for position, value in enumerate(trainable_variables)]
        non_trainable = [
            _secret_seed_state(step_key, position, value) if seed else value
            for position, (value, seed) in enumerate(zip(non_trainable, is_seed_state))
        ]
        add_batch_axis = lambda value: None if value is None else value[None]  # noqa: E731
        with taps.Session(taps_values) as trace:
            y_pred, non_trainable, added_losses = model.stateless_call(
                trainable, non_trainable, jax.tree_util.tree_map(add_batch_axis, x_i), training=True, return_losses=True
            )
        if added_losses:
            raise refusals.regularization_error(f"{len(added_losses)} losses added in the model's call")
        losses = loss_fn(jax.tree_util.tree_map(add_batch_axis, y_i), y_pred)  # A batch of one: any shape is its own.
        loss = mechanism.per_example_losses(ops.OPS, losses, weight[None])[0]  # weight: [] or per entry ([L])
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
        run = lambda key: per_example(diff_trainable, zeros, non_trainable, key, x, y, weights)  # noqa: E731
        with _refuse_writes_from_random_draws(model):
            (grads, tap_grads), (y_pred, new_non_trainable, losses, inputs) = run(step_key)
            if step_key is not None:
                # Two keys at once, traced only: a stored value that follows the step's secret key is batched.
                jax.eval_shape(jax.vmap(lambda key: run(key)[1][1], out_axes=None), jax.random.split(step_key, 2))
        by_position = dict(zip(differentiated, grads))
        all_grads = [by_position.get(i) for i in range(len(trainable_variables))]
        tap_rows = {key: (inputs[key], tap_grads[key]) for key in tapped}
        return all_grads, tap_rows, y_pred, new_non_trainable, losses

    return fn


@contextlib.contextmanager
def _refuse_writes_from_random_draws(model: keras.Model):
    """Turns vmap's refusal of a batched written non-trainable value (``out_axes=None``) into the refusal of state
    that leaves the step without noise, following its secret random draws (`model_checks` refused the data's)."""
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


def _clipped_sum_per_example(grads, tap_rows, clip_norm, tapped, num_rows: int) -> tuple[list, jax.Array]:
    """sum_i clip(g_i, C) per variable (`_per_example_fn`'s gradients, tapped layers' rules), unclipped norms [B]."""
    rules = registry.registered()
    ruled = {key: rules[type(layer)].norms_and_sums(layer, *tap_rows[key]) for key, (layer, *_) in tapped.items()}
    squares = [jnp.sum(jnp.reshape(g.astype(jnp.float32), (num_rows, -1)) ** 2, axis=1) for g in grads if g is not None]
    squares += [squared for squared, _ in ruled.values()]
    norms = mechanism.norms_from_squares(ops.OPS, sum(squares, jnp.zeros([num_rows], jnp.float32)))
    factors = mechanism.clip_factors(ops.OPS, norms, clip_norm)
    sums = [None if g is None else layer_rules.weighted_sum(factors, g) for g in grads]
    for key, (_, indices, _) in tapped.items():
        for index, total in zip(indices, ruled[key][1](factors)):
            sums[index] = total
    return sums, norms


def _private_train_step(self: keras.Model, state, data):
    trainable_variables, non_trainable_variables, optimizer_variables, metrics_variables = state
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    optimizer = private_model.dp_optimizer(self)
    optimizer.private_config = config = private_model.record(self).config
    loss_fn = refusals.per_example_loss_fn(self.loss, keras, lambda loss: loss.reduction in (None, "none"))
    _check_model(self)
    model_checks.check_model(self, x, (trainable_variables, non_trainable_variables))  # random-generator states too
    num_rows = jax.tree_util.tree_leaves(x)[0].shape[0]  # tree_leaves skips None
    # Per row ([B], [B, 1]) or per loss entry (a [B, L] padding mask): `mechanism.per_example_losses`.
    weights = jnp.ones([num_rows], jnp.float32) if sample_weight is None else jnp.asarray(sample_weight, jnp.float32)
    is_seed_state = _seed_states(self)
    clip_norm, _ = schedule_values = optimizer.schedule_values_at(optimizer_variables)  # read once
    adaptive = optimizer.adaptive_clipping is not None  # its count is summed with the sums over physical batches
    num_microbatches = optimizer.num_microbatches
    # Microbatch gradients mix examples, which the taps' per-example norms do not: no taps there.
    classes = (keras.layers.Embedding,) if config.method == "vectorized" else None
    tapped = {} if num_microbatches else taps.tappable(self, trainable_variables, non_trainable_variables, x, classes)
    per_example = _per_example_fn(self, loss_fn, trainable_variables, tapped, is_seed_state)

    # Once per step, for the random layers' states (every example of every physical batch draws the same).
    step_key = optimizer.secret_key(optimizer_variables) if any(is_seed_state) else None

    def physical_batch(batch):
        grads, tap_rows, y_pred, new_non_trainable, losses = per_example(non_trainable_variables, step_key, *batch)
        if num_microbatches:
            assignment = optimizer.microbatch_assignment(optimizer_variables, losses.shape[0])
            sums, norms = microbatches.clipped_sum(grads, losses, assignment, num_microbatches, clip_norm)
        else:
            with keras.StatelessScope(state_mapping=list(zip(self.trainable_variables, trainable_variables))):
                # The rules that read a variable (LoRA's adapters) read the step's value, not a traced constant.
                sums, norms = _clipped_sum_per_example(grads, tap_rows, clip_norm, tapped, losses.shape[0])
        if adaptive:
            rows = None if num_microbatches else jnp.any(jnp.reshape(batch[2] != 0, (norms.shape[0], -1)), 1)
            sums = [*sums, ops.centred_count(norms, clip_norm, rows)]
        return sums, (y_pred, new_non_trainable, losses)

    shapes = [v.shape for v in trainable_variables] + ([()] if adaptive else [])
    clipped_sums, (y_pred, new_non_trainable, losses), first = accumulation.accumulated(
        physical_batch, (x, y, weights), num_rows, optimizer.accumulation_steps, shapes
    )
    num_examples = jnp.sum(jnp.any(jnp.reshape(weights != 0, (num_rows, -1)), axis=1))  # rows with a weight
    advanced = _advanced_seed_states(self, trainable_variables, non_trainable_variables, x, is_seed_state)
    count = clipped_sums.pop() if adaptive else None
    applied = (optimizer_variables, clipped_sums, num_examples, num_rows, trainable_variables)
    trainable_variables, optimizer_variables = optimizer.stateless_apply_clipped_sum(
        *applied, schedule_values=schedule_values, centred_count=count
    )
    non_trainable_variables = [
        new if seed else first(value) for value, new, seed in zip(new_non_trainable, advanced, is_seed_state)
    ]
    if config.training_metrics:
        logs, metrics_variables = self._update_metrics_variables(
            metrics_variables, jnp.sum(losses) / max(num_rows, 1), x, y, y_pred, sample_weight
        )
    else:
        logs = {"dp_step": optimizer.step_at(optimizer_variables)}
    return logs, (trainable_variables, non_trainable_variables, optimizer_variables, metrics_variables)


class _CheckedTrainFunction:
    """TensorFlow's `_CheckedTrainFunction` on JAX: Keras's ``(state, iterator) -> (logs, state)`` after the host-side
    checks; a state other than the one it returned last starts a new run of steps (docs/privacy.md, 'Which entry points
    are covered, and how'). When a call raises, the state goes back into the variables without the key
    (`JaxDPOptimizerMixin.at_rest`): Keras's ``fit`` would put nothing back if the first step's trace raises."""

    def __init__(self, model: keras.Model, function: Callable):
        self._model = model
        self._function = function
        self._returned: tuple = ()  # The optimizer state returned last: the only one a run continues from.
        self._most_steps = 0  # The step counter is at most this.
        self.budget_stop: str | None = None  # What the budget's refusal suggests (`_private_make_train_function`).

    def __call__(self, state, iterator):
        optimizer = private_model.dp_optimizer(self._model)
        trainable, non_trainable, optimizer_variables, metrics = state
        new_run = len(optimizer_variables) != len(self._returned) or any(
            map(operator.is_not, optimizer_variables, self._returned)
        )
        try:
            refusal = None
            if new_run or self._most_steps >= optimizer.schedule.num_steps:
                refusal = optimizer.refusal_in(optimizer_variables, before_a_step=True, budget_stop=self.budget_stop)
            if new_run:
                self._most_steps = int(optimizer.step_at(optimizer_variables))
                state = (trainable, non_trainable, optimizer.new_run(optimizer_variables), metrics)
            if refusal is not None:
                raise refusal
            with _checked(self._model, check=False):  # `_private_make_train_function` checked the model
                logs, state = self._function(state, iterator)
        except BaseException:
            self._returned = ()
            _put_back(self._model, (*state[:2], optimizer.at_rest(state[2]), state[3]))
            raise
        self._returned = tuple(state[2])
        self._most_steps += max(1, int(self._model.steps_per_execution))
        return logs, state


def _put_back(model: keras.Model, state) -> None:
    """Assigns ``state``'s values, where a step has not taken them over (donated buffers), to ``model``'s variables."""
    groups = (model.trainable_variables, model.non_trainable_variables, model.optimizer.variables)
    for variables, values in zip((*groups, model.metrics_variables), state):
        for variable, value in zip(variables, values):
            if not value.is_deleted():
                variable.assign(value)


def _check_sampling(model: keras.Model, seen: tuple[str, Any] | None) -> None:
    """Refuses, given to ``fit``, Poisson batches unlike the schedule's (or with ``public_batch_size``), arrays without
    it and, under several processes, anything but Poisson batches; warns once per optimizer on other data. ``seen``:
    ``(caller, x)`` as `entry_points.DataSeen` recorded it, or None."""
    optimizer = getattr(model, "optimizer", None)
    if not isinstance(optimizer, optimizer_base.DPOptimizerBase):
        return  # The train step refuses it, naming what to use.
    caller, x = seen or ("model.train_function", None)
    distribution.check_data(x, caller, data.PoissonBatches)
    p = optimizer.schedule.sampling_probability
    if isinstance(x, data.PoissonBatches):
        batch_sizes.check_data_size(optimizer.num_examples, x.num_examples, type(optimizer).__name__)
        data.check_resume(x, optimizer)  # a seeded run resumed at another step than the optimizer's: refused
        batch_sizes.check_poisson_batches(x.sampling_probability, p, optimizer.public_batch_size, caller)
        optimizer.note_batch_cap(x.num_examples, x.max_batch_size)  # a cap that voids the target delta: refused
        return
    if caller == entry_points.FIT:  # train_on_batch takes one batch, which may be the user's own Poisson sample
        batch_sizes.check_not_arrays(x, p, optimizer.public_batch_size)
    problem = entry_points.UNSEEN_BATCHES if seen is None else batch_sizes.not_poisson_batches(caller, x)
    if optimizer.note_unverified_sampling(problem):
        warnings.warn(batch_sizes.not_poisson_message(problem, p), batch_sizes.SamplingWarning, stacklevel=4)


def _private_fit(self: keras.Model, *args, **kwargs):
    """``Model.fit``, whose refusal past the budget is one `BudgetExhaustedError` without Keras's traceback (the
    checks are the train function's, the same for ``keras.Model.fit(model, ...)``)."""
    callbacks = inspect.signature(keras.Model.fit).bind(self, *args, **kwargs).arguments.get("callbacks")
    # Checked before Keras's own first trace, which fails to add a regulariser's scalar to a per-example loss.
    with _checked(self), private_model.budget_refusal(self, callbacks):
        return keras.Model.fit(self, *args, **kwargs)


def _private_make_train_function(self: keras.Model, force: bool = False):
    """Keras's ``make_train_function`` after `_check_sampling`, wrapped in `_CheckedTrainFunction`, with a new
    train-step object each time: JAX caches traces by function object, and after ``compile`` with another DP optimizer
    the old trace, with its schedule, keys and refusals, would be replayed."""
    _check_model(self)
    seen = private_model.record(self).data_seen.take()
    within_fit = seen is not None and seen[0] == entry_points.FIT
    if within_fit and isinstance(self.optimizer, optimizer_base.DPOptimizerBase):
        self.optimizer.check_budget_left(None)  # spent before this fit: BudgetStop would not help
    _check_sampling(self, seen)
    if force or self.train_function is None:
        self.train_step = types.MethodType(_private_train_step, self)
    type(self).make_train_function(self, force)
    if not isinstance(self.train_function, _CheckedTrainFunction):
        self.train_function = _CheckedTrainFunction(self, self.train_function)
    # Past the budget within a fit (which began with steps left), BudgetStop would have ended it at the last step.
    stops = private_model.record(self).fit_stops_at_the_budget
    self.train_function.budget_stop = step_checks.BUDGET_STOP if within_fit and not stops else None


def _private_jax_state_sync(self: keras.Model):
    """Keras's ``jax_state_sync``, then `raise_refused_step` when steps ran since the last sync: a refusal surfaces in
    the call that made it, at the epoch's end at the latest."""
    # Whether steps ran since the last sync: Keras's JAX trainer keeps that in private attributes only.
    stepped = not getattr(self, "_jax_state_synced", True) and getattr(self, "_jax_state", None)
    type(self).jax_state_sync(self)
    optimizer = getattr(self, "optimizer", None)
    if stepped and isinstance(optimizer, optimizer_base.DPOptimizerBase):
        optimizer.raise_refused_step(getattr(self.train_function, "budget_stop", None))


def make_private(model: keras.Model, method: str = "auto", *, training_metrics: bool = False) -> keras.Model:
    """Gives ``model`` (returned, changed in place) a JAX train step that clips per example and applies through the
    DP optimizer. Compile it, before or after, with a `keras_dyndp.jax_backend` DP optimizer and a per-example loss
    (``reduction="none"``).

    Args:
        model: a Keras model (Sequential, functional or subclassed) without trainable batch normalisation.
        method: ``'auto'`` or ``'ghost'`` (the same: the variables a rule covers clipped from their taps, the
            rest by ``jax.vmap``) or ``'vectorized'`` (per-example gradients, Embedding taps).
        training_metrics: False logs only ``dp_step`` (public; validation metrics as usual). True logs the training
            batch's loss and metrics, WITHOUT noise, outside the DP guarantee (one outlier can move the logged epoch
            loss far; docs/privacy.md).

    Raises:
        ValueError: on another ``method``, a non-bool ``training_metrics`` or a non-``keras.Model``; when the first
            step is traced, on what docs/privacy.md's "Refused, and why" lists.
    """
    return private_model.make_private(model, method, training_metrics, _HOOKS)


def _install(model: keras.Model) -> None:
    """make_private's entry points and train function on ``model`` (its train step is installed)."""
    model.make_train_function = types.MethodType(_private_make_train_function, model)
    model.jax_state_sync = types.MethodType(_private_jax_state_sync, model)
    model.fit = types.MethodType(_private_fit, model)
    model.train_on_batch = types.MethodType(private_model.private_train_on_batch, model)
    model.train_function = None


_HOOKS = private_model.Hooks(
    backend="JAX",
    model_class=keras.Model,
    optimizer_class=optimizer_base.DPOptimizerBase,
    methods=METHODS,
    train_step=_private_train_step,
    unwrap_optimizer=_unwrap_optimizer,
    install=_install,
    data_hook="_symbolic_build",  # Keras 3's: what unbound entry points show of their data (docs/privacy.md).
)
