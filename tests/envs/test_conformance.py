"""Conformance tests generated from the registry: every registered id is covered on registration."""

from __future__ import annotations

import pickle

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env
from pettingzoo.test import parallel_api_test

import simpop
from simpop.envs.registration import spec

#: Extra constructor arguments some ids need in tests (e.g. a dataset path); filled by benchmarks' conftest.
from tests.envs.registry_kwargs import kwargs_for

IDS = simpop.ids()


def _sample_actions(env, step: int) -> dict:
    """Seeded actions for every live seat (the off-turn one is ignored by the env)."""
    actions = {}
    for i, agent in enumerate(env.agents):
        space = env.action_space(agent)
        space.seed(1000 * step + i)
        actions[agent] = space.sample()
    return actions


def _rollout(env, seed: int, steps: int = 12) -> list:
    obs, _ = env.reset(seed=seed)
    record = [obs]
    for step in range(steps):
        if not env.agents:
            obs, _ = env.reset(seed=seed + step + 1)
            record.append(("reset", obs))
            continue
        record.append(env.step(_sample_actions(env, step)))
    record.append([(t.seat, t.text, t.act) for t in env.transcript])
    return record


def test_registry_is_not_empty():
    assert "simpop/Persuasion-v0" in IDS and "simpop/PersuasionAct-v0" in IDS


@pytest.mark.parametrize("env_id", IDS)
def test_parallel_api(env_id):
    env = simpop.make(env_id, **kwargs_for(env_id))
    parallel_api_test(env, num_cycles=60)


@pytest.mark.parametrize("env_id", IDS)
def test_same_seed_same_transcript(env_id):
    a = _rollout(simpop.make(env_id, **kwargs_for(env_id)), seed=7)
    b = _rollout(simpop.make(env_id, **kwargs_for(env_id)), seed=7)
    assert repr(a) == repr(b)
    assert sum(1 for r in a if isinstance(r, tuple) and len(r) == 5) >= 10


@pytest.mark.parametrize("env_id", IDS)
def test_pickle_round_trip(env_id):
    env = simpop.make(env_id, **kwargs_for(env_id))
    env.reset(seed=3)
    env.step(_sample_actions(env, 0))
    clone = pickle.loads(pickle.dumps(env))
    assert [(t.seat, t.text) for t in clone.transcript] == [(t.seat, t.text) for t in env.transcript]
    actions = _sample_actions(env, 1)
    assert repr(clone.step(actions)) == repr(env.step(actions))


@pytest.mark.parametrize("env_id", IDS)
def test_scenarios_selectable(env_id):
    env = simpop.make(env_id, **kwargs_for(env_id))
    scenario_ids = env.scenario_ids()
    assert scenario_ids and len(set(scenario_ids)) == len(scenario_ids)
    env.reset(seed=0, options={"scenario_id": scenario_ids[-1]})
    assert env.scenario.id == scenario_ids[-1]
    with pytest.raises(KeyError, match="scenario_id"):
        env.reset(options={"scenario_id": "no-such-scenario"})


@pytest.mark.parametrize("env_id", IDS)
def test_spaces_memoised(env_id):
    env = simpop.make(env_id, **kwargs_for(env_id))
    for agent in env.possible_agents:
        assert env.observation_space(agent) is env.observation_space(agent)
        assert env.action_space(agent) is env.action_space(agent)
    assert len(env.possible_agents) == 2 and env.policy_seat != env.user_seat


@pytest.mark.parametrize("env_id", [i for i in IDS if spec(i).default_simulator])
def test_single_agent_view_passes_gymnasium_checker(env_id):
    env = gymnasium.make(env_id, **kwargs_for(env_id))
    check_env(env.unwrapped, skip_render_check=True)
