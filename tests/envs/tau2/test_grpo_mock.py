"""Two GRPO updates on the τ² mock domain: a LoRA agent on the one-layer ``tiny_model`` (SmolLM2's tokenizer and
chat template; SmolLM2 itself plays τ² in test_embedded_episode.py), the scripted user."""

from __future__ import annotations

import math

import pytest
import torch

from simpop.agents.policy import LLMPolicy, ModelConfig
from simpop.envs.dialogue import parse_observation
from simpop.envs.tau2.simulators import ScriptedUser
from simpop.train import loop
from simpop.train.grpo import GRPOConfig, GRPOTrainer

ENV_KWARGS = {"domain": "mock", "max_steps": 6}


@pytest.fixture
def one_torch_thread():
    """The backend sets torch's thread count (1 is fastest on a shared CPU); put it back afterwards."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_two_grpo_updates_on_mock(one_torch_thread, tiny_model, tmp_path):
    from simpop.agents.transformers_backend import TransformersBackend

    config = GRPOConfig(group_size=2, scenarios_per_update=1, max_new_tokens=8, seed=0)
    model = ModelConfig(lora=True, lora_r=4, lora_alpha=8)
    policy = LLMPolicy(TransformersBackend(tiny_model, threads=1), config.sampling(), lora=model.lora,
                       lora_r=model.lora_r, lora_alpha=model.lora_alpha)
    trainer = GRPOTrainer("simpop/Tau2-mock-v0", policy, ScriptedUser(), config, env_kwargs=ENV_KWARGS)
    batches = []
    collect = trainer.collect

    def recording_collect():  # keeps each update's rollouts for the checks below
        batches.append(collect())
        return batches[-1]

    trainer.collect = recording_collect
    adapter = [p.detach().clone() for p in policy.parameters()]

    history = loop.run(trainer, 2, tmp_path)

    assert len(history) == 2 and trainer.update_count == 2
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 2
    for metrics, batch in zip(history, batches):
        print(f"\nτ² mock GRPO update: {metrics}")
        assert math.isfinite(metrics["loss"]) and metrics["policy_tokens"] > 0 and metrics["tokens_per_s"] > 0
        assert 0 <= metrics["reward_mean"] <= 1 and 0 <= metrics["success"] <= 1
        assert metrics["policy_entropy"] > 0
        for t in batch.trajectories:
            # τ²'s opening assistant message (greeting or pre-filled history) is in the policy's first
            # prompt as context, although the policy never wrote it.
            opening = next(m["content"] for m in parse_observation(t.observations["agent"][0])["messages"]
                           if m["role"] == "assistant")
            assert opening in policy.backend.tokenizer.decode(t.token_ids[:t.prompt_length])
            assert not any(t.mask[:t.prompt_length]) and t.policy_tokens > 0
    moved = any(not torch.equal(a, p) for a, p in zip(adapter, policy.parameters()))
    if any(m["zero_var_frac"] < 1 for m in history):
        assert moved and any(m["grad_norm"] > 0 for m in history)
    else:  # every group's rewards were equal: GRPO has no signal, so the loss is exactly zero
        assert all(m["zero_var_frac"] == 1.0 and m["loss"] == 0.0 for m in history) and not moved
