"""`dyndp-privacy`: privacy report of dynamic DP-SGD schedules from the command line (no TensorFlow import).

Either calibrate schedules from a spec

  dyndp-privacy --epsilon=1.2 --num_examples=60000 --batch_size=250 --epochs=20 --rho_mu=1.25 --rho_c=3.33 \\
      --method=vanilla,dynamic,zcdp,tcdp --plot_dir=/tmp/plots

or report a saved schedule (`DPSchedule.to_json()` text, or an example trainer's `<model_dir>/run_config.json`)

  dyndp-privacy --schedule_json=schedule.json --delta=1e-5

It prints a table row per method (`keras_dyndp.privacy_report`). The paper's methods are calibrated under
--accountant (pld by default; gdp_clt is the paper's). --plot_dir writes `epsilon_consumption.png` (paper Fig. 2,
spec mode) and `accountant_comparison.png` (Fig. 3, of the dynamic or the loaded schedule). A bad spec prints one
error line on stderr and exits with status 2.
"""

from __future__ import annotations

import functools
import json
import os
import sys

from absl import app
from absl import flags

from keras_dyndp import cli
from keras_dyndp import privacy_report
from keras_dyndp import schedules
from keras_dyndp.accounting import registry
from keras_dyndp.core import validation

# The command's own flag registry, so that importing this module beside an example trainer (which defines flags of
# the same names on absl's global registry) cannot clash.
_FLAGS = flags.FlagValues()
_string, _float, _integer, _enum, _list = (
    functools.partial(define, flag_values=_FLAGS)
    for define in (flags.DEFINE_string, flags.DEFINE_float, flags.DEFINE_integer, flags.DEFINE_enum, flags.DEFINE_list)
)
_METHOD = _string("method", "all", f"Comma-separated methods among {schedules.ALL_METHODS}, or 'all'.")
_EPSILON = _float("epsilon", None, "Target epsilon of the run (spec mode).")
_DELTA = _float("delta", None, "Target delta; default 1 / (10 num_examples), the paper's choice.")
_NUM_EXAMPLES = _integer("num_examples", None, "Training set size N (spec mode).")
_BATCH_SIZE = _integer("batch_size", None, "Expected batch size; p = batch_size / num_examples.")
_EPOCHS = _float("epochs", None, "Epochs; T = ceil(epochs * N / batch_size). Or give --steps.")
_STEPS = _integer("steps", None, "Number of steps T (instead of --epochs).")
_RHO_MU = _float("rho_mu", 1.0, "mu_T / mu_0 >= 1 (also the zcdp/tcdp noise decay z_0 / z_T).")
_RHO_C = _float("rho_c", 1.0, "C_0 / C_T >= 1.")
_INITIAL_CLIP = _float("initial_clip", 1.0, "Initial clipping norm C_0.")
_SCHEDULE_JSON = _string(
    "schedule_json",
    None,
    "Path of a saved DPSchedule.to_json() file or of an example trainer's <model_dir>/run_config.json.",
)
_ACCOUNTANT = _enum(
    "accountant",
    registry.DEFAULT_ACCOUNTANT,
    list(registry.ACCOUNTANT_NAMES),
    "Accountant the paper's methods are calibrated under (spec mode): pld (rigorous, tight), rdp (rigorous), or "
    "gdp_clt (the paper's approximation, which can understate epsilon).",
)
_ACCOUNTANTS = _list("accountants", list(registry.ACCOUNTANT_NAMES), "Accountants to report.")
_NUM_POINTS = _integer("num_points", privacy_report.DEFAULT_NUM_POINTS, "Points per plotted curve.")
_PLOT_DIR = _string("plot_dir", None, "Directory for the PNG plots (created if missing).")

_PROGRAM = "dyndp-privacy"

# Why the baselines' rows look odd beside the paper's methods: each meets the target under its own accountant
# (eps_own), which is looser than PLD or RDP for this package's Poisson-sampled, add-or-remove-one training.
_BASELINE_NOTES = {
    "zcdp": "  zcdp: its accountant uses no amplification by subsampling, so it needs far more noise (large z) for the "
    "target than the paper's methods; the rigorous epsilon of that noise (eps_pld, eps_rdp) is far below the "
    "target: a valid but wasteful schedule.",
    "tcdp": "  tcdp: eps_own is the baseline's claim for fixed-size batches and replace-one neighbours "
    "(keras_dyndp.accounting.cdp); eps_rdp and eps_pld are what Poisson-sampled training guarantees.",
}


def _parse_flags(argv: list[str]) -> list[str]:
    remaining = cli.parse_flags(argv, program=_PROGRAM)
    _FLAGS.mark_as_parsed()  # Its flags were parsed through the global registry they were appended to.
    return remaining


def _methods() -> list[str]:
    """The --method list, checked against `schedules.ALL_METHODS`."""
    if _METHOD.value.strip() == "all":
        return list(schedules.ALL_METHODS)
    methods = [method.strip() for method in _METHOD.value.split(",") if method.strip()]
    return list(validation.check_subset("methods", methods, schedules.ALL_METHODS, allow_empty=False))


def _load_schedule(path: str) -> schedules.DPSchedule:
    """The schedule of a `DPSchedule.to_json()` file or of an example trainer's run_config.json (its "schedule")."""
    try:
        with open(path, encoding="utf-8") as handle:
            config = json.load(handle)
        if isinstance(config, dict) and "schedule" in config:  # a research trainer's <model_dir>/run_config.json
            if config["schedule"] is None:
                raise ValueError(f"{path} holds a non-private run (method {config.get('method')}): no schedule.")
            config = config["schedule"]
        return schedules.DPSchedule.from_config(config)
    except (json.JSONDecodeError, TypeError, KeyError, AttributeError) as error:
        raise ValueError(
            f"{path} is neither a DPSchedule.to_json() file nor an example trainer's run_config.json ({error})."
        ) from error


def _plot(plot, name: str, *args, **kwargs) -> None:
    """Writes a `privacy_report` plot as --plot_dir/``name`` and prints its path."""
    os.makedirs(_PLOT_DIR.value, exist_ok=True)
    print(plot(os.path.join(_PLOT_DIR.value, name), *args, **kwargs))


def _plot_comparison(schedule: schedules.DPSchedule, delta: float, title: str) -> None:
    comparison = privacy_report.plot_accountant_comparison
    _plot(comparison, "accountant_comparison.png", schedule, delta, _ACCOUNTANTS.value, _NUM_POINTS.value, title=title)


def _report_loaded(path: str) -> None:
    if _DELTA.value is None:
        raise ValueError("--delta is required with --schedule_json.")
    schedule, name = _load_schedule(path), os.path.basename(path)
    print(privacy_report.format_table(privacy_report.report_rows({name: schedule}, _DELTA.value, _ACCOUNTANTS.value)))
    if _PLOT_DIR.value:
        _plot_comparison(schedule, _DELTA.value, f"{name}: epsilon over steps by accountant")


def _report_spec() -> None:
    required = {"epsilon": _EPSILON.value, "num_examples": _NUM_EXAMPLES.value, "batch_size": _BATCH_SIZE.value}
    missing = [f"--{name}" for name, value in required.items() if value is None]
    if missing:
        raise ValueError(f"{', '.join(missing)} required (or give --schedule_json).")
    p, num_steps = schedules.sampling_from_epochs(
        _NUM_EXAMPLES.value, _BATCH_SIZE.value, epochs=_EPOCHS.value, steps=_STEPS.value
    )
    delta = 1 / (10 * _NUM_EXAMPLES.value) if _DELTA.value is None else _DELTA.value
    spec = {"target_epsilon": _EPSILON.value, "target_delta": delta, "sampling_probability": p, "num_steps": num_steps}
    spec.update(initial_clip=_INITIAL_CLIP.value, accountant=_ACCOUNTANT.value)
    rhos = {"rho_mu": _RHO_MU.value, "rho_c": _RHO_C.value}
    built = {method: schedules.calibrate(method, **spec, **rhos) for method in _methods()}
    print(
        f"p = {p:.6g}, T = {num_steps}, target (epsilon, delta) = ({_EPSILON.value:g}, {delta:g}), "
        f"rho_mu = {_RHO_MU.value:g}, rho_c = {_RHO_C.value:g}, paper's methods calibrated under "
        f"{_ACCOUNTANT.value}"
    )
    print(privacy_report.format_table(privacy_report.report_rows(built, delta, _ACCOUNTANTS.value)))
    baselines = [method for method in built if method in _BASELINE_NOTES]
    if baselines:
        print("\n".join(["Notes:"] + [_BASELINE_NOTES[method] for method in baselines]))
    if _PLOT_DIR.value:
        _plot(privacy_report.plot_epsilon_consumption, "epsilon_consumption.png", **spec, num_points=_NUM_POINTS.value)
        dynamic = built.get("dynamic") or schedules.calibrate("dynamic", **spec, **rhos)
        _plot_comparison(
            dynamic, delta, f"Dynamic DP-SGD (1/rho_mu = {1 / _RHO_MU.value:.2g}, 1/rho_c = {1 / _RHO_C.value:.2g})"
        )


def main(argv: list[str]) -> None:
    del argv  # Checked by `_parse_flags`.
    try:
        if _SCHEDULE_JSON.value:
            _report_loaded(_SCHEDULE_JSON.value)
        else:
            _report_spec()
    except (ValueError, OSError) as error:
        cli.fail(str(error), _PROGRAM)


def run() -> None:
    """Console entry point `dyndp-privacy`."""
    main_module = sys.modules["__main__"]
    if not main_module.__doc__:  # The console-script wrapper has none; absl's --help prints it as the usage.
        main_module.__doc__ = __doc__
    flags.FLAGS.append_flag_values(_FLAGS)  # Only in this program's process.
    for name in _FLAGS:  # --help lists the key flags of the program that runs (sys.argv[0]): make ours key flags.
        flags.FLAGS.register_key_flag_for_module(sys.argv[0], _FLAGS[name])
    app.run(main, flags_parser=_parse_flags)


if __name__ == "__main__":
    run()
