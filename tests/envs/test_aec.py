"""The AEC view (``simpop.make(id, api="aec")``, ``env.aec()``) of every registered env passes PettingZoo's api_test."""

from __future__ import annotations

import json
import pickle
import warnings

import pytest
from pettingzoo import AECEnv
from pettingzoo.test import api_test

import simpop
from simpop.envs.aec import TextObservation
from tests.envs.registry_kwargs import kwargs_for


@pytest.mark.parametrize("env_id", simpop.ids())
def test_aec_view_passes_pettingzoo_api_test(env_id):
    env = simpop.make(env_id, api="aec", **kwargs_for(env_id))
    assert isinstance(env, AECEnv)
    for i, seat in enumerate(env.possible_agents):
        env.action_space(seat).seed(i)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PettingZoo's style advice (agent names, Box spaces) is not a failure
        api_test(env, num_cycles=40)


def test_one_aec_cycle_is_one_dialogue_turn():
    env = simpop.make("simpop/Persuasion-v1").aec()
    env.reset(seed=3)
    policy, user = env.possible_agents
    observation, *_ , info = env.last()
    assert isinstance(observation, TextObservation) and isinstance(observation, str)
    assert info["to_act"] == policy and env.agent_selection == policy
    env.step("Hello! Would you consider a small donation to Save the Children?")
    assert env.agent_selection == user
    env.step(None)  # the off-turn seat: ignored
    transcript = env.unwrapped.transcript
    assert [t.seat for t in transcript] == [policy]
    assert env.infos[user]["to_act"] == user
    view = json.loads(env.observe(user))
    assert view["messages"][-1]["content"].startswith("Hello!")
    assert pickle.loads(pickle.dumps(env.observe(user))) == env.observe(user)


def test_unknown_api_is_refused():
    with pytest.raises(ValueError, match="api must be 'parallel' or 'aec'"):
        simpop.make("simpop/PersuasionAct-v0", api="gym")
