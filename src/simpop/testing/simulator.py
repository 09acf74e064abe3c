"""The Simulator contract for whatever fills the user seat: slots, ``act`` = slot 0 of ``act_batch``, seeded
determinism, ``spec``, ``feedback``, ``member``, bad slots raising (simulators are duck-typed)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from simpop.testing.harness import (MAX_EPISODE_STEPS, calling, expect_error, fail, first_difference, fresh_env,
                                  is_simulator, reset, sample, short, simulator_factory, step)

#: ``policy(observation, action_space, rng) -> action``: plays the policy seat in the simulator checks.
Policy = Callable[[Any, Any, np.random.Generator], Any]


def _new_simulator(check: str, simulator_or_factory: Any, env: Any) -> Any:
    """A simulator for ``env``: the instance itself, a new one of the class, or the factory's."""
    factory = simulator_factory(simulator_or_factory)
    with calling(check, "building the simulator", "the simulator factory is called with the env"):
        sim = factory(env)
    if not is_simulator(sim):
        fail(check, f"the factory returned {short(sim)}, which has no reset_batch/act_batch",
             "return a Simulator (reset_batch, act_batch, reset, act, feedback, member, spec)")
    return sim


def _default_policy(observation: Any, action_space: Any, rng: np.random.Generator) -> Any:
    return sample(action_space, int(rng.integers(2**31 - 1)))


def _user_rng(env: Any) -> np.random.Generator:
    if callable(getattr(env, "user_rng", None)):
        return env.user_rng()
    return np.random.default_rng(getattr(env, "user_seed", 0))


def _check_action(check: str, env: Any, action: Any, where: str) -> None:
    space = env.action_space(env.user_seat)
    if not space.contains(action):
        fail(check, f"{where}: the simulator answered {short(action)}, which is not in the user seat's "
             f"action space {space}", "return actions from env.action_space(env.user_seat)")


def _policy_step(check: str, env: Any, obs: dict[str, Any], policy: Policy, rng: np.random.Generator) -> tuple:
    seat = env.policy_seat
    with calling(check, "the policy", "pass a policy(observation, action_space, rng) that returns an action"):
        action = policy(obs[seat], env.action_space(seat), rng)
    return step(check, env, {seat: action})


def _batched_run(check: str, sim: Any, envs: list[Any], *, seed: int, episodes: int,
                 policy: Policy) -> list[tuple[int, int, int, Any]]:
    """Drive ``len(envs)`` dialogues per episode through one simulator's slots, acting on subsets of slots.

    Each round the policy moves in every dialogue where the policy seat is to act; then the simulator
    answers the pending user-seat dialogues, leaving one out (round robin) when several are pending and
    passing the slots in reverse order every other round. Finished dialogues get :meth:`feedback`.

    Returns:
        Every user action, as ``(episode, slot, user turn, action)``.
    """
    run: list[tuple[int, int, int, Any]] = []
    n = len(envs)
    fix_batch = "act_batch(observations, slots) returns one action per slot, in the order of slots"
    for episode in range(episodes):
        obs = [reset(check, env, seed + 1000 * episode + i)[0] for i, env in enumerate(envs)]
        rngs = [np.random.default_rng([seed, episode, i]) for i in range(n)]
        with calling(check, f"reset_batch(<{n} scenarios>, <{n} generators>)",
                     "reset_batch(scenarios, rngs) starts one dialogue per slot"):
            sim.reset_batch([env.scenario for env in envs], [_user_rng(env) for env in envs])
        for slot in range(n):
            with calling(check, f"member({slot})", "member(slot) returns the simulator driving the slot"):
                member = sim.member(slot)
            if not is_simulator(member):
                fail(check, f"member({slot}) returned {short(member)}, not a simulator",
                     "return the simulator that drives the slot (self, except in populations)")
        returns, turns, finished = [0.0] * n, [0] * n, set()
        for rounds in range(MAX_EPISODE_STEPS):
            for i, env in enumerate(envs):
                if env.agents and env.to_act == env.policy_seat:
                    obs[i], rewards, *_ = _policy_step(check, env, obs[i], policy, rngs[i])
                    returns[i] += float(rewards.get(env.policy_seat, 0.0))
            pending = [i for i, env in enumerate(envs) if env.agents and env.to_act == env.user_seat]
            if len(pending) > 1:
                pending.pop(rounds % len(pending))
            if rounds % 2:
                pending.reverse()
            if pending:
                user = envs[0].user_seat
                with calling(check, f"act_batch(<{len(pending)} observations>, {pending})", fix_batch):
                    actions = sim.act_batch([obs[i][user] for i in pending], list(pending))
                if not isinstance(actions, (list, tuple)) or len(actions) != len(pending):
                    fail(check, f"act_batch(..., slots={pending}) returned {short(actions)}, "
                         f"not {len(pending)} actions", fix_batch)
                for i, action in zip(pending, actions, strict=True):
                    _check_action(check, envs[i], action, f"episode {episode}, slot {i}, user turn {turns[i]}")
                    run.append((episode, i, turns[i], action))
                    turns[i] += 1
                    obs[i], rewards, *_ = step(check, envs[i], {user: action})
                    returns[i] += float(rewards.get(envs[i].policy_seat, 0.0))
            done = [i for i, env in enumerate(envs) if not env.agents and i not in finished]
            if done:
                with calling(check, f"feedback({done}, <rewards>)", "feedback(slots, rewards) takes float rewards"):
                    sim.feedback(done, [returns[i] for i in done])
                finished.update(done)
            if len(finished) == n:
                break
        else:
            fail(check, f"episode {episode} did not end within {MAX_EPISODE_STEPS} rounds",
                 "the env must end episodes (max_steps)")
    return run


def _require_user_turns(check: str, turns: int) -> None:
    if turns == 0:
        fail(check, "the user seat never acted: every dialogue ended before the simulator's turn",
             "pass policy=... that plays the policy seat well enough to hand the turn over "
             "(the default samples the policy seat's action space)")


def check_simulator_spec(simulator_or_factory: Any, env_id_or_factory: Any, *, seed: int = 0,
                         episodes: int = 1, slots: int = 1, policy: Policy | None = None) -> None:
    """``spec`` has ``kind``, ``model``, ``personas``, ``decoding``; ``str(spec)`` is stable across calls and use.

    Stable means: the same on every access, after playing ``episodes`` episodes of ``slots`` dialogues,
    for a second simulator from the same factory, and free of object addresses.

    Raises:
        AssertionError: If the spec is missing attributes or its string changes.
    """
    name = "check_simulator_spec"
    envs = [fresh_env(name, env_id_or_factory) for _ in range(slots)]
    sim = _new_simulator(name, simulator_or_factory, envs[0])
    with calling(name, "simulator.spec", "spec is a property returning a SimulatorSpec"):
        spec = sim.spec
    missing = [a for a in ("kind", "model", "personas", "decoding") if not hasattr(spec, a)]
    if missing:
        fail(name, f"spec {short(spec)} has no {', '.join(missing)}",
             "return a SimulatorSpec(kind=..., model=..., personas=..., decoding=...) from the spec property")
    if not isinstance(spec.kind, str) or not spec.kind:
        fail(name, f"spec.kind is {spec.kind!r}", "name the simulator's kind (e.g. 'native', 'frozen', 'custom')")
    text = str(spec)
    fix = "build the spec only from settings that define the simulator (no counters, ids or addresses)"
    if " at 0x" in text:
        fail(name, f"str(spec) contains an object address: {text!r}", fix)
    if str(sim.spec) != text:
        fail(name, f"str(spec) changed between two accesses: {text!r} then {str(sim.spec)!r}", fix)
    _batched_run(name, sim, envs, seed=seed, episodes=episodes, policy=policy or _default_policy)
    if str(sim.spec) != text:
        fail(name, f"str(spec) changed after playing: {text!r} then {str(sim.spec)!r}", fix)
    other = _new_simulator(name, simulator_or_factory, envs[0])
    if str(other.spec) != text:
        fail(name, f"two simulators from the same factory have different specs: {text!r} and {str(other.spec)!r}",
             fix)


def check_simulator_batch(simulator_or_factory: Any, env_id_or_factory: Any, *, seed: int = 0, episodes: int = 2,
                          slots: int = 3, policy: Policy | None = None) -> None:
    """Full dialogues through ``slots`` slots: ``reset_batch``, ``act_batch`` on subsets, ``member``, ``feedback``.

    Every answer must be one action per requested slot, contained in the env's user action space.

    Raises:
        AssertionError: If a slot call fails or returns a wrong or out-of-space action.
    """
    name = "check_simulator_batch"
    envs = [fresh_env(name, env_id_or_factory) for _ in range(slots)]
    sim = _new_simulator(name, simulator_or_factory, envs[0])
    run = _batched_run(name, sim, envs, seed=seed, episodes=episodes, policy=policy or _default_policy)
    _require_user_turns(name, len(run))


def _single_run(check: str, sim: Any, env: Any, *, seed: int, batch: bool, policy: Policy) -> list[Any]:
    """One dialogue through ``reset``/``act`` (or ``reset_batch``/``act_batch`` slot 0); the user actions."""
    obs, _ = reset(check, env, seed)
    rng = np.random.default_rng([seed, 0, 0])
    call = "reset_batch([scenario], [rng])" if batch else "reset(scenario, rng)"
    with calling(check, call, "start one dialogue in slot 0"):
        if batch:
            sim.reset_batch([env.scenario], [_user_rng(env)])
        else:
            sim.reset(env.scenario, _user_rng(env))
    actions: list[Any] = []
    user = env.user_seat
    for _ in range(MAX_EPISODE_STEPS):
        if not env.agents:
            break
        if env.to_act != user:
            obs, *_ = _policy_step(check, env, obs, policy, rng)
            continue
        call = "act_batch([observation], [0])" if batch else "act(observation)"
        with calling(check, call, "answer slot 0's observation"):
            action = sim.act_batch([obs[user]], [0])[0] if batch else sim.act(obs[user])
        _check_action(check, env, action, f"{call}, user turn {len(actions)}")
        actions.append(action)
        obs, *_ = step(check, env, {user: action})
    else:
        fail(check, f"the episode did not end within {MAX_EPISODE_STEPS} steps", "the env must end episodes")
    return actions


def check_simulator_slot0(simulator_or_factory: Any, env_id_or_factory: Any, *, seed: int = 0, episodes: int = 2,
                          slots: int = 1, policy: Policy | None = None) -> None:
    """``reset``/``act`` behave exactly as ``reset_batch``/``act_batch`` slot 0 of a batch of one.

    For each of ``episodes`` seeds, one dialogue is played through ``act`` and one, from the same seed,
    through ``act_batch([obs], [0])`` (each with a fresh simulator from a factory); the user actions must match.
    (``slots`` is accepted for a signature shared with the other simulator checks; batches here have one slot.)

    Raises:
        AssertionError: On the first differing action.
    """
    name = "check_simulator_slot0"
    policy = policy or _default_policy
    turns = 0
    for episode in range(episodes):
        runs = []
        for batch in (False, True):
            env = fresh_env(name, env_id_or_factory)
            sim = _new_simulator(name, simulator_or_factory, env)
            runs.append(_single_run(name, sim, env, seed=seed + episode, batch=batch, policy=policy))
        found = first_difference(runs[0], runs[1], "user actions")
        if found:
            fail(name, f"seed {seed + episode}: act() and act_batch(..., [0]) answered differently: {found}",
                 "act(obs) must be act_batch([obs], [0])[0] and reset(s, rng) must be "
                 "reset_batch([s], [rng]) (the Simulator base class defines them so; do not override them apart)")
        turns += len(runs[0])
    _require_user_turns(name, turns)


def check_simulator_determinism(simulator_or_factory: Any, env_id_or_factory: Any, *, seed: int = 0,
                                episodes: int = 2, slots: int = 3, policy: Policy | None = None) -> None:
    """Two batched runs with the same seed (fresh simulators from a factory) give the same user actions.

    Raises:
        AssertionError: On the first differing action.
    """
    name = "check_simulator_determinism"
    runs = []
    for _ in range(2):
        envs = [fresh_env(name, env_id_or_factory) for _ in range(slots)]
        sim = _new_simulator(name, simulator_or_factory, envs[0])
        runs.append(_batched_run(name, sim, envs, seed=seed, episodes=episodes, policy=policy or _default_policy))
    first, second = runs
    found = next((f"(episode, slot, user turn) = {x[:3]}: {d}" for x, y in zip(first, second, strict=False)
                  if (d := first_difference(x[3], y[3], "action") or first_difference(x[:3], y[:3], "order"))), None)
    if found is None and len(first) != len(second):
        found = f"the end: {len(first)} user actions != {len(second)}"
    if found:
        fail(name, f"two runs with seed={seed} differ at {found}",
             "draw every random choice from the generators given to reset_batch/reset (no global random/np.random, "
             "unseeded generators or clocks) and discard all per-dialogue state in reset_batch")
    _require_user_turns(name, len(first))


def check_simulator_bad_slot(simulator_or_factory: Any, env_id_or_factory: Any, *, seed: int = 0, episodes: int = 1,
                             slots: int = 3, policy: Policy | None = None) -> None:
    """``act_batch`` for a slot that ``reset_batch`` did not start raises ``IndexError`` or ``ValueError``.

    After ``reset_batch`` starts ``slots`` slots, the first user-seat observation is sent for slot ``slots``.
    (``episodes`` is accepted for a signature shared with the other simulator checks.)

    Raises:
        AssertionError: If the bad slot is answered or raises another error.
    """
    name = "check_simulator_bad_slot"
    env = fresh_env(name, env_id_or_factory)
    obs, _ = reset(name, env, seed)
    rng = np.random.default_rng(seed)
    for _ in range(MAX_EPISODE_STEPS):
        if not env.agents or env.to_act == env.user_seat:
            break
        obs, *_ = _policy_step(name, env, obs, policy or _default_policy, rng)
    if not env.agents:
        _require_user_turns(name, 0)
    sim = _new_simulator(name, simulator_or_factory, env)
    with calling(name, f"reset_batch(<{slots} scenarios>, <{slots} generators>)", "start one dialogue per slot"):
        sim.reset_batch([env.scenario] * slots, [np.random.default_rng([seed, i]) for i in range(slots)])
    fix = (f"raise IndexError (or ValueError) saying which slots exist, e.g. 'slot {slots} was not started: "
           f"reset_batch() started {slots} slots'")
    expect_error(name, f"act_batch for slot {slots} after reset_batch started {slots} slots",
                 lambda: sim.act_batch([obs[env.user_seat]], [slots]), (IndexError, ValueError), "", fix)
