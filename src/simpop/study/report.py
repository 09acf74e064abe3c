"""``simpop study report DIR``: success and ratings per policy with intervals, and the paired comparison.

Per policy (arm): chats, abandoned chats (the person left; excluded from every rate below), errors (the policy
or env raised; counted as failures, as in ``simpop eval``), success with a Wilson 95% interval, mean reward,
naturalness (1-5) with a percentile-bootstrap 95% interval, would-talk-again with a Wilson interval, and mean
chat time. **Paired comparison** (each arm against the first): per participant who completed chats with both
arms, the difference of their mean success, naturalness and would-talk-again, averaged over participants with
a percentile-bootstrap 95% interval (:func:`~simpop.evaluation.metrics.bootstrap_ci` over the per-participant
differences). Outputs in ``DIR``, as ``simpop eval`` writes them: ``summary.json``, ``report.md`` and
``success.png``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from simpop.evaluation.eval_run import CHART, CI_LEVEL, REPORT, SUMMARY, plot_success
from simpop.evaluation.metrics import bootstrap_ci, wilson_ci
from simpop.evaluation.panel import EpisodeRecord
from simpop.study import storage
from simpop.study.chat import ABANDONED

#: Bootstrap resamples of the rating and paired intervals.
RESAMPLES = 10_000


def _study(r: EpisodeRecord) -> dict[str, Any]:
    return r.extra["study"]


def _abandoned(r: EpisodeRecord) -> bool:
    return (r.error or "").startswith(ABANDONED)


def _rating(r: EpisodeRecord, key: str) -> Any:
    ratings = _study(r).get("ratings")
    return ratings.get(key) if isinstance(ratings, dict) else None


def _num(x: Any) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def _wilson(k: float, n: int) -> dict[str, Any]:
    rate, lo, hi = wilson_ci(k, n, CI_LEVEL)
    return {"n": n, "count": k, "rate": _num(rate), "ci_low": _num(lo), "ci_high": _num(hi)}


def _mean(values: Sequence[float], seed: int) -> dict[str, Any]:
    mean, lo, hi = bootstrap_ci([values], level=CI_LEVEL, resamples=RESAMPLES, seed=seed)
    return {"n": len(values), "mean": _num(mean), "ci_low": _num(lo), "ci_high": _num(hi)}


def _arm(records: Sequence[EpisodeRecord], spec: str, seed: int) -> dict[str, Any]:
    kept = [r for r in records if not _abandoned(r)]
    rate = _wilson(sum(bool(r.success) for r in kept), len(kept))
    natural = [float(v) for r in kept if (v := _rating(r, "naturalness")) is not None]
    again = [bool(v) for r in kept if (v := _rating(r, "would_talk_again")) is not None]
    sources: dict[str, int] = {}
    for r in kept:
        source = str(r.info.get("outcome_source"))
        sources[source] = sources.get(source, 0) + 1
    return {"spec": spec, "chats": len(records), "abandoned": len(records) - len(kept), "episodes": len(kept),
            "errors": sum(r.error is not None for r in kept), "successes": rate["count"], "success": rate["rate"],
            "ci_low": rate["ci_low"], "ci_high": rate["ci_high"],
            "mean_reward": _num(float(np.mean([r.reward for r in kept]))) if kept else None,
            "naturalness": _mean(natural, seed), "would_talk_again": _wilson(sum(again), len(again)),
            "mean_chat_s": _num(float(np.mean([_study(r)["timings"].get("chat_s") or 0.0 for r in kept])))
            if kept else None, "outcome_sources": sources}


def _paired(records: Sequence[EpisodeRecord], a: str, b: str, seed: int) -> dict[str, Any]:
    metrics: dict[str, Callable[[EpisodeRecord], Any]] = {
        "success": lambda r: float(bool(r.success)),
        "naturalness": lambda r: _rating(r, "naturalness"),
        "would_talk_again": lambda r: None if (v := _rating(r, "would_talk_again")) is None else float(v)}
    out: dict[str, Any] = {}
    for name, value in metrics.items():
        cells: dict[tuple[str, str], list[float]] = {}
        for r in records:
            if not _abandoned(r) and (v := value(r)) is not None:
                cells.setdefault((r.member, _study(r)["policy"]), []).append(float(v))
        people = sorted({p for p, arm in cells if arm == a} & {p for p, arm in cells if arm == b})
        mean_a = [float(np.mean(cells[p, a])) for p in people]
        mean_b = [float(np.mean(cells[p, b])) for p in people]
        diff, lo, hi = bootstrap_ci([[b_ - a_ for a_, b_ in zip(mean_a, mean_b)]], level=CI_LEVEL, resamples=RESAMPLES, seed=seed)
        out[name] = {"participants": len(people), "a": _num(float(np.mean(mean_a))) if people else None,
                     "b": _num(float(np.mean(mean_b))) if people else None, "diff": _num(diff),
                     "ci_low": _num(lo), "ci_high": _num(hi)}
    return out


def summarize(records: Sequence[EpisodeRecord], settings: Mapping[str, Any], seed: int = 0) -> dict[str, Any]:
    """The study's summary (module docstring) from its saved chats."""
    policies: dict[str, str] = dict(settings["policies"])
    by_arm = {label: [r for r in records if _study(r)["policy"] == label] for label in policies}
    labels = list(policies)
    overall = _arm(records, "all", seed)
    return {"env": settings["env"], "env_kwargs": settings.get("env_kwargs", {}), "policies": policies,
            "seed": settings["seed"], "scenarios": len(settings["scenarios"]),
            "chats_per_participant": settings["chats_per_participant"],
            "ci": {"level": CI_LEVEL, "success": "wilson", "naturalness": "bootstrap",
                   "would_talk_again": "wilson", "paired": "bootstrap", "resamples": RESAMPLES},
            "participants": len({r.member for r in records}), "chats": len(records),
            "rated": sum(_study(r).get("ratings") is not None for r in records),
            "abandoned": overall["abandoned"], "errors": overall["errors"],
            "arms": {label: _arm(by_arm[label], spec, seed) for label, spec in policies.items()},
            "paired": {f"{b} - {labels[0]}": {"a": labels[0], "b": b, **_paired(records, labels[0], b, seed)}
                       for b in labels[1:]}}


def write_report(out: str | Path, seed: int = 0) -> dict[str, Any]:
    """Read the study in ``out``; write ``summary.json``, ``report.md`` and ``success.png``; return the summary."""
    out = Path(out)
    summary = summarize(storage.read_chats(out), storage.read_settings(out), seed)
    (out / SUMMARY).write_text(json.dumps(summary, indent=2, sort_keys=True, ensure_ascii=False) + "\n",
                               encoding="utf-8")
    (out / REPORT).write_text(render_report(summary), encoding="utf-8")
    chart = {"policy": "human study", "env": summary["env"], "members": summary["arms"],
             **_arm_total(summary)}
    plot_success(chart, out / CHART)
    return summary


def _arm_total(summary: Mapping[str, Any]) -> dict[str, Any]:
    """Overall success over every arm (the chart's last bar)."""
    arms = summary["arms"].values()
    k, n = sum(a["successes"] for a in arms), sum(a["episodes"] for a in arms)
    rate = _wilson(k, n)
    return {"success": rate["rate"], "ci_low": rate["ci_low"], "ci_high": rate["ci_high"]}


def render_report(summary: Mapping[str, Any]) -> str:
    """``report.md``: the policies, success and ratings per policy, the paired comparison."""
    def num(x: Any, signed: bool = False) -> str:
        return "n/a" if x is None else (f"{x:+.3f}" if signed else f"{x:.3f}")

    def ci(s: Mapping[str, Any], signed: bool = False) -> str:
        return "n/a" if s["ci_low"] is None else f"[{num(s['ci_low'], signed)}, {num(s['ci_high'], signed)}]"

    level = int(CI_LEVEL * 100)
    lines = [f"# simpop study on `{summary['env']}`", "",
             f"{summary['participants']} participant(s), {summary['chats']} chat(s) ({summary['rated']} rated, "
             f"{summary['abandoned']} abandoned, {summary['errors']} with an error), "
             f"{summary['chats_per_participant']} chat(s) per participant, {summary['scenarios']} scenario(s), "
             f"seed {summary['seed']}. Abandoned chats are left out of every rate; errors count as failures.", "",
             "## Policies (revealed)", "", "| policy | spec |", "|---|---|"]
    lines += [f"| {label} | `{spec}` |" for label, spec in summary["policies"].items()]
    lines += ["", "## Success and ratings", "",
              f"Success and would-talk-again with Wilson {level}% intervals; naturalness (1-5) with percentile "
              f"bootstrap {level}% intervals.", "",
              "| policy | chats | abandoned | errors | successes | success | 95% CI | mean reward | naturalness | "
              "95% CI | would talk again | 95% CI | mean chat s |",
              "|---|---:|---:|---:|---:|---:|---|---:|---:|---|---:|---|---:|"]
    for label, s in summary["arms"].items():
        nat, again = s["naturalness"], s["would_talk_again"]
        lines.append(f"| {label} | {s['chats']} | {s['abandoned']} | {s['errors']} | {s['successes']} | "
                     f"{num(s['success'])} | {ci(s)} | {num(s['mean_reward'])} | {num(nat['mean'])} (n={nat['n']}) | "
                     f"{ci(nat)} | {num(again['rate'])} (n={again['n']}) | {ci(again)} | {num(s['mean_chat_s'])} |")
    lines += ["", "## Paired comparison", ""]
    if not summary["paired"]:
        lines.append("One policy only: nothing to compare.")
    for name, p in summary["paired"].items():
        lines += [f"`{name}`: per participant who completed chats with both, the difference of their means; "
                  f"percentile bootstrap {level}% interval over participants.", "",
                  f"| measure | participants | {p['a']} | {p['b']} | {name} | 95% CI |",
                  "|---|---:|---:|---:|---:|---|"]
        for measure in ("success", "naturalness", "would_talk_again"):
            m = p[measure]
            lines.append(f"| {measure} | {m['participants']} | {num(m['a'])} | {num(m['b'])} | "
                         f"{num(m['diff'], True)} | {ci(m, True)} |")
        lines.append("")
    lines += ["", f"![success per policy]({CHART})", ""]
    return "\n".join(lines)
