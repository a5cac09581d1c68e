"""A research run's settings: the `Task` a script contributes (data, model, the paper's hyperparameters) and the
`RunConfig` of one run (every shared flag, each field the flag of its name), resolved against the task and its data.

Privacy unit: one training example (add-or-remove-one adjacency); for ``research.federated_mnist`` one client.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from keras_dyndp import cli
from keras_dyndp import datasets
from keras_dyndp import schedules
from keras_dyndp.accounting import registry
from keras_dyndp.tf_backend.keras_compat import keras


class FlagError(cli.UsageError):
    """A flag value that only proves invalid once the data is known (e.g. --batch_size > N): one error line, exit 2."""


@dataclasses.dataclass(frozen=True)
class Task:
    """What a script contributes: data, model and the paper's hyperparameters (the flags' defaults).

    Attributes:
      name: task name, written to the results CSV.
      load_data: returns the `datasets.TaskData`; raises `datasets.DataNotFoundError` when the data is absent.
      build_model: builds the (uncompiled) Keras model from the data; it outputs logits.
      epsilon, learning_rate, initial_clip, batch_size, epochs, rho_mu, rho_c, optimizer: defaults of the flags
        (rho_mu and rho_c: the authors' 1/rho_mu = 0.8 and 1/rho_c = 0.3 unless given).
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
    rho_mu: float = 1 / 0.8
    rho_c: float = 1 / 0.3
    optimizer: str = "sgd"
    binary: bool = False
    privacy_unit: str = "training example"
    notes: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """Everything one run of `train` needs besides its `Task`: hyperparameters and run options.

    Each field is the flag of the same name (`config_from_flags`, where the help says what it does), with the flag's
    default. A field left None takes the default of the task or its data, filled in by `resolved` once the data is
    loaded; `max_steps`, `seed`, `model_dir` and `results_csv` stay None when unset: no step limit, OS entropy, no
    checkpoints, no CSV row. `option_conflict` says which combinations `train` refuses.
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
    adaptive_clipping: bool = False
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
        """This config with the defaults of `task` (its hyperparameters) and of its N = `num_train` training examples
        filled in: delta 1 / (10 N), sampling 'shuffle' for nonprivate and 'poisson' otherwise, accountant the
        registry's default, or for zcdp / tcdp the baseline's own.

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

        from_task = ("rho_mu", "rho_c", "initial_clip", "learning_rate", "optimizer", "epochs")
        return dataclasses.replace(
            self,
            epsilon=default(self.epsilon, task.epsilon) if self.private else math.inf,
            delta=default(self.delta, 1.0 / (10 * num_train)),
            batch_size=batch_size,
            sampling=default(self.sampling, "poisson" if self.private else "shuffle"),
            accountant=accountant,
            **{name: default(getattr(self, name), getattr(task, name)) for name in from_task},
        )


# Each RunConfig field's default: what a results-CSV row of an earlier version, lacking the field's column, ran with.
RUN_CONFIG_DEFAULTS = {field.name: field.default for field in dataclasses.fields(RunConfig)}
