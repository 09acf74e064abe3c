"""The CooperBench env: gold episodes on every mini pair, turn order, actions, observations, pickling."""

from __future__ import annotations

import json
import pickle
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import simpop
from simpop.envs.cooperbench.env import CooperBenchEnv
from simpop.envs.cooperbench.simulators import ScriptedTeammate
from simpop.envs.dialogue import parse_observation

CONFLICTING = {"f1-f2", "f3-f4"}  # by construction of the mini set (see the package docstring)


def _episode(env: CooperBenchEnv, scenario_id: str, agent1, agent2, seed: int = 0):
    """Run one episode with a simulator in each seat; return (actions, last step)."""
    obs, _ = env.reset(seed=seed, options={"scenario_id": scenario_id})
    agent1.reset(env.scenario, env.user_rng())
    agent2.reset(env.scenario, env.user_rng())
    actions, step = [], None
    while env.agents:
        seat = env.to_act
        action = (agent1 if seat == "agent1" else agent2).act(obs[seat])
        actions.append((seat, json.loads(action)["type"]))
        step = env.step({seat: action})
        obs = step[0]
    return actions, step


@pytest.fixture(scope="module")
def env() -> CooperBenchEnv:
    return simpop.make("simpop/CooperBench-mini-v0")


def test_gold_patches_on_every_mini_pair():
    """Both seats submit gold: reward 1 on every clean pair; conflicting pairs fail under the lead rule."""

    def play(scenario_id):
        env = CooperBenchEnv("mini")  # one env per thread: episodes run side by side
        _, step = _episode(env, scenario_id, ScriptedTeammate(seat="agent1"), ScriptedTeammate(seat="agent2"))
        return scenario_id, step

    with ThreadPoolExecutor(max_workers=3) as pool:
        episodes = list(pool.map(play, CooperBenchEnv("mini").scenario_ids()))
    rewards = {}
    for scenario_id, (_, reward, terminated, truncated, info) in episodes:
        assert terminated["agent1"] and not truncated["agent1"] and reward["agent1"] == reward["agent2"]
        result = info["agent1"]["cooperbench"]
        conflicting = scenario_id.rsplit("/", 1)[1] in CONFLICTING
        assert result["merge"]["status"] == ("conflicts" if conflicting else "clean"), scenario_id
        assert result["apply_status"] == {"agent1": "applied", "agent2": "applied"}
        if conflicting:
            # Lead rule: agent1's gold patch alone passes its own feature, not agent2's.
            assert "agent1's patch alone does not pass both" in result["feature1"]["error"]
        else:
            assert result["feature1"]["passed"] and result["feature2"]["passed"]
            assert result["feature1"]["tests_passed"] >= 2 and result["feature1"]["exit_code"] == 0
        rewards[scenario_id] = reward["agent1"]
    assert len(rewards) == 18
    assert {k for k, r in rewards.items() if r == 1.0} == {k for k in rewards if k.rsplit("/", 1)[1] not in CONFLICTING}


def test_turn_order_and_scripted_failure_modes(env):
    late = ScriptedTeammate(seat="agent2", mode="late", delay_turns=3)
    actions, (_, reward, *_rest) = _episode(env, "textkit/task1/f1-f3", ScriptedTeammate(seat="agent1"), late)
    # agent1 first, alternating; after agent1 submits, agent2 takes every remaining turn.
    assert actions == [("agent1", "message"), ("agent2", "message"), ("agent1", "write"), ("agent2", "view"),
                       ("agent1", "submit"), ("agent2", "message"), ("agent2", "view"), ("agent2", "write"),
                       ("agent2", "write"), ("agent2", "submit")]
    assert reward["agent1"] == 1.0

    silent, _ = _episode(env, "textkit/task1/f1-f3", ScriptedTeammate(seat="agent1"),
                         ScriptedTeammate(seat="agent2", mode="silent"))
    assert ("agent2", "message") not in silent

    breaker = ScriptedTeammate(seat="agent2", mode="breaks_announcement")
    env.reset(seed=0, options={"scenario_id": "textkit/task1/f1-f3"})
    breaker.reset(env.scenario, env.user_rng())
    plan = [json.loads(breaker.act("{}")) for _ in range(4)]
    announced = plan[0]["text"]
    written = {a["path"] for a in plan if a["type"] == "write"}
    assert written == {"textkit/__init__.py", "textkit/case.py"}
    assert not all(path in announced for path in written)

    mixed = ScriptedTeammate(mode={"silent": 1.0, "late": 1.0})
    mixed.reset_batch([env.scenario] * 20, [np.random.default_rng(i) for i in range(20)])
    assert set(mixed.modes) == {"silent", "late"}
    with pytest.raises(ValueError, match="mode must be one of"):
        ScriptedTeammate(mode="sleepy")


def test_actions_results_and_invalid_actions():
    env = CooperBenchEnv("mini", max_steps=30)
    obs, _ = env.reset(seed=1, options={"scenario_id": "calc/task3/f1-f3"})
    first = parse_observation(obs["agent1"])
    assert first["to_act"] == "agent1" and first["feature_id"] == 1 and "modulo" in first["feature"].lower()
    assert "calc/evaluator.py" in first["files"] and first["inbox"] == [] and first["result"] is None

    def step(seat, action):
        o, r, te, tr, info = env.step({seat: action if isinstance(action, str) else json.dumps(action)})
        return parse_observation(o[seat]), info[seat]

    for bad, why in [("not json", "expected one JSON object"),
                     ({"type": "write", "path": "../x.py", "content": ""}, "contains '..'"),
                     ({"type": "write", "path": "/etc/x", "content": ""}, "absolute path"),
                     ({"type": "view", "path": ".git/config"}, "inside .git"),
                     ({"type": "write", "path": "calc", "content": ""}, "is a directory"),
                     ({"type": "write", "path": "README.md/x.py", "content": ""}, "is a file"),
                     ('{"type": "message", "text": "\\ud800"}', "unpaired surrogates"),
                     ({"type": "message", "text": "x" * 5000}, "limited to")]:
        view, info = step("agent1", bad)
        assert why in info["invalid_action"] and why in view["error"] and view["to_act"] == "agent1"
    view, info = step("agent1", {"type": "view", "path": "calc"})
    assert "invalid_action" not in info and view["result"].splitlines()[1:] == ["calc/__init__.py", "calc/evaluator.py"]
    assert view["to_act"] == "agent2"

    view, _ = step("agent2", {"type": "message", "text": "I take tokenize(); you take OPERATORS."})
    me = parse_observation(env._observe("agent1"))
    assert me["inbox"] == ["[Message from agent2]: I take tokenize(); you take OPERATORS."]
    assert me["messages"][-1] == {"role": "user", "content": me["inbox"][0]}

    source = parse_observation(env._observe("agent1"))
    view, _ = step("agent1", {"type": "view", "path": "./calc//evaluator.py"})
    assert view["result"].startswith("calc/evaluator.py:\n") and '"/": (2, operator.truediv),' in view["result"]
    assert source["inbox"] and view["inbox"] == []
    step("agent2", "test")
    modulo = view["result"].split(":\n", 1)[1].replace('    "/": (2, operator.truediv),\n',
                                                       '    "/": (2, operator.truediv),\n    "%": (2, operator.mod),\n')
    view, _ = step("agent1", {"type": "write", "path": "calc/evaluator.py", "content": modulo})
    assert view["result"].startswith("wrote calc/evaluator.py")
    step("agent2", {"type": "view", "path": "nope.py"})
    assert parse_observation(env._observe("agent2"))["result"] == "no such file: nope.py"
    view, _ = step("agent1", "test")
    assert view["result"].startswith("feature 1: PASSED (2 passed, 0 failed)")
    step("agent2", {"type": "write", "path": "tests/test_mine.py", "content": "x = 1\n"})
    assert "left out of your patch" in parse_observation(env._observe("agent2"))["result"]
    view, _ = step("agent1", {"type": "delete", "path": "README.md"})
    assert view["result"] == "deleted README.md" and "README.md" not in view["files"]
    step("agent2", "submit")
    view, _ = step("agent1", "submit")
    assert view["submitted"] == {"agent1": True, "agent2": True} and view["to_act"] is None and env.done


def test_truncation_grades_the_working_copies():
    env = CooperBenchEnv("mini", max_steps=3)
    gold = ScriptedTeammate(seat="agent1", mode="silent")
    obs, _ = env.reset(seed=0, options={"scenario_id": "kvstore/task2/f1-f3"})
    gold.reset(env.scenario, env.user_rng())
    env.step({"agent1": gold.act(obs["agent1"])})  # agent1 writes its gold file
    env.step({"agent2": "test"})
    _, reward, terminated, truncated, info = env.step({"agent1": '{"type": "view", "path": "."}'})
    assert truncated["agent1"] and not terminated["agent1"] and reward["agent1"] == 0.0
    result = info["agent1"]["cooperbench"]
    assert result["unsubmitted_patches_graded"] == ["agent1", "agent2"]
    assert result["apply_status"] == {"agent1": "applied", "agent2": "skipped"}
    # agent1's unsubmitted gold copy merged cleanly with nothing: its feature passes, agent2's does not.
    assert result["merge"]["status"] == "clean" and result["feature1"]["passed"] and not result["feature2"]["passed"]
    assert "kvstore/store.py" in info["agent1"]["patches"]["agent1"] and info["agent1"]["patches"]["agent2"] == ""


def test_pickled_env_continues_identically():
    env = CooperBenchEnv("mini")
    env.reset(seed=5, options={"scenario_id": "textkit/task1/f2-f4"})
    env.step({"agent1": json.dumps({"type": "write", "path": "textkit/new.py", "content": "X = 1\n"})})
    clone = pickle.loads(pickle.dumps(env))
    for e in (env, clone):
        e.step({"agent2": "submit"})
    a = env.step({"agent1": "submit"})
    b = clone.step({"agent1": "submit"})
    assert a[1] == b[1] and a[4]["agent1"]["patches"] == b[4]["agent1"]["patches"]
    assert "textkit/new.py" in a[4]["agent1"]["patches"]["agent1"]


def test_real_dataset_id_needs_a_dataset():
    with pytest.raises(ValueError, match="dataset="):
        simpop.make("simpop/CooperBench-v0")
    with pytest.raises(KeyError, match="unknown subset"):
        CooperBenchEnv("mini", subset="nope")
    assert len(CooperBenchEnv("mini", subset="lite").scenario_ids()) == 6
