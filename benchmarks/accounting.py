"""Times keras_dyndp's accounting of heterogeneous schedules beside dp_accounting's per-step accountants.

The schedule is the one measured in DESIGN.md: p = 250/60000, noise multiplier linear from 1.2 to 0.6 over
`--steps` steps (all distinct), delta = 1e-5. Printed, in one run:

1. exact heterogeneous RDP (`fast_rdp`), and dp_accounting's RdpAccountant composing the first `--reference_steps`
   steps one by one (0 skips it; all 4800 take ~4 minutes on 2 CPU cores); the epsilons are compared on that prefix;
2. the grouped PLD upper bound (`fast_pld`), and dp_accounting's PLDAccountant composing the first
   `--reference_steps` steps one by one;
3. `schedules.calibrate('dynamic', ...)` of a T-step schedule to epsilon 1.2 under each accountant, with the
   epsilon of the result under all three;
4. with --calibration_examples, the calibration examples of docs/accounting.md (delta 1e-5), each calibrated under
   the default accountant (PLD) and under the GDP-CLT: wall time, and the PLD epsilon of both schedules.

    python benchmarks/accounting.py --steps=4800 --reference_steps=200 --calibration_examples
"""

import functools
import time

import calibration_examples  # benchmarks/calibration_examples.py
import numpy as np
from absl import app
from absl import flags
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant

from keras_dyndp import schedules
from keras_dyndp.accounting import fast_pld
from keras_dyndp.accounting import fast_rdp
from keras_dyndp.accounting import gdp
from keras_dyndp.accounting import registry

_STEPS = flags.DEFINE_integer("steps", 4800, "Number of DP-SGD steps T.", lower_bound=1)
_REFERENCE_STEPS = flags.DEFINE_integer(
    "reference_steps", None, "Steps composed one by one by dp_accounting (default: all; 0: skip).", lower_bound=0
)
_SAMPLING_PROBABILITY = flags.DEFINE_float("sampling_probability", 250 / 60000, "Poisson sampling probability p.")
_DELTA = flags.DEFINE_float("delta", 1e-5, "Target delta.")
_STEPS_PER_EPOCH = flags.DEFINE_integer("steps_per_epoch", 240, "Epoch length for the per-epoch curve.", lower_bound=1)
_CALIBRATION_EXAMPLES = flags.DEFINE_bool(
    "calibration_examples", False, "Also time docs/accounting.md's calibration examples."
)


def _timed(function):
    start_wall, start_cpu = time.perf_counter(), time.process_time()
    value = function()
    return value, time.perf_counter() - start_wall, time.process_time() - start_cpu


def _reference_epsilon(accountant, noise_multipliers: np.ndarray) -> float:
    for noise_multiplier in noise_multipliers:
        accountant.compose(
            dp_event.PoissonSampledDpEvent(_SAMPLING_PROBABILITY.value, dp_event.GaussianDpEvent(noise_multiplier))
        )
    return accountant.get_epsilon(_DELTA.value)


def main(argv):
    del argv
    steps = _STEPS.value
    reference_steps = steps if _REFERENCE_STEPS.value is None else min(_REFERENCE_STEPS.value, steps)
    probability, delta = _SAMPLING_PROBABILITY.value, _DELTA.value
    noise_multipliers = np.linspace(1.2, 0.6, steps)
    print(f"p={probability:.6g} T={steps} delta={delta:g}, noise multiplier linear 1.2 -> 0.6")

    epsilon, wall, cpu = _timed(lambda: fast_rdp.rdp_epsilon(probability, noise_multipliers, delta))
    print(f"fast_rdp.rdp_epsilon, T={steps}: epsilon={epsilon:.10g}  wall {wall:.3f} s  cpu {cpu:.3f} s")

    epoch_ends = list(range(0, steps + 1, _STEPS_PER_EPOCH.value))
    curve, wall, cpu = _timed(lambda: fast_rdp.rdp_epsilons_at(probability, noise_multipliers, delta, epoch_ends))
    print(
        f"fast_rdp.rdp_epsilons_at, {len(epoch_ends)} epoch ends: last={curve[-1]:.10g}  "
        f"wall {wall:.3f} s  cpu {cpu:.3f} s"
    )

    clt_epsilon, wall, cpu = _timed(lambda: gdp.epsilon_from_mu(gdp.clt_mu(probability, 1 / noise_multipliers), delta))
    print(f"GDP-CLT (approximate): epsilon={clt_epsilon:.10g}  wall {wall:.4f} s  cpu {cpu:.4f} s")

    epsilon, wall, cpu = _timed(lambda: fast_pld.pld_epsilon(probability, noise_multipliers, delta))
    print(
        f"fast_pld.pld_epsilon (grouped upper bound), T={steps}: epsilon={epsilon:.10g}  "
        f"wall {wall:.3f} s  cpu {cpu:.3f} s"
    )

    if reference_steps:
        prefix = noise_multipliers[:reference_steps]
        references = (
            ("RdpAccountant", rdp_privacy_accountant.RdpAccountant, fast_rdp.rdp_epsilon),
            (
                "PLDAccountant",
                lambda: pld_privacy_accountant.PLDAccountant(
                    value_discretization_interval=registry.DEFAULT_PLD_VALUE_DISCRETIZATION_INTERVAL
                ),
                fast_pld.pld_epsilon,
            ),
        )
        for name, make_accountant, fast_function in references:
            expected, wall, cpu = _timed(lambda: _reference_epsilon(make_accountant(), prefix))  # noqa: B023 (run now)
            fast = fast_function(probability, prefix, delta)
            print(
                f"dp_accounting {name} one by one, first {reference_steps} steps: epsilon={expected:.10g}  "
                f"wall {wall:.3f} s  cpu {cpu:.3f} s  ({1000 * cpu / reference_steps:.1f} ms cpu/step, "
                f"~{cpu * steps / reference_steps:.0f} s cpu for all {steps})"
            )
            print(
                f"  keras_dyndp on the same prefix: epsilon={fast:.10g}  relative difference "
                f"{(fast - expected) / expected:+.2e}"
            )

    for accountant in registry.ACCOUNTANT_NAMES:
        schedule, wall, cpu = _timed(
            functools.partial(
                schedules.calibrate,
                "dynamic",
                target_epsilon=1.2,
                target_delta=delta,
                sampling_probability=probability,
                num_steps=steps,
                initial_clip=1.5,
                rho_mu=1 / 0.8,
                rho_c=1 / 0.3,
                accountant=accountant,
            )
        )
        spent = ", ".join(f"{name} {schedule.epsilon(delta, name):.4f}" for name in registry.ACCOUNTANT_NAMES)
        print(
            f"calibrate('dynamic', epsilon 1.2, accountant='{accountant}'): wall {wall:.2f} s  cpu {cpu:.2f} s; "
            f"z_first {schedule.noise_multipliers[0]:.4f}; epsilon {spent}"
        )

    if _CALIBRATION_EXAMPLES.value:
        _calibration_examples()


def _calibration_examples() -> None:
    for name, arguments in calibration_examples.EXAMPLES:
        rigorous, wall, _ = _timed(functools.partial(schedules.calibrate_shape, 1.0, target_delta=1e-5, **arguments))
        clt = schedules.calibrate_shape(1.0, target_delta=1e-5, accountant="gdp_clt", **arguments)
        print(
            f"{name}: default ({rigorous.calibration.accountant}) calibration {wall:.2f} s, PLD epsilon "
            f"{rigorous.epsilon(1e-5, 'pld'):.4f}; calibrated under the GDP-CLT: PLD epsilon "
            f"{clt.epsilon(1e-5, 'pld'):.4f}, RDP {clt.epsilon(1e-5, 'rdp'):.4f}"
        )


if __name__ == "__main__":
    app.run(main)
