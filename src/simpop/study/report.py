"""``simpop study report DIR``: the primary outcome, success and ratings per policy, exclusions, the people.

**Exclusions** first: the rules declared in ``study.json`` (``exclusions``, fixed before the first participant;
:data:`~simpop.study.study.EXCLUSION_RULES`) are applied exactly, per participant: one who fails a rule in any
chat they finished is left out of everything below, and the report counts how many each rule removed (one
participant may fail several). Per policy (arm): chats, abandoned chats (the person left; excluded from every rate below), errors (the policy
or env raised; counted as failures, as in ``simpop eval``), success with a Wilson 95% interval, mean reward,
naturalness (1-5) with a percentile-bootstrap 95% interval, would-talk-again with a Wilson interval, and mean
chat time. **Paired comparison** (each arm against the first): per participant who completed chats with both
arms, the difference of their mean success, naturalness and would-talk-again, averaged over participants with
a percentile-bootstrap 95% interval (:func:`~simpop.evaluation.metrics.bootstrap_ci` over the per-participant
differences). The **primary outcome** declared in the settings (``success``, ``reward`` or a numeric info key
such as P4G's ``donation``, the pledged amount) leads the paired comparison, and is averaged per policy. The
ledger gives the participant flow (declined, joined, completed) and the questionnaire's answers, set beside
the shipped persona distributions (:func:`~simpop.study.modes.persona_reference`). Outputs in ``DIR``, as
``simpop eval`` writes them: ``summary.json``, ``report.md`` and ``success.png``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from simpop.evaluation.eval_summary import CHART, CI_LEVEL, REPORT, SUMMARY, plot_success
from simpop.evaluation.metrics import bootstrap_ci, wilson_ci
from simpop.evaluation.panel import EpisodeRecord
from simpop.study import modes, storage
from simpop.study.chat import ABANDONED
from simpop.study.study import ATTENTION_ITEM, DEFAULTS

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


def exclusions(records: Sequence[EpisodeRecord], rules: Mapping[str, Any]) -> tuple[set[str], dict[str, int]]:
    """The participants the declared ``rules`` exclude, and how many each rule removed."""
    failed: dict[str, set[str]] = {rule: set() for rule, value in rules.items() if value not in (None, False)}
    for r in records:
        if _abandoned(r):
            continue
        effort = _study(r).get("effort") or {}
        if "min_human_s" in failed and float(effort.get("human_s", 0.0)) < float(rules["min_human_s"]):
            failed["min_human_s"].add(r.member)
        if "min_mean_chars" in failed and float(effort.get("mean_chars", 0.0)) < float(rules["min_mean_chars"]):
            failed["min_mean_chars"].add(r.member)
        if "attention" in failed and (v := _rating(r, "attention")) is not None and v != ATTENTION_ITEM[1]:
            failed["attention"].add(r.member)
    excluded = set().union(*failed.values()) if failed else set()
    return excluded, {rule: len(people) for rule, people in failed.items()}


def outcome(name: str) -> Callable[[EpisodeRecord], float | None]:
    """The per-chat value of an outcome: ``success`` (0/1), ``reward``, or a numeric info key (None if absent)."""
    if name == "success":
        return lambda r: float(bool(r.success))
    if name == "reward":
        return lambda r: float(r.reward)

    def value(r: EpisodeRecord) -> float | None:
        v = r.info.get(name)
        return float(v) if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) else None

    return value


def paired_differences(records: Sequence[EpisodeRecord], a: str, b: str,
                       value: Callable[[EpisodeRecord], Any]) -> tuple[list[float], list[float]]:
    """Per participant who finished chats with both policies, their mean ``value`` under ``a`` and under ``b``
    (abandoned chats and missing values left out)."""
    cells: dict[tuple[str, str], list[float]] = {}
    for r in records:
        if not _abandoned(r) and (v := value(r)) is not None:
            cells.setdefault((r.member, _study(r)["policy"]), []).append(float(v))
    people = sorted({p for p, arm in cells if arm == a} & {p for p, arm in cells if arm == b})
    return [float(np.mean(cells[p, a])) for p in people], [float(np.mean(cells[p, b])) for p in people]


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


def _paired(records: Sequence[EpisodeRecord], a: str, b: str, seed: int, primary: str) -> dict[str, Any]:
    metrics: dict[str, Callable[[EpisodeRecord], Any]] = {
        primary: outcome(primary),
        "success": outcome("success"),
        "naturalness": lambda r: _rating(r, "naturalness"),
        "would_talk_again": lambda r: None if (v := _rating(r, "would_talk_again")) is None else float(v)}
    out: dict[str, Any] = {}
    for name, value in metrics.items():
        mean_a, mean_b = paired_differences(records, a, b, value)
        diff, lo, hi = bootstrap_ci([[b_ - a_ for a_, b_ in zip(mean_a, mean_b)]], level=CI_LEVEL,
                                    resamples=RESAMPLES, seed=seed)
        out[name] = {"participants": len(mean_a), "a": _num(float(np.mean(mean_a))) if mean_a else None,
                     "b": _num(float(np.mean(mean_b))) if mean_b else None, "diff": _num(diff),
                     "ci_low": _num(lo), "ci_high": _num(hi)}
    return out


def summarize(records: Sequence[EpisodeRecord], settings: Mapping[str, Any], seed: int = 0,
              ledger: Sequence[Mapping[str, Any]] = (), counts: Mapping[str, int] | None = None) -> dict[str, Any]:
    """The study's summary (module docstring) from its saved chats, ledger and counts."""
    settings = {**DEFAULTS, **settings}
    policies: dict[str, str] = dict(settings["policies"])
    primary = settings["primary_outcome"]
    excluded, removed = exclusions(records, settings["exclusions"])
    chats_before = len(records)
    records = [r for r in records if r.member not in excluded]
    by_arm = {label: [r for r in records if _study(r)["policy"] == label] for label in policies}
    labels = list(policies)
    overall = _arm(records, "all", seed)
    value = outcome(primary)
    arms = {label: _arm(by_arm[label], spec, seed) for label, spec in policies.items()}
    for label, arm in arms.items():
        values = [v for r in by_arm[label] if not _abandoned(r) and (v := value(r)) is not None]
        arm["primary"] = _mean(values, seed)
    joined = [e for e in ledger if e.get("event") == "joined"]
    answers = {e["participant"]: e["answers"] for e in ledger
               if e.get("event") == "questionnaire" and e["participant"] not in excluded}
    return {"env": settings["env"], "env_kwargs": settings.get("env_kwargs", {}), "policies": policies,
            "seed": settings["seed"], "scenarios": len(settings["scenarios"]),
            "chats_per_participant": settings["chats_per_participant"],
            "ci": {"level": CI_LEVEL, "success": "wilson", "naturalness": "bootstrap",
                   "would_talk_again": "wilson", "paired": "bootstrap", "resamples": RESAMPLES},
            "participant_mode": settings["participant_mode"], "bonus": settings["bonus"],
            "primary_outcome": primary, "questionnaire_to_policy": bool(settings["questionnaire_to_policy"]),
            "over_bonus": sum(int((_study(r).get("effort") or {}).get("over_bonus", 0)) for r in records),
            "flow": {"declined": int((counts or {}).get("declined", 0)), "joined": len(joined),
                     "completed": sum(e.get("event") == "completed" for e in ledger),
                     "with_chats": len({r.member for r in records} | excluded)},
            "exclusions": {"rules": dict(settings["exclusions"]), "removed": removed,
                           "participants": len(excluded), "chats": chats_before - len(records)},
            "participants": len({r.member for r in records}), "chats": len(records),
            "rated": sum(_study(r).get("ratings") is not None for r in records),
            "abandoned": overall["abandoned"], "errors": overall["errors"],
            "arms": arms,
            "paired": {f"{b} - {labels[0]}": {"a": labels[0], "b": b, **_paired(records, labels[0], b, seed, primary)}
                       for b in labels[1:]},
            "questionnaire": _questionnaire(settings["questionnaire"], list(answers.values()))}


def _questionnaire(items: Sequence[str], answers: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per item asked, the people's answers beside the shipped persona distributions."""
    out: dict[str, Any] = {}
    for item in items:
        given = [a[item] for a in answers if a.get(item) is not None]
        reference = modes.persona_reference(item)
        if item == "age":
            out[item] = {"n": len(given), "people": {"mean": _num(float(np.mean(given))) if given else None,
                                                      "sd": _num(float(np.std(given))) if given else None},
                         **reference}
        else:
            out[item] = {"n": len(given), "people": {o: given.count(o) / len(given) if given else None
                                                      for o in modes.QUESTIONS[item][1]}, **reference}
    return out


def write_report(out: str | Path, seed: int = 0) -> dict[str, Any]:
    """Read the study in ``out``; write ``summary.json``, ``report.md`` and ``success.png``; return the summary."""
    out = Path(out)
    summary = summarize(storage.read_chats(out), storage.read_settings(out), seed, storage.read_ledger(out),
                        storage.read_counts(out))
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
    flow, excl, primary = summary["flow"], summary["exclusions"], summary["primary_outcome"]
    mode = summary["participant_mode"] + (f" (bonus ${summary['bonus']:.2f}; {summary['over_bonus']} pledge(s) "
                                          f"above it refused in the chat and restated)" if summary["bonus"] else "")
    shown = (" The policies were shown each participant's questionnaire answers." if summary["questionnaire_to_policy"]
             else "")
    lines = [f"# simpop study on `{summary['env']}`", "",
             f"Participants as: {mode}. Primary outcome: `{primary}` (paired, each policy against the first).{shown}",
             "",
             "## Participants and exclusions", "",
             f"{flow['declined']} declined consent (only counted); {flow['joined']} consented and joined; "
             f"{flow['with_chats']} saved a chat; {flow['completed']} received a completion code.", ""]
    if excl["rules"]:
        lines += ["Exclusion rules declared in `study.json` before the first participant, applied per participant "
                  "(one failing chat excludes them):", "", "| rule | threshold | participants removed |",
                  "|---|---|---:|"]
        lines += [f"| {rule} | {value} | {excl['removed'].get(rule, 0)} |" for rule, value in excl["rules"].items()]
        lines += ["", f"Excluded: {excl['participants']} participant(s), {excl['chats']} chat(s); everything below "
                      f"leaves them out.", ""]
    else:
        lines += ["No exclusion rules were declared.", ""]
    lines += [
             f"{summary['participants']} participant(s), {summary['chats']} chat(s) ({summary['rated']} rated, "
             f"{summary['abandoned']} abandoned, {summary['errors']} with an error), "
             f"{summary['chats_per_participant']} chat(s) per participant, {summary['scenarios']} scenario(s), "
             f"seed {summary['seed']}. Abandoned chats are left out of every rate; errors count as failures.", "",
             "## Policies (revealed)", "", "| policy | spec |", "|---|---|"]
    lines += [f"| {label} | `{spec}` |" for label, spec in summary["policies"].items()]
    lines += ["", f"## Primary outcome: `{primary}`", "",
              f"Mean per chat with a percentile-bootstrap {level}% interval.", "",
              "| policy | chats | mean | 95% CI |", "|---|---:|---:|---|"]
    lines += [f"| {label} | {s['primary']['n']} | {num(s['primary']['mean'])} | {ci(s['primary'])} |"
              for label, s in summary["arms"].items()]
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
        for measure in dict.fromkeys((primary, "success", "naturalness", "would_talk_again")):
            m = p[measure]
            lines.append(f"| {measure} | {m['participants']} | {num(m['a'])} | {num(m['b'])} | "
                         f"{num(m['diff'], True)} | {ci(m, True)} |")
        lines.append("")
    if summary["questionnaire"]:
        lines += ["## The people beside the shipped personas", "",
                  "Questionnaire answers (consented, not excluded) beside the default scenarios' persona sampler "
                  "(`training`) and the shipped fit of the real P4G persuadees (`p4g_people`).", "",
                  "| item | value | people | training | p4g_people |", "|---|---|---:|---:|---:|"]
        for item, q in summary["questionnaire"].items():
            for value in q["people"]:
                lines.append(f"| {item} (n={q['n']}) | {value} | {num(q['people'][value])} | "
                             f"{num(q['training'][value])} | {num(q['p4g_people'][value])} |")
        lines.append("")
    lines += ["", f"![success per policy]({CHART})", ""]
    return "\n".join(lines)
