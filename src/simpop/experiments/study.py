"""The confirmatory simulator study's analysis (docs/collapse-study.md states its plan and rules; issue 46).

The study runs ``simpop experiment collapse`` in blocks of seeds (one output folder each). This module merges the
blocks' ``summary.json`` per condition and seed, then applies the pre-registered rules:

- **primary**: final human-fitted success, condition minus frozen paired by seed, two-sided paired t-tests, Holm's
  step-down over every condition at family-wise ``alpha`` (:func:`holm`): *better* / *worse with people* / *no
  difference shown*;
- **secondary** (95% t-intervals): the same difference on the held-out and robustness panels, the training
  simulator's realism index, the CPU seconds per update;
- **recommendation** (:func:`recommend`): among the conditions better with people and not worse on another panel, the
  best mean; within :data:`TIE` of it, the cheapest.

``python -m simpop.experiments.study OUT BLOCK [BLOCK ...]`` writes ``OUT/study-summary.json``, ``OUT/table.md`` and
the per-seed plots.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from simpop.experiments.power import power, read_summary

BASELINE = "frozen"
#: Differences in mean human-fitted success within which the cheaper condition is recommended.
TIE = 0.02
#: The difference the study is powered for, and the family-wise level.
DIFFERENCE, ALPHA = 0.05, 0.05
SECONDARY = {"heldout_success": "held-out", "robust_success": "robustness"}


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm-adjusted p-values (step-down, monotone, capped at 1), in the input's order."""
    order = np.argsort(pvalues, kind="stable")
    m, running, adjusted = len(pvalues), 0.0, [0.0] * len(pvalues)
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (m - rank) * float(pvalues[index])))
        adjusted[index] = running
    return adjusted


def merge(summaries: Sequence[dict[str, Any]]) -> tuple[list[int], dict[str, dict[str, list[float]]]]:
    """The seeds and, per condition and metric, the per-seed values of blocks run with the same settings.

    Raises:
        ValueError: the blocks differ in conditions or settings other than their seeds, or share a seed.
    """
    def settings(summary: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in summary["setup"]["config"].items() if k not in ("first_seed", "workers")}

    seeds: list[int] = []
    values: dict[str, dict[str, list[float]]] = {}
    for summary in summaries:
        if settings(summary) != settings(summaries[0]):
            raise ValueError("the blocks were run with different settings; merge only blocks of one plan")
        seeds += summary["setup"]["seeds"]
        for name, condition in summary["conditions"].items():
            for metric, stat in condition["metrics"].items():
                values.setdefault(name, {}).setdefault(metric, []).extend(stat["per_seed"])
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"the blocks share seeds: {sorted(s for s in set(seeds) if seeds.count(s) > 1)}")
    return seeds, values


def interval(values: Sequence[float] | np.ndarray) -> dict[str, float]:
    """Mean, 95% Student-t interval and two-sided p-value (mean 0) of ``values``."""
    from scipy import stats

    x = np.asarray(values, dtype=float)
    mean, sem = float(x.mean()), float(x.std(ddof=1) / math.sqrt(len(x)))
    half = float(stats.t.ppf(0.975, len(x) - 1)) * sem
    p = float(2 * stats.t.sf(abs(mean) / sem, len(x) - 1)) if sem > 0 else float(mean == 0)
    return {"mean": mean, "ci_low": mean - half, "ci_high": mean + half, "p": p, "n": len(x)}


def analyse(summaries: Sequence[dict[str, Any]], planned_seeds: int) -> dict[str, Any]:
    """The study's table, verdicts, recommendation and achieved power (module docstring)."""
    seeds, values = merge(summaries)
    frozen = values[BASELINE]
    others = [c for c in values if c != BASELINE]
    rows: dict[str, dict[str, Any]] = {}
    for name in [BASELINE, *others]:
        v = values[name]
        row: dict[str, Any] = {"human_success": interval(v["human_success"]),
                               "cpu_s_per_update": interval(v["cpu_s_per_update"]),
                               "cost_ratio": float(np.mean(v["cpu_s_per_update"]) / np.mean(frozen["cpu_s_per_update"]))}
        if "realism_index" in v:
            row["realism_index"] = interval(v["realism_index"])
        if name != BASELINE:
            row["human_difference"] = interval(np.subtract(v["human_success"], frozen["human_success"]))
            for metric in SECONDARY:
                row[f"{metric.split('_')[0]}_difference"] = interval(np.subtract(v[metric], frozen[metric]))
        rows[name] = row
    for name, adjusted in zip(others, holm([rows[c]["human_difference"]["p"] for c in others])):
        d = rows[name]["human_difference"]
        d["p_holm"] = adjusted
        rows[name]["verdict"] = ("no difference shown" if adjusted >= ALPHA
                                 else "better with people" if d["mean"] > 0 else "worse with people")
    recommended, reason = recommend(rows)
    variances = [float(np.var(np.subtract(values[c]["human_success"], frozen["human_success"]), ddof=1))
                 for c in others]
    sd = math.sqrt(float(np.mean(variances)))
    return {"seeds": seeds, "planned_seeds": planned_seeds, "interim": len(seeds) < planned_seeds,
            "paired_sd_human": sd, "power": power(len(seeds), DIFFERENCE, sd, ALPHA / len(others)),
            "rows": rows, "recommended": recommended, "reason": reason}


def recommend(rows: dict[str, dict[str, Any]]) -> tuple[str | None, str]:
    """The pre-registered rule: sets each row's ``recommendation``; the recommended condition (None: none) and why."""
    eligible = []
    for name, row in rows.items():
        if name == BASELINE:
            row["recommendation"] = "baseline"
            continue
        worse_on = [label for metric, label in SECONDARY.items()
                    if row[f"{metric.split('_')[0]}_difference"]["ci_high"] < 0]
        row["recommendation"] = {"worse with people": "avoid", "no difference shown": "no gain shown"}.get(
            row["verdict"], f"not recommended: worse on the {' and '.join(worse_on)} panel" if worse_on else "")
        if row["verdict"] == "better with people" and not worse_on:
            eligible.append(name)
    if not eligible:
        safe = [n for n, r in rows.items() if n == BASELINE or r["verdict"] != "worse with people"]
        cheapest = min(safe, key=lambda n: rows[n]["cpu_s_per_update"]["mean"])
        return None, (f"no condition transfers to people better than frozen at this power; the cheapest condition "
                      f"not worse with people is {cheapest}")
    best = max(rows[n]["human_difference"]["mean"] for n in eligible)
    tied = [n for n in eligible if best - rows[n]["human_difference"]["mean"] <= TIE]
    chosen = min(tied, key=lambda n: rows[n]["cpu_s_per_update"]["mean"])
    for name in eligible:
        rows[name]["recommendation"] = "recommended" if name == chosen else "also transfers"
    return chosen, (f"{chosen}: better with people than frozen (Holm), not worse on another panel, and the cheapest of "
                    f"{', '.join(tied)} (within {TIE} of the best mean)")


def table(result: dict[str, Any]) -> str:
    """The markdown table: conditions x transfer to people x cost x recommendation (each marked interim before the
    planned seeds are in: nothing is acted on from it)."""
    from simpop.experiments.collapse_report import cell

    mark = " (interim)" if result["interim"] else ""
    lines = ["| condition | human-fitted success | − frozen (95% CI) | Holm p | verdict | held-out − frozen | "
             "robustness − frozen | realism index | CPU s / update (× frozen) | recommendation |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, row in result["rows"].items():
        base = name == BASELINE
        cells = [name, cell(row["human_success"]),
                 "" if base else cell(row["human_difference"], signed=True),
                 "" if base else f"{row['human_difference']['p_holm']:.3g}", row.get("verdict", ""),
                 "" if base else cell(row["heldout_difference"], signed=True),
                 "" if base else cell(row["robust_difference"], signed=True),
                 cell(row["realism_index"]) if "realism_index" in row else "n/a",
                 f"{row['cpu_s_per_update']['mean']:.3f} (× {row['cost_ratio']:.2f})", row["recommendation"] + mark]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(seeds: Sequence[int], values: dict[str, dict[str, list[float]]], out: Path) -> list[Path]:
    """Per-seed plots: final human-fitted success per condition, and each condition minus frozen by seed."""
    from simpop.experiments.collapse_report import figure, save

    names = list(values)
    paths = []
    rng = np.random.default_rng(0)  # horizontal jitter only
    for stem, label, get in (
            ("human_success_per_seed", "final human-fitted success", lambda n: values[n]["human_success"]),
            ("human_difference_per_seed", "human-fitted success − frozen (paired by seed)",
             lambda n: np.subtract(values[n]["human_success"], values[BASELINE]["human_success"]))):
        shown = names if stem == "human_success_per_seed" else [n for n in names if n != BASELINE]
        fig, ax = figure(figsize=(8.0, 4.2))
        for i, name in enumerate(shown):
            y = np.asarray(get(name), dtype=float)
            ax.scatter(i + rng.uniform(-0.18, 0.18, len(y)), y, s=9, alpha=0.55)
            s = interval(y)
            ax.errorbar([i], [s["mean"]], yerr=[[s["mean"] - s["ci_low"]], [s["ci_high"] - s["mean"]]], fmt="o",
                        color="black", capsize=4)
        if stem != "human_success_per_seed":
            ax.axhline(0, color="grey", linewidth=0.8)
        ax.set_xticks(range(len(shown)), shown, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel(label)
        ax.set_title(f"{len(seeds)} seeds ({min(seeds)}-{max(seeds)}); black: mean and 95% CI", fontsize=9)
        ax.grid(alpha=0.3, axis="y")
        paths.append(save(fig, out / f"{stem}.png"))
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m simpop.experiments.study OUT BLOCK...``: merge the blocks, write the table and plots; returns the
    exit status."""
    from simpop.user_input import ArgumentParser, error_line, integer

    parser = ArgumentParser(prog="python -m simpop.experiments.study", description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="folder for study-summary.json, table.md and the plots")
    parser.add_argument("blocks", nargs="+", type=Path, help="finished collapse folders (or their summary.json)")
    parser.add_argument("--planned-seeds", type=integer(2), default=54, help="the pre-registered seeds (default 54)")
    args = parser.parse_args(argv)
    try:
        summaries = [read_summary(b) for b in args.blocks]
        result = analyse(summaries, args.planned_seeds)
    except (ValueError, KeyError) as error:
        print(f"{parser.prog}: error: {error_line(error)}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "study-summary.json").write_text(json.dumps({**result, "blocks": [str(b) for b in args.blocks]},
                                                            indent=2))
    (args.out / "table.md").write_text(table(result))
    seeds, values = merge(summaries)
    plot(seeds, values, args.out)
    print(table(result))
    print(f"{'INTERIM: ' if result['interim'] else ''}{len(result['seeds'])} of {args.planned_seeds} seeds; paired SD "
          f"{result['paired_sd_human']:.3f}; power for {DIFFERENCE} at alpha {ALPHA}/{len(values) - 1}: "
          f"{result['power']:.2f}; recommendation: {result['reason']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
