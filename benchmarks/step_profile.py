"""Where the DP step's extra time goes on TensorFlow: the ops of the DP step and of the non-private step, per op type.

Runs `benchmarks/step_time.py`'s paths (the same models, batch and compiled train functions) under TensorFlow's
profiler, alternating the paths, and sums each op's time per op type over the traced steps, from the host plane of
the profile (TensorFlow's executor runs one op per event on CPU). An op's time here is its kernel's wall time on its
thread: ops that run in parallel both count, so the columns add up to more than the step where the executor overlaps
ops (the "steps" row gives the steps' wall time). The table lists the op types whose time differs most between the
two paths, with each one's share of the difference.

    [TF_ENABLE_ONEDNN_OPTS=0|1] python benchmarks/step_profile.py --model cnn --profiled_steps 20 --rounds 3 \
        [--top 25] [--record PATH]   (step_time.py's flags: --batch_size, --warmup_steps, --record)
"""

from __future__ import annotations

import collections
import pathlib
import re
import statistics
import tempfile
import time

import records  # benchmarks/records.py (this script's directory is on sys.path)
import step_time  # benchmarks/step_time.py
import tensorflow as tf
from absl import app
from absl import flags

from keras_dyndp.tf_backend.per_example import conv2d  # onednn_enabled

FLAGS = flags.FLAGS
flags.DEFINE_string("model", "cnn", "The model, one of step_time.py's.")
flags.DEFINE_list("compare", ["nonprivate", "dyndp_fast"], "Two of step_time.py's paths: the baseline, then the other.")
flags.DEFINE_integer("profiled_steps", 20, "Steps traced per path and round.")
flags.DEFINE_integer("rounds", 3, "Rounds; each traces every path once, in alternating order.")
flags.DEFINE_integer("top", 25, "Op types listed.")
flags.register_validator("compare", lambda paths: len(set(paths)) == len(paths) == 2, "two different paths")

OP_TYPE = re.compile(r"_?[A-Z][A-Za-z0-9]*")


def _op_times(logdir: pathlib.Path) -> collections.Counter:
    """Microseconds per op type in the profile under ``logdir``: the events of the host plane's TensorFlow-op lines,
    whose names read ``name:type``."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2  # noqa: PLC0415  (TensorFlow's own profile format)

    times: collections.Counter = collections.Counter()
    for path in logdir.rglob("*.xplane.pb"):
        space = xplane_pb2.XSpace()
        space.ParseFromString(path.read_bytes())
        for plane in space.planes:
            if plane.name != "/host:CPU":
                continue
            names = {key: metadata.name for key, metadata in plane.event_metadata.items()}
            for line in plane.lines:
                for event in line.events:
                    name = names.get(event.metadata_id, "")
                    op_type = name.rsplit(":", 1)[-1]
                    if "::" not in name and ":" in name and OP_TYPE.fullmatch(op_type):  # not the executor's events
                        times[op_type] += event.duration_ps / 1e6
    return times


def profile(runner: step_time.Runner, steps: int) -> tuple[collections.Counter, float]:
    """(microseconds per op type, wall seconds per step) of ``steps`` traced steps of ``runner``."""
    with tempfile.TemporaryDirectory() as logdir:
        tf.profiler.experimental.start(logdir)
        start = time.perf_counter()
        runner.run(steps)
        seconds = (time.perf_counter() - start) / steps
        tf.profiler.experimental.stop()
        return _op_times(pathlib.Path(logdir)), seconds


def summary(totals: dict[str, collections.Counter], walls: dict[str, list[float]], steps: int, top: int) -> dict:
    """Per op type (the ``top`` largest differences first), ms per step on each path, the difference and its share;
    the sums over all ops and the steps' wall time (median of the rounds)."""
    base, other = FLAGS.compare
    per_step = {path: {op: us / 1e3 / steps for op, us in totals[path].items()} for path in totals}
    ops = set().union(*per_step.values())
    difference = {op: per_step[other].get(op, 0.0) - per_step[base].get(op, 0.0) for op in ops}
    extra = sum(difference.values())
    rows = [
        {
            "op": op,
            base: per_step[base].get(op, 0.0),
            other: per_step[other].get(op, 0.0),
            "difference": difference[op],
            "share_percent": 100 * difference[op] / extra if extra else 0.0,
        }
        for op in sorted(difference, key=lambda op: -abs(difference[op]))[:top]
    ]
    sums = {path: sum(per_step[path].values()) for path in per_step}
    wall = {path: statistics.median(times) * 1e3 for path, times in walls.items()}
    return {
        "ops": rows,
        "all_ops": sums,
        "all_ops_difference": sums[other] - sums[base],
        "wall_ms": wall,
        "wall_difference": wall[other] - wall[base],
    }


def table(result: dict) -> str:
    """Markdown of `summary`."""
    base, other = FLAGS.compare
    lines = [
        f"| op type | {base} ms/step | {other} ms/step | difference | share of the difference |",
        "|---|---|---|---|---|",
    ]
    for row in result["ops"]:
        lines.append(
            f"| {row['op']} | {row[base]:.3f} | {row[other]:.3f} | {row['difference']:+.3f} | "
            f"{row['share_percent']:.0f}% |"
        )
    for label, key in (("all ops (sum)", "all_ops"), ("steps (wall, median of rounds)", "wall_ms")):
        values, difference = result[key], result[key.removesuffix("_ms") + "_difference"]
        lines.append(f"| {label} | {values[base]:.3f} | {values[other]:.3f} | {difference:+.3f} | |")
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    del argv
    runners = {path: step_time.Runner(FLAGS.model, path, FLAGS.batch_size) for path in FLAGS.compare}
    for runner in runners.values():
        runner.run(FLAGS.warmup_steps)
    totals = {path: collections.Counter() for path in runners}
    walls: dict[str, list[float]] = {path: [] for path in runners}
    for round_index in range(FLAGS.rounds):
        order = list(runners) if round_index % 2 == 0 else list(reversed(runners))
        for path in order:
            times, seconds = profile(runners[path], FLAGS.profiled_steps)
            totals[path].update(times)
            walls[path].append(seconds)
    print(
        f"{step_time.device_description()}, oneDNN {'on' if conv2d.onednn_enabled() else 'off'}, model "
        f"{FLAGS.model}, batch {FLAGS.batch_size}, {FLAGS.rounds} rounds x {FLAGS.profiled_steps} profiled steps"
    )
    result = summary(totals, walls, FLAGS.rounds * FLAGS.profiled_steps, FLAGS.top)
    print(table(result))
    if FLAGS.record:
        records.write_record(FLAGS.record, records.command_line(), {"model": FLAGS.model, **result})


if __name__ == "__main__":
    app.run(main)
