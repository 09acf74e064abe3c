"""``simpop experiment monitor``: calibrate the collapse early warning on the act-level collapse experiment.

Each (condition, seed) of the collapse experiment (``frozen``, ``verbalized``, ``cotrain``; the trainers and the
held-out panel of :mod:`simpop.experiments.collapse`) runs through :func:`simpop.train.loop.run` with the
:class:`~simpop.train.monitor.CollapseMonitor` (its pre-registered default rule, ``on_collapse=warn``) probing
the adaptive experiment's probe panel (:func:`simpop.experiments.conditions.probe_specs`: other persuadee
models, never the held-out panel) every ``probe_every`` updates, and the held-out panel every ``eval_every``.

Measures (defined before any run was seen):

- **stop point** of a run: the first evaluation at which held-out success reaches its maximum over the run
  (after it, held-out success never improves);
- **lead time** (frozen runs): stop point minus the update at which the monitor fired (> 0: it fired before
  held-out success stopped improving); a frozen run where it never fires is a **miss**;
- **false alarm**: a verbalized or cotrain run where it fires at all.

The post-hoc variant of the rule (:data:`simpop.train.monitor.POST_HOC_REQUIRE`) is judged on the same runs by
replaying its firing rule on the recorded indicators. ``report.md`` gives, for each rule, the lead time's mean
with a 95% Student-t CI over the frozen seeds that fired, the detection rate and the false-alarm rate with Wilson
95% CIs over runs, and every run's numbers.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simpop.experiments.conditions import probe_specs
from simpop.experiments.runs import Seeded, json_default, read_jsonl, run_experiment, run_folder, train_run
from simpop.validation import at_least_one, check_fields

CONDITIONS = ("frozen", "verbalized", "cotrain")


@dataclass(frozen=True)
class MonitorCalibrationConfig(Seeded):
    """Settings of ``simpop experiment monitor``.

    Attributes:
        seeds: Seeds per condition.
        first_seed: The first seed.
        conditions: A subset of frozen, verbalized, cotrain.
        updates: Updates per run.
        eval_every: Updates between held-out evaluations.
        eval_episodes: Dialogues per held-out member per evaluation.
        probe_every: Updates between probes.
        probe_episodes: Dialogues per probe member per probe.
        workers: Parallel processes.
    """

    seeds: int = 5
    first_seed: int = 0
    conditions: tuple[str, ...] = CONDITIONS
    updates: int = 200
    eval_every: int = 10
    eval_episodes: int = 64
    probe_every: int = 10
    probe_episodes: int = 32
    workers: int = 2

    def __post_init__(self) -> None:
        check_fields(self)
        if not self.conditions or set(self.conditions) - set(CONDITIONS):
            raise ValueError(f"MonitorCalibrationConfig: conditions must be from {', '.join(CONDITIONS)}")
        at_least_one(self, ("seeds", "updates", "eval_every", "eval_episodes", "probe_every", "probe_episodes",
                            "workers"))


def run_one(config: MonitorCalibrationConfig, condition: str, seed: int, out: Path, resume: bool = True,
            report: Callable[[str, int, int, dict[str, Any]], None] | None = None, report_to: str = "none") -> Path:
    """One monitored run with :func:`~simpop.experiments.runs.train_run`, always resumed (whatever ``resume``
    says: a finished run is left as it is, an unfinished one continues from its newest checkpoint); its run folder.
    ``report_to``: its experiment trackers (:mod:`simpop.evaluation.trackers`)."""
    from simpop.evaluation.panel import evaluate
    from simpop.experiments import conditions
    from simpop.simulators.registry import load_panel
    from simpop.train.loop import LoopConfig
    from simpop.train.monitor import CollapseMonitor

    cc = conditions.CollapseConfig(level="act", seeds=1, updates=config.updates, eval_every=config.eval_every,
                                   eval_episodes=config.eval_episodes, workers=1, threads=1)
    conditions.write_card(run_folder(out, condition, seed), cc, condition, seed, experiment="monitor")

    def start(env: Any) -> tuple[Any, dict[str, Any]]:
        trainer = conditions.build_trainer(condition, cc, seed, env)
        heldout = conditions.build_panel(cc, env)
        probe_panel = load_panel({"name": "probe", "members": probe_specs()}, env)
        eval_seed, probe_seed = 1_000_003 + seed, 2_000_003 + seed

        def evaluation(step: int) -> dict[str, Any]:
            held = evaluate(cc.env_id, trainer.policy, heldout, config.eval_episodes, eval_seed, cc.env_kwargs())
            return {"heldout_success": held.success}

        def probe(step: int) -> dict[str, float]:
            return evaluate(cc.env_id, trainer.policy, probe_panel, config.probe_episodes, probe_seed,
                            cc.env_kwargs()).per_member

        return trainer, {"evaluate": evaluation, "probe": probe, "monitor": CollapseMonitor()}

    loop = LoopConfig(save_every=config.updates, keep_checkpoints=1, eval_every=config.eval_every,
                      report_to=report_to, monitor=True, probe_every=config.probe_every,
                      probe_episodes=config.probe_episodes)
    return train_run(cc, condition, seed, out, True, 1, start, report, report_to, loop)


def outcome(run_dir: Path, condition: str, seed: int) -> dict[str, Any]:
    """A finished run's outcome from its ``metrics.jsonl``: firing update, stop point, held-out curve, probes."""
    records = read_jsonl(run_dir / "metrics.jsonl")
    curve = {r["step"]: r["heldout_success"] for r in records if r["kind"] == "eval"}
    best = max(curve.values())
    warning = [r["step"] for r in records if r["kind"] == "collapse_warning"]
    probes = [{k: v for k, v in r.items() if k not in ("kind", "step", "time")} for r in records
              if r["kind"] == "probe"]
    return {"condition": condition, "seed": seed, "fired_at": warning[0] if warning else None,
            "stop": next(s for s in sorted(curve) if curve[s] == best),
            "curve": {str(s): curve[s] for s in sorted(curve)}, "probes": probes}


def judge(results: list[dict[str, Any]], fired: dict[tuple[str, int], int | None]) -> dict[str, Any]:
    """Lead time (t-CI over frozen seeds that fired), detection and false-alarm rates (Wilson CIs) for firing
    updates ``fired[(condition, seed)]``."""
    from simpop.evaluation.metrics import mean_ci, wilson_ci

    def rate(hits: int, n: int) -> dict[str, Any]:
        return {**dict(zip(("rate", "ci_low", "ci_high"), wilson_ci(hits, n))), "n": n}

    frozen = [r for r in results if r["condition"] == "frozen"]
    leads = [r["stop"] - fired[r["condition"], r["seed"]] for r in frozen
             if fired[r["condition"], r["seed"]] is not None]
    others = [r for r in results if r["condition"] != "frozen"]
    alarms = [r for r in others if fired[r["condition"], r["seed"]] is not None]
    out: dict[str, Any] = {"lead_time": {**dict(zip(("mean", "ci_low", "ci_high"), mean_ci(leads))),
                                         "per_seed": leads, "n": len(leads)}}
    if frozen:
        out["detection"] = rate(len(leads), len(frozen))
    if others:
        out["false_alarms"] = {**rate(len(alarms), len(others)),
                               "per_condition": {c: sum(r["condition"] == c for r in alarms)
                                                 for c in sorted({r["condition"] for r in others})}}
    return out


def summarise(results: list[dict[str, Any]], config: MonitorCalibrationConfig, wall_time_s: float) -> dict[str, Any]:
    """The pre-registered rule's verdicts (as the runs fired) and the post-hoc variant's (replayed on the recorded
    indicators, :func:`simpop.train.monitor.replay`)."""
    from simpop.train.monitor import POST_HOC_REQUIRE, MonitorRule, replay

    variant = MonitorRule(require=POST_HOC_REQUIRE)
    steps = [config.probe_every * (i + 1) for i in range(config.updates // config.probe_every)]
    return {"config": config.__dict__ | {"conditions": list(config.conditions)}, "wall_time_s": wall_time_s,
            "runs": results,
            "rules": {"pre-registered": judge(results, {(r["condition"], r["seed"]): r["fired_at"] for r in results}),
                      f"post-hoc (require one of {', '.join(POST_HOC_REQUIRE)})": judge(
                          results, {(r["condition"], r["seed"]): replay(r["probes"], steps, variant)
                                    for r in results})}}


def render_report(summary: dict[str, Any]) -> str:
    """The calibration report (Markdown) of a summary: settings, per-rule table, per-run lines."""
    c = summary["config"]
    lines = ["# Collapse monitor calibration (act-level P4G)", "",
             f"Conditions {c['conditions']}, seeds {c['first_seed']}..{c['first_seed'] + c['seeds'] - 1}, "
             f"{c['updates']} updates; held-out evaluation every {c['eval_every']} updates ({c['eval_episodes']} "
             f"dialogues per member), probe every {c['probe_every']} ({c['probe_episodes']} per probe member). "
             f"Wall time {summary['wall_time_s']:.0f} s. Rule: the pre-registered default of simpop.train.monitor.",
             ""]
    for name, verdicts in summary["rules"].items():
        lines += [f"### Rule: {name}", ""]
        lead = verdicts["lead_time"]
        if lead["n"]:
            lines.append(f"- **Lead time** (frozen; stop point - firing update, > 0 = early): {lead['mean']:+.1f} "
                         f"updates [95% CI {lead['ci_low']:+.1f}, {lead['ci_high']:+.1f}] over {lead['n']} seeds that "
                         f"fired (per seed {lead['per_seed']}).")
        else:
            lines.append("- **Lead time**: the monitor fired on no frozen run.")
        if "detection" in verdicts:
            d = verdicts["detection"]
            lines.append(f"- **Detection** (frozen runs where it fired): {d['rate']:.2f} [{d['ci_low']:.2f}, "
                         f"{d['ci_high']:.2f}] of {d['n']}.")
        if "false_alarms" in verdicts:
            f = verdicts["false_alarms"]
            lines.append(f"- **False alarms** (verbalized/cotrain runs where it fired): {f['rate']:.2f} "
                         f"[{f['ci_low']:.2f}, {f['ci_high']:.2f}] of {f['n']} ({f['per_condition']}).")
        lines.append("")
    lines.append("The table shows the pre-registered rule as the runs fired it.")
    lines += ["", "| condition | seed | fired at | stop point | held-out at 0 / best / final | indicators at firing |",
              "|---|---|---|---|---|---|"]
    for r in summary["runs"]:
        curve = list(r["curve"].values())
        fired = next((p for p in r["probes"] if p["warning_fired_now"]), None)
        held = ", ".join(k.split("/")[1] for k, v in (fired or {}).items() if k.startswith("indicator/") and v) or "-"
        lines.append(f"| {r['condition']} | {r['seed']} | {r['fired_at'] if r['fired_at'] is not None else '-'} | "
                     f"{r['stop']} | {curve[0]:.3f} / {max(curve):.3f} / {curve[-1]:.3f} | {held} |")
    return "\n".join(lines) + "\n"


def run_calibration(config: MonitorCalibrationConfig, out: str | Path, resume: bool = False,
                    report_to: str = "none") -> Path:
    """Run every (condition, seed) (finished ones are kept with ``resume``), then write summary and report.
    ``report_to``: the experiment trackers of every run (:mod:`simpop.evaluation.trackers`)."""
    out, wall_time_s = run_experiment(run_one, config, out, resume, MonitorCalibrationConfig(), False, report_to)
    results = [outcome(run_folder(out, c, s), c, s) for s in config.seed_list for c in config.conditions]
    summary = summarise(results, config, wall_time_s)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=json_default))
    report = out / "report.md"
    report.write_text(render_report(summary))
    return report
