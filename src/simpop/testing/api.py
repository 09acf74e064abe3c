"""API conformance: the two seats, memoised spaces, PettingZoo's and Gymnasium's API tests, scenario selection."""

from __future__ import annotations

import itertools
import warnings
from typing import Any

import numpy as np

from simpop.testing.harness import (calling, expect_error, fail, fresh_env, is_env, reset, sample_actions, short,
                                  simulator_factory, step)


def check_seats(env_or_factory: Any, *, seed: int = 0) -> None:
    """Exactly two seats, named ``policy_seat`` and ``user_seat`` in ``possible_agents``; ``to_act`` is one.

    Raises:
        AssertionError: If the seats do not follow the contract.
    """
    name = "check_seats"
    env = fresh_env(name, env_or_factory)
    agents = list(getattr(env, "possible_agents", []))
    policy, user = getattr(env, "policy_seat", None), getattr(env, "user_seat", None)
    if len(agents) != 2 or len(set(agents)) != 2:
        fail(name, f"possible_agents is {agents!r}, not two distinct seats",
             "a dialogue env has exactly two seats: possible_agents = [policy_seat, user_seat]")
    if policy is None or user is None or policy == user or {policy, user} != set(agents):
        fail(name, f"policy_seat={policy!r} and user_seat={user!r} do not name the two seats {agents!r}",
             "set the class attributes policy_seat and user_seat to the two (different) seat names")
    reset(name, env, seed)
    if sorted(env.agents) != sorted(agents):
        fail(name, f"after reset() agents is {env.agents!r}, not both seats {agents!r}",
             "reset() must make both seats live (self.agents = list(self.possible_agents))")
    if getattr(env, "to_act", None) not in agents:
        fail(name, f"after reset() to_act is {getattr(env, 'to_act', None)!r}, not a seat",
             "set env.to_act to the seat that acts first (DialogueEnv does this from first_seat)")


def check_spaces_memoised(env_or_factory: Any, *, seed: int = 0) -> None:
    """``observation_space(a)`` / ``action_space(a)`` return the same object every call, before and after reset.

    Raises:
        AssertionError: If a space is rebuilt.
    """
    name = "check_spaces_memoised"
    env = fresh_env(name, env_or_factory)
    fix = "build the spaces once (in __init__) and return the stored objects (PettingZoo requires memoised spaces)"
    before = {}
    for agent in env.possible_agents:
        for kind in ("observation_space", "action_space"):
            getter = getattr(env, kind)
            first = getter(agent)
            if getter(agent) is not first:
                fail(name, f"{kind}({agent!r}) returned a new object on the second call", fix)
            before[kind, agent] = first
    reset(name, env, seed)
    step(name, env, sample_actions(env, 0))
    for (kind, agent), space in before.items():
        if getattr(env, kind)(agent) is not space:
            fail(name, f"{kind}({agent!r}) returned a different object after reset() and step()", fix)


#: How the warnings of PettingZoo's parallel_api_test begin (each is an API violation).
_PETTINGZOO_WARNINGS = ("Live agent was not given", "Agent was given", "No agents present",
                        "This environment does not have")


def check_parallel_api(env_or_factory: Any, *, seed: int = 0, num_cycles: int = 60) -> None:
    """PettingZoo's ``parallel_api_test`` (action spaces seeded from ``seed``), plus what it leaves out.

    PettingZoo's warnings (e.g. a live seat given no reward) count as failures, and every observation
    returned during its run must be contained in its seat's observation space, every reward a number.

    Raises:
        AssertionError: With PettingZoo's finding or the offending observation.
    """
    from pettingzoo.test import parallel_api_test

    name = "check_parallel_api"
    env = fresh_env(name, env_or_factory)
    for i, agent in enumerate(env.possible_agents):
        env.action_space(agent).seed(seed + i)
    seen: list[tuple[str, dict[str, Any], dict[str, Any]]] = []
    env_step, env_reset, steps = env.step, env.reset, itertools.count()

    def recording_step(actions: dict[str, Any]) -> tuple[Any, ...]:
        out = env_step(actions)
        seen.append((f"step {next(steps)} of PettingZoo's run", out[0], out[1]))
        return out

    def recording_reset(*args: Any, **kwargs: Any) -> tuple[Any, Any]:
        out = env_reset(*args, **kwargs)
        seen.append(("reset", out[0], {}))
        return out

    # Instance attributes shadow the methods for PettingZoo's run only (the env is a fresh one of ours).
    env.step, env.reset = recording_step, recording_reset
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # PettingZoo's test passes a made-up reset option on purpose; DialogueEnv warns about it.
        warnings.filterwarnings("ignore", message="ignoring unknown reset options")
        with calling(name, "pettingzoo.test.parallel_api_test", "follow the PettingZoo ParallelEnv API "
                     "(see the traceback; DialogueEnv's base class handles most of it)"):
            parallel_api_test(env, num_cycles=num_cycles)
    del env.step, env.reset
    found = [str(w.message).splitlines()[0] for w in caught if str(w.message).startswith(_PETTINGZOO_WARNINGS)]
    if found:
        fail(name, f"PettingZoo's parallel_api_test warned: {'; '.join(dict.fromkeys(found))}",
             "return observations, rewards, terminations, truncations and infos for exactly the live seats")
    for when, observations, rewards in seen:
        for agent, observation in observations.items():
            space = env.observation_space(agent)
            if not space.contains(observation):
                fail(name, f"{when}: the observation for {agent!r}, {short(observation)}, is not in its "
                     f"observation space {space}",
                     "return observations inside observation_space(seat) (dtype, shape, bounds)")
        bad = {a: r for a, r in rewards.items() if not isinstance(r, (float, int, np.floating, np.integer))}
        if bad:
            fail(name, f"{when}: rewards {short(bad)} are not numbers", "return float rewards per seat")


def check_scenarios(env_or_factory: Any, *, seed: int = 0) -> None:
    """``scenario_ids()`` is non-empty and unique; ``reset(options={"scenario_id": i})`` selects it; unknown ids raise.

    Raises:
        AssertionError: If scenario selection does not follow the contract.
    """
    name = "check_scenarios"
    env = fresh_env(name, env_or_factory)
    with calling(name, "scenario_ids()", "implement scenario_ids() returning a list of ids"):
        ids = list(env.scenario_ids())
    if not ids or len(set(ids)) != len(ids):
        fail(name, f"scenario_ids() returned {len(ids)} ids, {len(set(ids))} distinct",
             "return every scenario id once, in a stable order")
    for scenario_id in dict.fromkeys([ids[-1], ids[0]]):
        reset(name, env, seed, {"scenario_id": scenario_id})
        got = getattr(env.scenario, "id", None)
        if got != scenario_id:
            fail(name, f"reset(options={{'scenario_id': {scenario_id!r}}}) gave scenario {got!r}",
                 "load the requested scenario (and expose it as env.scenario with .id)")
    unknown = {"scenario_id": "no-such-scenario"}
    expect_error(name, f"reset(options={unknown})", lambda: env.reset(seed=seed, options=unknown), (KeyError,),
                 "scenario_id", "raise KeyError naming scenario_id and where the valid ids are (env.scenario_ids())")


def check_single_agent_view(env_or_factory: Any, simulator: Any, *, seed: int = 0) -> None:
    """Gymnasium's ``env_checker`` on ``UserSeat(env, simulator)``, the policy seat's single-agent view.

    Args:
        env_or_factory: The env (used as is if an instance; else a fresh one).
        simulator: The user-seat simulator, or a factory called with the env (see :mod:`simpop.testing`).
        seed: Seed for the view's action space.

    Raises:
        AssertionError: With Gymnasium's finding.
    """
    from gymnasium.utils.env_checker import check_env

    from simpop.envs.wrappers import UserSeat

    name = "check_single_agent_view"
    env = env_or_factory if is_env(env_or_factory) else fresh_env(name, env_or_factory)
    sim = simulator_factory(simulator)(env)
    with calling(name, "UserSeat(env, simulator)", "the env must offer policy_seat/user_seat and its spaces"):
        view = UserSeat(env, sim)
    view.action_space.seed(seed)
    with calling(name, "gymnasium.utils.env_checker.check_env(UserSeat(env, simulator))",
                 "follow the Gymnasium Env API for the policy seat (see the traceback)"):
        check_env(view, skip_render_check=True)
