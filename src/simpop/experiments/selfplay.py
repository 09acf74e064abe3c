"""Act-level measurements of self-play and multi-model rotation (docs/selfplay.md states the plan and rules).

Conditions, each trained with GRPO on ``simpop/PersuasionAct-v0`` for the same number of updates and seeds:

- ``frozen``: one fixed simulator, the native persuadee (base model, sampled, the scenarios' personas).
- ``rotate``: population rule ``rotate`` over three model families (base, ``shuffled-0``, ``shuffled-1``), the next
  member every ``rotate_every`` updates.
- ``self``: self-play, the user seat a second head trained by the same trainer on a zero-sum reward
  (``user_reward=opposed``).

Every run's policy is evaluated before training and after it on the held-out panel ``p4g-act-v1`` (model families
training never used, held-out personas, other temperatures) and on a secondary panel of two more strategy-shuffled
models (``shuffled-2``, ``shuffled-3``). Run it with ``python -m simpop.experiments.selfplay OUT [--seeds N]``; it
writes ``OUT/summary.json`` and prints the report's tables.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from simpop.experiments.runs import read_jsonl
from simpop.user_input import ArgumentParser, integer

ENV = "simpop/PersuasionAct-v0"
CONDITIONS = ("frozen", "rotate", "self")
ROTATION = ["persuadee", "persuadee:shuffled-0", "persuadee:shuffled-1"]
SECONDARY = {"shuffled-2-T0.9": "persuadee:shuffled-2?temperature=0.9&personas=heldout-300-4242",
             "shuffled-3-T1.1": "persuadee:shuffled-3?temperature=1.1&personas=heldout-300-4242"}


def run(condition: str, seed: int, updates: int, rotate_every: int, episodes: int) -> dict[str, Any]:
    """Train one policy under ``condition`` and evaluate it before and after; its record."""
    import simpop
    from simpop.agents.policy import ModelConfig, build_policy
    from simpop.evaluation.panel import evaluate
    from simpop.evaluation.panels import load_named_panel
    from simpop.simulators.population import Panel
    from simpop.simulators.registry import build_many, build_simulator
    from simpop.train.grpo import GRPOConfig, GRPOTrainer
    from simpop.train.loop import run as run_loop
    from simpop.train.selfplay import SelfPlayConfig, SelfPlayTrainer

    env = simpop.make(ENV)
    grpo = GRPOConfig(group_size=8, scenarios_per_update=8, lr=1e-2, seed=seed)  # the recorded results' rate
    policy = build_policy(env, ModelConfig(), seed=seed)
    if condition == "self":
        trainer: Any = SelfPlayTrainer(ENV, policy, "self", grpo, SelfPlayConfig(user_reward="opposed"))
    else:
        spec: Any = "persuadee" if condition == "frozen" else {"members": ROTATION, "rule": "rotate",
                                                                "rotate_every": rotate_every}
        trainer = GRPOTrainer(ENV, policy, build_simulator(spec, env), grpo)
    panels = {"heldout": load_named_panel("p4g-act-v1", env, env_id=ENV),
              "secondary": Panel(build_many(SECONDARY, env), name="shuffled-heldout")}
    if condition != "self":
        for panel in panels.values():
            panel.check_disjoint([trainer.training_simulator], strict=True)

    def success() -> dict[str, float]:
        out = {}
        for name, panel in panels.items():
            result = evaluate(ENV, trainer.policy, panel, episodes, seed=1_000_003)
            out[name] = result.success
            out.update({f"{name}/{k}": v for k, v in result.per_member.items()})
        return out

    start, begin = success(), time.perf_counter()
    history = run_loop(trainer, updates)
    end = success()
    record: dict[str, Any] = {"condition": condition, "seed": seed, "before": start, "after": end,
                              "train_s": time.perf_counter() - begin}
    first, last = history[: max(1, updates // 10)], history[-max(1, updates // 10):]
    for key in ("success", "user/success", "reward_mean", "user/reward_mean"):
        if key in history[0]:
            record[f"{key}@first10%"] = float(np.mean([m[key] for m in first]))
            record[f"{key}@last10%"] = float(np.mean([m[key] for m in last]))
    if condition == "rotate":
        record["members_played"] = [m["rotation_member"] for m in history]
    return record


def summarise(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Per condition: mean and 95% t-interval over seeds of held-out success after training; paired differences."""
    from simpop.evaluation.metrics import mean_ci

    def ci(values: list[float]) -> dict[str, float]:
        return dict(zip(("mean", "lo", "hi"), mean_ci(values)))

    by: dict[str, dict[int, dict[str, Any]]] = {}
    for r in records:
        by.setdefault(r["condition"], {})[r["seed"]] = r
    out: dict[str, Any] = {"conditions": {}, "differences": {}}
    for condition, runs in by.items():
        out["conditions"][condition] = {panel: ci([r["after"][panel] for r in runs.values()])
                                        for panel in ("heldout", "secondary")}
        out["conditions"][condition]["before_heldout"] = ci([r["before"]["heldout"] for r in runs.values()])
    for condition in ("rotate", "self"):
        if condition in by and "frozen" in by:
            seeds = sorted(set(by[condition]) & set(by["frozen"]))
            out["differences"][f"{condition}-frozen"] = {
                panel: ci([by[condition][s]["after"][panel] - by["frozen"][s]["after"][panel] for s in seeds])
                for panel in ("heldout", "secondary")}
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m simpop.experiments.selfplay OUT``: run every condition and seed not yet in ``OUT/runs.jsonl``
    (a stopped run resumes), then write ``OUT/summary.json`` and print it."""
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--seeds", type=integer(1, 10_000), default=8)
    parser.add_argument("--updates", type=integer(1, 1_000_000_000), default=100)
    parser.add_argument("--rotate-every", type=integer(1, 1_000_000_000), default=5)
    parser.add_argument("--episodes", type=integer(1, 100_000), default=64, help="dialogues per panel member and evaluation")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    records_path = args.out / "runs.jsonl"
    done = {(r["condition"], r["seed"]) for r in read_jsonl(records_path)}
    for seed in range(args.seeds):
        for condition in CONDITIONS:
            if (condition, seed) in done:
                continue
            record = run(condition, seed, args.updates, args.rotate_every, args.episodes)
            with records_path.open("a") as f:
                f.write(json.dumps(record) + "\n")
            print(f"{condition} seed {seed}: held-out {record['before']['heldout']:.3f} -> "
                  f"{record['after']['heldout']:.3f}  ({record['train_s']:.0f} s)", flush=True)
    summary = {"setup": vars(args) | {"out": str(args.out)}, **summarise(read_jsonl(records_path))}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps({k: v for k, v in summary.items() if k != "setup"}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
