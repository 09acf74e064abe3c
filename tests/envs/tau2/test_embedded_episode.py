"""A full τ² episode with the embedded model (SmolLM2-135M) as both agent and user, through the rollout engine."""

from __future__ import annotations


from simpop.agents.base import SamplingParams
from simpop.envs.tau2.env import Tau2Env
from simpop.simulators.llm import LLMSimulator
from simpop.rollout import RolloutEngine


def test_embedded_model_plays_agent_and_user_on_mock():
    from simpop.agents.transformers_backend import TransformersBackend
    from simpop.agents.policy import LLMPolicy

    backend = TransformersBackend("smollm2")
    policy = LLMPolicy(backend, SamplingParams(max_new_tokens=16, temperature=1.0, logprobs=True), lora=True)
    user = LLMSimulator(backend, SamplingParams(max_new_tokens=16))  # greedy: τ²'s default user setting
    engine = RolloutEngine(lambda: Tau2Env("mock", max_steps=4), policy, user)
    [trajectory] = engine.collect(["create_task_1"], seed=0)
    final = trajectory.infos[-1]
    assert trajectory.terminated or trajectory.truncated
    assert final["termination_reason"] in {"user_stop", "agent_stop", "user_error", "max_steps", "too_many_errors"}
    assert final["reward"] == trajectory.total_reward and 0.0 <= final["reward"] <= 1.0
    assert trajectory.actions["agent"] and trajectory.actions["user"]
    # The policy's system prompt is τ²'s agent prompt (policy and tools) and its tokens are tracked exactly.
    assert trajectory.policy_tokens > 0 and len(trajectory.token_ids) == len(trajectory.mask) == len(trajectory.logprobs)
    assert "<policy>" in backend.tokenizer.decode(trajectory.token_ids[:trajectory.prompt_length])
    print(f"\nembedded τ² mock episode: {len(trajectory.infos)} steps, {final['termination_reason']}, "
          f"reward {final['reward']}, {engine.stats.total_s:.1f}s (model {engine.stats.model_s:.1f}s)")
