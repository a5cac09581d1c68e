"""The study's report: each contender's selected configuration and its final runs summarised over seeds (`summary`),
as a markdown table (`markdown_table`, with the paired difference to tuned vanilla) and a plot of test accuracy
against epsilon (`plot`)."""

from __future__ import annotations

import statistics

from research.contenders import CONTENDERS


def _mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def summary(rows: list[dict]) -> list[dict]:
    """Per (epsilon, contender): the selection and its final runs' test accuracy, epsilons and wall times."""
    result = []
    finals = [row for row in rows if row["phase"] == "final"]
    tunes = [row for row in rows if row["phase"] == "tune"]
    for epsilon in sorted({float(row["epsilon"]) for row in finals}):
        for name in CONTENDERS:
            group = [row for row in finals if float(row["epsilon"]) == epsilon and row["contender"] == name]
            if not group:
                continue
            tuning = [row for row in tunes if float(row["epsilon"]) == epsilon and row["contender"] == name]
            chosen = next(row for row in tuning if row["config_index"] == group[0]["config_index"])
            mean, std = _mean_std([float(row["test_accuracy"]) for row in group])
            result.append(
                dict(
                    epsilon=epsilon,
                    contender=name,
                    mean=mean,
                    std=std,
                    n=len(group),
                    by_seed={row["seed"]: float(row["test_accuracy"]) for row in group},
                    validation_accuracy=float(chosen["test_accuracy"]),
                    config=group[0],
                    epsilon_pld=max(float(row["epsilon_pld"]) for row in group),
                    epsilon_rdp=max(float(row["epsilon_rdp"]) for row in group),
                    final_wall_s=statistics.median(float(row["wall_time_s"]) for row in group),
                    tuning_wall_s=sum(float(row["wall_time_s"]) for row in tuning),
                    tuned=len(tuning),
                )
            )
    return result


def _hyperparameters(row: dict) -> str:
    parts = [f"lr {float(row['learning_rate']):.3g}", f"C_0 {float(row['initial_clip']):.3g}"]
    for name, label in (("rho_mu", "1/ρ_μ"), ("rho_c", "1/ρ_c"), ("lr_decay", "1/lr_decay")):
        if float(row[name]) != 1.0:
            parts.append(f"{label} {1 / float(row[name]):.2f}")
    return ", ".join(parts)


def _paired_difference(entry: dict, reference: dict | None) -> str:
    """Mean ± std over the seeds both ran of entry's accuracy minus reference's (same seed: same initialisation and
    batch sampling), in points."""
    if reference is None or reference is entry:
        return "-"
    seeds = sorted(set(entry["by_seed"]) & set(reference["by_seed"]))
    if not seeds:
        return "-"
    mean, std = _mean_std([100 * (entry["by_seed"][seed] - reference["by_seed"][seed]) for seed in seeds])
    return f"{mean:+.2f} ± {std:.2f}"


def markdown_table(rows: list[dict]) -> str:
    """The study's table: one line per epsilon and contender, with its difference to vanilla paired by seed."""
    lines = [
        "| ε (PLD target) | contender | test accuracy % (mean ± std, n) | − vanilla, paired by seed | "
        "selected (#, validation %) | PLD ε | RDP ε | wall s: final run (median), tuning (sum) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    entries = summary(rows)
    for entry in entries:
        config = entry["config"]
        vanilla = next(
            (other for other in entries if other["contender"] == "vanilla" and other["epsilon"] == entry["epsilon"]),
            None,
        )
        lines.append(
            f"| {entry['epsilon']:g} | {entry['contender']} | {100 * entry['mean']:.2f} ± {100 * entry['std']:.2f} "
            f"({entry['n']}) | {_paired_difference(entry, vanilla)} | "
            f"{_hyperparameters(config)} (#{config['config_index']} of {entry['tuned']}, "
            f"{100 * entry['validation_accuracy']:.2f}) | {entry['epsilon_pld']:.3f} | {entry['epsilon_rdp']:.3f} | "
            f"{entry['final_wall_s']:.0f}, {entry['tuning_wall_s']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: str) -> None:
    """Test accuracy (mean ± std over the final seeds) against epsilon, one line per contender."""
    from matplotlib import figure

    entries = summary(rows)
    fig = figure.Figure(figsize=(6.0, 4.0))
    axes = fig.add_subplot()
    names = [name for name in CONTENDERS if any(entry["contender"] == name for entry in entries)]
    for offset, name in enumerate(names):
        own = [entry for entry in entries if entry["contender"] == name]
        # A small horizontal offset per contender keeps the error bars apart.
        shift = 1 + 0.02 * (offset - (len(names) - 1) / 2)
        axes.errorbar(
            [entry["epsilon"] * shift for entry in own],
            [100 * entry["mean"] for entry in own],
            yerr=[100 * entry["std"] for entry in own],
            marker="o",
            capsize=3,
            label=name,
        )
    axes.set_xscale("log")
    epsilons = sorted({entry["epsilon"] for entry in entries})
    axes.set_xticks(epsilons, [f"{epsilon:g}" for epsilon in epsilons])
    axes.minorticks_off()
    axes.set_xlabel("ε (PLD, δ = 1/(10N))")
    axes.set_ylabel("test accuracy (%)")
    task = rows[0]["task"] if rows else ""
    axes.set_title(f"{task}: tuned contenders at equal PLD ε", fontsize=9)
    axes.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
