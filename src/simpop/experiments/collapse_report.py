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

**One seed** (e.g. the text level's budget): a per-seed interval cannot be estimated, so where the summary
holds the units *inside* the seed (``per_unit``: each evaluation dialogue's success, each update's
zero-variance fraction) the comparison is paired by unit instead, dialogue by dialogue (evaluations replay
the same scenarios and reset seeds) or update by update, and its interval is a percentile bootstrap over the
units (:func:`simpop.evaluation.metrics.bootstrap_ci`). Policy entropy has no per-dialogue values, so its
comparisons keep the (degenerate) one-seed interval and can only point the same direction.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from simpop.evaluation.metrics import bootstrap_ci, mean_ci

#: The baseline condition and the fixes it is compared with.
FROZEN = "frozen"
FIXES = ("verbalized", "cotrain", "population")
#: "Falls toward zero": the frozen policy's final entropy is below this share of its initial entropy.
ENTROPY_COLLAPSE_RATIO = 0.25
#: A run has converged when its training success over the last 10% of updates is within this of the 10% before.
CONVERGED_CHANGE = 0.03
#: Zero-variance share at which GRPO's gradient has (nearly) stopped, for the collapse curve's entropy test.
SATURATED_ZERO_VAR = 0.9
#: Co-training objectives that run on the data simpop ships, i.e. that may become the default (the others need
#: a corpus); in the order a tie prefers them (the simpler first).
DEFAULT_CANDIDATES = ("target", "persona", "diverse")
#: Means within this are a tie when choosing the default objective.
OBJECTIVE_TIE = 0.005

SUPPORTS, SAME_DIRECTION, CONTRADICTS = "supports", "same direction, CI includes 0", "contradicts"
REPRODUCED, INCONCLUSIVE, NOT_REPRODUCED = "reproduced", "inconclusive", "not reproduced"

#: Summary metrics (key -> table header), in table order.
SUMMARY_METRICS = {
    "train_success": "training-sim success",
    "heldout_success": "held-out success",
    "collapse_gap": "collapse gap",
    "policy_entropy": "policy entropy (nats)",
    "zero_var_frac": "zero-variance groups",
    "train_rise": "training success rise",
    "late_change": "training success change, last 20%",
    "robust_success": "robustness-panel success",
    "human_success": "human-fitted-panel success",
    "corpus_success": "corpus-panel success",
    "realism_index": "training-sim realism index",
}
#: The panels' success metrics, in the ablation table's column order.
PANEL_METRICS = {"heldout_success": "held-out", "robust_success": "robustness-panel",
                 "human_success": "human-fitted-panel", "corpus_success": "corpus-panel"}


def stat(values: Sequence[float], units: Sequence[Sequence[float]] | None = None,
         statistic: Any = None) -> dict[str, Any]:
    """``{"mean", "ci_low", "ci_high", "n", "per_seed", "unit"}`` of per-seed values (95% Student-t CI).

    With one seed and ``units`` (the samples inside it, e.g. one evaluation's per-dialogue successes; two
    samples for a difference such as the collapse gap, with ``statistic`` of both), the interval is a
    percentile bootstrap over those units instead; ``per_unit`` keeps a single sample for paired comparisons.
    """
    values = [float(v) for v in values]
    summary = {"n": len(values), "per_seed": values, "unit": "seed"}
    if len(values) == 1 and units is not None and all(len(u) > 1 for u in units):
        _, lo, hi = bootstrap_ci(units, statistic)
        summary.update(mean=values[0], ci_low=lo, ci_high=hi, unit="unit")
        if len(units) == 1:
            summary["per_unit"] = [float(u) for u in units[0]]
        return summary
    mean, lo, hi = mean_ci(values)
    return {"mean": mean, "ci_low": lo, "ci_high": hi, **summary}


@dataclass
class Comparison:
    """One paired test: differences oriented so that > 0 supports the claim, per seed (Student-t interval)
    or, with one seed, per unit inside it (``unit`` ``"dialogue"`` or ``"update"``: bootstrap interval)."""

    label: str
    differences: list[float]
    unit: str = "seed"
    mean: float = math.nan
    ci_low: float = math.nan
    ci_high: float = math.nan
    status: str = CONTRADICTS

    def __post_init__(self) -> None:
        self.mean, self.ci_low, self.ci_high = (mean_ci(self.differences) if self.unit == "seed"
                                                else bootstrap_ci([self.differences]))
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
        """The verdict as JSON-ready data (its comparisons included), for ``summary.json``."""
        return {"claim": self.claim, "statement": self.statement, "verdict": self.verdict,
                "comparisons": [asdict(c) for c in self.comparisons]}


def _per_seed(conditions: Mapping[str, Any], condition: str, metric: str) -> np.ndarray:
    return np.asarray(conditions[condition]["metrics"][metric]["per_seed"], dtype=float)


#: What the per-unit values of a metric are (the unit of a one-seed comparison).
UNITS = {"train_success": "dialogue", "heldout_success": "dialogue", "initial_train_success": "dialogue",
         "initial_heldout_success": "dialogue", "zero_var_frac": "update"}


def _compare(conditions: Mapping[str, Any], label: str, plus: tuple[str, str], minus: tuple[str, str],
             scale: float = 1.0) -> Comparison:
    """``scale * plus - minus`` (each a (condition, metric)), per seed; with one seed, per unit when both
    sides hold paired units (same metric unit, same count), with a bootstrap interval."""
    a, b = (conditions[c]["metrics"][m] for c, m in (plus, minus))
    units = a.get("per_unit"), b.get("per_unit")
    if (len(a["per_seed"]) == 1 and units[0] is not None and units[1] is not None and len(units[0]) == len(units[1])
            and UNITS.get(plus[1]) == UNITS.get(minus[1]) is not None):
        return Comparison(label, [scale * x - y for x, y in zip(*units)], UNITS[plus[1]])
    return Comparison(label, list(scale * _per_seed(conditions, *plus) - _per_seed(conditions, *minus)))


def judged(conditions: Mapping[str, Any]) -> bool:
    """Whether the claims can be judged: the frozen condition and at least one fix (each claim compares them)."""
    return FROZEN in conditions and any(f in conditions for f in FIXES)


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
    cmp = lambda label, plus, minus, scale=1.0: _compare(conditions, label, plus, minus, scale)  # noqa: E731

    a = Verdict("a", "Under the frozen simulator, training success rises while held-out success ends below "
                     "both fixes.")
    a.comparisons.append(cmp("frozen: final - initial training-sim success", (FROZEN, "train_success"),
                             (FROZEN, "initial_train_success")))
    for fix in fixes:
        a.comparisons.append(cmp(f"held-out success: {fix} - frozen", (fix, "heldout_success"),
                                 (FROZEN, "heldout_success")))

    b = Verdict("b", "The frozen simulator's policy entropy falls toward zero and stays above zero under the "
                     "fixes.")
    b.comparisons.append(cmp("frozen: initial - final entropy", (FROZEN, "initial_policy_entropy"),
                             (FROZEN, "policy_entropy")))
    b.comparisons.append(cmp(f"frozen: {ENTROPY_COLLAPSE_RATIO:g} x initial - final entropy",
                             (FROZEN, "initial_policy_entropy"), (FROZEN, "policy_entropy"), ENTROPY_COLLAPSE_RATIO))
    for fix in fixes:
        b.comparisons.append(cmp(f"final entropy: {fix} - frozen", (fix, "policy_entropy"),
                                 (FROZEN, "policy_entropy")))

    c = Verdict("c", "The frozen simulator's zero-variance group fraction is higher.")
    for fix in fixes:
        c.comparisons.append(cmp(f"zero-variance fraction: frozen - {fix}", (FROZEN, "zero_var_frac"),
                                 (fix, "zero_var_frac")))
    return [a, b, c]


# ============================================================================================ ablation
def ablation(conditions: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each co-training ablation ``base+objective`` against its ``base`` condition (the configured objective), paired
    by seed, on the held-out panel and (when evaluated) the robustness and corpus panels."""
    rows = []
    for name in conditions:
        base, plus, objective = name.partition("+")
        if not plus or base not in conditions:
            continue
        row: dict[str, Any] = {"condition": name, "base": base, "objective": objective}
        for metric in PANEL_METRICS:
            if all(metric in conditions[c]["metrics"] for c in (name, base)):
                row[metric] = asdict(_compare(conditions, f"{metric}: {name} - {base}", (name, metric),
                                              (base, metric)))
        rows.append(row)
    return rows


def choose_objective(rows: Sequence[Mapping[str, Any]], current: str = "target") -> tuple[str, str]:
    """The default co-training objective by the rule fixed before the comparison was run, and why.

    Candidates are the objectives in :data:`DEFAULT_CANDIDATES` (they run on shipped data). One replaces
    ``current`` only if its held-out difference to the base condition has a CI above 0 and its robustness-panel
    difference is not significantly negative (CI not entirely below 0); among several, the highest held-out mean
    wins, ties (:data:`OBJECTIVE_TIE`) going to the earlier in :data:`DEFAULT_CANDIDATES`.
    """
    qualified = []
    for row in rows:
        held, robust = row.get("heldout_success"), row.get("robust_success")
        if row["objective"] not in DEFAULT_CANDIDATES or held is None:
            continue
        if held["ci_low"] > 0 and (robust is None or robust["ci_high"] >= 0):
            qualified.append((held["mean"], row["objective"], row["condition"]))
    if not qualified:
        return current, (f"no candidate ({', '.join(DEFAULT_CANDIDATES)}) beat {current} on the held-out panel with "
                         f"a CI above 0 without losing significantly on the robustness panel: {current} stays")
    best = max(m for m, _, _ in qualified)
    tied = [q for q in qualified if best - q[0] <= OBJECTIVE_TIE]
    mean, objective, condition = min(tied, key=lambda q: DEFAULT_CANDIDATES.index(q[1]))
    return objective, (f"{condition} beat its base on the held-out panel ({mean:+.3f}, CI above 0) and not "
                       f"significantly worse on the robustness panel")


def ablation_section(conditions: Mapping[str, Any], current: str = "target") -> str:
    """Markdown: the ablation table (paired differences on every panel evaluated) and the default-objective rule's
    result."""
    rows = ablation(conditions)
    if not rows:
        return ""
    panels = [m for m in PANEL_METRICS if any(m in row for row in rows)]
    lines = ["| condition | vs | " + " | ".join(f"{PANEL_METRICS[m]} success | paired difference" for m in panels)
             + " |", "|---|---|" + "---|---|" * len(panels)]
    for row in rows:
        metrics = conditions[row["condition"]]["metrics"]
        cells = []
        for metric in panels:
            d = row.get(metric)
            cells += [cell(metrics.get(metric)), cell(d, signed=True)]
        lines.append(f"| {row['condition']} | {row['base']} | " + " | ".join(cells) + " |")
    objective, reason = choose_objective(rows, current)
    return "\n".join(lines + ["", f"Default objective by the pre-stated rule: **{objective}** ({reason})."])


# ========================================================================================= convergence
def convergence_note(conditions: Mapping[str, Any]) -> str:
    """One sentence: which conditions' training success is flat over the last 20% of updates."""
    flat: list[Any] = []
    moving: list[Any] = []
    for name, cond in conditions.items():
        change = cond["metrics"].get("late_change")
        if change is None or not math.isfinite(change["mean"]):
            continue
        (flat if abs(change["mean"]) <= CONVERGED_CHANGE else moving).append(f"{name} {change['mean']:+.3f}")
    if not flat and not moving:
        return ""
    text = (f"Convergence (training success over the last 10% of updates minus the 10% before, mean over seeds; "
            f"flat when within ±{CONVERGED_CHANGE:g}): ")
    text += ("every condition converged" if not moving else "**not converged: " + ", ".join(moving) + "**")
    return text + (f" ({', '.join(flat)})." if flat else ".")


# ======================================================================================= collapse curve
def _by_seed(records: Sequence[Mapping[str, Any]], condition: str, kind: str,
             metric: str) -> dict[int, dict[int, float]]:
    """``{seed: {step: value}}`` of ``metric`` in ``condition``'s records of ``kind`` (records without it skipped)."""
    out: dict[int, dict[int, float]] = {}
    for r in records:
        if r.get("condition") == condition and r.get("kind") == kind and r.get(metric) is not None:
            out.setdefault(int(r["seed"]), {})[int(r["step"])] = float(r[metric])
    return out


def _common_steps(by_seed: Mapping[int, Mapping[int, float]]) -> list[int]:
    """The steps every seed reached (a partial run does not bend a curve)."""
    return sorted(set.intersection(*(set(v) for v in by_seed.values()))) if by_seed else []


def collapse_curve(records: Sequence[Mapping[str, Any]], condition: str = FROZEN) -> dict[str, Any] | None:
    """Does ``condition``'s held-out success peak and then decline, and does its entropy keep falling once GRPO's
    gradient has stopped? Split half, so that choosing the peak does not bias the test: the peak is the step where
    the first half of the seeds' mean held-out curve is highest; on the other half, final minus peak-step held-out
    success, paired by seed (t CI). Entropy: from the first evaluation after which the updates' seed-mean
    zero-variance share reaches :data:`SATURATED_ZERO_VAR`, final minus that evaluation's entropy, over all seeds.
    None with fewer than 4 seeds."""
    held = _by_seed(records, condition, "eval", "heldout_success")
    entropy = _by_seed(records, condition, "eval", "policy_entropy")
    zero_var = _by_seed(records, condition, "train", "zero_var_frac")
    seeds = sorted(held)
    steps = _common_steps(held)
    if len(seeds) < 4 or len(steps) < 3:
        return None
    first, second = seeds[: len(seeds) // 2], seeds[len(seeds) // 2:]
    peak = max(steps, key=lambda t: (np.mean([held[s][t] for s in first]), -t))
    final = steps[-1]
    decline = mean_ci([held[s][final] - held[s][peak] for s in second])
    out: dict[str, Any] = {
        "condition": condition, "peak_step": peak, "final_step": final, "peak_seeds": first, "test_seeds": second,
        "peak_heldout": float(np.mean([held[s][peak] for s in second])),
        "final_heldout": float(np.mean([held[s][final] for s in second])),
        "decline": {"mean": decline[0], "ci_low": decline[1], "ci_high": decline[2]},
        "peaks_then_declines": bool(decline[2] < 0),
    }
    updates = _common_steps(zero_var)
    saturated = next((u for u in updates if np.mean([zero_var[s][u] for s in zero_var]) >= SATURATED_ZERO_VAR), None)
    start = next((t for t in steps if saturated is not None and t >= saturated), None)
    if start is not None and start < final and all(s in entropy for s in seeds):
        change = mean_ci([entropy[s][final] - entropy[s][start] for s in seeds])
        out["entropy_after_saturation"] = {"from_step": start, "mean": change[0], "ci_low": change[1],
                                           "ci_high": change[2], "keeps_falling": bool(change[2] < 0)}
    else:
        out["entropy_after_saturation"] = None
    return out


def curve_section(curve: Mapping[str, Any] | None) -> str:
    """Markdown: the collapse-curve tests (:func:`collapse_curve`) in plain words."""
    if not curve:
        return ""
    d = curve["decline"]
    lines = [f"Held-out success of **{curve['condition']}** peaks at update {curve['peak_step']} (chosen on seeds "
             f"{curve['peak_seeds']}); on seeds {curve['test_seeds']} it is {curve['peak_heldout']:.3f} there and "
             f"{curve['final_heldout']:.3f} at update {curve['final_step']}: final - peak {d['mean']:+.3f} "
             f"[{d['ci_low']:+.3f}, {d['ci_high']:+.3f}]. **Peaks then declines: "
             f"{'yes' if curve['peaks_then_declines'] else 'no'}.**"]
    e = curve.get("entropy_after_saturation")
    if e is None:
        lines.append(f"Zero-variance groups never reached {SATURATED_ZERO_VAR:.0%} of an update (seed mean) before the "
                     "last evaluation, so whether entropy keeps falling after the gradient stops is not tested.")
    else:
        lines.append(f"From update {e['from_step']} (zero-variance groups ≥ {SATURATED_ZERO_VAR:.0%}) to the end, "
                     f"policy entropy changes {e['mean']:+.3f} nats [{e['ci_low']:+.3f}, {e['ci_high']:+.3f}]. "
                     f"**Keeps falling: {'yes' if e['keeps_falling'] else 'no'}.**")
    return "\n\n".join(lines)


# ============================================================================================ markdown
def cell(s: Mapping[str, Any] | None, digits: int = 3, signed: bool = False) -> str:
    """A statistic as ``mean [ci_low, ci_high]`` (``signed``: with signs, for a difference), the experiments' one
    table cell; ``n/a`` for None (a summary written before the metric existed) or a mean that is not finite."""
    if s is None or not math.isfinite(s["mean"]):
        return "n/a"
    sign = "+" if signed else ""
    return f"{s['mean']:{sign}.{digits}f} [{s['ci_low']:{sign}.{digits}f}, {s['ci_high']:{sign}.{digits}f}]"


def summary_table(conditions: Mapping[str, Any]) -> str:
    """Markdown table: one row per condition, one column per :data:`SUMMARY_METRICS` that some condition has
    (mean [95% CI])."""
    shown = [m for m in SUMMARY_METRICS if any(m in c["metrics"] for c in conditions.values())]
    head = "| condition | " + " | ".join(SUMMARY_METRICS[m] for m in shown) + " |"
    rows = [head, "|" + "---|" * (len(shown) + 1)]
    for name, cond in conditions.items():
        rows.append(f"| {name} | " + " | ".join(cell(cond["metrics"].get(m)) for m in shown) + " |")
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


def people_section(conditions: Mapping[str, Any]) -> str:
    """Markdown: per condition, success on its own training simulator(s) against success on the human-fitted panel
    (paired by seed), the human-fitted success against frozen's, and the training simulator's realism index (how far
    from people it is, :mod:`simpop.evaluation.realism`); empty without a human-fitted panel."""
    if not all("human_success" in c["metrics"] for c in conditions.values()):
        return ""
    lines = ["| condition | training-sim success | human-fitted success | human - training (paired) | "
             f"human-fitted: condition - {FROZEN} (paired) | training-sim realism index |", "|---|---|---|---|---|---|"]
    for name, cond in conditions.items():
        m = cond["metrics"]
        gap = asdict(_compare(conditions, "", (name, "human_success"), (name, "train_success")))
        versus = (asdict(_compare(conditions, "", (name, "human_success"), (FROZEN, "human_success")))
                  if FROZEN in conditions and name != FROZEN else None)
        lines.append(f"| {name} | {cell(m.get('train_success'))} | {cell(m.get('human_success'))} | "
                     f"{cell(gap, signed=True)} | {cell(versus, signed=True) if versus else ''} | "
                     f"{cell(m.get('realism_index'))} |")
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
        ("Values are the mean over seeds with a 95% Student-t CI" if len(setup["seeds"]) > 1 else
         "One seed: values are that seed's, with 95% percentile-bootstrap CIs over the evaluation dialogues "
         "(successes, collapse gap) and the updates (zero-variance groups); comparisons are paired by dialogue or "
         "update. Policy entropy has no per-dialogue values: its interval collapses to the value")
        + ". *Final* = the last evaluation. "
        "Collapse gap = training-simulator success - held-out success. Policy entropy = "
        + ("mean per-token entropy (nats) of the policy's generated tokens" if setup["level"] == "text"
           else "mean entropy (nats) of the policy's action distribution over its decisions")
        + " in the held-out dialogues. Zero-variance groups = share of GRPO groups whose rewards were all "
        "equal, averaged over all updates. Training success rise = the training batches' success in the second "
        "half of the updates minus the first half (the learning signal on the training simulator(s) itself).",
        "",
        "## Summary (final values)",
        "",
        summary_table(conditions),
        "",
        convergence_note(conditions),
        "",
        "## Verdicts",
        "",
        ("" if verdicts else f"Not judged: the claims compare {FROZEN} with the fixes ({', '.join(FIXES)}), and this "
                             "run lacks one side. ")
        + "Each claim is tested with paired differences (by seed; with one seed by dialogue or update; see "
        "`simpop.experiments.collapse_report`): "
        "*reproduced* = every comparison's CI lies above 0; *not reproduced* = some comparison's mean "
        "goes the other way; *inconclusive* = the right direction without significance. "
        + (", ".join(f"{n} {k}" for k, n in counts.items()) + "." if counts else ""),
        "",
        verdict_section(verdicts),
        "## How each condition's simulator is built",
        "",
    ]
    for name, cond in conditions.items():
        lines.append(f"- **{name}**: {cond['description']}")
    lines += ["", f"- **held-out panel**: {setup['panel']}"]
    for key, label in (("robust_panel", "robustness panel"), ("human_panel", "human-fitted panel"),
                       ("corpus_panel", "corpus panel")):
        if setup.get(key):
            lines.append(f"- **{label}**: {setup[key]}")
    current = setup.get("config", {}).get("cotrain", {}).get("objective", "target")
    for title, body in (("Co-training objectives (ablation, paired by seed)", ablation_section(conditions, current)),
                        ("Simulator to people", people_section(conditions)),
                        ("Collapse curve", curve_section(summary.get("curve")))):
        if body:
            lines += ["", f"## {title}", "", body]
    lines += ["", "## Plots", ""]
    lines += [f"![{Path(p).stem}]({Path(p).name})" for p in plots]
    return "\n".join(lines) + "\n"


# ============================================================================================== plots
#: (file stem, metrics.jsonl kind, metric key, y label, (low, high) range of the metric) of each plot.
PLOTS = (
    ("heldout_success", "eval", "heldout_success", "held-out panel success", (0.0, 1.0)),
    ("robust_success", "eval", "robust_success", "robustness-panel success", (0.0, 1.0)),
    ("human_success", "eval", "human_success", "human-fitted-panel success", (0.0, 1.0)),
    ("corpus_success", "eval", "corpus_success", "corpus-panel success", (0.0, 1.0)),
    ("train_success", "eval", "train_success", "training-simulator success", (0.0, 1.0)),
    ("policy_entropy", "eval", "policy_entropy", "policy entropy (nats, held-out dialogues)", (0.0, None)),
    ("zero_var_frac", "train", "zero_var_frac", "zero-variance group fraction", (0.0, 1.0)),
)


def curves(records: Sequence[Mapping[str, Any]], kind: str, metric: str
           ) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """Per condition: ``(steps, mean, ci_low, ci_high)`` of ``metric`` over seeds at each step.

    Only steps that every seed of the condition reached are kept (a partial run does not bend the curve).
    """
    out = {}
    for condition in dict.fromkeys(r["condition"] for r in records if r.get("kind") == kind):
        by_seed = _by_seed(records, condition, kind, metric)
        if not by_seed:
            continue
        kept = _common_steps(by_seed)
        stats = np.array([mean_ci([by_seed[s][t] for s in sorted(by_seed)]) for t in kept]).reshape(-1, 3)
        out[condition] = (np.array(kept), stats[:, 0], stats[:, 1], stats[:, 2])
    return out


def plot_curves(records: Sequence[Mapping[str, Any]], out_dir: str | Path, order: Sequence[str] = (),
                plots: Sequence[tuple[str, str, str, str, tuple[float, float | None]]] = PLOTS) -> list[Path]:
    """Write one PNG per ``plots`` entry (as in :data:`PLOTS`; a line per condition, 95% CI band over seeds)."""
    out_dir = Path(out_dir)
    paths = []
    for stem, kind, metric, label, (low, high) in plots:
        data = curves(records, kind, metric)
        if not data:
            continue
        names = [c for c in order if c in data] + sorted(c for c in data if c not in order)
        fig, ax = figure(figsize=(6.4, 4.0))
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
        paths.append(save(fig, out_dir / f"{stem}.png"))
    return paths


def plot_per_seed(records: Sequence[Mapping[str, Any]], out_dir: str | Path, order: Sequence[str] = (),
                  metrics: Sequence[str] = tuple(PANEL_METRICS)) -> list[Path]:
    """Write ``<metric>_per_seed.png`` per evaluated metric: one panel per condition, a line per seed."""
    paths = []
    for metric in metrics:
        names = list(dict.fromkeys([*order, *sorted({r["condition"] for r in records})]))
        data = {c: _by_seed(records, c, "eval", metric) for c in names}
        data = {c: v for c, v in data.items() if v}
        if not data:
            continue
        cols = min(4, len(data))
        rows = math.ceil(len(data) / cols)
        fig, axes = figure(rows, cols, figsize=(3.2 * cols, 2.6 * rows), sharex=True, sharey=True, squeeze=False)
        for ax, (name, seeds) in zip(axes.flat, data.items()):
            for _seed, values in sorted(seeds.items()):
                steps = sorted(values)
                ax.plot(steps, [values[t] for t in steps], linewidth=0.9, alpha=0.7)
            ax.set_title(name, fontsize=9)
            ax.set_ylim(0.0, 1.0)
            ax.grid(alpha=0.3)
        for ax in list(axes.flat)[len(data):]:
            ax.set_visible(False)
        fig.supxlabel("policy updates", fontsize=9)
        fig.supylabel(metric.replace("_", " ") + " (one line per seed)", fontsize=9)
        paths.append(save(fig, Path(out_dir) / f"{metric}_per_seed.png"))
    return paths


def figure(*grid: int, **options: Any) -> tuple[Any, Any]:
    """A matplotlib figure and its axes (``pyplot.subplots(*grid, **options)`` at 110 dpi), for files only."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt.subplots(*grid, dpi=110, **options)


def save(fig: Any, path: Path) -> Path:
    """Lay ``fig`` out, write it to ``path`` and close it; the path."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
