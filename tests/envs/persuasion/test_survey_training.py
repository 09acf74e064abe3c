"""Text GRPO learns from the closing survey: SmolLM2 policy (LoRA) against a sampling SmolLM2 persuadee."""

from __future__ import annotations

import numpy as np
import torch

import simpop
from simpop.agents.policy import ModelConfig, build_policy
from simpop.simulators.registry import build_simulator
from simpop.train.grpo import GRPOConfig, GRPOTrainer

ENV = "simpop/Persuasion-v1"
ENV_KWARGS = {"max_turns": 2}


def test_two_text_grpo_updates_get_reward_variance_from_the_survey_and_move_the_lora_weights():
    env = simpop.make(ENV, **ENV_KWARGS)
    # A fixed seed: with SmolLM2 at temperature 1 a group of two differs in roughly one group in eight (seeds 0-3:
    # P(I donate nothing) is 0.1-0.4 per chat and shared by a group's persona); seed 1's first update has one.
    config = GRPOConfig(group_size=2, scenarios_per_update=2, max_new_tokens=12, seed=1)
    policy = build_policy(env, ModelConfig(lora=True, lora_r=4, lora_alpha=8), config.sampling())
    simulator = build_simulator("frozen:smollm2?temperature=1.0&max_new_tokens=24", env=env)
    trainer = GRPOTrainer(ENV, policy, simulator, config, env_kwargs=ENV_KWARGS)
    before = [p.detach().clone() for p in policy.parameters()]
    batches, metrics = [], []
    for _ in range(2):
        batch = trainer.collect()
        batches.append(batch)
        metrics.append(trainer.update(batch))
    trajectories = [t for b in batches for t in b.trajectories]
    # Every dialogue has an outcome: stated in the dialogue or answered in the survey (never truncated).
    assert all(t.terminated and not t.truncated for t in trajectories)
    sources = [t.infos[-1]["outcome_source"] for t in trajectories]
    assert set(sources) <= {"decided_in_dialogue", "survey"} and "survey" in sources
    assert all(t.infos[-1]["survey_parse"] == "strict" for t, s in zip(trajectories, sources) if s == "survey")
    assert simulator.stats["survey_scored"] == sources.count("survey") and simulator.stats["survey_errors"] == 0
    # At least one group's rewards differ, so GRPO has a gradient and the adapter moves.
    variances = [np.var([t.total_reward for t in b.trajectories if t.group == g])
                 for b in batches for g in set(b.groups.tolist())]
    assert any(v > 0 for v in variances) and min(m["zero_var_frac"] for m in metrics) < 1.0
    assert any(m["grad_norm"] > 0 for m in metrics)
    assert any(not torch.equal(b, p) for b, p in zip(before, policy.parameters()))
