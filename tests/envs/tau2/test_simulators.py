"""τ²'s native simulators pass the gold tasks; simpop's generic simulators and rollout engine drive the τ² seats
unchanged."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from simpop.agents.base import SamplingParams
from simpop.envs.dialogue import parse_observation
from simpop.envs.tau2.env import Tau2Env
from simpop.envs.tau2.simulators import ScriptedUser, play_gold
from simpop.envs.wrappers import UserSeat
from simpop.rollout import RolloutEngine
from simpop.simulators.llm import DialogueFormat, LLMSimulator
from simpop.simulators.registry import build_simulator
from simpop.simulators.verbalized import VerbalizedSimulator
from simpop.seat import Player
from tests.simulators.fakes import FakeBackend, verbalized_json


def play(seat: UserSeat, task_id: str):
    return play_gold(seat, task_id, seed=1)


def test_frozen_llm_simulator_plays_the_user_from_the_scenarios_instructions():
    backend = FakeBackend()  # greedy: always the same reply, like a collapsed τ² user at temperature 0
    env = Tau2Env("mock", max_user_repeats=3)
    reward, terminated, info = play(UserSeat(env, LLMSimulator(backend)), "create_task_1")
    chats = [chat for batch, _ in backend.calls for chat in batch]
    assert chats[0][0] == {"role": "system", "content": env.scenario.user_instructions()}
    assert chats[0][1:] == [{"role": "user", "content": "Hi! How can I help you today?"}]
    assert all(m["role"] in ("user", "assistant") for chat in chats for m in chat[1:])  # no agent tool calls
    assert terminated and info["termination_reason"] == "user_error" and info["user_repeats"] == 3 and reward == 0.0


def test_verbalized_simulator_can_end_the_dialogue_with_tau2s_stop_token():
    replies = iter([verbalized_json(("Please create 'Important Meeting' for user_1.", 1.0))]
                   + [verbalized_json(("Thanks! ###STOP###", 0.9), ("Thanks.", 0.1))] * 5)
    backend = FakeBackend(respond=lambda chat, params, rng: next(replies))
    reward, terminated, info = play(UserSeat(Tau2Env("mock"), VerbalizedSimulator(backend, k=2, floor=0.0, tau=0.01)),
                                    "create_task_1")
    assert terminated and info["termination_reason"] == "user_stop" and reward == 1.0


def test_personas_can_replace_the_tasks_persona():
    env = Tau2Env("mock")
    scenario = env.load_scenario("create_task_1")
    assert "Professional and direct" in scenario.user_instructions()
    other = dataclasses.replace(scenario, persona="An impatient retiree who types in capitals.")
    assert "impatient retiree" in other.user_instructions() and "Professional" not in other.user_instructions()
    simulator = LLMSimulator(FakeBackend(), personas=["An impatient retiree."], persona_set="retirees")
    simulator.reset(scenario, np.random.default_rng(0))
    assert "An impatient retiree." in simulator.scenario(0).user_instructions()


class CreateTaskPolicy(Player):
    """A stateless batch policy for mock's create_task_1: call the tool once, then confirm."""

    def act_batch(self, observations, slots):
        actions = []
        for obs in observations:
            called = any(m["role"] == "tool" for m in parse_observation(obs)["messages"])
            actions.append("Your task is created." if called else json.dumps(
                {"name": "create_task", "arguments": {"user_id": "user_1", "title": "Important Meeting"}}))
        return actions


def test_rollout_engine_runs_tau2_dialogues_side_by_side():
    engine = RolloutEngine("simpop/Tau2-mock-v0", CreateTaskPolicy(), ScriptedUser(), n_envs=3)
    trajectories = engine.collect(["create_task_1"], group_size=3, seed=0)
    assert [t.total_reward for t in trajectories] == [1.0, 1.0, 1.0]
    assert all(t.success and t.terminated and t.infos[-1]["termination_reason"] == "user_stop" for t in trajectories)


def test_llm_simulator_sampling_is_reproducible_per_seed():
    def run(seed: int):
        env = Tau2Env("mock", max_steps=6)
        sim = LLMSimulator(FakeBackend(), SamplingParams(temperature=1.0))
        seat = UserSeat(env, sim)
        seat.reset(seed=seed, options={"scenario_id": "create_task_1"})
        for _ in range(2):
            seat.step("Could you tell me more?")
        return [t.text for t in env.transcript]
    assert run(3) == run(3)


def test_spec_strings_build_tau2_user_simulators():
    env = Tau2Env("mock")
    native = build_simulator("native", env=env)
    assert isinstance(native, ScriptedUser) and isinstance(build_simulator("native:simpop/Tau2-mock-v0"), ScriptedUser)
    backends = {"fake": FakeBackend()}
    frozen = build_simulator("frozen:fake?temperature=0.5", env=env, backends=backends)
    verbal = build_simulator("verbalized:fake?k=2", env=env, backends=backends)
    # τ² has no text format of its own: the default (the scenario's user instructions + the dialogue).
    assert type(frozen.text_format) is DialogueFormat and type(verbal.text_format) is DialogueFormat
    play(UserSeat(env, frozen), "create_task_1")
    assert backends["fake"].calls[0][0][0][0] == {"role": "system", "content": env.scenario.user_instructions()}
    with pytest.raises(ValueError, match="unknown τ² persona set 'heldout'"):  # only written-<sha> sets
        build_simulator("frozen:fake?personas=heldout", env=env, backends=backends)


def test_gold_agent_and_scripted_user_pass_every_mock_task_with_gold_actions():
    env = Tau2Env("mock")
    seat = UserSeat(env, ScriptedUser())
    passed = []
    for task_id in env.scenario_ids():
        if not env.load_scenario(task_id).task.evaluation_criteria.actions:
            continue
        reward, terminated, info = play_gold(seat, task_id)
        passed.append(info["success"])
    assert passed == [True] * 7
