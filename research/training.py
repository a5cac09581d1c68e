"""The training library every example script shares: flags, optimizer, fit loop, checkpoints and privacy report.

A task script (``research/digits.py``, ``research/mnist.py``, ...) only says how to load its data, how to build its
model and which hyperparameters the paper uses (a `Task`); `run` does the rest:

1. turns the shared flags below into a `RunConfig` (`config_from_flags`, the only reader of them; a flag left unset
   takes the task's default) and hands it to `train(task, config)`, which reads no flag and can be called from
   Python with a `RunConfig` built by hand;
2. calibrates the `keras_dyndp.schedules.DPSchedule` of the run: p = batch_size / N, T = ceil(epochs N /
   batch_size), C_t and sigma_t from ``--method``, ``--epsilon``, ``--delta`` (default 1 / (10 N)), ``--rho_mu``,
   ``--rho_c`` and ``--initial_clip``, met under ``--accountant`` (the rigorous PLD by default; ``gdp_clt`` is
   the paper's approximation); the baselines ``--method=zcdp`` / ``tcdp`` (constant clip, noise decaying by
   ``--rho_mu``) under their own;
3. trains with ``model.fit`` on Poisson-sampled batches (``--sampling=poisson``, what the accountants assume)
   with a `DynamicDPKeras*` optimizer, `PrivacyLogger` and `BudgetStop`, per-example clipping through the fast
   path (`keras_dyndp.tf_backend.per_example.make_private`) or the optimizer's generic jacobian path
   (``--per_example``);
4. with ``--model_dir``: checkpoints model and optimizer (the optimizer's ``dp_step`` is the schedule's step
   counter) every epoch, writes TensorBoard logs under ``<model_dir>/logs``, after training the run's privacy
   curve ``<model_dir>/privacy_curve.png`` (`write_privacy_curve`), and resumes from the latest checkpoint when
   rerun. It refuses to resume a run whose saved schedule differs from the one the flags give:
   the restored step counter would index another schedule and the accounting would be wrong;
5. with ``--strategy=mirrored`` (the local GPUs, or the logical CPUs) or ``--strategy=multi_worker`` (the
   machines of TF_CONFIG) builds model, optimizer and compile under the `tf.distribute` strategy, pads the Poisson
   batches to a multiple of the replica count and lets ``model.fit`` split each batch across the replicas; the
   noise is still added once per global step (`keras_dyndp.tf_backend.replicas`). ``--accumulation_steps=k`` clips
   each batch in k physical batches inside the step (`keras_dyndp.tf_backend.per_example.accumulation`). Under
   multi_worker the workers agree on the sampling seed (`keras_dyndp.tf_backend.replicas.agreed_random_bits`: the
   same Poisson batches),
   there is no ``--model_dir``, and only the chief appends to ``--results_csv``;
6. evaluates on the test set, prints the privacy report (GDP-CLT epsilon and a rigorous PLD or RDP epsilon of the
   steps actually taken) and, with ``--results_csv``, appends one row per run.

Bad flag values and missing data end the script with one line on stderr and exit code 2, without a traceback.

Privacy unit: one training example (add-or-remove-one adjacency); for ``research.federated_mnist`` one client.
Only the noised updates are private: loss and accuracy of a training batch are computed without noise, so DP runs
compute none unless ``--training_metrics`` asks for them (then the report says they are outside the guarantee).
The sampling and noise randomness must stay secret for the guarantee to hold: ``--seed`` makes experiments
reproducible and is meant for research; leave it unset (OS entropy) for a model you release. It seeds the model's
initialisation (TensorFlow's global seed) and, through seeds derived from (--seed, the step a run starts or resumes
at), the Poisson batches and the optimizer's ``noise_seed``; the DP noise never follows the global seed. A resumed
run thus repeats neither the batches nor the noise of the steps before it.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import itertools
import json
import math
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf
from absl import app
from absl import flags
from absl import logging

import keras_dyndp
from keras_dyndp import batch_sizes
from keras_dyndp import privacy_report
from keras_dyndp import schedules
from keras_dyndp import tf_backend as dp_optimizers
from keras_dyndp.accounting import cdp
from keras_dyndp.accounting import registry
from keras_dyndp.tf_backend import keras_compat
from keras_dyndp.tf_backend import per_example
from keras_dyndp.tf_backend.keras_compat import keras
from research import datasets

FLAGS = flags.FLAGS

METHODS = ("nonprivate",) + schedules.ALL_METHODS
STRATEGIES = ("default", "mirrored", "multi_worker")
OPTIMIZERS = {
    "sgd": (keras.optimizers.SGD, dp_optimizers.DynamicDPKerasSGD),
    "adam": (keras.optimizers.Adam, dp_optimizers.DynamicDPKerasAdam),
    "adagrad": (keras.optimizers.Adagrad, dp_optimizers.DynamicDPKerasAdagrad),
    "rmsprop": (keras.optimizers.RMSprop, dp_optimizers.DynamicDPKerasRMSprop),
}

flags.DEFINE_enum(
    "method",
    "dynamic",
    METHODS,
    "nonprivate: plain training; vanilla: constant C and sigma (Abadi et al. with the GDP-CLT); "
    "growing_mu, sensitivity_decay, dynamic: the paper's schedules (Alg. 1, Eq. 15-17, Alg. 2); "
    "zcdp, tcdp: the paper's noise-decay baselines (Table 1), constant clip, each calibrated by its "
    "own accountant (keras_dyndp.accounting.cdp).",
)
flags.DEFINE_float("epsilon", None, "Target epsilon of the whole run, > 0. Default: the task's.")
flags.DEFINE_float("delta", None, "Target delta in (0, 1). Default: 1 / (10 N), N = number of training examples.")
flags.DEFINE_float(
    "rho_mu",
    None,
    "Growth of the per-step privacy mu_T / mu_0, >= 1 (growing_mu, dynamic; for zcdp and tcdp the "
    "noise decay z_0 / z_T). The paper states it as 1/rho_mu in {0.1, ..., 0.8}: --rho_mu=1.25 is "
    "1/rho_mu = 0.8. Default: the task's.",
)
flags.DEFINE_float(
    "rho_c",
    None,
    "Decay of the clipping norm C_0 / C_T, >= 1 (sensitivity_decay, dynamic). The paper's 1/rho_c "
    "= 0.3 is --rho_c=3.3333. Default: the task's.",
)
flags.DEFINE_float("initial_clip", None, "Initial clipping norm C_0 > 0. Default: the task's.")
flags.DEFINE_float("learning_rate", None, "Learning rate > 0. Default: the task's.")
flags.DEFINE_float(
    "lr_decay",
    1.0,
    "Decay of the learning rate lr_0 / lr_T, >= 1: lr_t = lr_0 lr_decay^(-t/T) at steps t = 1..T, the family and "
    "index of the clip decay rho_c (1: constant). A learning-rate schedule is post-processing: privacy unchanged.",
)
flags.DEFINE_bool(
    "rescale_to_unit_norm",
    False,
    "DP methods: divide the noisy clipped sum by C_t as well (per-example gradients rescaled to norm <= 1, De et "
    "al. 2022), so that a clip decay no longer shrinks the step. Post-processing: privacy unchanged.",
)
flags.DEFINE_enum("optimizer", None, list(OPTIMIZERS), "Update rule. Default: the task's.")
flags.DEFINE_float(
    "epochs", None, "Run length in epochs, > 0: T = ceil(epochs N / batch_size) steps. Default: the task's."
)
flags.DEFINE_integer(
    "max_steps",
    None,
    "Stop after this many steps in total (resumed runs count their earlier steps). The schedule "
    "still spans --epochs; the report accounts only the steps taken.",
)
flags.DEFINE_integer(
    "batch_size",
    None,
    "Expected batch size, >= 1: the Poisson sampling probability is batch_size / N. Default: the task's.",
)
flags.DEFINE_enum(
    "sampling",
    None,
    ["poisson", "shuffle"],
    "Batching. poisson (default for DP): what the accountants assume. shuffle (default for "
    "nonprivate): shuffle-and-slice, for which the reported epsilon is only an approximation.",
)
flags.DEFINE_enum(
    "accountant",
    registry.DEFAULT_ACCOUNTANT,
    list(registry.ACCOUNTANT_NAMES),
    "Accountant the budget is calibrated under: pld (default; rigorous and tight), rdp (rigorous), "
    "or gdp_clt (the paper's approximation, which can understate epsilon; pass it to reproduce the "
    "paper). Not for --method=zcdp / tcdp, which use their own.",
)
flags.DEFINE_enum(
    "report_accountant",
    registry.DEFAULT_ACCOUNTANT,
    list(registry.RIGOROUS_ACCOUNTANT_NAMES),
    "Rigorous accountant reported beside the GDP-CLT: pld (default, the tightest; a full run "
    "calibrated under it reports the target) or rdp (looser).",
)
flags.DEFINE_enum(
    "per_example",
    "fast",
    ["fast", "jacobian"],
    "Per-example gradients: fast (keras_dyndp.tf_backend.per_example.make_private) or jacobian (the "
    "optimizer's generic tape.jacobian path, O(B^2)).",
)
flags.DEFINE_bool(
    "training_metrics",
    False,
    "Compute and show loss and accuracy of the training batches (progress bar, History, TensorBoard). "
    "They are computed on the private batches without noise, outside the DP guarantee; off, DP "
    "runs compute none. --method=nonprivate always shows them (it has no guarantee).",
)
flags.DEFINE_integer(
    "seed",
    None,
    "Seed for reproducible experiments: fixes the model's initialisation and, derived afresh for "
    "each start or resume step, the Poisson batches and the DP noise (so a resumed run replays "
    "neither). Unset: OS entropy. A known seed reveals the noise and the batches: never publish it "
    "with a model.",
)
flags.DEFINE_string(
    "model_dir",
    None,
    "Directory for checkpoints (model + optimizer, resumed when rerun), TensorBoard logs and, after a DP run, the "
    "privacy curve privacy_curve.png (epsilon at each epoch end, clip and noise per step).",
)
flags.DEFINE_string("results_csv", None, "CSV file to which one row per run is appended.")
flags.DEFINE_integer("eval_batch_size", 500, "Batch size of the test-set evaluation, >= 1.")
flags.DEFINE_integer("verbose", 1, "Keras progress output: 0 silent, 1 progress bar, 2 one line per epoch.")
flags.DEFINE_string("data_dir", None, "TensorFlow Datasets data directory (default ~/tensorflow_datasets).")
flags.DEFINE_enum(
    "strategy",
    "default",
    list(STRATEGIES),
    "tf.distribute strategy of the run. default: one device. mirrored: MirroredStrategy over all local GPUs (none: "
    "over the logical CPUs, usually one replica). multi_worker: MultiWorkerMirroredStrategy over the machines "
    "that the TF_CONFIG environment variable names; set TF_CONFIG on EACH worker (same cluster, its own task "
    "index) and start the same command on each; needs --seed (every worker must draw the same Poisson batches) "
    "and takes no --model_dir. The noise is added once per global step whatever the number of replicas "
    "(keras_dyndp.tf_backend.replicas).",
)
flags.DEFINE_integer(
    "pad_to_multiple",
    32,
    "m >= 0: pad each Poisson batch to the next multiple of m rows (a few batch shapes, each traced once) instead "
    "of every batch to the cap that overflows with probability 1e-15 (385 rows for an expected 250, 54% more to "
    "compute); 0 pads to the cap. The rows then follow the batch's size, which the DP step never divides by "
    "(keras_dyndp.poisson_batches).",
    lower_bound=0,
)
flags.DEFINE_integer(
    "accumulation_steps",
    1,
    "k >= 1: clip each batch (the logical batch, which p and T count) in k physical batches inside one train "
    "step and add the noise once: batches k times larger than memory allows. Needs --per_example=fast and a DP "
    "--method.",
)

_POSITIVE = (
    "epsilon",
    "initial_clip",
    "learning_rate",
    "epochs",
    "max_steps",
    "batch_size",
    "eval_batch_size",
    "accumulation_steps",
)
for _name in _POSITIVE:
    flags.register_validator(_name, lambda value: value is None or value > 0, message=f"--{_name} must be > 0.")
for _name in ("rho_mu", "rho_c"):
    flags.register_validator(
        _name,
        lambda value: value is None or (math.isfinite(value) and value >= 1),
        message=f"--{_name} must be >= 1 (the paper's 1/{_name} is in (0, 1]).",
    )
flags.register_validator(
    "lr_decay",
    lambda value: math.isfinite(value) and value >= 1,
    message="--lr_decay must be >= 1 (lr_0 / lr_T; 1 keeps the learning rate constant).",
)
flags.register_validator("delta", lambda value: value is None or 0 < value < 1, message="--delta must be in (0, 1).")
flags.register_validator("verbose", lambda value: value in (0, 1, 2), message="--verbose must be 0, 1 or 2.")


def _accumulation_conflict(options: dict[str, Any]) -> str | None:
    if options["accumulation_steps"] <= 1:
        return None
    if options["per_example"] != "fast":
        return (
            "--accumulation_steps > 1 needs --per_example=fast: make_private's train step clips the batch in physical "
            "batches; the jacobian path clips inside the optimizer, on the whole batch."
        )
    if options["method"] == "nonprivate":
        return "--accumulation_steps applies to the DP methods; --method=nonprivate has no clipping to split."
    return None


def _multi_worker_conflict(options: dict[str, Any]) -> str | None:
    if options["strategy"] != "multi_worker":
        return None
    if options["model_dir"] is not None:
        return (
            "--strategy=multi_worker takes no --model_dir: every worker would write the same checkpoints and "
            "run_config.json into it. Run without --model_dir (or use --strategy=mirrored on one machine)."
        )
    return None


# Each check with the flags it reads (those a command-line error names).
_OPTION_CHECKS = (
    (("method", "per_example", "accumulation_steps"), _accumulation_conflict),
    (("strategy", "model_dir"), _multi_worker_conflict),
)


def option_conflict(options: dict[str, Any]) -> str | None:
    """Why the run options `options` (a dict of flag or `RunConfig` field values) cannot go together, or None.

    * --accumulation_steps > 1 needs the fast path, whose train step splits the batch (the jacobian path clips
      in the optimizer, which sees one batch), and a DP method (a plain optimizer has nothing to accumulate).
    * --strategy=multi_worker takes no --model_dir: every worker would write the same checkpoints, TensorBoard
      logs and run_config.json into it; the examples do not implement Keras's chief-and-temporary-directories
      pattern.
    """
    for _, check in _OPTION_CHECKS:
        message = check(options)
        if message is not None:
            return message
    return None


def _validator(check: Callable[[dict[str, Any]], str | None]) -> Callable[[dict[str, Any]], bool]:
    def validate(values: dict[str, Any]) -> bool:
        message = check(values)
        if message is not None:
            raise flags.ValidationError(message)
        return True

    return validate


for _names, _check in _OPTION_CHECKS:
    flags.register_multi_flags_validator(_names, _validator(_check))


class FlagError(Exception):
    """A flag value that only proves invalid once the data is known (e.g. --batch_size > N)."""


@dataclasses.dataclass(frozen=True)
class Task:
    """What a script contributes: data, model and the paper's hyperparameters (the flags' defaults).

    Attributes:
      name: task name, written to the results CSV.
      load_data: returns the `datasets.TaskData`; raises `datasets.DataNotFoundError` when the data is absent.
      build_model: builds the (uncompiled) Keras model from the data; it outputs logits.
      epsilon, learning_rate, initial_clip, batch_size, epochs, rho_mu, rho_c, optimizer: defaults of the flags.
      binary: one logit and a binary cross-entropy instead of softmax cross-entropy.
      privacy_unit: what one protected record is, for the report.
      notes: extra lines for the privacy report (e.g. what the guarantee does not cover).
    """

    name: str
    load_data: Callable[[], datasets.TaskData]
    build_model: Callable[[datasets.TaskData], keras.Model]
    epsilon: float
    learning_rate: float
    initial_clip: float
    batch_size: int
    epochs: float
    rho_mu: float = 1.25
    rho_c: float = 1 / 0.3
    optimizer: str = "sgd"
    binary: bool = False
    privacy_unit: str = "training example"
    notes: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """Everything one run of `train` needs besides its `Task`: hyperparameters and run options.

    Each field is the flag of the same name (`config_from_flags`), with the flag's default. A field left None takes
    the default that depends on the task or its data, filled in by `resolved` once the data is loaded: the task's
    hyperparameters (epsilon, rho_mu, rho_c, initial_clip, learning_rate, optimizer, epochs, batch_size), delta
    1 / (10 N), sampling 'shuffle' for nonprivate and 'poisson' otherwise, and accountant the registry's default
    for the paper's methods and the baseline's own for zcdp / tcdp. `max_steps`, `seed`, `model_dir` and
    `results_csv` stay None when unset: no step limit, OS entropy, no checkpoints, no CSV row. `lr_decay`
    (lr_0 / lr_T) and `rescale_to_unit_norm` post-process the noisy sum (`make_optimizer`). `strategy` ('default',
    'mirrored' or 'multi_worker', see `make_strategy`) and `accumulation_steps` (k physical batches per logical
    batch) change how a step is computed, not what it releases; `option_conflict` says which combinations `train`
    refuses.
    """

    method: str = "dynamic"
    epsilon: float | None = None
    delta: float | None = None
    rho_mu: float | None = None
    rho_c: float | None = None
    initial_clip: float | None = None
    learning_rate: float | None = None
    lr_decay: float = 1.0
    rescale_to_unit_norm: bool = False
    optimizer: str | None = None
    epochs: float | None = None
    max_steps: int | None = None
    batch_size: int | None = None
    sampling: str | None = None
    accountant: str | None = None
    report_accountant: str = registry.DEFAULT_ACCOUNTANT
    per_example: str = "fast"
    training_metrics: bool = False
    seed: int | None = None
    model_dir: str | None = None
    results_csv: str | None = None
    eval_batch_size: int = 500
    verbose: int = 1
    strategy: str = "default"
    accumulation_steps: int = 1
    pad_to_multiple: int = 32

    @property
    def private(self) -> bool:
        return self.method != "nonprivate"

    def resolved(self, task: Task, num_train: int) -> RunConfig:
        """This config with the defaults of `task` and of its N = `num_train` training examples filled in.

        The epsilon of a nonprivate run is inf (it has no guarantee), whatever the config says.

        Raises:
          FlagError: if batch_size exceeds N, or an accountant other than its own is asked of a baseline.
        """
        batch_size = task.batch_size if self.batch_size is None else self.batch_size
        if batch_size > num_train:
            raise FlagError(f"--batch_size must be <= N = {num_train} (training examples). Received: {batch_size}.")
        accountant = registry.DEFAULT_ACCOUNTANT if self.accountant is None else self.accountant
        if self.method in schedules.BASELINES:
            if self.accountant is not None and self.accountant != self.method:
                raise FlagError(
                    f"--method={self.method} is calibrated by its own accountant; --accountant applies to "
                    f"{', '.join(schedules.METHODS)}. Received: --accountant={self.accountant}."
                )
            accountant = self.method

        def default(value: Any, fallback: Any) -> Any:
            return fallback if value is None else value

        return dataclasses.replace(
            self,
            epsilon=default(self.epsilon, task.epsilon) if self.private else math.inf,
            delta=default(self.delta, 1.0 / (10 * num_train)),
            rho_mu=default(self.rho_mu, task.rho_mu),
            rho_c=default(self.rho_c, task.rho_c),
            initial_clip=default(self.initial_clip, task.initial_clip),
            learning_rate=default(self.learning_rate, task.learning_rate),
            optimizer=default(self.optimizer, task.optimizer),
            epochs=default(self.epochs, task.epochs),
            batch_size=batch_size,
            sampling=default(self.sampling, "poisson" if self.private else "shuffle"),
            accountant=accountant,
        )


# Each RunConfig field's default: what a results-CSV row of an earlier version, lacking the field's column, ran with.
RUN_CONFIG_DEFAULTS = {field.name: field.default for field in dataclasses.fields(RunConfig)}


def config_from_flags() -> RunConfig:
    """The `RunConfig` the shared flags give: the one place that reads them (each field is the flag of its name).

    An --accountant neither given nor set becomes None, the method's own default, so that only an --accountant asked
    for is refused for the baselines.
    """
    values = {field.name: FLAGS[field.name].value for field in dataclasses.fields(RunConfig)}
    if FLAGS["accountant"].using_default_value and not FLAGS["accountant"].present:
        values["accountant"] = None
    return RunConfig(**values)


def make_schedule(config: RunConfig, num_train: int) -> tuple[schedules.DPSchedule | None, float, int]:
    """The run's schedule (None for nonprivate), sampling probability p and step count T."""
    try:
        p, num_steps = schedules.sampling_from_epochs(num_train, config.batch_size, epochs=config.epochs)
        if not config.private:
            return None, p, num_steps
        # A baseline's config.accountant is its own ('zcdp' / 'tcdp'), which calibrate does not take.
        accountant = registry.DEFAULT_ACCOUNTANT if config.method in schedules.BASELINES else config.accountant
        schedule = schedules.calibrate(
            config.method,
            target_epsilon=config.epsilon,
            target_delta=config.delta,
            sampling_probability=p,
            num_steps=num_steps,
            initial_clip=config.initial_clip,
            rho_mu=config.rho_mu,
            rho_c=config.rho_c,
            accountant=accountant,
        )
    except ValueError as error:
        raise FlagError(f"cannot calibrate the schedule from the flags: {error}") from error
    return schedule, p, num_steps


def learning_rate(config: RunConfig, num_steps: int) -> float | keras.optimizers.schedules.LearningRateSchedule:
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
    config: RunConfig, schedule: schedules.DPSchedule | None, num_steps: int, noise_seed: int | None = None
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
    )


def make_loss_and_metric(task: Task, private: bool) -> tuple[keras.losses.Loss, keras.metrics.Metric]:
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
    model: keras.Model, task: Task, optimizer: keras.optimizers.Optimizer, config: RunConfig
) -> keras.Model:
    """Compiles `model`; for DP runs it takes the fast per-example path (per_example 'fast') and, without
    training_metrics, computes no loss or metric on the training batches (evaluation keeps them)."""
    private = config.private
    loss, metric = make_loss_and_metric(task, private)
    if private:
        method = "jacobian" if config.per_example == "jacobian" else "auto"
        model = per_example.make_private(model, method=method, training_metrics=config.training_metrics)
    # weighted_metrics: Poisson batches are padded with zero-weight rows, which plain `metrics` would count.
    model.compile(optimizer=optimizer, loss=loss, weighted_metrics=[metric])
    return model


def epoch_lengths(config: RunConfig, num_steps: int, num_train: int) -> list[int]:
    """Steps of each Keras epoch: the run's T steps spread over round(--epochs) epochs, longer epochs first.

    T = round(epochs * N / B) is rarely a multiple of the epoch count, so the epochs take q or q + 1 steps; the
    progress bar then counts the epochs the flag asked for ("Epoch 30/30", not a 31st epoch of the remainder).
    A shuffled epoch is one pass of at most N // B batches, so shuffled runs take more epochs where T needs them.
    """
    num_epochs = max(1, round(config.epochs))
    if config.sampling != "poisson":
        num_epochs = max(num_epochs, math.ceil(num_steps / (num_train // config.batch_size)))
    num_epochs = min(num_epochs, max(num_steps, 1))
    shorter, longer_count = divmod(num_steps, num_epochs)
    return [shorter + 1] * longer_count + [shorter] * (num_epochs - longer_count)


def train_batches(
    config: RunConfig, data: datasets.TaskData, p: float, seed: int | None, num_steps: int, num_replicas: int = 1
) -> tf.data.Dataset:
    """`num_steps` (at most one epoch's) batches (x, y, sample_weight), Poisson-sampled or shuffled.

    Poisson batches are padded to the next multiple of `config.pad_to_multiple` rows (0: every batch to the cap),
    at most `keras_dyndp.batch_sizes.default_max_batch_size` rows; the multiple and the cap are rounded up to
    multiples of `num_replicas`, so that each global batch splits evenly across the replicas (Keras 3 needs it of
    the first batch of `fit`, keras-team/keras#19246); a larger cap only makes truncation rarer.
    """
    if config.sampling == "poisson":
        max_batch_size = batch_sizes.default_max_batch_size(data.num_train, p)
        max_batch_size = num_replicas * math.ceil(max_batch_size / num_replicas)
        return keras_dyndp.poisson_batches(
            data.x_train,
            data.y_train,
            sampling_probability=p,
            max_batch_size=max_batch_size,
            seed=seed,
            steps_per_epoch=num_steps,
            pad_to_multiple=math.lcm(config.pad_to_multiple, num_replicas) if config.pad_to_multiple else None,
        )
    return keras_dyndp.shuffled_batches(data.x_train, data.y_train, config.batch_size, seed=seed).take(num_steps)


def epoch_segments(start_step: int, stop_step: int, lengths: list[int]) -> list[tuple[int, int, int]]:
    """The `model.fit` calls that take steps [start_step, stop_step) in Keras epochs of the given lengths.

    Each is ``(initial_epoch, epochs, steps)``: Keras epochs ``initial_epoch .. epochs - 1`` of ``steps`` steps
    each. Consecutive epochs of one length share a call; a run that starts or stops inside an epoch gets that epoch
    as a call of its own with only the steps it takes, so the progress bar shows the true count ("7/7", not
    "11/11" for a last epoch cut short) and epoch numbers continue across calls.
    """
    segments: list[tuple[int, int, int]] = []
    epoch_start = 0
    for epoch, length in enumerate(lengths):
        steps = min(stop_step, epoch_start + length) - max(start_step, epoch_start)
        epoch_start += length
        if steps <= 0:
            continue
        if segments and segments[-1][1] == epoch and segments[-1][2] == steps:
            segments[-1] = (segments[-1][0], epoch + 1, steps)
        else:
            segments.append((epoch, epoch + 1, steps))
    return segments


_BATCH_STREAM, _NOISE_STREAM = 0, 1


def _derived_seed(seed: int | None, start_step: int, stream: int) -> int | None:
    """A fresh seed for each (seed, resume point, stream): a resumed run must not replay the batches or the noise.

    `stream` (`_BATCH_STREAM` or `_NOISE_STREAM`) keeps the batches' and the noise's seeds apart. None stays None
    (OS entropy).
    """
    if seed is None:
        return None
    return int(np.random.SeedSequence([seed, start_step, stream]).generate_state(1)[0])


def make_strategy(name: str) -> tf.distribute.Strategy:
    """The `tf.distribute` strategy of `--strategy=name` ('default', 'mirrored' or 'multi_worker').

    mirrored: `MirroredStrategy` over all local GPUs or, on a machine without one, over its logical CPU devices
    (one replica unless the CPU was split with `tf.config.set_logical_device_configuration`). multi_worker:
    `MultiWorkerMirroredStrategy` from the TF_CONFIG environment variable; it must be created before TensorFlow
    initialises its devices, so `train` makes it before loading any data.
    """
    if name == "default":
        return tf.distribute.get_strategy()
    if name not in STRATEGIES:
        raise FlagError(f"--strategy must be one of {', '.join(STRATEGIES)}. Received: {name!r}.")
    return _distributed_strategy(name)


@functools.cache
def _distributed_strategy(name: str) -> tf.distribute.Strategy:
    # One object per process and name, reused by every `train` (a sweep): TensorFlow sets up MultiWorkerMirrored's
    # collectives once, and two MirroredStrategy objects over the same devices number their collective ops alike.
    if name == "multi_worker":
        return tf.distribute.MultiWorkerMirroredStrategy()
    if tf.config.list_physical_devices("GPU"):
        return tf.distribute.MirroredStrategy()
    return tf.distribute.MirroredStrategy([device.name for device in tf.config.list_logical_devices("CPU")])


def is_chief(strategy: tf.distribute.Strategy) -> bool:
    """Whether this process writes the run's files: always, except on a non-chief worker of a multi-worker job."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not resolver.cluster_spec().as_dict():
        return True
    if resolver.task_type == "chief":
        return True
    return resolver.task_type == "worker" and resolver.task_id == 0 and "chief" not in resolver.cluster_spec().jobs


def _checkpoint_step(model_dir: str | None) -> int:
    """The step of the latest checkpoint under `model_dir` (its number, see `_SaveCheckpoint`); 0 if none."""
    latest = None if model_dir is None else tf.train.latest_checkpoint(os.path.join(model_dir, "checkpoints"))
    return 0 if latest is None else int(latest.rsplit("-", 1)[1])


class _StopAtStep(keras.callbacks.Callback):
    """Stops `fit` once the optimizer's step counter reaches `stop_step` (--max_steps, or T when nonprivate)."""

    def __init__(self, counter: tf.Variable, stop_step: int):
        super().__init__()
        self._counter = counter
        self._stop_step = stop_step

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if int(self._counter.numpy()) >= self._stop_step:
            self.model.stop_training = True


class _SaveCheckpoint(keras.callbacks.Callback):
    """Saves model + optimizer at every epoch end and at the end of training, numbered by the step counter."""

    def __init__(self, manager: tf.train.CheckpointManager, counter: tf.Variable):
        super().__init__()
        self._manager = manager
        self._counter = counter
        self._saved_step: int | None = None

    def _save(self) -> None:
        step = int(self._counter.numpy())
        if step != self._saved_step:
            self._manager.save(checkpoint_number=step)
            self._saved_step = step

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self._save()

    def on_train_end(self, logs: dict | None = None) -> None:
        self._save()


def _run_config_path(model_dir: str) -> str:
    return os.path.join(model_dir, "run_config.json")


def restore_or_start(
    model_dir: str,
    task_name: str,
    config: RunConfig,
    schedule: schedules.DPSchedule | None,
    checkpoint: tf.train.Checkpoint,
) -> tf.train.CheckpointManager:
    """Restores the latest checkpoint of `model_dir` after checking it belongs to the same schedule.

    A new `model_dir` gets `run_config.json` (the config and the schedule) for later checks.

    Raises:
      FlagError: if `model_dir` holds a run of another task, method or schedule.
    """
    os.makedirs(model_dir, exist_ok=True)
    manager = tf.train.CheckpointManager(checkpoint, os.path.join(model_dir, "checkpoints"), max_to_keep=2)
    saved_path = _run_config_path(model_dir)
    current = {
        "task": task_name,
        "method": config.method,
        "schedule": None if schedule is None else schedule.get_config(),
    }
    if os.path.exists(saved_path):
        with open(saved_path) as handle:
            saved = json.load(handle)
        if (saved.get("task"), saved.get("method")) != (task_name, config.method):
            raise FlagError(
                f"--model_dir={model_dir} holds a {saved.get('task')} run with --method={saved.get('method')}, "
                f"not {task_name} with --method={config.method}; use another --model_dir."
            )
        if schedule is not None and schedules.DPSchedule.from_config(saved["schedule"]) != schedule:
            raise FlagError(
                f"--model_dir={model_dir} holds a run with a different DP schedule "
                f"({schedules.DPSchedule.from_config(saved['schedule'])!r}) than these flags give ({schedule!r}); "
                "resuming would continue its step counter on another schedule and void the accounting. Rerun "
                "with the original flags or use another --model_dir."
            )
    else:
        with open(saved_path, "w") as handle:
            json.dump({**current, "flags": dataclasses.asdict(config)}, handle, indent=1)
    if manager.latest_checkpoint:
        checkpoint.restore(manager.latest_checkpoint).assert_existing_objects_matched()
    return manager


# The config fields written to the results CSV, in its column order. Files of earlier versions lack the last two;
# `append_results_csv` adds them (with their defaults) before appending.
_CSV_CONFIG_COLUMNS = (
    "method",
    "epsilon",
    "delta",
    "rho_mu",
    "rho_c",
    "initial_clip",
    "learning_rate",
    "batch_size",
    "epochs",
    "sampling",
    "seed",
    "lr_decay",
    "rescale_to_unit_norm",
)


@dataclasses.dataclass(frozen=True)
class RunResult:
    """What `train` measured, with the task's name, the resolved `RunConfig` and the `DPSchedule` (None: nonprivate)
    of the run."""

    task: str
    config: RunConfig
    steps: int
    total_steps: int
    test_accuracy: float
    epsilon_gdp_clt: float
    epsilon_rigorous: float
    wall_time_s: float
    schedule: schedules.DPSchedule | None = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def rigorous_accountant(self) -> str:
        """The accountant of `epsilon_rigorous` ('none' for a nonprivate run)."""
        return self.config.report_accountant if self.config.private else "none"

    def csv_row(self) -> dict[str, Any]:
        """The flat row of the results CSV: task, the config's `_CSV_CONFIG_COLUMNS`, then what was measured."""
        return {
            "task": self.task,
            **{name: getattr(self.config, name) for name in _CSV_CONFIG_COLUMNS},
            "steps": self.steps,
            "total_steps": self.total_steps,
            "test_accuracy": self.test_accuracy,
            "epsilon_gdp_clt": self.epsilon_gdp_clt,
            "epsilon_rigorous": self.epsilon_rigorous,
            "rigorous_accountant": self.rigorous_accountant,
            "wall_time_s": self.wall_time_s,
        }


def describe_privacy(
    config: RunConfig, schedule: schedules.DPSchedule | None, steps: int, p: float, task: Task
) -> tuple[str, float, float]:
    """The privacy report text of a run and the GDP-CLT and rigorous epsilons of its first `steps` steps."""
    if schedule is None:
        return "Privacy: none (--method=nonprivate).", math.inf, math.inf
    rigorous = config.report_accountant
    eps_clt = schedule.epsilon(config.delta, accountant="gdp_clt", steps=steps)
    eps_rigorous = schedule.epsilon(config.delta, accountant=rigorous, steps=steps)
    taken = min(steps, schedule.num_steps)
    last = max(taken - 1, 0)
    lines = [
        f"Privacy report ({config.method}, per {task.privacy_unit}, add-or-remove-one adjacency):",
        f"  sampling: {config.sampling}, p = {p:.6g}; steps taken {steps} of the schedule's {schedule.num_steps}",
        f"  clip C_t: {schedule.clip_norms[0]:.4g} -> {schedule.clip_norms[last]:.4g}; noise std on the "
        f"clipped sum sigma_t: {schedule.noise_stddevs[0]:.4g} -> {schedule.noise_stddevs[last]:.4g}",
        f"  epsilon at delta = {config.delta:.3g}:",
        f"    GDP-CLT (the paper's accountant; an approximation that can understate): {eps_clt:.4f}",
        f"    {rigorous.upper()} (rigorous upper bound): {eps_rigorous:.4f}",
    ]
    if config.method in schedules.BASELINES:
        eps_own = (
            cdp.baseline_epsilon(
                config.method, schedule.sampling_probability, schedule.noise_multipliers[:taken], config.delta
            )
            if taken
            else 0.0
        )
        lines.append(f"    {config.method} (the baseline's own accountant): {eps_own:.4f}")
        if config.method == "tcdp":
            lines.append(
                "      (its claim for fixed-size batches drawn without replacement, replace-one neighbours; "
                "not a guarantee of this Poisson-sampled run)"
            )
    lines.append(f"  budget calibrated under {config.accountant}: target epsilon {config.epsilon:g}")
    if config.training_metrics:
        lines.append(
            "  NOTE: --training_metrics: the training loss and accuracy shown were computed on the private "
            "batches without noise; they are OUTSIDE the DP guarantee (one example can move them visibly). "
            "Do not publish them."
        )
    else:
        lines.append("  training batches: no loss or metric computed (only the noised updates leave them).")
    if config.sampling == "shuffle":
        lines.append("  NOTE: shuffled batches; these epsilons assume Poisson sampling and are approximate.")
    if config.seed is not None:
        lines.append(f"  NOTE: --seed={config.seed} fixes the sampling and noise; do not release this model.")
    lines.extend(f"  NOTE: {note}" for note in task.notes)
    return "\n".join(lines), eps_clt, eps_rigorous


def write_privacy_curve(
    config: RunConfig, schedule: schedules.DPSchedule, lengths: list[int], steps: int, task_name: str
) -> str:
    """Writes ``<model_dir>/privacy_curve.png`` and returns its path: the epsilon of the run's first k steps under
    the reported accountant at each epoch end up to the `steps` taken (a point per epoch, not per step, keeps the
    accountant fast), above the clip norm and noise std of those steps (`privacy_report.plot_run_privacy`)."""
    epoch_ends = [end for end in itertools.accumulate(lengths) if end < steps] + [steps]
    return privacy_report.plot_run_privacy(
        os.path.join(config.model_dir, "privacy_curve.png"),
        schedule,
        config.delta,
        epoch_ends,
        accountant=config.report_accountant,
        title=f"{task_name}, {config.method}: epsilon after the first k of {steps} steps",
    )


def append_results_csv(path: str, result: RunResult) -> None:
    """Appends `result.csv_row()` to the CSV at `path`, writing the header to a new file.

    A file of an earlier version, whose header lacks some config columns, is first rewritten with them, filled with
    the `RunConfig` defaults those runs had (constant learning rate, no rescaling).

    Raises:
      FlagError: if the file's header has columns this version does not write (another program's CSV).
    """
    row = result.csv_row()
    if os.path.dirname(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
    if os.path.exists(path) and os.path.getsize(path) > 0:
        with open(path, newline="") as handle:
            reader = csv.DictReader(handle)
            old_rows, header = list(reader), list(reader.fieldnames or [])
        if set(header) - set(row):
            raise FlagError(
                f"--results_csv={path} has columns this program does not write ({sorted(set(header) - set(row))}); "
                "use another file."
            )
        if header != list(row):
            with open(path, "w", newline="") as handle:
                writer = csv.DictWriter(handle, fieldnames=list(row))
                writer.writeheader()
                writer.writerows(
                    {name: old.get(name, RUN_CONFIG_DEFAULTS.get(name)) for name in row} for old in old_rows
                )
    append_csv_row(path, row)


def read_csv_rows(path: str) -> list[dict[str, str]]:
    """The rows of the CSV file at `path` as dicts (empty when it does not exist)."""
    if not os.path.exists(path):
        return []
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def append_csv_row(path: str, row: dict[str, Any]) -> None:
    """Appends `row` to the CSV file at `path`, writing its keys as the header of a new or empty file."""
    new = not os.path.exists(path) or os.path.getsize(path) == 0
    with open(path, "a", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(row))
        if new:
            writer.writeheader()
        writer.writerow(row)


def train(task: Task, config: RunConfig) -> RunResult:
    """Runs one training job of `task` as `config` says and returns what it measured.

    Raises:
      FlagError: on config values that do not fit the data or the model directory (named by their flags).
      datasets.DataNotFoundError: when the task's data is absent.
    """
    start_time = time.time()
    conflict = option_conflict(dataclasses.asdict(config))
    if conflict is not None:
        raise FlagError(conflict)
    # First: MultiWorkerMirroredStrategy must exist before anything initialises TensorFlow's devices.
    strategy = make_strategy(config.strategy)
    num_replicas = strategy.num_replicas_in_sync
    chief = is_chief(strategy)
    data = task.load_data()
    print(data.description)
    config = config.resolved(task, data.num_train)
    if config.sampling == "shuffle" and config.batch_size % num_replicas:
        raise FlagError(
            f"--sampling=shuffle under {num_replicas} replicas needs a --batch_size that is a multiple of "
            f"{num_replicas} (each batch is split evenly). Received: {config.batch_size}."
        )
    schedule, p, num_steps = make_schedule(config, data.num_train)
    stop_step = num_steps if config.max_steps is None else min(num_steps, config.max_steps)
    print(
        f"Strategy: {config.strategy}, {num_replicas} replica(s) in sync"
        + (
            f"; each batch clipped in {config.accumulation_steps} physical batches"
            if config.accumulation_steps > 1
            else ""
        )
    )

    if config.seed is not None:
        keras.utils.set_random_seed(config.seed)
    with strategy.scope():  # Variables (model, optimizer, metrics) are created mirrored.
        model = task.build_model(data)
        # The noise seed must be fixed before the optimizer exists, hence before the checkpoint restores its counter.
        optimizer = make_optimizer(
            config, schedule, num_steps, _derived_seed(config.seed, _checkpoint_step(config.model_dir), _NOISE_STREAM)
        )
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
        manager = restore_or_start(config.model_dir, task.name, config, schedule, checkpoint)
        fit_callbacks += [
            _SaveCheckpoint(manager, counter),
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
        + (
            f" epsilon={config.epsilon:g} delta={config.delta:.3g} C_0={config.initial_clip:g} "
            f"rho_mu={config.rho_mu:g} rho_c={config.rho_c:g}"
            if config.private
            else ""
        )
    )

    if start_step >= stop_step:
        print(f"Nothing to train: {start_step} of {stop_step} steps already taken.")
    lengths = epoch_lengths(config, num_steps, data.num_train)
    print(
        f"{num_steps} steps = {len(lengths)} Keras epochs of "
        + "-".join(str(length) for length in sorted(set(lengths)))
        + " steps"
        + (f"; stopping after step {stop_step} (--max_steps)" if stop_step < num_steps else "")
    )
    if config.verbose:
        fit_callbacks.append(keras_compat.RunProgressBar(len(lengths)))
    for initial_epoch, epochs, segment_steps in epoch_segments(start_step, stop_step, lengths):
        step = int(counter.numpy())
        if step >= stop_step:  # A callback ended training early (the budget, --max_steps).
            break
        with strategy.scope():  # keras_dyndp.tf_backend.data sees the strategy the batches are split across.
            batches = train_batches(
                config,
                data,
                p,
                _derived_seed(config.seed, step, _BATCH_STREAM),
                segment_steps,
                num_replicas=num_replicas,
            )
        # shuffle=False: the batches are already sampled (Poisson or shuffled) by train_batches.
        model.fit(
            batches,
            epochs=epochs,
            initial_epoch=initial_epoch,
            callbacks=fit_callbacks,
            shuffle=False,
            verbose=config.verbose,
        )
    steps = int(counter.numpy())

    _, accuracy = model.evaluate(data.x_test, data.y_test, batch_size=config.eval_batch_size, verbose=0)
    report, eps_clt, eps_rigorous = describe_privacy(config, schedule, steps, p, task)
    wall_time = time.time() - start_time
    print(f"Test accuracy: {accuracy:.4f} ({len(data.y_test)} examples); wall time {wall_time:.1f} s")
    print(report)
    if config.model_dir is not None and schedule is not None and steps:
        print(f"Privacy curve: {write_privacy_curve(config, schedule, lengths, steps, task.name)}")
    result = RunResult(
        task=task.name,
        config=config,
        steps=steps,
        total_steps=num_steps,
        test_accuracy=float(accuracy),
        epsilon_gdp_clt=eps_clt,
        epsilon_rigorous=eps_rigorous,
        wall_time_s=round(wall_time, 2),
        schedule=schedule,
    )
    if config.results_csv and chief:  # One row per run, not one per worker.
        append_results_csv(config.results_csv, result)
    return result


def _program_name(argv: list[str]) -> str:
    return os.path.basename(argv[0]) if argv else "example"


def parse_flags(argv: list[str]) -> list[str]:
    """absl flag parsing that reports a bad value in one line and exits with code 2 (absl's own exits 1).

    ``--help`` (and ``--helpshort``, ``--helpfull``, ``--helpxml``) print the usage and exit 0: absl exits 1 after
    them, which a shell or CI step would read as a failure.
    """
    try:
        return FLAGS(argv)
    except flags.Error as error:
        print(f"{_program_name(argv)}: error: {error}", file=sys.stderr)
        sys.exit(2)
    except SystemExit as help_exit:  # Only absl's help flags exit while parsing, with status 1.
        sys.exit(0 if help_exit.code == 1 else help_exit.code)


def main_for(task_factory: Callable[[], Task]) -> Callable[[list[str]], None]:
    """The absl `main` of a task script: trains, and turns expected errors into one line and exit code 2."""

    def main(argv: list[str]) -> None:
        if len(argv) > 1:
            print(f"{_program_name(argv)}: error: unexpected arguments {argv[1:]}", file=sys.stderr)
            sys.exit(2)
        logging.set_verbosity(logging.WARNING)
        try:
            train(task_factory(), config_from_flags())
        except (FlagError, datasets.DataNotFoundError) as error:
            print(f"{_program_name(argv)}: error: {error}", file=sys.stderr)
            sys.exit(2)

    return main


def run(task_factory: Callable[[], Task]) -> None:
    """Entry point of a task script: ``if __name__ == '__main__': training.run(make_task)``."""
    app.run(main_for(task_factory), flags_parser=parse_flags)
