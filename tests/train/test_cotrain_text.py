"""Co-training at the text level on the one-layer ``tiny_model`` (tiny lengths): a LoRA simulator learns; the
plumbing only (SmolLM2 co-trains in test_cotrain_vllm.py and tests/integrations/test_openenv_cotrain.py)."""

from __future__ import annotations

import math

import pytest
import torch

from simpop.agents.base import SamplingParams
from simpop.agents.policy import LLMPolicy
from simpop.simulators.trainable import TrainableLLMSimulator
from simpop.train.cotrain import CoTrainConfig, CoTrainer
from simpop.train.grpo import GRPOConfig, GRPOTrainer

ENV = "simpop/Persuasion-v0"
ENV_KWARGS = {"max_turns": 1}


def test_llm_simulator_update_on_shared_rollouts_changes_its_adapter_only(tiny_model):
    from simpop.agents.transformers_backend import TransformersBackend

    grpo = GRPOConfig(group_size=2, scenarios_per_update=2, max_new_tokens=4, seed=1)
    policy = LLMPolicy(TransformersBackend(tiny_model), grpo.sampling(), lora=True, lora_r=4, lora_alpha=8,
                       system_prompt="Ask for a donation.")
    shared = TransformersBackend(tiny_model)  # the simulators' base: one adapter per simulator
    sims = [TrainableLLMSimulator(shared, f"sim{i}", SamplingParams(max_new_tokens=4, temperature=1.0), lora_r=4,
                                  lora_alpha=8, name=f"sim{i}") for i in range(2)]
    assert shared.adapter_names == ["sim0", "sim1"] and [s.adapter for s in sims] == ["sim0", "sim1"]
    trainer = CoTrainer(GRPOTrainer(ENV, policy, None, grpo, env_kwargs=ENV_KWARGS), sims,
                        CoTrainConfig(population_size=2, sim_lr=1e-2, target_success=0.25))
    # Co-training checkpoints every pass with gradients of the backends it trains; None leaves theirs.
    assert policy.backend.checkpoint_tokens == shared.checkpoint_tokens == 0
    shared.checkpoint_tokens = 7
    CoTrainer(GRPOTrainer(ENV, policy, None, grpo, env_kwargs=ENV_KWARGS), sims,
              CoTrainConfig(population_size=2, checkpoint_tokens=None))
    assert (policy.backend.checkpoint_tokens, shared.checkpoint_tokens) == (0, 7)
    with pytest.raises(ValueError, match="checkpoint_tokens must be >= 0 or None"):
        CoTrainConfig(checkpoint_tokens=-1)
    shared.checkpoint_tokens = 0

    for sim in sims:
        sim.clear()
    batch = trainer.policy_trainer.collect()
    mine = [t for t in batch.trajectories if t.simulator == "sim0"]
    episodes = sims[0].episodes
    assert len(episodes) == len(mine) and all(e.turns and e.turns[0].token_ids for e in episodes)
    with torch.no_grad():  # re-scoring reproduces the sampling log-probs of the simulator's own tokens
        scores = sims[0].score(episodes)
    recorded = torch.tensor([sum(sum(t.logprobs) for t in e.turns) for e in episodes])
    assert torch.allclose(scores.logprob, recorded, atol=1e-3)
    assert float(scores.kl.abs().max()) < 1e-5  # a fresh adapter is the base model

    # Give each simulator's dialogues differing outcomes, so that its objective has a gradient (target
    # 0.25 != batch success 0.5). With one dialogue, the batch success is its own: the advantage is 0.
    counts = {name: sum(t.simulator == name for t in batch.trajectories) for name in ("sim0", "sim1")}
    assert max(counts.values()) >= 2  # 4 dialogues, 2 simulators
    for name in counts:
        for i, t in enumerate(t for t in batch.trajectories if t.simulator == name):
            t.success = i % 2 == 0
    before = {name: [p.detach().clone() for p in shared.parameters(name)] for name in counts}
    policy_before = [p.detach().clone() for p in policy.parameters()]
    metrics = trainer.update_simulators(batch)
    assert math.isfinite(metrics["sim_loss"]) and 0 < metrics["sim_success"] < 1
    for name, n in counts.items():
        changed = [not torch.equal(b, p) for b, p in zip(before[name], shared.parameters(name))]
        assert any(changed) == (n >= 2), (name, n)
    assert all(torch.equal(b, p) for b, p in zip(policy_before, policy.parameters()))

    snapshot = sims[0].snapshot()
    assert snapshot.frozen and snapshot.adapter in shared.adapter_names
    assert all(torch.equal(a, b) for a, b in zip(shared.parameters(snapshot.adapter), shared.parameters("sim0")))
