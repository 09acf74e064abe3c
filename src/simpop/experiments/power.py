"""Sizing a collapse-experiment comparison from a pilot (``simpop experiment collapse --plan PILOT``).

A condition's final success on a panel, paired by seed with frozen's, differs from seed to seed for two reasons:
the training seed (a different policy) and the evaluation sample (``eval_episodes`` dialogues per panel member).
For each comparison in a pilot's ``summary.json`` the variance of the paired differences ``V`` is split as

    V = S + E,    E = mean over seeds of (p_c (1 - p_c) + p_f (1 - p_f)) / n,

where ``n`` is the pilot's evaluation dialogues on the panel (``eval_episodes`` x members) and ``E`` the binomial
variance of the two success estimates (an upper bound: the conditions are evaluated on the same scenarios, which
can only correlate them positively). ``S = V - E`` (at least 0) is the training seeds' part, which only more seeds
shrink; ``E`` shrinks as ``n`` grows. The pooled ``V`` and ``E`` are the means over every comparison with frozen in
every pilot given (blocks of equal size). With ``k`` times the pilot's evaluation dialogues the paired standard
deviation is ``sqrt(S + E / k)``, and the seeds needed are the fewest with which a two-sided paired t-test at level
``alpha / m`` (``m`` comparisons with frozen: Holm's strictest step, so each comparison's power is at least this)
detects ``difference`` with probability ``power`` (noncentral t).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

# The paired t-test's power lives in simpop.evaluation.metrics (``simpop study plan`` uses it too); re-exported.
from simpop.evaluation.metrics import MAX_PAIRS as MAX_SEEDS
from simpop.evaluation.metrics import paired_power as power  # noqa: F401
from simpop.evaluation.metrics import pairs_needed as seeds_needed

#: Panels a summary can hold (metric name -> the panel's name in the plan).
PANEL_METRICS = {"human_success": "human", "heldout_success": "heldout", "robust_success": "robust",
                 "corpus_success": "corpus"}
#: Multiples of the pilot's evaluation dialogues that the plan prices.
EVAL_MULTIPLES = (1, 2, 4, 8)


@dataclass(frozen=True)
class Variance:
    """The paired-difference variance of one panel, pooled over ``comparisons``: ``total`` = ``seed`` + ``eval``
    at the pilot's ``dialogues`` per condition on the panel; ``largest``: the largest single comparison's total."""

    panel: str
    total: float
    seed: float
    eval: float
    largest: float
    dialogues: int
    comparisons: list[str]

    def sd(self, multiple: float = 1.0) -> float:
        """Paired standard deviation with ``multiple`` times the pilot's evaluation dialogues."""
        return math.sqrt(self.seed + self.eval / multiple)


def read_summary(path: str | Path) -> dict[str, Any]:
    """A pilot's ``summary.json``: ``path`` is a run folder holding one, or the file itself.

    Raises:
        ValueError: no summary there, or not a collapse summary.
    """
    path = Path(path)
    file = path / "summary.json" if path.is_dir() else path
    if not file.is_file():
        raise ValueError(f"{path}: no summary.json (a finished `simpop experiment collapse` folder, or its summary)")
    try:
        summary = json.loads(file.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"{file}: not readable JSON ({error})") from None
    if not isinstance(summary, dict) or "frozen" not in summary.get("conditions", {}) or "setup" not in summary:
        raise ValueError(f"{file}: not a collapse summary with a frozen condition (the plan compares with frozen)")
    return summary


def panel_members(summary: dict[str, Any], panel: str) -> int:
    """Members of ``panel`` in the pilot (the human-fitted panel's from its shipped definition)."""
    from simpop.experiments.conditions import CORPUS_PANEL_TEMPERATURES, PANEL_TEMPERATURES, ROBUST_PANEL_TEMPERATURES

    if panel == "human":
        from simpop.evaluation.panels import panel_definition

        return len(panel_definition(summary["setup"]["config"]["human_panel"]).members)
    return len({"heldout": PANEL_TEMPERATURES, "robust": ROBUST_PANEL_TEMPERATURES,
                "corpus": CORPUS_PANEL_TEMPERATURES}[panel])


def variances(summaries: Sequence[dict[str, Any]]) -> list[Variance]:
    """Per panel the pilots share, the pooled variance of paired differences with frozen and its split."""
    out = []
    for metric, panel in PANEL_METRICS.items():
        if not all(metric in s["conditions"]["frozen"]["metrics"] for s in summaries):
            continue
        totals, evals, names, dialogues = [], [], [], set()
        for summary in summaries:
            n = summary["setup"]["eval_episodes"] * panel_members(summary, panel)
            dialogues.add(n)
            frozen = np.asarray(summary["conditions"]["frozen"]["metrics"][metric]["per_seed"], dtype=float)
            for name, condition in summary["conditions"].items():
                if name == "frozen" or metric not in condition["metrics"]:
                    continue
                other = np.asarray(condition["metrics"][metric]["per_seed"], dtype=float)
                if len(other) != len(frozen) or len(other) < 2:
                    continue
                totals.append(float(np.var(other - frozen, ddof=1)))
                evals.append(float(np.mean(other * (1 - other) + frozen * (1 - frozen)) / n))
                names.append(name)
        if not totals:
            continue
        if len(dialogues) > 1:
            raise ValueError(f"the pilots evaluated the {panel} panel on different numbers of dialogues "
                             f"({sorted(dialogues)}); plan from pilots of one size")
        total, evaluation = float(np.mean(totals)), float(np.mean(evals))
        out.append(Variance(panel, total, max(total - evaluation, 0.0), evaluation, max(totals), dialogues.pop(),
                            names))
    if not out:
        raise ValueError("the pilots hold no condition paired with frozen over two or more seeds")
    return out


def plan(pilots: Sequence[str | Path], difference: float, comparisons: int, alpha: float = 0.05,
         target: float = 0.8) -> str:
    """The plan as text: per panel, the variance split and the seeds needed at each evaluation size.

    Raises:
        ValueError: a pilot is unusable, or ``difference``, ``comparisons``, ``alpha`` or ``target`` out of range.
    """
    if not (math.isfinite(difference) and 0 < difference < 1):
        raise ValueError(f"the difference to detect must be in (0, 1) (a success rate), got {difference}")
    if comparisons < 1 or not 0 < alpha < 1 or not 0 < target < 1:
        raise ValueError(f"need comparisons >= 1, alpha and power in (0, 1); got {comparisons}, {alpha}, {target}")
    summaries = [read_summary(p) for p in pilots]
    lines = [f"Plan from {len(summaries)} pilot(s) ({', '.join(str(p) for p in pilots)}): detect a paired difference "
             f"of {difference:g} in final success with {target:.0%} power, two-sided, alpha {alpha:g} / {comparisons} "
             f"comparison(s) with frozen (Holm's strictest step).", ""]
    for v in variances(summaries):
        per_member = v.dialogues // panel_members(summaries[0], v.panel)
        lines += [f"{v.panel} panel: paired sd {math.sqrt(v.total):.3f} (seeds {math.sqrt(v.seed):.3f}, evaluation "
                  f"{math.sqrt(v.eval):.3f} at {per_member} dialogues per member; largest comparison "
                  f"{math.sqrt(v.largest):.3f}; pooled over {len(v.comparisons)}: {', '.join(v.comparisons)})",
                  "  eval_episodes  paired sd  seeds needed  (largest comparison's sd: seeds)"]
        for k in EVAL_MULTIPLES:
            sd = v.sd(k)
            worst = math.sqrt(max(v.largest - v.eval, 0.0) + v.eval / k)
            need, need_worst = (seeds_needed(difference, s, alpha / comparisons, target) for s in (sd, worst))
            text = lambda n: str(n) if n <= MAX_SEEDS else f"> {MAX_SEEDS}"  # noqa: E731
            lines.append(f"  {per_member * k:>13}  {sd:>9.3f}  {text(need):>12}  ({worst:.3f}: {text(need_worst)})")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"
