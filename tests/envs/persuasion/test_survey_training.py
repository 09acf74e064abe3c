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


def test_one_text_grpo_update_gets_reward_variance_from_the_survey_and_moves_the_lora_weights(smollm2):
    env = simpop.make(ENV, **ENV_KWARGS)
    # A fixed seed: with SmolLM2 at temperature 1 a group of two differs in roughly one group in eight (seeds 0-3:
    # P(I donate nothing) is 0.1-0.4 per chat and shared by a group's persona); seed 1's first update has one
    # (rewards 0, 1 in one group, 1, 1 in the other).
    config = GRPOConfig(group_size=2, scenarios_per_update=2, max_new_tokens=12, seed=1)
    policy = build_policy(env, ModelConfig(lora=True, lora_r=4, lora_alpha=8), config.sampling())
    # The persuadee only generates and scores: the session's read-only SmolLM2 (the policy trains its own).
    simulator = build_simulator("frozen:smollm2?temperature=1.0&max_new_tokens=24", env=env,
                                backends={"smollm2": smollm2})
    trainer = GRPOTrainer(ENV, policy, simulator, config, env_kwargs=ENV_KWARGS)
    before = [p.detach().clone() for p in policy.parameters()]
    batch = trainer.collect()
    metrics = trainer.update(batch)
    trajectories = batch.trajectories
    # Every dialogue has an outcome: stated in the dialogue or answered in the survey (never truncated).
    assert all(t.terminated and not t.truncated for t in trajectories)
    sources = [t.infos[-1]["outcome_source"] for t in trajectories]
    assert set(sources) <= {"decided_in_dialogue", "survey"} and "survey" in sources
    assert all(t.infos[-1]["survey_parse"] == "strict" for t, s in zip(trajectories, sources) if s == "survey")
    assert simulator.stats["survey_scored"] == sources.count("survey") and simulator.stats["survey_errors"] == 0
    # A group's rewards differ, so GRPO has a gradient and the adapter moves.
    variances = [np.var([t.total_reward for t in trajectories if t.group == g]) for g in set(batch.groups.tolist())]
    assert any(v > 0 for v in variances) and metrics["zero_var_frac"] < 1.0
    assert metrics["grad_norm"] > 0
    assert any(not torch.equal(b, p) for b, p in zip(before, policy.parameters()))
