"""An evaluation's summary and report: success per member and overall with Wilson intervals, per task, policy entropy
(``summary.json``), the markdown report (``report.md``) and the chart (``success.png``). ``simpop study`` reports
with the same chart and constants."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from simpop.evaluation.metrics import wilson_ci
from simpop.evaluation.eval_tau2 import tau2_env
from simpop.evaluation.panel import EpisodeRecord

SUMMARY, REPORT, CHART = "summary.json", "report.md", "success.png"
CI_LEVEL = 0.95


def _rate(records: Sequence[EpisodeRecord]) -> dict[str, Any]:
    n, wins = len(records), sum(bool(r.success) for r in records)
    rate, lo, hi = wilson_ci(wins, n, CI_LEVEL)
    return {"episodes": n, "successes": wins, "success": _num(rate), "ci_low": _num(lo), "ci_high": _num(hi)}


def _num(x: float) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def _entropy(records: Sequence[EpisodeRecord]) -> float | None:
    weighted = [(r.entropy, r.entropy_weight) for r in records if r.entropy is not None and r.entropy_weight > 0]
    total = sum(w for _, w in weighted)
    return float(sum(e * w for e, w in weighted) / total) if total else None


def summarize(records: Sequence[EpisodeRecord], members: Mapping[str, str], settings: Mapping[str, Any],
              planned: int | None = None) -> dict[str, Any]:
    """The summary of ``records`` (in plan order): overall, per member and per task (module docstring).

    ``planned`` is how many episodes the evaluation plans in all (``complete`` says whether all are in).
    """
    by_member = {m: [r for r in records if r.member == m] for m in members}
    tasks: dict[str, list[EpisodeRecord]] = {}
    for r in records:
        tasks.setdefault(r.scenario, []).append(r)
    summary: dict[str, Any] = {
        "env": settings["env"], "env_kwargs": settings["env_kwargs"], "policy": settings["policy"],
        "panel": settings["panel"], "seed": settings["seed"], "episodes_per_member": settings["episodes"],
        "num_trials": settings["num_trials"], "ci": {"level": CI_LEVEL, "method": "wilson"},
        **_rate(records), "errors": sum(r.error is not None for r in records),
        "invalid_actions": sum(r.invalid_actions for r in records), "entropy": _entropy(records),
        "mean_reward": _num(float(np.mean([r.reward for r in records]))) if records else None,
        "members": {}, "tasks": {},
    }
    for m, spec in members.items():
        rs = by_member[m]
        summary["members"][m] = {"spec": spec, **_rate(rs), "errors": sum(r.error is not None for r in rs),
                                 "invalid_actions": sum(r.invalid_actions for r in rs), "entropy": _entropy(rs),
                                 "mean_reward": _num(float(np.mean([r.reward for r in rs]))) if rs else None}
    for task, rs in tasks.items():
        summary["tasks"][task] = {**_rate(rs), "per_member": {
            m: {"episodes": len(x), "successes": sum(bool(r.success) for r in x)}
            for m in members if (x := [r for r in rs if r.member == m])}}
    summary["planned"] = planned
    summary["complete"] = planned is None or len(records) == planned
    summary["tau2"] = {} if settings["env"] and tau2_env(settings["env"]) else None
    return summary


def render_report(summary: Mapping[str, Any]) -> str:
    """``report.md``: the panel card, the member table with Wilson intervals, τ² pass^k, per-task results."""
    def pct(x: Any) -> str:
        return "n/a" if x is None else f"{x:.3f}"

    def ci(s: Mapping[str, Any]) -> str:
        return "n/a" if s["ci_low"] is None else f"[{s['ci_low']:.3f}, {s['ci_high']:.3f}]"

    lines = [f"# simpop eval: `{summary['policy']}` on `{summary['env']}`", "",
             f"Panel `{summary['panel']}`, seed {summary['seed']}, "
             + (f"{summary['num_trials']} trial(s) of every task" if summary["num_trials"]
                else f"{summary['episodes_per_member']} episode(s) per member")
             + f". Success with Wilson {int(CI_LEVEL * 100)}% intervals.", "",
             "## Panel card", ""]
    check = summary.get("heldout_check")
    if check:
        alike = check["look_alikes"]
        lines += [f"Held out from the training simulators of `{check['run']}` "
                  + ("(strict: every axis differs)." if check["strict"] else
                     "(no member is a training simulator; what a member shares with one is named)."), "",
                  "| member | spec | shared with training |", "|---|---|---|"]
        lines += [f"| {m} | `{s['spec']}` | {'; '.join(alike.get(m, [])) or '-'} |"
                  for m, s in summary["members"].items()]
    else:
        lines += ["| member | spec |", "|---|---|"]
        lines += [f"| {m} | `{s['spec']}` |" for m, s in summary["members"].items()]
    lines += ["", "## Success", "",
              "| member | episodes | successes | success | 95% CI | errors | invalid actions | mean reward | entropy |",
              "|---|---:|---:|---:|---|---:|---:|---:|---:|"]
    rows = [*summary["members"].items(), ("**all**", summary)]
    for m, s in rows:
        lines.append(f"| {m} | {s['episodes']} | {s['successes']} | {pct(s['success'])} | {ci(s)} | {s['errors']} | "
                     f"{s['invalid_actions']} | {pct(s['mean_reward'])} | {pct(s['entropy'])} |")
    tau2 = summary.get("tau2")
    if tau2:
        lines += ["", "## τ² pass^k", ""]
        if tau2.get("pass_hat_k"):
            ks = list(tau2["pass_hat_k"])
            lines += ["| member | " + " | ".join(f"pass^{k}" for k in ks) + " |", "|---|" + "---:|" * len(ks)]
            for m, values in tau2.get("pass_hat_k_per_member", {}).items():
                lines.append(f"| {m} | " + " | ".join(pct(values.get(k)) for k in ks) + " |")
            lines.append("| **all** | " + " | ".join(pct(tau2["pass_hat_k"][k]) for k in ks) + " |")
        for key in ("note", "error"):
            if tau2.get(key):
                lines.append(f"\n{tau2[key]}")
    lines += ["", "## Per task", "", "| task | episodes | successes | success | 95% CI |", "|---|---:|---:|---:|---|"]
    lines += [f"| {t} | {s['episodes']} | {s['successes']} | {pct(s['success'])} | {ci(s)} |"
              for t, s in summary["tasks"].items()]
    lines += ["", f"![success per member]({CHART})", ""]
    return "\n".join(lines)


def plot_success(summary: Mapping[str, Any], path: str | Path) -> Path:
    """A bar per member (and overall) with its Wilson interval as error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [*summary["members"].items(), ("all", summary)]
    names = [m for m, _ in rows]
    values = [s["success"] if s["success"] is not None else 0.0 for _, s in rows]
    low = [v - s["ci_low"] if s["ci_low"] is not None else 0.0 for v, (_, s) in zip(values, rows)]
    high = [s["ci_high"] - v if s["ci_high"] is not None else 0.0 for v, (_, s) in zip(values, rows)]
    fig, ax = plt.subplots(figsize=(max(4.0, 1.1 * len(rows) + 1.5), 3.6))
    colors = ["tab:blue"] * (len(rows) - 1) + ["tab:gray"]
    ax.bar(range(len(rows)), values, yerr=[low, high], capsize=4, color=colors)
    ax.set_xticks(range(len(rows)), names, rotation=30, ha="right")
    ax.set_ylim(0, 1)
    ax.set_ylabel(f"success ({int(CI_LEVEL * 100)}% Wilson CI)")
    ax.set_title(f"{summary['policy']} on {summary['env']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return Path(path)
