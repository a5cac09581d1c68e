"""Privacy report: for each method (`schedules.ALL_METHODS`), the schedule's first and last noise multipliers and
clip norms, and its epsilon under 'gdp_clt' (the paper's approximation, which can understate epsilon), 'rdp' and
'pld' (rigorous), and 'own' (the accountant it was calibrated with). Rows (`ReportRow`), text (`format_table`) and
plots (paper Fig. 2 `plot_epsilon_consumption`, Fig. 3 `plot_accountant_comparison`, a run's `plot_run_privacy`; Agg
PNGs, pyplot left alone) are separate. `run_summary` is the privacy paragraph every trainer prints after a run."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from collections.abc import Sequence

import numpy as np

from keras_dyndp import schedules
from keras_dyndp.accounting import cdp
from keras_dyndp.accounting import registry
from keras_dyndp.core import batch_sizes
from keras_dyndp.core import validation

__all__ = [
    "DEFAULT_CONSUMPTION_RHO_MUS",
    "DEFAULT_NUM_POINTS",
    "ReportRow",
    "RunSummary",
    "curve_steps",
    "epsilon_curves",
    "format_table",
    "plot_accountant_comparison",
    "plot_epsilon_consumption",
    "plot_run_privacy",
    "report_rows",
    "run_summary",
    "schedule_row",
]

# Paper Fig. 2: mu_t growth rates 1/rho_mu in {1, 0.8, 0.5, 0.3}.
DEFAULT_CONSUMPTION_RHO_MUS = (1.0, 1 / 0.8, 1 / 0.5, 1 / 0.3)
DEFAULT_NUM_POINTS = 50


@dataclasses.dataclass(frozen=True)
class ReportRow:
    """One method's schedule summary. `epsilons`: {requested accountant: epsilon}. `epsilon_own` is None
    (`calibrated_by` '-') for a schedule that does not say how it was calibrated."""

    method: str
    calibrated_by: str
    num_steps: int
    first_noise_multiplier: float
    last_noise_multiplier: float
    first_clip_norm: float
    last_clip_norm: float
    epsilon_own: float | None
    epsilons: Mapping[str, float] = dataclasses.field(default_factory=dict)


def schedule_row(
    method: str, schedule: schedules.DPSchedule, delta: float, accountants: Sequence[str] = registry.ACCOUNTANT_NAMES
) -> ReportRow:
    """The `ReportRow` of one schedule; 'own' is the baseline's accountant for 'zcdp' / 'tcdp', else
    `schedule.calibration`'s (none for a schedule built by hand)."""
    delta = validation.check_delta(delta)
    accountants = validation.check_subset("accountants", accountants, registry.ACCOUNTANT_NAMES)
    if method in schedules.BASELINES:
        own = cdp.baseline_epsilon(method, schedule.sampling_probability, schedule.noise_multipliers, delta)
        calibrated_by = method
    elif schedule.calibration is not None:
        calibrated_by = schedule.calibration.accountant
        own = schedule.epsilon(delta, calibrated_by)
    else:
        own, calibrated_by = None, "-"
    multipliers = schedule.noise_multipliers
    return ReportRow(
        method=method,
        calibrated_by=calibrated_by,
        num_steps=schedule.num_steps,
        first_noise_multiplier=float(multipliers[0]),
        last_noise_multiplier=float(multipliers[-1]),
        first_clip_norm=float(schedule.clip_norms[0]),
        last_clip_norm=float(schedule.clip_norms[-1]),
        epsilon_own=own,
        epsilons={name: schedule.epsilon(delta, name) for name in accountants},
    )


def report_rows(
    named_schedules: Mapping[str, schedules.DPSchedule],
    delta: float,
    accountants: Sequence[str] = registry.ACCOUNTANT_NAMES,
) -> list[ReportRow]:
    """`schedule_row` for each (method, schedule), in order."""
    return [schedule_row(method, schedule, delta, accountants) for method, schedule in named_schedules.items()]


def format_table(rows: Sequence[ReportRow]) -> str:
    """Fixed-width text table, a line per row, an epsilon column per accountant ('-' where not computed)."""
    headers = ("method", "calibrated_by", "T", "z_first", "z_last", "C_first", "C_last", "eps_own") + tuple(
        f"eps_{name}" for name in registry.ACCOUNTANT_NAMES
    )

    def cells(row: ReportRow) -> tuple[str, ...]:
        values = [row.first_noise_multiplier, row.last_noise_multiplier, row.first_clip_norm, row.last_clip_norm]
        values += [row.epsilon_own, *(row.epsilons.get(name) for name in registry.ACCOUNTANT_NAMES)]
        return (row.method, row.calibrated_by, str(row.num_steps), *("-" if v is None else f"{v:.4g}" for v in values))

    lines = [headers] + [cells(row) for row in rows]
    widths = [max(len(line[column]) for line in lines) for column in range(len(headers))]
    return "\n".join("  ".join(cell.rjust(width) for cell, width in zip(line, widths)).rstrip() for line in lines)


def curve_steps(num_steps: int, num_points: int = DEFAULT_NUM_POINTS) -> np.ndarray:
    """About `num_points` distinct step counts from 1 to T, evenly spaced (always ending at T)."""
    num_steps = validation.check_positive_int("num_steps", num_steps)
    num_points = validation.check_positive_int("num_points", num_points)
    return np.unique(np.linspace(1, num_steps, min(num_points, num_steps)).round().astype(int))


def epsilon_curves(
    schedule: schedules.DPSchedule,
    delta: float,
    accountants: Sequence[str] = registry.ACCOUNTANT_NAMES,
    num_points: int = DEFAULT_NUM_POINTS,
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """(steps [K], {accountant: epsilons [K]}): epsilon of the first k steps for about `num_points` values of k,
    one cumulative pass per accountant (`epsilons_at`)."""
    delta = validation.check_delta(delta)
    accountants = validation.check_subset("accountants", accountants, registry.ACCOUNTANT_NAMES)
    steps = curve_steps(schedule.num_steps, num_points)
    return steps, {name: schedule.epsilons_at(delta, steps, name) for name in accountants}


def _save(figure, path: str) -> str:
    figure.savefig(path, dpi=100)
    return path


def _new_figure(title: str, num_panels: int = 1):
    """A figure of `num_panels` stacked axes sharing the step axis; the first plots epsilon over steps."""
    from matplotlib.figure import Figure  # pylint: disable=import-outside-toplevel  (slow import, plots only)

    figure = Figure(figsize=(6.0, 4.0 + 2.0 * (num_panels - 1)), layout="constrained")
    panels = list(figure.subplots(num_panels, 1, sharex=True, squeeze=False)[:, 0])
    panels[0].set_title(title)
    panels[0].set_ylabel("epsilon of the first k steps")
    panels[-1].set_xlabel("step k")
    for axes in panels:
        axes.grid(alpha=0.3)
    return figure, panels


def plot_epsilon_consumption(
    path: str,
    *,
    target_epsilon: float,
    target_delta: float,
    sampling_probability: float,
    num_steps: int,
    initial_clip: float = 1.0,
    rho_mus: Sequence[float] = DEFAULT_CONSUMPTION_RHO_MUS,
    num_points: int = DEFAULT_NUM_POINTS,
    accountant: str = registry.DEFAULT_ACCOUNTANT,
) -> str:
    """Paper Fig. 2 (the paper used 'gdp_clt'): epsilon of the first k steps of growing-mu schedules, one curve per
    rho_mu, calibrated and measured under `accountant` (every curve ends at the target). A PNG at `path`, returned."""
    figure, (axes,) = _new_figure(f"Privacy budget consumption ({accountant}), epsilon = {target_epsilon:g}")
    budget = {"target_epsilon": target_epsilon, "target_delta": target_delta, "num_steps": num_steps}
    budget.update(sampling_probability=sampling_probability, initial_clip=initial_clip, accountant=accountant)
    for rho_mu in rho_mus:
        schedule = schedules.calibrate("growing_mu", rho_mu=rho_mu, **budget)
        steps, curves = epsilon_curves(schedule, target_delta, [accountant], num_points)
        axes.plot(steps, curves[accountant], label=f"1/rho_mu = {1 / rho_mu:.2g}")
    axes.legend()
    return _save(figure, path)


def plot_accountant_comparison(
    path: str,
    schedule: schedules.DPSchedule,
    delta: float,
    accountants: Sequence[str] = registry.ACCOUNTANT_NAMES,
    num_points: int = DEFAULT_NUM_POINTS,
    title: str = "Epsilon over steps by accountant",
) -> str:
    """Paper Fig. 3: epsilon of the first k steps of one schedule under each accountant (the GDP-CLT may fall below
    the rigorous RDP and PLD). A PNG at `path`, returned."""
    steps, curves = epsilon_curves(schedule, delta, accountants, num_points)
    figure, (axes,) = _new_figure(title)
    for name, values in curves.items():
        axes.plot(steps, values, label=name)
    axes.legend()
    return _save(figure, path)


def plot_run_privacy(
    path: str,
    schedule: schedules.DPSchedule,
    delta: float,
    steps: Sequence[int],
    accountant: str = registry.DEFAULT_ACCOUNTANT,
    title: str = "Privacy of the run",
) -> str:
    """A run's privacy: epsilon of its first k steps under `accountant` at each k of `steps` (e.g. the epoch ends; a
    few points keep it fast), above C_t and sigma_t of the steps taken. A PNG at `path`, returned.

    Raises:
      ValueError: if `steps` is empty or holds a count outside [1, T], or on a bad `delta` or `accountant`.
    """
    delta, entry = validation.check_delta(delta), registry.get(accountant)
    counts = np.unique(np.asarray(steps, dtype=np.int64))
    if counts.size == 0 or counts[0] < 1 or counts[-1] > schedule.num_steps:
        raise ValueError(
            f"`steps` must hold step counts in [1, T = {schedule.num_steps}]. Received: steps={list(steps)}."
        )
    epsilons, taken = schedule.epsilons_at(delta, counts, entry.name), np.arange(1, counts[-1] + 1)
    figure, (privacy, knobs) = _new_figure(title, num_panels=2)
    label = f"{accountant}, delta = {delta:.3g}"  # plotted from (0, 0): no step, no privacy spent
    privacy.plot(np.concatenate([[0], counts]), np.concatenate([[0.0], epsilons]), marker="o", label=label)
    if schedule.calibration is not None:
        privacy.axhline(schedule.calibration.target_epsilon, color="grey", linestyle="--", label="target epsilon")
    privacy.legend()
    knobs.plot(taken, schedule.clip_norms[: taken.size], label="clip norm C_t")
    knobs.plot(taken, schedule.noise_stddevs[: taken.size], label="noise std sigma_t (on the clipped sum)")
    knobs.set_ylabel("C_t, sigma_t")
    knobs.legend()
    return _save(figure, path)


@dataclasses.dataclass(frozen=True)
class RunSummary:
    """The privacy summary of a finished run: `text` (what ``str`` gives, to print) and the epsilons it states.

    Attributes:
      text: the lines of the summary.
      epsilon_gdp_clt: the GDP-CLT epsilon of the steps taken (the paper's approximation; inf: no guarantee).
      epsilon_rigorous: the epsilon of the steps taken under `rigorous_accountant` (inf: no guarantee).
      rigorous_accountant: 'pld' or 'rdp'; 'none' for a run without a schedule.
      delta_total: the delta both epsilons hold at: the ``delta`` asked for plus what capping the Poisson batches
        adds (`keras_dyndp.core.batch_sizes.added_delta`); 1 for a run without a schedule.
    """

    text: str
    epsilon_gdp_clt: float
    epsilon_rigorous: float
    rigorous_accountant: str
    delta_total: float = 1.0

    def __str__(self) -> str:
        return self.text


def _baseline_lines(method: str, schedule: schedules.DPSchedule, delta: float, taken: int) -> list[str]:
    """The epsilon a noise-decay baseline ('zcdp', 'tcdp') claims under its own accountant; nothing for the others."""
    if method not in schedules.BASELINES:
        return []
    multipliers = schedule.noise_multipliers[:taken]
    own = cdp.baseline_epsilon(method, schedule.sampling_probability, multipliers, delta) if taken else 0.0
    lines = [f"    {method} (the baseline's own accountant): {own:.4f}"]
    if method == "tcdp":  # Its theorem is for fixed-size batches (keras_dyndp.accounting.cdp).
        lines.append(
            "      (its claim for fixed-size batches drawn without replacement, replace-one neighbours; "
            "not a guarantee of this Poisson-sampled run)"
        )
    return lines


def _caveat_lines(training_metrics: bool, sampling: str, seed: int | None, notes: Sequence[str]) -> list[str]:
    """What the epsilons do not cover: training metrics, shuffled batches, a known seed, the caller's notes."""
    if training_metrics:
        lines = [
            "  NOTE: training_metrics: the training loss and accuracy shown were computed on the private batches "
            "without noise; they are OUTSIDE the DP guarantee (one example can move them visibly). Do not publish them."
        ]
    else:
        lines = ["  training batches: no loss or metric computed (only the noised updates leave them)."]
    if sampling != "poisson":
        drawn = {"shuffle": "shuffled"}.get(sampling, sampling)
        lines.append(f"  NOTE: {drawn} batches; these epsilons assume Poisson sampling and are approximate.")
    if seed is not None:
        lines.append(f"  NOTE: seed {seed} fixes the sampling and noise; do not release this model.")
    return lines + [f"  NOTE: {note}" for note in notes]


def _delta_lines(schedule, delta: float, steps: int, epsilon: float, overflow_probability: float | None):
    """The delta the epsilons hold at, ``delta`` plus the cap's (`batch_sizes.added_delta` at the largest ``epsilon``,
    if ``overflow_probability`` is given), and the line saying so, naming a ``delta`` other than the target's."""
    added = batch_sizes.added_delta(overflow_probability or 0.0, steps, epsilon)
    calibration = schedule.calibration
    other = calibration is not None and delta != calibration.target_delta
    target = f" (NOT the budget's target delta {calibration.target_delta:.3g})" if other else ""
    if overflow_probability is None:
        return delta, [f"  epsilon at delta = {delta:.3g}{target}:"]
    total = f" + {added:.3g} (the batches' cap, max_batch_size) = {delta + added:.3g}"
    return delta + added, [f"  epsilon at delta = {delta:.3g}{target}{total}:"]


def _calibration_lines(schedule, calibrated_under: str | None, target_epsilon: float | None) -> list[str]:
    """The line naming the accountant and target the budget was calibrated to (the schedule's `calibration` unless
    given), or none when neither is known."""
    calibration = schedule.calibration
    calibrated_under = calibrated_under or (calibration.accountant if calibration else None)
    target_epsilon = target_epsilon if target_epsilon is not None else (calibration and calibration.target_epsilon)
    if calibrated_under and target_epsilon is not None:
        return [f"  budget calibrated under {calibrated_under}: target epsilon {target_epsilon:g}"]
    return []


def _clip_line(schedule: schedules.DPSchedule, method: str, last: int) -> str:
    """The summary's line on C_t and sigma_t (with adaptive clipping: C_0 and the noise multipliers z_t)."""
    if method == "adaptive":
        z = schedule.noise_multipliers
        return (
            f"  clip C_t: adapted from C_0 = {schedule.clip_norms[0]:.4g} (adaptive clipping); noise multiplier z_t "
            f"{z[0]:.4g} -> {z[last]:.4g}, shared by the gradient and the count of unclipped examples"
        )
    return (
        f"  clip C_t: {schedule.clip_norms[0]:.4g} -> {schedule.clip_norms[last]:.4g}; noise std on the "
        f"clipped sum sigma_t: {schedule.noise_stddevs[0]:.4g} -> {schedule.noise_stddevs[last]:.4g}"
    )


def run_summary(
    schedule: schedules.DPSchedule | None,
    delta: float,
    steps: int,
    *,
    method: str,
    privacy_unit: str = "training example",
    accountant: str = registry.DEFAULT_ACCOUNTANT,
    sampling: str = "poisson",
    training_metrics: bool = False,
    seed: int | None = None,
    calibrated_under: str | None = None,
    target_epsilon: float | None = None,
    notes: Sequence[str] = (),
    overflow_probability: float | None = None,
) -> RunSummary:
    """The privacy summary a trainer prints after training: what was protected, the steps taken, C_t and sigma_t,
    the epsilon of the steps taken under the GDP-CLT and a rigorous accountant, the budget, and what the epsilons
    do not cover.

    Args:
      schedule: the run's `DPSchedule`; None for a run without DP (the summary then says there is no guarantee).
      delta: the delta of the epsilons, in (0, 1).
      steps: the DP steps taken (the optimizer's ``dp_step``), >= 0; a run may stop before the schedule's T.
      method: the schedule's method, for the header ('dynamic', 'vanilla', ..., 'zcdp', 'tcdp', 'nonprivate'; 'adaptive'
        for the vanilla schedule with adaptive clipping, whose C_t the schedule does not hold).
      privacy_unit: what one protected record is ('training example', 'client', ...): add-or-remove-one adjacency.
      accountant: the rigorous accountant reported beside the GDP-CLT, 'pld' (tightest) or 'rdp'.
      sampling: how the batches were drawn; anything but 'poisson' is flagged (the accountants assume Poisson).
      training_metrics: whether training-batch loss and metrics were computed (outside the guarantee): flagged.
      seed: the seed of the sampling and noise, if one was fixed (flagged: the noise is then known).
      calibrated_under: the accountant the budget was calibrated under; default the schedule's `calibration`'s.
      target_epsilon: the calibration's target epsilon; default the schedule's `calibration`'s.
      notes: further lines of what the guarantee does not cover (e.g. a vocabulary learnt from the private data).
      overflow_probability: the optimizer's `overflow_probability` after ``fit``, in [0, 1]: its added delta enters
        the total delta stated. None (not known): the epsilons are stated at ``delta`` alone.

    Returns:
      A `RunSummary`; ``print(run_summary(...))`` prints its text.
    """
    if schedule is None:
        return RunSummary(f"Privacy: none ({method}: no DP guarantee).", np.inf, np.inf, "none")
    delta = validation.check_delta(delta)
    eps_clt = schedule.epsilon(delta, accountant="gdp_clt", steps=steps)
    eps_rigorous = schedule.epsilon(delta, accountant=accountant, steps=steps)
    last = max(steps - 1, 0)  # steps <= T: schedule.epsilon refused more.
    total, delta_lines = _delta_lines(schedule, delta, steps, max(eps_clt, eps_rigorous), overflow_probability)
    lines = [
        f"Privacy report ({method}, per {privacy_unit}, add-or-remove-one adjacency):",
        f"  sampling: {sampling}, p = {schedule.sampling_probability:.6g}; steps taken {steps} of the schedule's "
        f"{schedule.num_steps}",
        _clip_line(schedule, method, last),
        *delta_lines,
        f"    GDP-CLT (the paper's accountant; an approximation that can understate: not one to quote): {eps_clt:.4f}",
        f"    {accountant.upper()} (rigorous upper bound): {eps_rigorous:.4f}",
        *_baseline_lines(method, schedule, delta, steps),
    ]
    lines += _calibration_lines(schedule, calibrated_under, target_epsilon)
    lines += _caveat_lines(training_metrics, sampling, seed, notes)
    return RunSummary("\n".join(lines), float(eps_clt), float(eps_rigorous), accountant, total)
