"""``simpop eval compare A B``: paired differences of two evaluations of one panel, per (member, task), with bootstrap
intervals."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from simpop.evaluation.eval_records import EPISODES, read_records
from simpop.evaluation.eval_summary import CI_LEVEL


def compare_evaluations(a: str | Path, b: str | Path, *, resamples: int = 10_000, seed: int = 0) -> dict[str, Any]:
    """Paired differences ``B - A`` of mean success per (member, task), with bootstrap 95% intervals.

    Each pair is one (member, task) present in both folders (its success averaged over that folder's trials or
    repeats). Overall and per member: the mean of the pair differences and a percentile bootstrap interval
    (``resamples`` resamples of the pairs, a generator seeded with ``seed``); per task: the difference
    averaged over members.
    """
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    means = []
    for folder in (a, b):
        path = Path(folder) / EPISODES
        if not path.is_file():
            raise FileNotFoundError(f"{folder} is not a simpop eval folder (no {EPISODES})")
        cells: dict[tuple[str, str], list[float]] = {}
        for r in read_records(path):
            cells.setdefault((r.member, r.scenario), []).append(float(bool(r.success)))
        means.append({k: float(np.mean(v)) for k, v in cells.items()})
    mean_a, mean_b = means
    pairs = sorted(set(mean_a) & set(mean_b))
    if not pairs:
        raise ValueError(f"{a} and {b} share no (member, task) pair; compare evaluations of the same panel and env")
    rng = np.random.default_rng(seed)

    def stat(keys: list[tuple[str, str]]) -> dict[str, Any]:
        d = np.array([mean_b[k] - mean_a[k] for k in keys])
        boot = d[rng.integers(0, len(d), size=(resamples, len(d)))].mean(axis=1)
        lo, hi = np.quantile(boot, [(1 - CI_LEVEL) / 2, (1 + CI_LEVEL) / 2])
        return {"pairs": len(keys), "a": float(np.mean([mean_a[k] for k in keys])),
                "b": float(np.mean([mean_b[k] for k in keys])), "diff": float(d.mean()),
                "ci_low": float(lo), "ci_high": float(hi)}

    members = sorted({m for m, _ in pairs})
    tasks = sorted({t for _, t in pairs})
    return {"a": str(a), "b": str(b), "direction": "B - A", "resamples": resamples, "seed": seed,
            "unpaired": {"a_only": len(set(mean_a) - set(mean_b)), "b_only": len(set(mean_b) - set(mean_a))},
            "overall": stat(pairs), "members": {m: stat([p for p in pairs if p[0] == m]) for m in members},
            "tasks": {t: {"pairs": len(ks), "diff": float(np.mean([mean_b[k] - mean_a[k] for k in ks]))}
                      for t in tasks if (ks := [p for p in pairs if p[1] == t])}}


def compare_table(result: Mapping[str, Any], max_tasks: int = 20) -> str:
    """The comparison as markdown: per member and overall, then the tasks that changed most."""
    lines = [f"B - A: B = `{result['b']}`, A = `{result['a']}` (bootstrap {int(CI_LEVEL * 100)}% CI over "
             f"(member, task) pairs, {result['resamples']} resamples)", "",
             "| member | pairs | success A | success B | B - A | 95% CI |", "|---|---:|---:|---:|---:|---|"]
    for m, s in [*result["members"].items(), ("**all**", result["overall"])]:
        lines.append(f"| {m} | {s['pairs']} | {s['a']:.3f} | {s['b']:.3f} | {s['diff']:+.3f} | "
                     f"[{s['ci_low']:+.3f}, {s['ci_high']:+.3f}] |")
    changed = sorted(((t, s) for t, s in result["tasks"].items() if s["diff"] != 0), key=lambda x: -abs(x[1]["diff"]))
    if changed:
        lines += ["", f"Tasks that changed most (of {len(changed)} changed, {len(result['tasks'])} in all; mean over "
                      f"members):", "", "| task | pairs | B - A |", "|---|---:|---:|"]
        lines += [f"| {t} | {s['pairs']} | {s['diff']:+.3f} |" for t, s in changed[:max_tasks]]
    unpaired = result["unpaired"]
    if unpaired["a_only"] or unpaired["b_only"]:
        lines += ["", f"Unpaired (left out): {unpaired['a_only']} in A only, {unpaired['b_only']} in B only."]
    return "\n".join(lines) + "\n"
