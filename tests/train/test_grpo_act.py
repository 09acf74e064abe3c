"""Act-level GRPO on PersuasionAct-v0: it learns, logs, checkpoints, and resumes exactly."""

from __future__ import annotations

import json

import numpy as np

import simpop
from simpop.envs.persuasion.simulators import native_act
from simpop.evaluation.metrics import WALL_CLOCK_KEYS
from simpop.train import checkpoint
from simpop.train.grpo import ActPolicy, GRPOConfig, GRPOTrainer
from simpop.rollout import RolloutEngine

ENV = "simpop/PersuasionAct-v0"


def _trainer(run_dir=None, resume=False, **config) -> GRPOTrainer:
    cfg = GRPOConfig(**{"group_size": 8, "scenarios_per_update": 8, "epochs": 4, "seed": 11, **config})
    env = simpop.make(ENV)
    return GRPOTrainer(ENV, ActPolicy.for_env(env, cfg.hidden_size, cfg.seed), native_act(env), cfg,
                       run_dir=run_dir, resume=resume)


def _success(policy: ActPolicy, seed: int = 1234) -> float:
    """Success of ``policy`` (sampling) on a fixed evaluation set of 256 dialogues."""
    engine = RolloutEngine(ENV, policy, native_act(simpop.make(ENV)))
    return float(np.mean([t.success for t in engine.collect(64, group_size=4, seed=seed)]))


def test_act_grpo_improves_success_over_the_initial_policy():
    trainer = _trainer()
    initial = _success(trainer.policy)
    history = trainer.train(15)
    final = _success(trainer.policy)
    assert final > initial + 0.1, (initial, final)
    assert history[-1]["policy_entropy"] < history[0]["policy_entropy"]
    assert all(0 <= m["zero_var_frac"] <= 1 and np.isfinite(m["loss"]) for m in history)


def test_metrics_and_checkpoints_on_disk(tmp_path):
    trainer = _trainer(tmp_path, save_every=2, keep_checkpoints=2, kl_coef=0.05, scenarios_per_update=2)
    trainer.train(5)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5]
    expected = {"reward_mean", "reward_std", "success", "policy_entropy", "zero_var_frac", "kl", "loss",
                "steps_per_s"}
    assert expected <= set(records[0])
    assert records[-1]["kl"] > 0  # the KL to the frozen initial policy grows as it learns
    assert [p.name for p in sorted(checkpoint.checkpoint_dir(tmp_path).glob("step_*.pt"))] == \
        ["step_0000002.pt", "step_0000004.pt"]


def _lines(run_dir) -> list[dict]:
    """metrics.jsonl records without wall-clock fields (which differ between any two runs)."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in WALL_CLOCK_KEYS} for r in records]


def test_kill_and_resume_reproduces_the_uninterrupted_run(tmp_path):
    small = {"scenarios_per_update": 4, "kl_coef": 0.02}
    _trainer(tmp_path / "straight", **small).train(6)
    _trainer(tmp_path / "killed", **small).train(3)
    # The killed run had written a 4th metrics line but died before its checkpoint.
    with (tmp_path / "killed" / "metrics.jsonl").open("a") as f:
        f.write('{"step": 4, "reward_mean": 0.123}\n')
    resumed = _trainer(tmp_path / "killed", resume=True, **small)
    assert resumed.update_count == 3
    resumed.train(3)
    straight, killed = _lines(tmp_path / "straight"), _lines(tmp_path / "killed")
    assert len(straight) == 6 and straight == killed
    fresh = _trainer(tmp_path / "other-seed", **{**small, "seed": 12})
    fresh.train(1)
    assert _lines(tmp_path / "other-seed")[0] != straight[0]  # the comparison can fail
