"""The trainer every research task script shares: flags, optimizer, fit loop, checkpoints and privacy report.

A task script (``research/digits.py``, ``research/mnist.py``, ...) only says how to load its data, how to build its
model and which hyperparameters the paper uses (a `run_config.Task`); `run` hands the flags' `RunConfig`
(`run_flags.config_from_flags`) to `train(task, config)`, which reads no flag and can be called from Python:

1. calibrates the run's `keras_dyndp.schedules.DPSchedule` (`make_schedule`): p = batch_size / N, T = ceil(epochs N
   / batch_size), C_t and sigma_t of ``--method`` met under ``--accountant`` (the baselines zcdp / tcdp under their
   own);
2. trains with ``model.fit`` on Poisson-sampled batches (`batches`) with a `DynamicDPKeras*` optimizer,
   `PrivacyLogger` and `BudgetStop`, per-example clipping by `keras_dyndp.tf_backend.per_example.make_private`
   (``--per_example``);
3. with ``--model_dir``: checkpoints every epoch and resumes (`checkpoints`), TensorBoard logs under
   ``<model_dir>/logs`` and the privacy curve ``<model_dir>/privacy_curve.png`` (`results.write_privacy_curve`);
4. under a `tf.distribute` strategy (``--strategy``, `distribute`) builds model, optimizer and compile in its scope
   and pads the Poisson batches to a multiple of the replicas (the noise is still added once per global step,
   `keras_dyndp.tf_backend.distribution`); under multi_worker the workers agree on the sampling seed and only the chief
   appends to ``--results_csv``;
5. evaluates on the test set, prints the privacy report (GDP-CLT epsilon and a rigorous PLD or RDP epsilon of the
   steps actually taken) and, with ``--results_csv``, appends one row per run.

Only the noised updates are private: loss and accuracy of a training batch are computed without noise, so DP runs
compute none unless ``--training_metrics`` asks for them (then the report says they are outside the guarantee).
``--seed`` seeds the model's initialisation (TensorFlow's global seed) and, through seeds derived from it and the
step a run starts or resumes at (`batches.derived_seed`), the Poisson batches and the optimizer's ``noise_seed``:
the DP noise never follows the global seed, and a resumed run repeats neither the batches nor the noise.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable

import tensorflow as tf

import keras_dyndp
from keras_dyndp import cli
from keras_dyndp import schedules
from keras_dyndp import tf_backend as dp_optimizers
from keras_dyndp.accounting import registry
from keras_dyndp.tf_backend import keras_compat
from keras_dyndp.tf_backend import per_example
from keras_dyndp.tf_backend.keras_compat import keras
from research import batches
from research import checkpoints
from research import distribute
from research import results
from research import run_config
from research import run_flags

OPTIMIZERS = {
    "sgd": (keras.optimizers.SGD, dp_optimizers.DynamicDPKerasSGD),
    "adam": (keras.optimizers.Adam, dp_optimizers.DynamicDPKerasAdam),
    "adagrad": (keras.optimizers.Adagrad, dp_optimizers.DynamicDPKerasAdagrad),
    "rmsprop": (keras.optimizers.RMSprop, dp_optimizers.DynamicDPKerasRMSprop),
}


def make_schedule(config: run_config.RunConfig, num_train: int) -> tuple[schedules.DPSchedule | None, float, int]:
    """The run's schedule (None for nonprivate), sampling probability p and step count T."""
    try:
        p, num_steps = schedules.sampling_from_epochs(num_train, config.batch_size, epochs=config.epochs)
        if not config.private:
            return None, p, num_steps
        schedule = schedules.calibrate(
            config.method,
            target_epsilon=config.epsilon,
            target_delta=config.delta,
            sampling_probability=p,
            num_steps=num_steps,
            initial_clip=config.initial_clip,
            rho_mu=config.rho_mu,
            rho_c=config.rho_c,
            # A baseline's config.accountant is its own ('zcdp' / 'tcdp'), which calibrate does not take.
            accountant=registry.DEFAULT_ACCOUNTANT if config.method in schedules.BASELINES else config.accountant,
        )
    except ValueError as error:
        raise run_config.FlagError(f"cannot calibrate the schedule from the flags: {error}") from error
    return schedule, p, num_steps


def learning_rate(
    config: run_config.RunConfig, num_steps: int
) -> float | keras.optimizers.schedules.LearningRateSchedule:
    """The learning rate of the run: constant, or lr_t = lr_0 lr_decay^(-t/T) at steps t = 1..T (T = `num_steps`).

    It is the clip decay's family on the clip's index (`schedules`: step k = t - 1 clips to C_0 rho_c^(-t/T)), so
    with lr_decay = rho_c, vanilla with this learning rate takes the step of sensitivity decay wherever every
    gradient is clipped. Keras's `ExponentialDecay` evaluates lr(k) = r lr_0 lr_decay^(-k/T) at the optimizer's
    step counter k, hence r = lr_decay^(-1/T).
    """
    if config.lr_decay == 1.0:
        return config.learning_rate
    return keras.optimizers.schedules.ExponentialDecay(
        config.learning_rate * config.lr_decay ** (-1.0 / num_steps),
        decay_steps=num_steps,
        decay_rate=1.0 / config.lr_decay,
    )


def make_optimizer(
    config: run_config.RunConfig, schedule: schedules.DPSchedule | None, num_steps: int, noise_seed: int | None = None
) -> keras.optimizers.Optimizer:
    """The Keras optimizer of the run's `num_steps` steps: a `DynamicDPKeras*` following `schedule` (its noise
    seeded by `noise_seed`, None: OS entropy), or the plain one."""
    plain_cls, dp_cls = OPTIMIZERS[config.optimizer]
    rate = learning_rate(config, num_steps)
    if schedule is None:
        return plain_cls(learning_rate=rate)
    return dp_cls(
        schedule=schedule,
        expected_batch_size=config.batch_size,
        learning_rate=rate,
        noise_seed=noise_seed,
        accumulation_steps=config.accumulation_steps,
        rescale_to_unit_norm=config.rescale_to_unit_norm,
        # True: keras_dyndp.AdaptiveClipping's defaults, the paper's (median, learning rate 0.2, count noise n / 20).
        adaptive_clipping=config.adaptive_clipping or None,
    )


def make_loss_and_metric(task: run_config.Task, private: bool) -> tuple[keras.losses.Loss, keras.metrics.Metric]:
    """Loss on logits (per-example, reduction NONE, when private) and the accuracy metric."""
    # "none" is Keras 2's Reduction.NONE and Keras 3's reduction=None alike; the default reduces over the batch.
    reduction = {"reduction": "none"} if private else {}
    if task.binary:
        return (
            keras.losses.BinaryCrossentropy(from_logits=True, **reduction),
            keras.metrics.BinaryAccuracy(name="accuracy", threshold=0.0),
        )
    return (
        keras.losses.SparseCategoricalCrossentropy(from_logits=True, **reduction),
        keras.metrics.SparseCategoricalAccuracy(name="accuracy"),
    )


def compile_model(
    model: keras.Model, task: run_config.Task, optimizer: keras.optimizers.Optimizer, config: run_config.RunConfig
) -> keras.Model:
    """Compiles `model`; for DP runs it takes the fast per-example path (per_example 'fast') and, without
    training_metrics, computes no loss or metric on the training batches (evaluation keeps them)."""
    loss, metric = make_loss_and_metric(task, config.private)
    if config.private:
        method = "jacobian" if config.per_example == "jacobian" else "auto"
        model = per_example.make_private(model, method=method, training_metrics=config.training_metrics)
    # weighted_metrics: Poisson batches are padded with zero-weight rows, which plain `metrics` would count.
    model.compile(optimizer=optimizer, loss=loss, weighted_metrics=[metric])
    return model


class _StopAtStep(keras.callbacks.Callback):
    """Stops `fit` once the optimizer's step counter reaches `stop_step` (--max_steps, or T when nonprivate)."""

    def __init__(self, counter: tf.Variable, stop_step: int):
        super().__init__()
        self._counter = counter
        self._stop_step = stop_step

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if int(self._counter.numpy()) >= self._stop_step:
            self.model.stop_training = True


def train(task: run_config.Task, config: run_config.RunConfig) -> results.RunResult:
    """Runs one training job of `task` as `config` says and returns what it measured.

    Raises:
      run_config.FlagError: on config values that do not fit the data or the model directory (named by their flags).
      datasets.DataNotFoundError: when the task's data is absent.
    """
    start_time = time.time()
    conflict = run_flags.option_conflict(dataclasses.asdict(config))
    if conflict is not None:
        raise run_config.FlagError(conflict)
    # First: MultiWorkerMirroredStrategy must exist before anything initialises TensorFlow's devices.
    strategy = distribute.make_strategy(config.strategy)
    num_replicas = strategy.num_replicas_in_sync
    data = task.load_data()
    print(data.description)
    config = config.resolved(task, data.num_train)
    if config.sampling == "shuffle" and config.batch_size % num_replicas:
        raise run_config.FlagError(
            f"--sampling=shuffle under {num_replicas} replicas needs a --batch_size that is a multiple of "
            f"{num_replicas} (each batch is split evenly). Received: {config.batch_size}."
        )
    schedule, p, num_steps = make_schedule(config, data.num_train)
    stop_step = num_steps if config.max_steps is None else min(num_steps, config.max_steps)
    accumulation = config.accumulation_steps
    print(
        f"Strategy: {config.strategy}, {num_replicas} replica(s) in sync"
        + (f"; each batch clipped in {accumulation} physical batches" if accumulation > 1 else "")
    )

    if config.seed is not None:
        keras.utils.set_random_seed(config.seed)
    with strategy.scope():  # Variables (model, optimizer, metrics) are created mirrored.
        model = task.build_model(data)
        # The noise seed must be fixed before the optimizer exists, hence before the checkpoint restores its counter.
        resume_step = checkpoints.checkpoint_step(config.model_dir)
        noise_seed = batches.derived_seed(config.seed, resume_step, batches.NOISE_STREAM)
        optimizer = make_optimizer(config, schedule, num_steps, noise_seed)
        model = compile_model(model, task, optimizer, config)
        optimizer.build(model.trainable_variables)
    counter = optimizer.iterations  # = optimizer.dp_step for the DP optimizers; once per global step.

    fit_callbacks: list[keras.callbacks.Callback] = []
    if schedule is not None:
        log_dir = None if config.model_dir is None else os.path.join(config.model_dir, "logs")
        fit_callbacks += [
            keras_dyndp.PrivacyLogger(config.report_accountant, delta=config.delta, log_dir=log_dir),
            keras_dyndp.BudgetStop(),
        ]
    if stop_step < num_steps or schedule is None:
        fit_callbacks.append(_StopAtStep(counter, stop_step))
    if config.model_dir is not None:
        checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
        manager = checkpoints.restore_or_start(config.model_dir, task.name, config, schedule, checkpoint)
        fit_callbacks += [
            checkpoints.SaveCheckpoint(manager, counter),
            keras.callbacks.TensorBoard(os.path.join(config.model_dir, "logs"), profile_batch=0),
        ]
    start_step = int(counter.numpy())
    if start_step:
        print(f"Resumed from {config.model_dir} at step {start_step} of {num_steps}.")
    print(
        f"{task.name}: method={config.method} N={data.num_train} batch={config.batch_size} ({config.sampling}) "
        f"steps={num_steps} lr={config.learning_rate}"
        + (f" (decaying to lr/{config.lr_decay:g})" if config.lr_decay != 1.0 else "")
        + f" optimizer={config.optimizer}"
        + (" rescaled to unit norm" if config.private and config.rescale_to_unit_norm else "")
        + (" clipped adaptively from C_0" if config.private and config.adaptive_clipping else "")
        + (
            f" epsilon={config.epsilon:g} delta={config.delta:.3g} C_0={config.initial_clip:g} "
            f"rho_mu={config.rho_mu:g} rho_c={config.rho_c:g}"
            if config.private
            else ""
        )
    )

    if start_step >= stop_step:
        print(f"Nothing to train: {start_step} of {stop_step} steps already taken.")
    lengths = batches.epoch_lengths(config, num_steps, data.num_train)
    print(
        f"{num_steps} steps = {len(lengths)} Keras epochs of "
        + "-".join(str(length) for length in sorted(set(lengths)))
        + " steps"
        + (f"; stopping after step {stop_step} (--max_steps)" if stop_step < num_steps else "")
    )
    if config.verbose:
        fit_callbacks.append(keras_compat.RunProgressBar(len(lengths)))
    for initial_epoch, epochs, segment_steps in batches.epoch_segments(start_step, stop_step, lengths):
        step = int(counter.numpy())
        if step >= stop_step:  # A callback ended training early (the budget, --max_steps).
            break
        with strategy.scope():  # keras_dyndp.tf_backend.data sees the strategy the batches are split across.
            segment_batches = batches.train_batches(
                config,
                data,
                p,
                batches.derived_seed(config.seed, step, batches.BATCH_STREAM),
                segment_steps,
                start_step=step,
            )
        # shuffle=False: the batches are already sampled (Poisson or shuffled) by batches.train_batches.
        model.fit(
            segment_batches,
            epochs=epochs,
            initial_epoch=initial_epoch,
            callbacks=fit_callbacks,
            shuffle=False,
            verbose=config.verbose,
        )
    steps = int(counter.numpy())

    _, accuracy = model.evaluate(data.x_test, data.y_test, batch_size=config.eval_batch_size, verbose=0)
    summary = keras_dyndp.run_summary(
        schedule,
        config.delta,
        steps,
        method=config.method,
        privacy_unit=task.privacy_unit,
        accountant=config.report_accountant,
        sampling=config.sampling,
        training_metrics=config.training_metrics,
        seed=config.seed,
        calibrated_under=config.accountant,
        target_epsilon=config.epsilon,
        notes=task.notes,
    )
    wall_time = time.time() - start_time
    print(f"Test accuracy: {accuracy:.4f} ({len(data.y_test)} examples); wall time {wall_time:.1f} s")
    print(summary)
    if config.model_dir is not None and schedule is not None and steps:
        print(f"Privacy curve: {results.write_privacy_curve(config, schedule, lengths, steps, task.name)}")
    result = results.RunResult(
        task=task.name,
        config=config,
        steps=steps,
        total_steps=num_steps,
        test_accuracy=float(accuracy),
        epsilon_gdp_clt=summary.epsilon_gdp_clt,
        epsilon_rigorous=summary.epsilon_rigorous,
        wall_time_s=round(wall_time, 2),
        schedule=schedule,
    )
    if config.results_csv and distribute.is_chief(strategy):  # One row per run, not one per worker.
        results.append_results_csv(config.results_csv, result)
    return result


def run(task_factory: Callable[[], run_config.Task]) -> None:
    """Entry point of a task script, ``if __name__ == '__main__': trainer.run(make_task)``: trains with the flags'
    `run_config.RunConfig`; a bad flag value or missing data is one error line and exit status 2 (`keras_dyndp.cli`)."""
    cli.run(lambda: train(task_factory(), run_flags.config_from_flags()))
