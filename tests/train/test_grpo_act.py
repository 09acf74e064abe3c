"""Act-level GRPO on PersuasionAct-v0: it learns, logs, checkpoints, and resumes exactly."""

from __future__ import annotations

import json

import numpy as np

import simpop
from simpop.agents.policy import ActPolicy, ModelConfig, build_policy
from simpop.envs.persuasion.simulators import native_act
from simpop.evaluation.metrics import WALL_CLOCK_KEYS
from simpop.rollout import RolloutEngine
from simpop import checkpoint
from simpop.train import loop
from simpop.train.grpo import GRPOConfig, GRPOTrainer

ENV = "simpop/PersuasionAct-v0"


def _trainer(**config) -> GRPOTrainer:
    # lr 1e-2 (above the 200-update default, 3e-3): these tests learn in 15 updates
    cfg = GRPOConfig(**{"group_size": 8, "scenarios_per_update": 8, "epochs": 4, "lr": 1e-2, "seed": 11, **config})
    env = simpop.make(ENV)
    return GRPOTrainer(ENV, build_policy(env, ModelConfig(), seed=cfg.seed), native_act(env), cfg)


def _success(policy: ActPolicy, seed: int = 1234) -> float:
    """Success of ``policy`` (sampling) on a fixed evaluation set of 256 dialogues."""
    engine = RolloutEngine(ENV, policy, native_act(simpop.make(ENV)))
    return float(np.mean([t.success for t in engine.collect(64, group_size=4, seed=seed)]))


def test_act_grpo_improves_success_over_the_initial_policy():
    trainer = _trainer()
    assert isinstance(trainer.policy, ActPolicy)
    initial = _success(trainer.policy)
    history = loop.run(trainer, 15)
    assert len(history) == 15 and trainer.update_count == 15
    final = _success(trainer.policy)
    assert final > initial + 0.1, (initial, final)
    assert history[-1]["policy_entropy"] < history[0]["policy_entropy"]
    assert all(0 <= m["zero_var_frac"] <= 1 and np.isfinite(m["loss"]) for m in history)


def test_metrics_and_checkpoints_on_disk(tmp_path):
    trainer = _trainer(kl_coef=0.05, scenarios_per_update=2)
    loop.run(trainer, 7, tmp_path, config=loop.LoopConfig(save_every=2, keep_checkpoints=3))
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6, 7]
    assert all(r["kind"] == "train" for r in records)
    expected = {"reward_mean", "reward_std", "success", "policy_entropy", "zero_var_frac", "kl", "loss",
                "steps_per_s"}
    assert expected <= set(records[0])
    assert records[-1]["kl"] > 0  # the KL to the frozen initial policy grows as it learns
    # every save_every updates and after the last one; the newest keep_checkpoints are kept
    assert [p.name for p in sorted(checkpoint.checkpoint_dir(tmp_path).glob("step_*.pt"))] == \
        ["step_0000004.pt", "step_0000006.pt", "step_0000007.pt"]
    step, state = checkpoint.load(checkpoint.latest(tmp_path), restore_rng=False)
    assert step == 7 and state["update_count"] == 7 and state["config"]["kl_coef"] == 0.05


def _lines(run_dir) -> list[dict]:
    """metrics.jsonl records without wall-clock fields (which differ between any two runs)."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in WALL_CLOCK_KEYS} for r in records]


def test_kill_and_resume_reproduces_the_uninterrupted_run(tmp_path):
    small = {"scenarios_per_update": 4, "kl_coef": 0.02}
    loop.run(_trainer(**small), 6, tmp_path / "straight")
    loop.run(_trainer(**small), 3, tmp_path / "killed")
    # The killed run had written a 4th metrics line but died before its checkpoint.
    with (tmp_path / "killed" / "metrics.jsonl").open("a") as f:
        f.write('{"step": 4, "kind": "train", "reward_mean": 0.123}\n')
    resumed = _trainer(**small)
    history = loop.run(resumed, 6, tmp_path / "killed", resume=True)
    assert len(history) == 3 and resumed.update_count == 6  # only the remaining updates
    straight, killed = _lines(tmp_path / "straight"), _lines(tmp_path / "killed")
    assert len(straight) == 6 and straight == killed
    loop.run(_trainer(**{**small, "seed": 12}), 1, tmp_path / "other-seed")
    assert _lines(tmp_path / "other-seed")[0] != straight[0]  # the comparison can fail
