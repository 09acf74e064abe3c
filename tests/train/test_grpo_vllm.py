"""Text GRPO generating on a real vLLM server (the session's ``vllm_server``) while training LoRA in torch."""

from __future__ import annotations

import math

import numpy as np
import torch

import simpop
from simpop.agents.base import SamplingParams
from simpop.agents.policy import LLMPolicy
from simpop.agents.vllm_backend import VLLMBackend, build_generator
from simpop.envs.persuasion.simulators import native_text
from simpop.train.grpo import Batch, GRPOConfig, GRPOTrainer

ENV = "simpop/Persuasion-v0"
ENV_KWARGS = {"max_turns": 2}


class Recorder:
    """Wraps the generator's client: every (model, prompt, generation) the server produced."""

    def __init__(self, client: VLLMBackend):
        self.client, self.calls = client, []
        self._generate_ids = client.generate_ids
        client.generate_ids = self  # type: ignore[method-assign]

    def __call__(self, prompts, params):
        generations = self._generate_ids(prompts, params)
        self.calls += [(self.client.model, p, g) for p, g in zip(prompts, generations)]
        return generations


def _with_signal(batch: Batch) -> Batch:
    """The same rollouts with advantages +1 / -1 per group, so every update moves the adapter."""
    return Batch(batch.trajectories, np.array([1.0, -1.0] * (len(batch.trajectories) // 2)), batch.stats)


def test_lora_grpo_syncs_versioned_adapters_and_keeps_token_ids(vllm_server):
    from simpop.agents.transformers_backend import TransformersBackend

    cfg = GRPOConfig(group_size=2, scenarios_per_update=1, max_new_tokens=6, seed=5, lr=5e-3)
    backend = TransformersBackend("smollm2")
    policy = LLMPolicy(backend, cfg.sampling(), lora=True, lora_r=4, lora_alpha=8,
                       system_prompt="Ask for a donation.")
    policy.generator = build_generator(f"vllm:{vllm_server.url}", "smollm2", backend.path, policy.adapter, 4)
    recorder = Recorder(policy.generator.client)
    trainer = GRPOTrainer(ENV, policy, native_text(simpop.make(ENV, **ENV_KWARGS)), cfg, env_kwargs=ENV_KWARGS)

    served = []
    for update in (1, 2):
        batch = trainer.collect()
        served.append({model for model, _, _ in recorder.calls})
        recorder.calls.clear()
        metrics = trainer.update(_with_signal(batch))
        assert metrics["generator_version"] == update and policy.generator.served == f"policy@v{update}"
        loaded = {m["id"] for m in policy.generator.client.served_models()}
        assert f"policy@v{update}" in loaded and f"policy@v{update - 1}" not in loaded  # old versions unloaded
        assert metrics["grad_norm"] > 0 and math.isfinite(metrics["loss"])
        # Same weights, two engines: the sampling log-probs of vLLM and torch agree closely.
        assert 0 <= metrics["gen_logp_abs_diff"] < 0.05 and 0 <= metrics["tis_truncated_frac"] <= 1
    # The first collection ran on the base model, the second on the first synced adapter.
    assert served == [{"smollm2"}, {"policy@v1"}]

    # Token ids round-trip across turns: each dialogue's turn-2 prompt starts with its turn-1 prompt plus
    # exactly the ids the server generated, and the server saw exactly the prompt ids simpop sent.
    trainer.collect()
    assert all(generation.prompt_ids == prompt for _, prompt, generation in recorder.calls)
    sent = [prompt for _, prompt, _ in recorder.calls]
    continued = [any(len(later) > len(prompt) + len(generation.token_ids)
                     and later[:len(prompt) + len(generation.token_ids)] == prompt + generation.token_ids
                     for later in sent)
                 for _, prompt, generation in recorder.calls]
    pairs = sum(continued)
    assert pairs == cfg.group_size  # every first turn (and no second one) is continued token for token

    # The adapter on the server is the trained one: vLLM's log-probs under policy@v2 match torch's with the
    # adapter, and differ from the base model's.
    prompt = backend.encode_chat([{"role": "user", "content": "Would you donate to a children's charity?"}])
    client = policy.generator.client
    client.adapter = "policy@v2"
    (sampled,) = client.generate_ids([prompt], SamplingParams(max_new_tokens=8, temperature=1.0, seed=0,
                                                              logprobs=True))
    sequence, mask = prompt + sampled.token_ids, [0] * len(prompt) + [1] * len(sampled.token_ids)
    with torch.no_grad():
        trained = policy.score([sequence], [mask]).logprobs[0, len(prompt):]
        with policy.lora.disabled():
            base = backend.token_logprobs([sequence], [mask]).logprobs[0, len(prompt):]
    served_logp = torch.tensor(sampled.logprobs)
    assert (served_logp - trained).abs().mean() < 0.02 < (trained - base).abs().mean()


def test_full_finetune_sync_reloads_the_server_weights_in_place(vllm_server):
    from simpop.agents.transformers_backend import TransformersBackend
    from simpop.agents.vllm_backend import VLLMGenerator

    backend = TransformersBackend("smollm2", trainable=True)
    generator = VLLMGenerator(VLLMBackend(vllm_server.base_url, vllm_server.served_name, tokenizer=backend.path), None)
    prompt = backend.encode_chat([{"role": "user", "content": "Would you donate?"}])
    params = SamplingParams(max_new_tokens=6, temperature=1.0, seed=0, logprobs=True)

    def gap() -> float:
        """Mean |log-prob| difference between the server and the torch model on the server's own sample."""
        (sampled,) = generator.generate_ids([prompt], params)
        sequence = prompt + sampled.token_ids
        with torch.no_grad():
            torch_logp = backend.token_logprobs([sequence], [[0] * len(prompt) + [1] * len(sampled.token_ids)])
        return float((torch.tensor(sampled.logprobs) - torch_logp.logprobs[0, len(prompt):]).abs().mean())

    try:
        assert gap() < 1e-3
        with torch.no_grad():  # a "training step" the server has not seen yet
            for name, weight in backend.model.named_parameters():
                if "layers.0.mlp" in name:
                    weight.mul_(3.0)
        assert gap() > 0.1
        assert generator.sync(backend.model)["generator_version"] == 1
        assert gap() < 1e-3
    finally:  # the session's server serves the base weights again
        generator.client.reload_weights(backend.path)


def test_text_grpo_rolls_out_in_ray_workers_on_the_synced_adapter(vllm_server, ray_cluster):
    """Ray workers run the trained policy's served side (the server client at the newest adapter), the trainer
    keeps the model: after an update, the workers' dialogues were sampled by ``policy@v1``, not the base model."""
    from simpop.agents.transformers_backend import TransformersBackend
    from simpop.rollout_ray import RayConfig, RayRolloutEngine

    cfg = GRPOConfig(group_size=2, scenarios_per_update=2, max_new_tokens=6, seed=7, lr=5e-3)
    backend = TransformersBackend("smollm2")
    policy = LLMPolicy(backend, cfg.sampling(), lora=True, lora_r=4, lora_alpha=8,
                       system_prompt="Ask for a donation.")
    policy.generator = build_generator(f"vllm:{vllm_server.url}", "smollm2", backend.path, policy.adapter, 4)
    trainer = GRPOTrainer(ENV, policy, native_text(simpop.make(ENV, **ENV_KWARGS)), cfg, env_kwargs=ENV_KWARGS)
    trainer.engine = RayRolloutEngine(ENV, policy, trainer.simulator, None, ENV_KWARGS,
                                      config=RayConfig(ray=True, ray_workers=2, ray_worker_cpus=0.5))
    try:
        assert trainer.update(_with_signal(trainer.collect()))["generator_version"] == 1
        batch = trainer.collect()
        assert trainer.engine.fallbacks["ray_fallback_waves"] == 0 and len(batch.trajectories) == 4
        gaps = {"trained": [], "base": []}
        with torch.no_grad():
            for t in batch.trajectories:
                on = torch.tensor(t.mask, dtype=torch.bool)
                served = torch.tensor(t.logprobs)[on]
                gaps["trained"].append((served - policy.score([t.token_ids], [t.mask]).logprobs[0][on]).abs())
                with policy.lora.disabled():
                    base = backend.token_logprobs([t.token_ids], [t.mask]).logprobs[0][on]
                gaps["base"].append((served - base).abs())
        trained, base = (float(torch.cat(gaps[k]).mean()) for k in ("trained", "base"))
        assert trained < 0.02 < base
        metrics = trainer.update(_with_signal(batch))
        assert metrics["generator_version"] == 2 and metrics["gen_logp_abs_diff"] < 0.05
    finally:
        trainer.engine.close()
