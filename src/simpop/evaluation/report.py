"""The collapse experiment's report: claim verdicts from the data, markdown tables, PNG curves.

Everything here reads the experiment's outputs (``summary.json`` values and ``metrics.jsonl`` records),
so a report can be rebuilt from a finished run without training anything.

**How a claim is judged.** Conditions share seeds, so every comparison is *paired by seed*: for each
seed the difference is oriented so that a positive value supports the claim (e.g. verbalized held-out
success minus frozen held-out success), and its mean gets a two-sided 95% Student-t interval
(:func:`simpop.evaluation.metrics.mean_ci`). A comparison

- **supports** the claim when the interval lies above 0,
- points the **same direction** when only the mean is above 0,
- **contradicts** it when the mean is 0 or below.

A claim is ``reproduced`` when every comparison supports it, ``not reproduced`` when any comparison
contradicts it, and ``inconclusive`` otherwise (right direction, not significant with these seeds).
The claims and their comparisons are spelled out in :func:`judge_claims`; nothing is hard-coded.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from simpop.evaluation.metrics import mean_ci

#: The baseline condition and the fixes it is compared with.
FROZEN = "frozen"
FIXES = ("verbalized", "cotrain", "population")
#: "Falls toward zero": the frozen policy's final entropy is below this share of its initial entropy.
ENTROPY_COLLAPSE_RATIO = 0.25

SUPPORTS, SAME_DIRECTION, CONTRADICTS = "supports", "same direction, CI includes 0", "contradicts"
REPRODUCED, INCONCLUSIVE, NOT_REPRODUCED = "reproduced", "inconclusive", "not reproduced"

#: Summary metrics (key -> table header), in table order.
SUMMARY_METRICS = {
    "train_success": "training-sim success",
    "heldout_success": "held-out success",
    "collapse_gap": "collapse gap",
    "policy_entropy": "policy entropy (nats)",
    "zero_var_frac": "zero-variance groups",
}


def stat(values: Sequence[float]) -> dict[str, Any]:
    """``{"mean", "ci_low", "ci_high", "n", "per_seed"}`` of per-seed values (95% Student-t CI)."""
    mean, lo, hi = mean_ci([float(v) for v in values])
    return {"mean": mean, "ci_low": lo, "ci_high": hi, "n": len(values), "per_seed": [float(v) for v in values]}


@dataclass
class Comparison:
    """One paired test: per-seed differences oriented so that > 0 supports the claim."""

    label: str
    differences: list[float]
    mean: float = math.nan
    ci_low: float = math.nan
    ci_high: float = math.nan
    status: str = CONTRADICTS

    def __post_init__(self) -> None:
        self.mean, self.ci_low, self.ci_high = mean_ci(self.differences)
        if not math.isfinite(self.mean) or self.mean <= 0:
            self.status = CONTRADICTS
        elif self.ci_low > 0 and len(self.differences) > 1:
            self.status = SUPPORTS
        else:
            self.status = SAME_DIRECTION


@dataclass
class Verdict:
    """A claim, the comparisons that test it, and the verdict they imply."""

    claim: str
    statement: str
    comparisons: list[Comparison] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        statuses = {c.status for c in self.comparisons}
        if not self.comparisons or CONTRADICTS in statuses:
            return NOT_REPRODUCED
        return REPRODUCED if statuses == {SUPPORTS} else INCONCLUSIVE

    def to_dict(self) -> dict[str, Any]:
        return {"claim": self.claim, "statement": self.statement, "verdict": self.verdict,
                "comparisons": [asdict(c) for c in self.comparisons]}


def _per_seed(conditions: Mapping[str, Any], condition: str, metric: str) -> np.ndarray:
    return np.asarray(conditions[condition]["metrics"][metric]["per_seed"], dtype=float)


def judge_claims(conditions: Mapping[str, Any]) -> list[Verdict]:
    """The three claims of the paper, tested on a summary's ``conditions`` (see the module docstring).

    (a) Under the frozen simulator training success rises (final minus initial training-simulator
        success) while held-out success ends below every fix (fix minus frozen, final held-out).
    (b) Its policy entropy falls (initial minus final), toward zero (``ENTROPY_COLLAPSE_RATIO`` x
        initial minus final), and stays higher under every fix (fix minus frozen, final entropy).
    (c) Its zero-variance group fraction is higher than under every fix (frozen minus fix).

    Fixes absent from ``conditions`` are skipped; the frozen condition is required.
    """
    if FROZEN not in conditions:
        raise ValueError(f"the summary has no {FROZEN!r} condition; claims compare every fix with it")
    fixes = [f for f in FIXES if f in conditions]
    ps = lambda c, m: _per_seed(conditions, c, m)  # noqa: E731 - local shorthand

    a = Verdict("a", "Under the frozen simulator, training success rises while held-out success ends below "
                     "both fixes.")
    a.comparisons.append(Comparison("frozen: final - initial training-sim success",
                                    list(ps(FROZEN, "train_success") - ps(FROZEN, "initial_train_success"))))
    for fix in fixes:
        a.comparisons.append(Comparison(f"held-out success: {fix} - frozen",
                                        list(ps(fix, "heldout_success") - ps(FROZEN, "heldout_success"))))

    b = Verdict("b", "The frozen simulator's policy entropy falls toward zero and stays above zero under the "
                     "fixes.")
    initial, final = ps(FROZEN, "initial_policy_entropy"), ps(FROZEN, "policy_entropy")
    b.comparisons.append(Comparison("frozen: initial - final entropy", list(initial - final)))
    b.comparisons.append(Comparison(f"frozen: {ENTROPY_COLLAPSE_RATIO:g} x initial - final entropy",
                                    list(ENTROPY_COLLAPSE_RATIO * initial - final)))
    for fix in fixes:
        b.comparisons.append(Comparison(f"final entropy: {fix} - frozen",
                                        list(ps(fix, "policy_entropy") - final)))

    c = Verdict("c", "The frozen simulator's zero-variance group fraction is higher.")
    for fix in fixes:
        c.comparisons.append(Comparison(f"zero-variance fraction: frozen - {fix}",
                                        list(ps(FROZEN, "zero_var_frac") - ps(fix, "zero_var_frac"))))
    return [a, b, c]


# ============================================================================================ markdown
def _cell(s: Mapping[str, Any], digits: int = 3) -> str:
    if not math.isfinite(s["mean"]):
        return "n/a"
    return f"{s['mean']:.{digits}f} [{s['ci_low']:.{digits}f}, {s['ci_high']:.{digits}f}]"


def summary_table(conditions: Mapping[str, Any]) -> str:
    """Markdown table: one row per condition, one column per :data:`SUMMARY_METRICS` (mean [95% CI])."""
    head = "| condition | " + " | ".join(SUMMARY_METRICS.values()) + " |"
    rows = [head, "|" + "---|" * (len(SUMMARY_METRICS) + 1)]
    for name, cond in conditions.items():
        rows.append(f"| {name} | " + " | ".join(_cell(cond["metrics"][m]) for m in SUMMARY_METRICS) + " |")
    return "\n".join(rows)


def verdict_section(verdicts: Sequence[Verdict]) -> str:
    """Markdown: each claim, its verdict, and the paired comparisons behind it."""
    lines = []
    for v in verdicts:
        lines += [f"### Claim ({v.claim}): {v.verdict.upper()}", "", v.statement, "",
                  "| paired comparison (> 0 supports the claim) | mean | 95% CI | result |", "|---|---|---|---|"]
        for c in v.comparisons:
            lines.append(f"| {c.label} | {c.mean:+.3f} | [{c.ci_low:+.3f}, {c.ci_high:+.3f}] | {c.status} |")
        lines.append("")
    return "\n".join(lines)


def render_report(summary: Mapping[str, Any], verdicts: Sequence[Verdict], plots: Sequence[str]) -> str:
    """The whole ``report.md``: setup, summary table, verdicts, how each condition was built, plots."""
    conditions = summary["conditions"]
    setup = summary["setup"]
    counts = {v.verdict: 0 for v in verdicts}
    for v in verdicts:
        counts[v.verdict] += 1
    lines = [
        "# Simulator collapse on Persuasion-for-Good",
        "",
        f"Level: **{setup['level']}** (`{setup['env_id']}`); seeds {setup['seeds']}; {setup['updates']} policy "
        f"updates of {setup['batch_size']} dialogues per condition (equal budgets); held-out evaluation every "
        f"{setup['eval_every']} updates on {setup['eval_episodes']} dialogues per panel member and on the "
        f"training simulator(s). Wall time {summary['wall_time_s']:.0f} s.",
        "",
        "Values are the mean over seeds with a 95% Student-t CI"
        + (" (one seed: the intervals collapse to the value, and no claim can be significant)"
           if len(setup["seeds"]) == 1 else "")
        + ". *Final* = the last evaluation. "
        "Collapse gap = training-simulator success - held-out success. Policy entropy = "
        + ("mean per-token entropy (nats) of the policy's generated tokens" if setup["level"] == "text"
           else "mean entropy (nats) of the policy's action distribution over its decisions")
        + " in the held-out dialogues. Zero-variance groups = share of GRPO groups whose rewards were all "
        "equal, averaged over all updates.",
        "",
        "## Summary (final values)",
        "",
        summary_table(conditions),
        "",
        "## Verdicts",
        "",
        "Each claim is tested with paired-by-seed differences (see `simpop.evaluation.report`): "
        "*reproduced* = every comparison's CI lies above 0; *not reproduced* = some comparison's mean "
        "goes the other way; *inconclusive* = the right direction without significance. "
        + ", ".join(f"{n} {k}" for k, n in counts.items()) + ".",
        "",
        verdict_section(verdicts),
        "## How each condition's simulator is built",
        "",
    ]
    for name, cond in conditions.items():
        lines.append(f"- **{name}**: {cond['description']}")
    lines += ["", f"- **held-out panel**: {setup['panel']}", "", "## Plots", ""]
    lines += [f"![{Path(p).stem}]({Path(p).name})" for p in plots]
    return "\n".join(lines) + "\n"


# ============================================================================================== plots
#: (file stem, metrics.jsonl kind, metric key, y label, (low, high) range of the metric) of each plot.
PLOTS = (
    ("heldout_success", "eval", "heldout_success", "held-out panel success", (0.0, 1.0)),
    ("train_success", "eval", "train_success", "training-simulator success", (0.0, 1.0)),
    ("policy_entropy", "eval", "policy_entropy", "policy entropy (nats, held-out dialogues)", (0.0, None)),
    ("zero_var_frac", "train", "zero_var_frac", "zero-variance group fraction", (0.0, 1.0)),
)


def curves(records: Sequence[Mapping[str, Any]], kind: str, metric: str
           ) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """Per condition: ``(steps, mean, ci_low, ci_high)`` of ``metric`` over seeds at each step.

    Only steps that every seed of the condition reached are kept (a partial run does not bend the curve).
    """
    by: dict[str, dict[int, dict[int, float]]] = {}
    for r in records:
        if r.get("kind") != kind or metric not in r or r[metric] is None:
            continue
        by.setdefault(r["condition"], {}).setdefault(int(r["step"]), {})[int(r["seed"])] = float(r[metric])
    out = {}
    for condition, steps in by.items():
        seeds = set().union(*steps.values())
        kept = sorted(s for s, values in steps.items() if set(values) == seeds)
        stats = np.array([mean_ci(list(steps[s].values())) for s in kept]).reshape(-1, 3)
        out[condition] = (np.array(kept), stats[:, 0], stats[:, 1], stats[:, 2])
    return out


def plot_curves(records: Sequence[Mapping[str, Any]], out_dir: str | Path, order: Sequence[str] = ()) -> list[Path]:
    """Write one PNG per :data:`PLOTS` entry (a line per condition, 95% CI band over seeds)."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    paths = []
    for stem, kind, metric, label, (low, high) in PLOTS:
        data = curves(records, kind, metric)
        if not data:
            continue
        names = [c for c in order if c in data] + sorted(c for c in data if c not in order)
        fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=110)
        for name in names:
            steps, mean, lo, hi = data[name]
            (line,) = ax.plot(steps, mean, label=name, linewidth=1.8)
            # A t-interval can leave the metric's range (e.g. above 1 for a rate); draw only the possible part.
            ax.fill_between(steps, np.clip(lo, low, high), np.clip(hi, low, high), color=line.get_color(), alpha=0.2,
                            linewidth=0)
        ax.set_xlabel("policy updates")
        ax.set_ylabel(label)
        ax.set_title(f"{label} (mean, 95% CI over seeds)", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = out_dir / f"{stem}.png"
        fig.savefig(path)
        plt.close(fig)
        paths.append(path)
    return paths
