"""Co-trained LLM simulators generating on the policy's vLLM server: one versioned LoRA name per simulator.

The fast tests use a fake vLLM server on loopback and a tiny random model with SmolLM2's tokenizer; the slow one
co-trains against the session's real server (``vllm_server``).
"""

from __future__ import annotations

import math

import pytest
import torch

from simpop.agents.base import SamplingParams
from simpop.agents.policy import LLMPolicy
from simpop.agents.vllm_backend import VLLMBackend, VLLMGenerator
from simpop.seat import Scores
from simpop.simulators.trainable import LLMEpisode, TrainableLLMSimulator
from simpop.train.cotrain import CoTrainConfig, CoTrainer
from simpop.train.grpo import GRPOConfig, GRPOTrainer
from simpop.train.objectives import Mismatch
from tests.agents.test_vllm_backend import FakeVLLM

ENV = "simpop/Persuasion-v0"
ENV_KWARGS = {"max_turns": 1}
SIM_PARAMS = SamplingParams(max_new_tokens=3, temperature=1.0)
SEED = 1  # each simulator drives 2 of the 4 dialogues


@pytest.fixture
def fake():
    server = FakeVLLM()
    yield server
    server.server.shutdown()


def _setup(model, url, workdir, sim_model=None, seed=SEED, **config):
    from simpop.agents.transformers_backend import TransformersBackend

    grpo = GRPOConfig(group_size=2, scenarios_per_update=2, max_new_tokens=3, seed=seed)
    policy = LLMPolicy(TransformersBackend(model), grpo.sampling(), lora=True, lora_r=4, lora_alpha=8,
                       system_prompt="Ask for a donation.")
    policy.generator = VLLMGenerator(VLLMBackend(f"{url}/v1", "smollm2", tokenizer=model), "policy", workdir=workdir)
    shared = TransformersBackend(sim_model or model)
    sims = [TrainableLLMSimulator(shared, f"sim{i}", SIM_PARAMS, lora_r=4, lora_alpha=8, name=f"sim{i}")
            for i in range(2)]
    trainer = CoTrainer(GRPOTrainer(ENV, policy, None, grpo, env_kwargs=ENV_KWARGS), sims,
                        CoTrainConfig(population_size=2, sim_lr=0.05, target_success=0.25, **config))
    return trainer, policy, sims


def test_simulators_generate_and_sync_their_own_versioned_adapters(fake, tiny_model, tmp_path):
    from safetensors.torch import load_file

    trainer, policy, sims = _setup(tiny_model, fake.url, tmp_path)
    assert [s.generator.adapter for s in sims] == ["sim0", "sim1"]
    assert all(s.generator.client is not policy.generator.client for s in sims)  # each sends its own model=

    for sim in sims:
        sim.clear()
    batch = trainer.policy_trainer.collect()
    drove = {s.name: sum(t.simulator == s.name for t in batch.trajectories) for s in sims}
    assert all(n >= 2 for n in drove.values()), drove  # both simulators update (seeded)
    # Each simulator loaded its adapter before its first reply and generated under its own name.
    models = [b["model"] for p, b in fake.requests if p == "/v1/completions"]
    assert set(models) == {"smollm2", "sim0@v1", "sim1@v1"}  # the policy's fresh adapter is the base model
    assert sorted(fake.adapters) == ["sim0@v1", "sim1@v1"]
    assert all(e.turns and len(e.turns[0].logprobs) == len(e.turns[0].token_ids) for s in sims for e in s.episodes)

    for sim in sims:  # differing outcomes per simulator, so that each objective has a gradient
        for i, t in enumerate(t for t in batch.trajectories if t.simulator == sim.name):
            t.success = i % 2 == 0
    policy_metrics = trainer.policy_trainer.update(batch)
    metrics = trainer.update_simulators(batch)
    assert policy_metrics["generator_version"] == 1 and metrics["sim_generator_version"] == 2
    assert sorted(fake.adapters) == ["policy@v1", "sim0@v2", "sim1@v2"]  # older versions unloaded
    for sim in sims:  # synced after the optimiser step: the served folder holds the updated weights
        served = load_file(f"{fake.adapters[f'{sim.adapter}@v2']}/adapter_model.safetensors")
        assert served.keys() == sim.state_dict().keys()
        assert all(torch.equal(served[k], v) for k, v in sim.state_dict().items())
    # The fake's log-probs (-0.5) are far from the random model's (about -log 49152 = -10.8): the mismatch is
    # logged, and every weight pi_torch / pi_gen is far below the cap (none truncated).
    assert 9 < metrics["sim_gen_logp_abs_diff"] < 12 and metrics["sim_tis_truncated_frac"] == 0
    assert math.isfinite(metrics["sim_loss"]) and metrics["sim_sync_s"] >= 0

    # A frozen snapshot serves its own adapter, loaded once before its first reply.
    snapshot = sims[0].snapshot()
    assert snapshot.generator.adapter == snapshot.adapter == "sim0_s0" and sims[0].generator.adapter == "sim0"
    snapshot.raw_generate([[{"role": "user", "content": "hi"}]], SIM_PARAMS)
    assert "sim0_s0@v1" in fake.adapters and "sim0@v2" in fake.adapters


def test_tis_weights_each_reply_token_of_the_score(tiny_model, fake, tmp_path):
    _, _, sims = _setup(tiny_model, fake.url, tmp_path)
    sim = sims[0]
    sim.raw_generate([[{"role": "user", "content": "Would you donate?"}]] * 2, SIM_PARAMS)
    episodes = [LLMEpisode([turn]) for turn in sim._last]
    sim.is_weights = None
    plain = sim.score(episodes)
    sim.is_weights = lambda logp, gen, mask: Mismatch(2.0 * mask, 0.0, 0.0)
    doubled = sim.score(episodes)
    assert isinstance(doubled, Scores) and torch.allclose(doubled.logprob, 2 * plain.logprob)
    assert torch.allclose(doubled.kl, plain.kl)


def test_simulators_on_another_base_model_or_switched_off_stay_in_torch(tiny_model, fake, tmp_path):
    with pytest.raises(ValueError, match="sim_generator"):
        _setup(tiny_model, fake.url, tmp_path, sim_model="smollm2")
    trainer, policy, sims = _setup(tiny_model, fake.url, tmp_path, sim_generator=False)
    assert policy.generator is not None and all(s.generator is None for s in sims)
    policy.generator.adapter = None  # a fully fine-tuned policy owns the server's base weights
    with pytest.raises(ValueError, match="--lora"):
        CoTrainer(trainer.policy_trainer, sims, CoTrainConfig(population_size=2))


def test_cotraining_update_on_a_real_server_moves_every_adapter_version(vllm_server):
    from simpop.agents.transformers_backend import TransformersBackend
    from simpop.agents.vllm_backend import build_generator

    grpo = GRPOConfig(group_size=2, scenarios_per_update=2, max_new_tokens=4, seed=SEED)
    backend = TransformersBackend("smollm2")
    policy = LLMPolicy(backend, grpo.sampling(), lora=True, lora_r=4, lora_alpha=8,
                       system_prompt="Ask for a donation.")
    policy.generator = build_generator(f"vllm:{vllm_server.url}", "smollm2", backend.path, policy.adapter, 4)
    shared = TransformersBackend("smollm2")
    sims = [TrainableLLMSimulator(shared, f"sim{i}", SIM_PARAMS, lora_r=4, lora_alpha=8, name=f"sim{i}")
            for i in range(2)]
    trainer = CoTrainer(GRPOTrainer(ENV, policy, None, grpo, env_kwargs=ENV_KWARGS), sims,
                        CoTrainConfig(population_size=2, sim_lr=0.05, target_success=0.25))
    for sim in sims:
        sim.clear()
    batch = trainer.policy_trainer.collect()
    assert all(sum(t.simulator == s.name for t in batch.trajectories) >= 2 for s in sims)
    for sim in sims:
        for i, t in enumerate(t for t in batch.trajectories if t.simulator == sim.name):
            t.success = i % 2 == 0
    metrics = trainer.policy_trainer.update(batch)
    metrics.update(trainer.update_simulators(batch))

    loaded = {m["id"] for m in policy.generator.client.served_models()}
    assert {"policy@v1", "sim0@v2", "sim1@v2"} <= loaded and not {"sim0@v1", "sim1@v1"} & loaded
    assert metrics["generator_version"] == 1 and metrics["sim_generator_version"] == 2
    # Replies were sampled on the server under sim0@v1 = the base weights: vLLM and torch agree.
    assert 0 <= metrics["sim_gen_logp_abs_diff"] < 0.05 and math.isfinite(metrics["sim_loss"])
    # The served sim0@v2 is the trained adapter: vLLM's log-probs under it match torch's.
    prompt = shared.encode_chat([{"role": "user", "content": "Would you donate to a children's charity?"}])
    client = sims[0].generator.client
    client.adapter = "sim0@v2"
    (sampled,) = client.generate_ids([prompt], SamplingParams(max_new_tokens=6, temperature=1.0, seed=0,
                                                              logprobs=True))
    sequence, mask = prompt + sampled.token_ids, [0] * len(prompt) + [1] * len(sampled.token_ids)
    sims[0].lora.activate()
    with torch.no_grad():
        trained = shared.token_logprobs([sequence], [mask]).logprobs[0, len(prompt):]
        with sims[0].lora.disabled():
            base = shared.token_logprobs([sequence], [mask]).logprobs[0, len(prompt):]
    served = torch.tensor(sampled.logprobs)
    assert (served - trained).abs().mean() < 0.02 < (trained - base).abs().mean()


def test_a_snapshot_leaving_the_pool_unloads_its_adapter(tiny_model, fake, tmp_path):
    trainer, _, sims = _setup(tiny_model, fake.url, tmp_path, pool_size=1, pool_sample_prob=0.5)
    (old,) = trainer.pool.members
    old.raw_generate([[{"role": "user", "content": "hi"}]], SIM_PARAMS)  # loads its adapter on first use
    assert f"{old.adapter}@v1" in fake.adapters
    trainer._add_snapshot(0, 1, sims[0].state_dict())
    assert trainer.pool.members[0] is not old and f"{old.adapter}@v1" not in fake.adapters
    assert not (tmp_path / f"{old.adapter}@v1").exists()


def test_a_resumed_policy_serves_its_weights_under_the_saved_version(tiny_model, fake, tmp_path):
    trainer, policy, _ = _setup(tiny_model, fake.url, tmp_path / "a")
    grpo = trainer.policy_trainer
    fresh = grpo.state_dict()  # before any sync: the server's base model is the policy
    metrics = grpo.update(grpo.collect())
    assert metrics["generator_version"] == 1
    state = grpo.state_dict()

    resumed, again, _ = _setup(tiny_model, fake.url, tmp_path / "b")
    resumed.policy_trainer.load_state_dict(fresh)
    assert again.generator.version == 0 and again.generator.served == "smollm2"
    resumed.policy_trainer.load_state_dict(state)
    # Before, a resumed run restarted its versions at 1 (metrics and served names differed from an uninterrupted run).
    assert again.generator.version == 1 and again.generator.served == "policy@v1"
    assert resumed.policy_trainer.update(resumed.policy_trainer.collect())["generator_version"] == 2
