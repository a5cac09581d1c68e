"""The shared flags of the research trainers, their checks, and `config_from_flags`, the one reader of them.

Bad flag values end the script with one line on stderr and exit code 2, without a traceback (`keras_dyndp.cli`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from absl import flags

from keras_dyndp import schedules
from keras_dyndp.accounting import registry
from research import run_config

FLAGS = flags.FLAGS

METHODS = ("nonprivate",) + schedules.ALL_METHODS
STRATEGIES = ("default", "mirrored", "multi_worker")

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
flags.DEFINE_bool(
    "adaptive_clipping",
    False,
    "DP methods: clip adaptively (Andrew et al. 2021, keras_dyndp.AdaptiveClipping's defaults: C_t follows the median "
    "per-example gradient norm from a noised count, learning rate 0.2, count noise n / 20), starting at "
    "--initial_clip; the schedule's clip norms are replaced, its noise multipliers are the total cost: epsilon "
    "unchanged.",
)
flags.DEFINE_enum("optimizer", None, ["sgd", "adam", "adagrad", "rmsprop"], "Update rule. Default: the task's.")
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
    "(keras_dyndp.tf_backend.distribution).",
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


def _adaptive_conflict(options: dict[str, Any]) -> str | None:
    if options["adaptive_clipping"] and options["method"] == "nonprivate":
        return "--adaptive_clipping applies to the DP methods; --method=nonprivate clips nothing."
    return None


def _multi_worker_conflict(options: dict[str, Any]) -> str | None:
    # The trainer does not implement Keras's chief-and-temporary-directories pattern.
    if options["strategy"] == "multi_worker" and options["model_dir"] is not None:
        return (
            "--strategy=multi_worker takes no --model_dir: every worker would write the same checkpoints and "
            "run_config.json into it. Run without --model_dir (or use --strategy=mirrored on one machine)."
        )
    return None


# Each check with the flags it reads (those a command-line error names).
_OPTION_CHECKS = (
    (("method", "per_example", "accumulation_steps"), _accumulation_conflict),
    (("strategy", "model_dir"), _multi_worker_conflict),
    (("method", "adaptive_clipping"), _adaptive_conflict),
)


def option_conflict(options: dict[str, Any]) -> str | None:
    """Why the run options `options` (a dict of flag or `RunConfig` field values) cannot go together, or None: the
    message of the first of `_OPTION_CHECKS` that refuses them."""
    messages = (check(options) for _, check in _OPTION_CHECKS)
    return next((message for message in messages if message is not None), None)


def _validator(check: Callable[[dict[str, Any]], str | None]) -> Callable[[dict[str, Any]], bool]:
    def validate(values: dict[str, Any]) -> bool:
        message = check(values)
        if message is not None:
            raise flags.ValidationError(message)
        return True

    return validate


for _names, _check in _OPTION_CHECKS:
    flags.register_multi_flags_validator(_names, _validator(_check))


def config_from_flags() -> run_config.RunConfig:
    """The `RunConfig` the shared flags give: the one place that reads them (each field is the flag of its name).

    An --accountant neither given nor set becomes None, the method's own default, so that only an --accountant asked
    for is refused for the baselines.
    """
    values = {field.name: FLAGS[field.name].value for field in dataclasses.fields(run_config.RunConfig)}
    if FLAGS["accountant"].using_default_value and not FLAGS["accountant"].present:
        values["accountant"] = None
    return run_config.RunConfig(**values)
