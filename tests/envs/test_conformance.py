"""Conformance tests generated from the registry: every registered id is covered on registration.

The checks themselves live in :mod:`simpop.testing`, where users run them on their own envs and
simulators; here every registered id runs every env check (:data:`simpop.testing.ENV_CHECKS`), the
single-agent view made by ``gymnasium.make`` passes Gymnasium's checker, and every id's native
simulator runs every simulator check (:data:`simpop.testing.SIMULATOR_CHECKS`); an id whose test arguments
build exactly another id's env runs them under that id (``SAME_ENV``).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

import gymnasium
import numpy as np
import pytest

import simpop
from simpop import testing
from simpop.envs.registration import load, spec

#: Extra constructor arguments some ids need in tests (e.g. a dataset path); filled by benchmarks' conftest.
from tests.envs.registry_kwargs import SAME_ENV, kwargs_for

IDS = simpop.ids()
#: Ids whose test arguments build exactly another id's env (same class, dataset and native simulator): the checks
#: run once, under the other id; :func:`test_an_id_checked_under_another_builds_the_same_env` holds them to that.
CHECKED = [i for i in IDS if i not in SAME_ENV]
#: Ids with a native simulator for the user seat.
SIMULATED = [i for i in CHECKED if spec(i).default_simulator]

#: Arguments for particular checks (the settings these tests used before the checks moved into simpop.testing).
CHECK_KWARGS: dict[str, dict[str, Any]] = {
    "parallel_api": {"num_cycles": 60},
    "determinism": {"seed": 7, "steps": 12, "min_steps": 10},
    "pickle": {"seed": 3},
}
#: Simulator-check settings: one episode per run keeps the τ² and CooperBench ids to seconds (the spec check
#: only needs the simulator to have played, so one dialogue).
SIMULATOR_KWARGS: dict[str, Any] = {"seed": 0, "episodes": 1, "slots": 3}
SIMULATOR_CHECK_KWARGS: dict[str, dict[str, Any]] = {"spec": {"slots": 1}}


def env_factory(env_id: str) -> Callable[[], Any]:
    """A zero-argument factory for ``env_id`` with the test kwargs it needs."""
    return functools.partial(simpop.make, env_id, **kwargs_for(env_id))


def _cooperbench_policy(observation: str, action_space: Any, rng: np.random.Generator) -> str:
    """Say hello, then submit: sampled text is never a valid CooperBench action, so the teammate would never act."""
    if json.loads(observation)["messages"]:
        return json.dumps({"type": "submit"})
    return json.dumps({"type": "message", "text": "I'll take feature 1; tell me which files you touch."})


#: Policy-seat players for the simulator checks, by env entry point (others: sample the policy seat's space).
POLICIES: dict[str, testing.Policy] = {"simpop.envs.cooperbench.env:CooperBenchEnv": _cooperbench_policy}


def test_registry_is_not_empty():
    assert "simpop/Persuasion-v0" in IDS and "simpop/PersuasionAct-v0" in IDS


@pytest.mark.parametrize("env_id, same", sorted(SAME_ENV.items()))
def test_an_id_checked_under_another_builds_the_same_env(env_id, same):
    mine, theirs = spec(env_id), spec(same)
    assert (mine.entry_point, mine.default_simulator) == (theirs.entry_point, theirs.default_simulator)
    env, other = env_factory(env_id)(), env_factory(same)()
    try:
        assert type(env) is type(other) and env.dataset == other.dataset
        assert env.scenario_ids() == other.scenario_ids()
        assert env.possible_agents == other.possible_agents and env.reset(seed=5) == other.reset(seed=5)
        for seat in env.possible_agents:
            assert env.observation_space(seat) == other.observation_space(seat)
            assert env.action_space(seat) == other.action_space(seat)
    finally:
        env.close()
        other.close()


@pytest.mark.parametrize("check", list(testing.ENV_CHECKS))
@pytest.mark.parametrize("env_id", CHECKED)
def test_env_conforms(env_id, check):
    testing.ENV_CHECKS[check](env_factory(env_id), **CHECK_KWARGS.get(check, {}))


@pytest.mark.parametrize("env_id", SIMULATED)
def test_single_agent_view_passes_gymnasium_checker(env_id):
    view = gymnasium.make(env_id, **kwargs_for(env_id)).unwrapped
    testing.check_single_agent_view(view.env, view.simulator)


@pytest.mark.parametrize("check", list(testing.SIMULATOR_CHECKS))
@pytest.mark.parametrize("env_id", SIMULATED)
def test_native_simulator_conforms(env_id, check):
    policy = POLICIES.get(spec(env_id).entry_point)
    kwargs = {**SIMULATOR_KWARGS, **SIMULATOR_CHECK_KWARGS.get(check, {})}
    testing.SIMULATOR_CHECKS[check](load(spec(env_id).default_simulator), env_factory(env_id), policy=policy, **kwargs)
