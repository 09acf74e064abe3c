"""``simpop train grpo`` with the policy on a vLLM server: a simulator on the policy's base model generates there
too (the experiments' path, :func:`simpop.agents.vllm_backend.on_policy_server`), against a fake server."""

from __future__ import annotations

import shutil

import pytest

from simpop.agents.policy import ModelConfig
from simpop.agents.vllm_backend import ServedGeneration
from simpop.envs.registration import make
from simpop.rollout_ray import RayConfig
from simpop.train.cli import build_grpo
from simpop.train.grpo import GRPOConfig
from tests.agents.test_vllm_backend import FakeVLLM

ENV, ENV_KWARGS = "simpop/Persuasion-v0", {"max_turns": 1}


@pytest.fixture
def fake():
    server = FakeVLLM()
    yield server
    server.server.shutdown()


def _trainer(tiny_model, simulator: str, generator: str):
    grpo = GRPOConfig(group_size=2, scenarios_per_update=1, max_new_tokens=3, seed=0)
    model = ModelConfig(model=str(tiny_model), dtype="float32", lora=True, lora_r=4, lora_alpha=8,
                        generator=generator)
    configs = {"grpo": grpo, "model": model, "rollout": RayConfig()}
    return build_grpo(ENV, make(ENV, **ENV_KWARGS), simulator, configs, ENV_KWARGS)


def test_a_simulator_on_the_policys_base_generates_on_its_server(fake, tiny_model, tmp_path):
    fake.root = str(tiny_model)  # the fake serves the tiny model's folder
    trainer = _trainer(tiny_model, f"frozen:transformers:{tiny_model}?max_new_tokens=3", f"vllm:{fake.url}")
    sim = trainer.training_simulator
    assert isinstance(sim.backend, ServedGeneration) and sim.backend.local.path == tiny_model
    trainer.collect()
    chats = [body for path, body in fake.requests if path == "/v1/chat/completions"]
    assert sim.stats["replies"] == 2 and {body["model"] for body in chats} == {"smollm2"}
    assert len(chats) == 1  # the fake policy's replies are equal: one greedy chat, asked once
    assert {body["model"] for path, body in fake.requests if path == "/v1/completions"} == {"smollm2"}  # the policy

    other = tmp_path / "other"  # another base model: it stays in process
    shutil.copytree(tiny_model, other)
    sim = _trainer(tiny_model, f"frozen:transformers:{other}", f"vllm:{fake.url}").training_simulator
    assert not isinstance(sim.backend, ServedGeneration) and sim.backend.path == other
    sim = _trainer(tiny_model, f"frozen:transformers:{tiny_model}", "").training_simulator
    assert not isinstance(sim.backend, ServedGeneration)  # the policy generates in torch: so does the simulator
