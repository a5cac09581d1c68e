"""The white-box audit's power: how often it flags a planted fault, measured over repeated one-run audits.

Each setting runs `keras_dyndp.audit.white_box_audit` ``--repeats`` times (seeds 0, 1, ...: the coin flips, the
batches and the noise differ per run) on the schedule of tests/audit/test_white_box.py: p = 1 (every included canary
in every step), T = ``--steps`` steps, C_t decaying geometrically from 1 to 0.5 and one sigma chosen so that the run
is mu-GDP with the claimed epsilon (``--claims``, at delta ``--delta``; the PLD epsilon of the schedule is reported).
A fault is planted in `keras_dyndp.core.mechanism` as the tests plant it:

* ``noiseF``: the noise standard deviation times F (the run is then (mu / F)-GDP);
* ``clipF``: every example clipped to F C_t instead of C_t (the canaries' gradients, of norm 10 max C_t, are
  clipped to F C_t: (F mu)-GDP);
* ``none``: the correct pipeline (a flag is then a false alarm, expected in <= 1 - confidence of the runs).

A run is flagged when its f-DP lower bound exceeds the claim (as in the tests). ``--setups`` lists the audit
settings as ``m`` (canaries; the guesses searched over the default grid with a Bonferroni split) or ``m:r`` (r
guesses fixed in advance, ``num_guesses=r``). Per setting the table gives the true epsilon of the faulty run (of the
Gaussian composition), the runs flagged, the mean f-DP and one-run bounds, and seconds per run (wall and CPU of this
process, all threads; build, trace, training and bounds included).

    nice -n 19 python benchmarks/audit_power.py                      # the table of docs/audit.md
    python benchmarks/audit_power.py --claims=8 --faults=noise0.7 --setups=100000:5000 --repeats=10
"""

import contextlib
import os
import platform
import time
import warnings
from unittest import mock

import numpy as np
import scipy.optimize
from absl import app
from absl import flags

import keras_dyndp
from keras_dyndp import audit
from keras_dyndp.audit import white_box
from keras_dyndp.core import mechanism

_CLAIMS = flags.DEFINE_list("claims", ["3.12", "8"], "Claimed epsilons (mu-GDP schedules at --delta).")
_SETUPS = flags.DEFINE_list(
    "setups", ["1000", "10000", "100000:5000"], "Audit settings: m (default guess grid) or m:r (r guesses fixed)."
)
_FAULTS = flags.DEFINE_list(
    "faults",
    ["none", "noise0.3", "noise0.5", "noise0.7", "noise0.9", "clip1.5", "clip2"],
    "Planted faults: none, noiseF (noise std x F) or clipF (clip norm x F).",
)
_REPEATS = flags.DEFINE_integer("repeats", 10, "Audits (one training run each) per setting.")
_STEPS = flags.DEFINE_integer("steps", 8, "Training steps T of the audited schedule.")
_DELTA = flags.DEFINE_float("delta", 1e-5, "Delta of the claims and of the bounds.")


def _cpu_model() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def _schedule(mu: float, steps: int) -> keras_dyndp.DPSchedule:
    clip_norms = np.geomspace(1.0, 0.5, steps)
    sigma = np.sqrt(np.sum(clip_norms**2)) / mu
    return keras_dyndp.DPSchedule(clip_norms, np.full(steps, sigma), 1.0)


def _mu(epsilon: float, delta: float) -> float:
    return scipy.optimize.brentq(lambda mu: audit.gdp_epsilon(mu, delta) - epsilon, 1e-3, 50.0, xtol=1e-10)


def _fault(name: str):
    """(a context that plants the fault, the factor on the run's mu)."""
    if name == "none":
        return contextlib.nullcontext(), 1.0
    if name.startswith("noise"):
        factor = float(name[len("noise") :])
        original = mechanism.noise_stddev
        return mock.patch.object(
            mechanism, "noise_stddev", lambda sigma, microbatches: factor * original(sigma, microbatches)
        ), 1.0 / factor
    if name.startswith("clip"):
        factor = float(name[len("clip") :])
        original = mechanism.clip_factors
        return mock.patch.object(
            mechanism, "clip_factors", lambda ops, norms, clip_norm: original(ops, norms, factor * clip_norm)
        ), factor
    raise ValueError(f"unknown fault {name!r}: none, noiseF or clipF")


def _setup(text: str) -> tuple[int, int | None]:
    m, _, r = text.partition(":")
    return int(m), int(r) if r else None


def main(_):
    warnings.simplefilter("ignore", keras_dyndp.NoiseSeedWarning)
    warnings.simplefilter("ignore", keras_dyndp.SamplingWarning)
    print(
        f"machine: {_cpu_model()}, {os.cpu_count()} cores; Python {platform.python_version()}, "
        f"Keras {keras_dyndp.backend.keras_module().__version__} on {keras_dyndp.keras_backend()}",
        flush=True,
    )
    rows = []
    header = (
        "| claim | m | guesses | fault | true eps | flagged | mean f-DP bound | mean one-run bound | s/run (wall) "
        "| CPU s/run |"
    )
    print(header.replace("|", " "), flush=True)
    for claim_text in _CLAIMS.value:
        mu = _mu(float(claim_text), _DELTA.value)
        schedule = _schedule(mu, _STEPS.value)
        for setup in _SETUPS.value:
            m, r = _setup(setup)
            for fault in _FAULTS.value:
                flagged, fdp, one_run, walls, cpus = 0, [], [], [], []
                for seed in range(_REPEATS.value):
                    patch, mu_factor = _fault(fault)
                    start_wall, start_cpu = time.perf_counter(), time.process_time()
                    with patch:
                        report = white_box.white_box_audit(
                            schedule, num_canaries=m, num_guesses=r, delta=_DELTA.value, noise_seed=seed, seed=seed
                        )
                    walls.append(time.perf_counter() - start_wall)
                    cpus.append(time.process_time() - start_cpu)
                    flagged += report.epsilon_fdp > report.claimed_epsilon
                    fdp.append(report.epsilon_fdp)
                    one_run.append(report.epsilon_one_run)
                true_epsilon = audit.gdp_epsilon(mu * mu_factor, _DELTA.value)
                row = (
                    f"| {report.claimed_epsilon:.2f} | {m} | {'grid' if r is None else r} | {fault} | "
                    f"{true_epsilon:.2f} | {flagged}/{_REPEATS.value} | {np.mean(fdp):.2f} | {np.mean(one_run):.2f} | "
                    f"{np.mean(walls):.1f} | {np.mean(cpus):.1f} |"
                )
                rows.append(row)
                print(row.replace("|", " "), flush=True)
    print()
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    print("\n".join(rows))


if __name__ == "__main__":
    app.run(main)
