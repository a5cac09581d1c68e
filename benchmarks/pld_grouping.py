"""Measures `fast_pld.pld_epsilon` (grouped, noise rounded down) against bounds on the ungrouped PLD epsilon.

The ungrouped PLD epsilon of T = 4800 distinct steps takes minutes with dp_accounting, so it is bracketed instead:
the same groups accounted with each group's LARGEST noise multiplier (rounded up) give a lower bound, ours (rounded
down) an upper bound; the ungrouped value lies between. With --ungrouped_steps > 0 the ungrouped PLD of a shorter
schedule is also computed directly (one dp_accounting composition per step).

  python benchmarks/pld_grouping.py [--ungrouped_steps=300]
"""

import time

import numpy as np
from absl import app
from absl import flags

from keras_dyndp import schedules
from keras_dyndp.accounting import fast_pld

_UNGROUPED_STEPS = flags.DEFINE_integer("ungrouped_steps", 0, "Also compose this many distinct steps ungrouped.")
_INTERVAL = flags.DEFINE_float("interval", 1e-3, "PLD value discretization interval.")

P, T, DELTA = 250 / 60000, 4800, 1e-5


def _grouped(multipliers: np.ndarray, round_up: bool) -> float:
    """PLD epsilon of `fast_pld`'s groups, each accounted with its smallest (default) or largest multiplier."""
    group_min, counts = fast_pld.group_noise_multipliers(multipliers)
    values = np.sort(multipliers)[np.cumsum(counts) - 1] if round_up else group_min
    composed = None
    for value, count in zip(values, counts):
        pld = fast_pld.subsampled_gaussian_pld(float(value), P, _INTERVAL.value).self_compose(int(count))
        composed = pld if composed is None else composed.compose(pld)
    return composed.get_epsilon_for_delta(DELTA)


def main(_):
    cases = {
        "linear 1.2->0.6": np.linspace(1.2, 0.6, T),
        "dynamic eps=1.2 1/rho_mu=0.3 1/rho_c=0.3": schedules.calibrate(
            "dynamic",
            target_epsilon=1.2,
            target_delta=DELTA,
            sampling_probability=P,
            num_steps=T,
            initial_clip=1.5,
            rho_mu=1 / 0.3,
            rho_c=1 / 0.3,
        ).noise_multipliers,
        "growing_mu eps=0.4 1/rho_mu=0.1": schedules.calibrate(
            "growing_mu",
            target_epsilon=0.4,
            target_delta=DELTA,
            sampling_probability=P,
            num_steps=T,
            initial_clip=1.5,
            rho_mu=10.0,
        ).noise_multipliers,
    }
    print(f"p={P:.6g} T={T} delta={DELTA} interval={_INTERVAL.value}")
    for name, multipliers in cases.items():
        start = time.perf_counter()
        upper = fast_pld.pld_epsilon(P, multipliers, DELTA, value_discretization_interval=_INTERVAL.value)
        seconds = time.perf_counter() - start
        groups = fast_pld.group_noise_multipliers(multipliers)[0].size
        lower = _grouped(multipliers, round_up=True)
        print(
            f"{name}: groups={groups} pld_epsilon={upper:.4f} ({seconds:.1f} s) "
            f"rounded-up lower bound={lower:.4f} gap={upper / lower - 1:.2%}"
        )
    if _UNGROUPED_STEPS.value:
        steps = _UNGROUPED_STEPS.value
        multipliers = np.linspace(1.2, 0.6, steps)
        start = time.perf_counter()
        composed = None
        for value in multipliers:
            pld = fast_pld.subsampled_gaussian_pld(float(value), P, _INTERVAL.value)
            composed = pld if composed is None else composed.compose(pld)
        exact = composed.get_epsilon_for_delta(DELTA)
        exact_seconds = time.perf_counter() - start
        grouped = fast_pld.pld_epsilon(P, multipliers, DELTA, value_discretization_interval=_INTERVAL.value)
        print(
            f"linear 1.2->0.6, T={steps}: ungrouped={exact:.4f} ({exact_seconds:.1f} s) grouped={grouped:.4f} "
            f"excess={grouped / exact - 1:.2%}"
        )


if __name__ == "__main__":
    app.run(main)
