"""CooperBench's simulators: the native default teammate, and LLM teammates (prompt, lenient action parsing,
counted fallbacks, an embedded-model episode)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from simpop.agents.base import Generation, SamplingParams
from simpop.envs.cooperbench.env import CooperBenchEnv
from simpop.envs.cooperbench.simulators import CooperBenchFormat, ScriptedTeammate, default_teammate
from simpop.simulators.llm import LLMSimulator
from simpop.simulators.registry import build_simulator
from simpop.envs.dialogue import parse_observation
from simpop.envs.wrappers import UserSeat


class CannedBackend:
    """Replies with the given texts in turn and records the chats it saw."""

    name = "canned"

    def __init__(self, replies: list[str]):
        self.replies = list(replies)
        self.chats: list = []

    def generate(self, chats, params):
        self.chats += chats
        return [Generation(self.replies.pop(0)) for _ in chats]


def test_llm_teammate_parses_leniently_and_counts_fallbacks():
    env = CooperBenchEnv("mini", max_steps=8)
    backend = CannedBackend([
        'Let me announce.\n```json\n{"type": "message", "text": "I take case.py"}\n```',
        "I have no idea what to do",
        '{"action": "submit"}',
    ])
    teammate = LLMSimulator(backend, SamplingParams(max_new_tokens=256), text_format=CooperBenchFormat("agent2"))
    view = UserSeat(env, teammate)
    obs, _ = view.reset(seed=0, options={"scenario_id": "textkit/task1/f1-f3"})
    for action in ('{"type": "message", "text": "I will edit slug.py only"}', '{"type": "view", "path": "."}',
                   '{"type": "submit"}'):
        obs, reward, terminated, truncated, info = view.step(action)
    assert terminated and reward == 0.0  # agent2 submitted nothing; agent1 nothing either
    assert [t.act for t in env.transcript if t.seat == "agent2"] == ["message", "message", "submit"]
    assert env.transcript[3].data["text"] == "I have no idea what to do"
    assert teammate.stats["unparsed_actions"] == 1 and teammate.stats["replies"] == 3
    system, *rest = backend.chats[1]
    assert system["role"] == "system" and system["content"].startswith("You are agent2")
    assert "Your feature (feature 3)" in system["content"]
    assert rest[-1]["role"] == "user" and rest[-1]["content"].endswith("reply with one JSON action.")
    assert "[Message from agent1]: I will edit slug.py only" in rest[0]["content"]
    assert all(a["role"] != b["role"] for a, b in zip(rest, rest[1:]))  # roles alternate
    assert parse_observation(obs)["submitted"] == {"agent1": True, "agent2": True}


def test_default_teammate_is_cooperative_scripted():
    teammate = default_teammate(CooperBenchEnv("mini"))
    assert isinstance(teammate, ScriptedTeammate) and teammate.seat == "agent2" and teammate.weights == {
        "cooperative": 1.0}


def test_embedded_model_as_agent1_against_the_scripted_teammate():
    import torch

    from simpop.agents.transformers_backend import TransformersBackend

    threads = torch.get_num_threads()
    env = CooperBenchEnv("mini", max_steps=6)
    # One thread: on a shared 2-core machine, more threads contend and are ~10x slower.
    agent = LLMSimulator(TransformersBackend("smollm2", threads=1), SamplingParams(max_new_tokens=24),
                         text_format=CooperBenchFormat("agent1"))
    view = UserSeat(env, ScriptedTeammate())
    obs, _ = view.reset(seed=0, options={"scenario_id": "kvstore/task2/f1-f3"})
    agent.reset(env.scenario, np.random.default_rng(0))
    done, steps = False, 0
    try:
        while not done:
            obs, reward, terminated, truncated, info = view.step(agent.act(obs))
            done, steps = terminated or truncated, steps + 1
    finally:
        torch.set_num_threads(threads)
    assert env.steps <= 6 and reward in (0.0, 1.0)
    assert agent.stats["replies"] == steps == agent.stats["backend_calls"]
    assert info["cooperbench"]["features"] == [1, 3] and info["cooperbench"]["apply_status"]["agent2"] == "applied"
    assert {t.seat for t in env.transcript} == {"agent1", "agent2"}
    assert all(json.loads(t.text)["type"] in ("message", "view", "write", "delete", "test", "submit")
               for t in env.transcript)


def test_llm_kinds_built_for_cooperbench_use_its_format():
    env = CooperBenchEnv("mini")
    teammate = build_simulator("frozen:smollm2", env=env, backends={"smollm2": CannedBackend(["no action here"])})
    assert isinstance(teammate.text_format, CooperBenchFormat) and teammate.text_format.seat == "agent2"
    teammate.reset(env.load_scenario(env.scenario_ids()[0]), np.random.default_rng(0))
    obs, _ = env.reset(seed=0)
    obs, *_ = env.step({"agent1": '{"type": "message", "text": "hi"}', "agent2": ""})
    assert json.loads(teammate.act(obs["agent2"]))["type"] == "message"
    assert teammate.stats["unparsed_actions"] == 1


def test_format_rejects_unknown_seats():
    with pytest.raises(ValueError, match="seat"):
        CooperBenchFormat("agent3")


@pytest.mark.parametrize("spec", ["frozen:fake", "verbalized:fake?k=3", "trainable:fake"])
def test_every_llm_kind_plays_cooperbench_through_its_format(spec):
    from tests.simulators.fakes import FakeBackend, FakeTrainableBackend

    env = CooperBenchEnv("mini")
    sim = build_simulator(spec, env=env, backends={"fake": FakeBackend(), "trainable:fake": FakeTrainableBackend()})
    assert isinstance(sim.text_format, CooperBenchFormat) and sim.text_format.seat == env.user_seat == "agent2"
    assert sim.stats["unparsed_actions"] == 0  # the format's counters start with the simulator's own
    scenario = env.load_scenario(env.scenario_ids()[0])
    sim.reset(scenario, np.random.default_rng(0))
    obs, _ = env.reset(seed=0, options={"scenario_id": scenario.id})
    obs, *_ = env.step({"agent1": '{"type": "message", "text": "hi"}', "agent2": ""})
    chat = sim.chat(obs["agent2"], 0)
    assert chat[0]["content"].startswith(scenario.instructions("agent2"))
    assert chat[-1]["content"].endswith("reply with one JSON action.")
