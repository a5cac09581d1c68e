"""Bit-identity check of the accounting across a refactor: run it on the old and the new code, then compare.

Records, for many schedules (every method, baseline and accountant, several p, T and budgets): the calibrated clip
norms and noise stds, epsilon under every accountant (with and without options) after several step counts, the
one-pass epsilon curves, the dp_accounting event, the GDP-CLT understatement text and each accountant's refusals.
Every float is kept as its bytes, so `compare` is exact (==).

    python benchmarks/accounting_identity.py record /tmp/before.pkl   # on the old code
    python benchmarks/accounting_identity.py record /tmp/after.pkl    # on the new code
    python benchmarks/accounting_identity.py compare /tmp/before.pkl /tmp/after.pkl
"""

import functools
import itertools
import pickle
import sys

import numpy as np

from keras_dyndp import privacy_report
from keras_dyndp import schedules
from keras_dyndp.accounting import registry
from keras_dyndp.schedules import budget as schedule_budget

DELTAS = (1e-5,)
BUDGETS = ((0.5, 1e-5), (4.0, 1e-6))
SAMPLING = ((0.01, 40), (250 / 60000, 120), (0.1, 25))
RHOS = ((1.0, 1.0), (1 / 0.8, 1 / 0.3), (1 / 0.5, 1 / 0.7))


def _outcome(function, *args, **kwargs):
    """The value, or the error's type and text."""
    try:
        return ("ok", function(*args, **kwargs))
    except Exception as error:  # pylint: disable=broad-except
        return ("error", type(error).__name__, str(error))


def _bits(value):
    if isinstance(value, np.ndarray):
        return ("array", value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, float):
        return ("float", np.float64(value).tobytes())
    if isinstance(value, tuple | list):
        return tuple(_bits(item) for item in value)
    if isinstance(value, dict):
        return tuple((key, _bits(item)) for key, item in value.items())
    return value


def _schedule_facts(schedule):
    facts = {
        "clip": schedule.clip_norms,
        "noise": schedule.noise_stddevs,
        "p": schedule.sampling_probability,
        "event": repr(schedule.to_dp_event()),
        "event_prefix": repr(schedule.to_dp_event(schedule.num_steps // 2)),
        "understatement": schedules.gdp_clt_understatement(schedule),
    }
    steps = sorted({0, 1, schedule.num_steps // 3, schedule.num_steps})
    for delta, name, k in itertools.product(DELTAS, registry.ACCOUNTANT_NAMES, steps):
        facts[f"eps {name} {delta} {k}"] = _outcome(schedule.epsilon, delta, name, steps=k)
    facts["eps pld final"] = _outcome(schedule.epsilon, 1e-5, "pld", **registry.get("pld").final_options)
    facts["eps rdp orders"] = _outcome(schedule.epsilon, 1e-5, "rdp", orders=[1.5, 2, 4, 8, 32])
    for name in registry.ACCOUNTANT_NAMES:
        facts[f"accountable {name}"] = _outcome(schedule.check_accountable, name)
    facts["curves"] = _outcome(privacy_report.epsilon_curves, schedule, 1e-5, num_points=7)
    return facts


def _cases():
    for method, (eps, delta), (p, steps), accountant in itertools.product(
        schedules.ALL_METHODS, BUDGETS, SAMPLING, registry.ACCOUNTANT_NAMES
    ):
        if method in schedules.BASELINES and accountant != registry.DEFAULT_ACCOUNTANT:
            continue  # The accountant is not used by the baselines.
        for rho_mu, rho_c in RHOS if method in ("dynamic", "growing_mu", "sensitivity_decay") else RHOS[:1]:
            arguments = dict(target_epsilon=eps, target_delta=delta, sampling_probability=p, num_steps=steps)
            yield (
                (method, eps, delta, p, steps, rho_mu, rho_c, accountant),
                functools.partial(
                    schedules.calibrate,
                    method,
                    **arguments,
                    initial_clip=1.5,
                    rho_mu=rho_mu,
                    rho_c=rho_c,
                    accountant=accountant,
                ),
            )
    boosted = np.ones(60)
    boosted[-5:] = 3.0
    for accountant, shape in itertools.product(registry.ACCOUNTANT_NAMES, (boosted, lambda t: 1 + t / 60, 2.0)):
        yield (
            ("shape", accountant, repr(shape)[:20]),
            functools.partial(
                schedules.calibrate_shape,
                lambda t: 1.0 + 0 * t,
                shape,
                target_epsilon=1.0,
                target_delta=1e-5,
                sampling_probability=0.02,
                num_steps=60,
                accountant=accountant,
            ),
        )
    # The optimizers' budget arguments.
    for method, accountant, epochs in itertools.product(("vanilla", "dynamic"), (None, "gdp_clt", "rdp"), (2, 0.5)):
        budget = dict.fromkeys(schedule_budget.BUDGET_ARGUMENTS)
        budget |= dict(target_epsilon=2.0, target_delta=1e-5, num_examples=1000, batch_size=50, epochs=epochs)
        budget |= dict(method=method, initial_clip=1.0, rho_mu=1.25, rho_c=2.0, accountant=accountant)
        yield (
            ("budget", method, accountant, epochs),
            lambda budget=budget: schedule_budget.resolve_schedule(None, budget, None, False)[0],
        )
    # Hand-built: zero noise, out-of-range noise, large and tiny multipliers.
    yield ("hand zero",), lambda: schedules.DPSchedule([1.0, 2.0, 1.0], [1.0, 0.0, 1.0], 0.1)
    yield ("hand tiny",), lambda: schedules.DPSchedule([1.0, 1.0], [1e-3, 1.0], 0.1)
    yield ("hand large",), lambda: schedules.DPSchedule([1.0] * 4, [1e3, 50.0, 3.0, 0.7], 0.3)
    # Refused calibrations.
    yield (
        ("refused clt",),
        lambda: schedules.calibrate(
            "vanilla",
            target_epsilon=1e4,
            target_delta=1e-5,
            sampling_probability=0.5,
            num_steps=3,
            initial_clip=1.0,
            accountant="gdp_clt",
        ),
    )
    yield (
        ("refused pld",),
        lambda: schedules.calibrate(
            "vanilla", target_epsilon=1e4, target_delta=1e-5, sampling_probability=0.5, num_steps=3, initial_clip=1.0
        ),
    )


def record(path):
    results = {}
    for key, build in _cases():
        outcome = _outcome(build)
        facts = _schedule_facts(outcome[1]) if outcome[0] == "ok" else None
        results[key] = _bits((outcome if facts is None else "ok", facts))
    with open(path, "wb") as file:
        pickle.dump(results, file)
    print(f"{len(results)} cases recorded in {path}")


def compare(before_path, after_path):
    with open(before_path, "rb") as file:
        before = pickle.load(file)
    with open(after_path, "rb") as file:
        after = pickle.load(file)
    differing = [key for key in before if before[key] != after.get(key)]
    facts = sum(len(value[1]) if value[1] else 1 for value in before.values())
    print(f"{len(before)} cases ({facts} facts) compared: {len(differing)} differ; {sorted(set(after) - set(before))}")
    for key in differing:
        old, new = dict(before[key][1] or ()), dict(after[key][1] or ())
        print(key, [name for name in old if old[name] != new.get(name)] or (before[key][0], after[key][0]))
    return 1 if differing or set(after) != set(before) else 0


if __name__ == "__main__":
    if sys.argv[1] == "record":
        record(sys.argv[2])
    else:
        sys.exit(compare(sys.argv[2], sys.argv[3]))
