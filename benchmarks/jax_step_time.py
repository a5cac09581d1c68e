"""Per-step time of keras_dyndp's DP step against non-private SGD on Keras 3's JAX backend, interleaved in one run.

Run through ``python benchmarks/step_time.py --backend=jax ...`` (or directly; KERAS_BACKEND is set to jax here).
Each path trains its own copy of the same model with its train step compiled as ``model.fit`` compiles it
(``jax.jit(model.train_step, donate_argnums=0)``), called on the model's state with one fixed batch; the timing blocks
on the returned state (``jax.block_until_ready``), so asynchronous dispatch is not mistaken for speed. Paths:

* ``nonprivate``: ``keras.optimizers.SGD``, mean loss.
* ``dyndp_fast``: ``keras_dyndp.make_private(model)`` with ``DynamicDPKerasSGD`` (each example alone under
  ``jax.vmap``, ghost rules for Dense, convolutions and Embedding, per-example gradients for the rest; in-graph noise).
* ``dyndp_adaptive``: ``dyndp_fast`` with adaptive clipping (``adaptive_clipping=True``; issue 57's goal: within
  1.05x of ``dyndp_fast``); only when named in ``--paths``.
* ``noise_floor``: the limit issue 56 measures the DP step against: the ``nonprivate`` step plus one draw of as
  many standard normals as the model has parameters, by the generator the DP step draws its noise with
  (`keras_dyndp.jax_backend.ops.standard_normals`: threefry under a secret key, folded with the step counter, so
  each step's draw is fresh), added to the updated weights (times 1e-6: the draw cannot be compiled away); only when
  named in ``--paths``.
* ``jax_privacy``: jax_privacy's Keras API, ``jax_privacy.keras_api.make_private(model, DPKerasConfig(...))`` with
  ``keras.optimizers.SGD`` (constant clipping norm 1 and noise multiplier 1, vmapped per-example gradients); in
  ``--paths`` by default when jax_privacy is installed (``pip install jax-privacy``; not a dependency).

Warm-up steps (compilation) are excluded. Each repetition runs every path for ``--steps`` steps, in the same order;
the table reports the median over repetitions of the mean step time and of the ratio to ``nonprivate`` within one
repetition. Models: cnn, lstm, text, wrn (WideResNet-16-4, CIFAR-10 shapes), transformer and vit
(benchmarks/models.py), as benchmarks/step_time.py.
``--dtype_policy=mixed_bfloat16`` computes in bfloat16 (norms, clipping, noise and sums stay float32). The table's
header gives the device's peak memory (``memory_stats``; GPUs report it, CPUs do not): the largest of the paths run,
so run one path per process (``--paths=nonprivate``, ``--paths=dyndp_fast``) to compare them. Each row also gives
XLA's account of its compiled step (kernels, floating-point operations, bytes accessed, temporary memory;
`_compiled_cost`) and its ratio to the non-private step's: counts beside the times.

Usage:
    python benchmarks/step_time.py --backend=jax --models cnn,lstm,text --batch_size 256 --steps 20 --repeats 5
"""

from __future__ import annotations

import os

os.environ["KERAS_BACKEND"] = "jax"

import importlib.metadata  # noqa: E402
import importlib.util  # noqa: E402
import platform  # noqa: E402
import re  # noqa: E402
import secrets  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

import interleaved  # noqa: E402  (benchmarks/interleaved.py)
import jax  # noqa: E402
import keras  # noqa: E402
import models  # noqa: E402  (benchmarks/models.py)
import numpy as np  # noqa: E402
import records  # noqa: E402  (benchmarks/records.py)
from absl import app  # noqa: E402
from absl import flags  # noqa: E402

from keras_dyndp import schedules  # noqa: E402
from keras_dyndp.core.batch_sizes import SamplingWarning  # noqa: E402
from keras_dyndp.jax_backend import DynamicDPKerasSGD  # noqa: E402
from keras_dyndp.jax_backend import JaxDPOptimizerMixin  # noqa: E402
from keras_dyndp.jax_backend import make_private  # noqa: E402
from keras_dyndp.jax_backend import ops  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_integer("batch_size", 256, "Examples per step.")
flags.DEFINE_integer("steps", 20, "Timed steps per repetition.")
flags.DEFINE_integer("warmup_steps", 3, "Untimed steps per path before the first repetition.")
flags.DEFINE_integer("repeats", 5, "Interleaved repetitions; the median is reported.")
flags.DEFINE_list("models", ["cnn", "lstm", "text"], f"Models among {', '.join(models.NAMES)}.")
flags.DEFINE_string("out_md", None, "Where to write the markdown table.")
flags.DEFINE_string(
    "record", None, "Where to write the run's record (benchmarks/records.py), e.g. benchmarks/results/x.json."
)
flags.DEFINE_enum("dtype_policy", "float32", ["float32", "mixed_bfloat16"], "Keras's global dtype policy.")

PATHS = ("nonprivate", "dyndp_fast", "dyndp_adaptive", "noise_floor", "jax_privacy")
flags.DEFINE_list(
    "paths",
    ["nonprivate", "dyndp_fast", *(["jax_privacy"] if importlib.util.find_spec("jax_privacy") else [])],
    f"Paths among {PATHS}; nonprivate is always run (the ratios' denominator).",
)
LEARNING_RATE = 0.05


def build(model_name: str, path: str, batch_size: int) -> keras.Model:
    keras.utils.set_random_seed(0)
    model = models.build(keras, model_name)
    if path in ("nonprivate", "noise_floor"):
        model.compile(
            optimizer=keras.optimizers.SGD(LEARNING_RATE),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        return model
    if path == "jax_privacy":
        from jax_privacy import keras_api  # pylint: disable=import-outside-toplevel  (optional)

        config = keras_api.DPKerasConfig(
            epsilon=50.0,  # only checked against the noise multiplier given: the benchmark trains far fewer steps
            delta=1e-5,
            clipping_norm=1.0,
            batch_size=batch_size,
            gradient_accumulation_steps=1,
            train_steps=2_000,
            train_size=100 * batch_size,  # its fit() counts train_size // batch_size steps per epoch
            noise_multiplier=1.0,
            rescale_to_unit_norm=False,
        )
        model = keras_api.make_private(model, config)
        model.compile(
            optimizer=keras.optimizers.SGD(LEARNING_RATE),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        return model
    num_steps = 100_000
    schedule = schedules.DPSchedule(np.ones(num_steps), np.ones(num_steps), batch_size / 60000)
    make_private(model)
    model.compile(
        optimizer=DynamicDPKerasSGD(
            schedule=schedule,
            expected_batch_size=batch_size,
            learning_rate=LEARNING_RATE,
            adaptive_clipping=path == "dyndp_adaptive",
        ),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none"),
    )
    return model


class _Stepper:
    """One path: its model's train step, compiled as Keras compiles it for ``fit`` (``jax.jit(train_step,
    donate_argnums=0)``), and its state, stepped on one batch; ``cost`` is XLA's account of that program."""

    def __init__(self, model: keras.Model, x: np.ndarray, y: np.ndarray, noise_floor: bool = False):
        # Builds the model, the optimizer and the path's train step. One fixed batch (not fit's arrays, which a DP
        # optimizer refuses since they are not Poisson batches): its SamplingWarning says so, and is expected here.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SamplingWarning)
            model.train_on_batch(x, y)
        state = [
            [v.value for v in variables]
            for variables in (
                model.trainable_variables,
                model.non_trainable_variables,
                model.optimizer.variables,
                model.metrics_variables,
            )
        ]
        if isinstance(model.optimizer, JaxDPOptimizerMixin):  # a run's state holds the secret key its step reads
            state[2] = model.optimizer.new_run(state[2])
        self._state = tuple(state)
        self._data = jax.tree_util.tree_map(jax.numpy.asarray, (x, y))
        step = _with_noise_draw(model.train_step) if noise_floor else model.train_step
        self._function = jax.jit(step, donate_argnums=0).lower(self._state, self._data).compile()
        self.cost = _compiled_cost(self._function)

    def run(self, steps: int) -> float:
        """Seconds per step over ``steps`` steps."""
        start = time.perf_counter()
        for _ in range(steps):
            _, self._state = self._function(self._state, self._data)
        jax.block_until_ready(self._state)
        return (time.perf_counter() - start) / steps


def _with_noise_draw(train_step):
    """``train_step`` followed by the DP step's draw of one standard normal per parameter (`noise_floor`), under a
    secret key folded with the optimizer's step counter (its first variable, Keras's ``iterations``)."""
    secret = jax.random.key(secrets.randbits(32))

    def step(state, data):
        logs, (trainable, *rest) = train_step(state, data)
        key = jax.random.fold_in(secret, state[2][0])
        noise = ops.OPS.normals(key, trainable)
        return logs, ([value + 1e-6 * z for value, z in zip(trainable, noise)], *rest)

    return step


_NOT_KERNELS = ("parameter", "constant", "get-tuple-element", "tuple", "bitcast")


def _entry_kernels(hlo: str) -> int:
    """The operations of a compiled module's entry computation that run as kernels of their own (fusions, copies,
    convolutions, ...; not parameters, constants, tuples or bitcasts): on a GPU each is a launch, which dominates a
    small model's step."""
    entry = hlo[hlo.index("\nENTRY") :]
    entry = entry[: entry.index("\n}")]
    opcodes = re.findall(r"^\s*(?:ROOT )?\S+ = .*? ([\w-]+)\(", entry, flags=re.MULTILINE)  # type, opcode(
    return sum(opcode not in _NOT_KERNELS for opcode in opcodes)


def _compiled_cost(compiled: jax.stages.Compiled) -> dict:
    """XLA's own account of a compiled step: the kernels it launches (`_entry_kernels`), its floating-point
    operations and bytes accessed (``cost_analysis``; a loop's body is counted once) and its temporary buffers
    (``memory_analysis``: the working memory beyond the state and batch, a device-independent view of the peak), as
    the compiler of the device it runs on makes them."""
    cost = compiled.cost_analysis()
    cost = (cost[0] if isinstance(cost, list) else cost) or {}
    memory = compiled.memory_analysis()
    return {
        "kernels": _entry_kernels(compiled.as_text()),
        "gflop": cost.get("flops", float("nan")) / 1e9,
        "gbytes": cost.get("bytes accessed", float("nan")) / 1e9,
        "temp_mib": float("nan") if memory is None else memory.temp_size_in_bytes / 2**20,
    }


def measure(model_name: str) -> list[dict]:
    x, y = models.make_data(model_name, FLAGS.batch_size)
    paths = ["nonprivate", *(path for path in FLAGS.paths if path != "nonprivate")]
    steppers = {
        path: _Stepper(build(model_name, path, FLAGS.batch_size), x, y, noise_floor=path == "noise_floor")
        for path in paths
    }
    runs = {path: stepper.run for path, stepper in steppers.items()}
    times = interleaved.step_table(runs, FLAGS.steps, FLAGS.repeats, FLAGS.warmup_steps, model_name)
    return [
        {
            "model": model_name,
            "path": path,
            "ms_per_step": times[path][0],
            "ratio": times[path][1],
            **{key: (value, value / steppers["nonprivate"].cost[key]) for key, value in steppers[path].cost.items()},
        }
        for path in paths
    ]


def peak_memory() -> str:
    """The device's peak bytes in use so far (``memory_stats``; the largest of the paths run in this process)."""
    stats = jax.devices()[0].memory_stats() or {}
    peak = stats.get("peak_bytes_in_use")
    return "not reported by this device" if peak is None else f"{peak / 2**20:,.0f} MiB"


def device_description() -> str:
    device = jax.devices()[0]
    kind = getattr(device, "device_kind", device.platform)
    cores = os.cpu_count()
    return f"{kind} ({device.platform}; {cores} CPU cores, {platform.processor() or platform.machine()})"


def markdown(rows: list[dict]) -> str:
    lines = [
        f"Keras {keras.__version__} on JAX {jax.__version__}, dp-accounting "
        f"{importlib.metadata.version('dp-accounting')}; {device_description()}; batch {FLAGS.batch_size}, "
        f"{FLAGS.steps} steps x {FLAGS.repeats} interleaved repetitions, medians; dtype policy {FLAGS.dtype_policy}; "
        f"peak device memory {peak_memory()} (paths {', '.join(FLAGS.paths)}).",
        "",
        "| model | path | ms / step | x non-private | XLA kernels (x) | XLA GFLOP (x) | XLA GB accessed (x) "
        "| XLA temp MiB (x) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['model']} | {r['path']} | {r['ms_per_step']:.2f} | {r['ratio']:.2f} | "
        + f"{r['kernels'][0]:,} ({r['kernels'][1]:.2f}x) | "
        + " | ".join(f"{r[key][0]:,.2f} ({r[key][1]:.2f}x)" for key in ("gflop", "gbytes", "temp_mib"))
        + " |"
        for r in rows
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> None:
    del argv  # Unused.
    unknown_paths = sorted(set(FLAGS.paths) - set(PATHS))
    if unknown_paths:
        raise app.UsageError(f"`--paths` must be among {PATHS}. Received: {unknown_paths}.")
    unknown = sorted(set(FLAGS.models) - set(models.NAMES))
    if unknown:
        raise app.UsageError(f"`--models` must be among {sorted(models.NAMES)}. Received: {unknown}.")
    keras.config.set_dtype_policy(FLAGS.dtype_policy)
    rows = [row for name in FLAGS.models for row in measure(name)]
    interleaved.report(markdown(rows), FLAGS.out_md)
    if FLAGS.record:  # {model: {path: {ms_per_step, ratio, kernels, gflop, ...}}}; XLA's counts as (value, ratio)
        results: dict = {}
        for row in rows:
            results.setdefault(row["model"], {})[row["path"]] = {
                k: v for k, v in row.items() if k not in ("model", "path")
            }
        records.write_record(FLAGS.record, records.command_line(), results)


if __name__ == "__main__":
    app.run(main)
