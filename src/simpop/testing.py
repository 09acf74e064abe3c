"""Conformance checks for dialogue envs and user simulators, for simpop's own tests and for yours.

Two entry points run every check and raise ``AssertionError`` naming the failed check and what to fix:

- :func:`check_dialogue_env` for a two-seat env (the :class:`~simpop.envs.dialogue.DialogueEnv`
  contract: PettingZoo's parallel API test, two seats, seeded determinism, pickling, scenario
  selection, memoised spaces, off-turn actions ignored, misuse raising, bad actions flagged, and
  optionally Gymnasium's checker on the single-agent view);
- :func:`check_simulator` for whatever fills the user seat (the Simulator contract: slots, ``act`` =
  slot 0 of ``act_batch``, seeded determinism, ``spec``, ``feedback``, ``member``, bad slots raising).

Each check is also a function of its own (:data:`ENV_CHECKS`, :data:`SIMULATOR_CHECKS`), so that a
test suite can parametrise over them::

    import functools, pytest, simpop
    from simpop.testing import ENV_CHECKS, check_simulator

    make_env = functools.partial(simpop.make, "simpop/PersuasionAct-v0")

    @pytest.mark.parametrize("check", list(ENV_CHECKS.values()), ids=list(ENV_CHECKS))
    def test_env(check):
        check(make_env)

    def test_my_simulator():
        check_simulator(lambda env: MySimulator(), make_env)

Envs are passed as a factory (a zero-argument callable, e.g. ``functools.partial(simpop.make, id)``),
a registered env id, or an instance (copied with :func:`copy.deepcopy` wherever a check needs fresh
envs); a factory gives the strongest checks. Simulators are passed as an instance, a class (called with
no arguments) or a factory called with the env (like the registry's ``default_simulator`` entry points);
a factory or class gives a fresh simulator to each run, an instance is reused (``reset_batch`` must then
discard all earlier state).

Importing this module is cheap (numpy, plus what ``import simpop`` loads): PettingZoo, the env modules
and ``simpop.envs.wrappers`` are imported when a check needs them, and nothing here imports torch,
transformers or ``simpop.simulators`` (simulators are duck-typed).
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import json
import math
import pickle
import warnings
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

import numpy as np

__all__ = [
    "ENV_CHECKS",
    "NOT_AN_ACTION",
    "SIMULATOR_CHECKS",
    "check_bad_action",
    "check_determinism",
    "check_dialogue_env",
    "check_misuse_raises",
    "check_off_turn_ignored",
    "check_parallel_api",
    "check_pickle",
    "check_scenarios",
    "check_seats",
    "check_simulator",
    "check_simulator_bad_slot",
    "check_simulator_batch",
    "check_simulator_determinism",
    "check_simulator_slot0",
    "check_simulator_spec",
    "check_single_agent_view",
    "check_spaces_memoised",
]

#: ``policy(observation, action_space, rng) -> action``: plays the policy seat in the simulator checks.
Policy = Callable[[Any, Any, np.random.Generator], Any]

#: Longest repr shown in a failure message.
_REPR_LIMIT = 240
#: Safety cap on steps while driving an env to the end of an episode (envs have their own step caps).
_MAX_EPISODE_STEPS = 100_000


class _NotAnAction:
    """The bad action :func:`check_bad_action` sends: an object of a type no action space contains."""

    def __repr__(self) -> str:
        return "<simpop.testing.NOT_AN_ACTION>"


#: An action no env should accept (its type is private to this module).
NOT_AN_ACTION = _NotAnAction()


# ============================================================================================ helpers
class _CheckFailed(AssertionError):
    """A failed check (an ``AssertionError``, so that test runners report it as a failure)."""


def _fail(check: str, problem: str, fix: str) -> NoReturn:
    raise _CheckFailed(f"[{check}] {problem}\n    fix: {fix}")


@contextlib.contextmanager
def _calling(check: str, what: str, fix: str) -> Iterator[None]:
    """Turn an unexpected exception from env or simulator code into a check failure."""
    try:
        yield
    except _CheckFailed:
        raise
    except Exception as exc:  # noqa: BLE001 - every exception from user code is a failure to report
        kind = "failed an assertion" if isinstance(exc, AssertionError) else f"raised {type(exc).__name__}"
        raise _CheckFailed(f"[{check}] {what} {kind}: {exc}\n    fix: {fix}") from exc


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _REPR_LIMIT else text[:_REPR_LIMIT] + f"... ({len(text)} chars)"


def _first_difference(a: Any, b: Any, path: str = "") -> str | None:
    """Where two nested records first differ (``None`` if equal); arrays compare by dtype, shape and bytes."""
    where = path or "<top>"
    if type(a) is not type(b):
        return f"{where}: {type(a).__name__} {_short(a)} != {type(b).__name__} {_short(b)}"
    if isinstance(a, np.ndarray):
        if a.dtype != b.dtype or a.shape != b.shape:
            return f"{where}: array {a.dtype}{a.shape} != array {b.dtype}{b.shape}"
        if a.dtype == object:
            return _first_difference(a.tolist(), b.tolist(), path)
        return None if a.tobytes() == b.tobytes() else f"{where}: {_short(a)} != {_short(b)}"
    if isinstance(a, dict):
        if set(a) != set(b):
            return f"{where}: keys {sorted(map(str, a))} != {sorted(map(str, b))}"
        for key in a:
            found = _first_difference(a[key], b[key], f"{path}[{key!r}]")
            if found:
                return found
        return None
    if isinstance(a, (list, tuple)):
        if len(a) != len(b):
            return f"{where}: length {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            found = _first_difference(x, y, f"{path}[{i}]")
            if found:
                return found
        return None
    if isinstance(a, float) and math.isnan(a) and math.isnan(b):
        return None
    try:
        equal = bool(a == b)
    except Exception:  # noqa: BLE001 - objects whose == is not a truth value
        equal = repr(a) == repr(b)
    return None if equal else f"{where}: {_short(a)} != {_short(b)}"


#: Names of the five results of ``env.step``, and of the records :func:`_rollout` keeps.
_STEP_FIELDS = ("observations", "rewards", "terminations", "truncations", "infos")
_RECORD_FIELDS = {"reset": ("observations", "infos", "user_seed"), "step": ("actions", *_STEP_FIELDS),
                  "transcript": ("transcript",)}


def _fields_difference(a: tuple[Any, ...], b: tuple[Any, ...], fields: tuple[str, ...]) -> str | None:
    """The first difference between two tuples of named results, e.g. ``rewards['persuader']: 0.0 != 0.5``."""
    if len(a) != len(b):
        return f"{len(a)} results != {len(b)} results"
    pairs = zip(fields, a, b, strict=False)
    return next((found for field, x, y in pairs if (found := _first_difference(x, y, field))), None)


def _is_env(obj: Any) -> bool:
    """An env instance (an env class is a factory)."""
    return not isinstance(obj, type) and callable(getattr(obj, "step", None)) and callable(getattr(obj, "reset", None))


def _env_factory(env_or_factory: Any) -> Callable[[], Any]:
    """A zero-argument callable returning a fresh env."""
    if isinstance(env_or_factory, str):
        import simpop

        return lambda: simpop.make(env_or_factory)
    if _is_env(env_or_factory):
        return lambda: copy.deepcopy(env_or_factory)
    if callable(env_or_factory):
        return env_or_factory
    raise TypeError(f"expected an env, a zero-argument env factory or a registered env id, got {env_or_factory!r}")


def _make_env(check: str, factory: Callable[[], Any]) -> Any:
    with _calling(check, "building the env", "the env factory must build an env with no arguments"):
        return factory()


def _env(env_or_factory: Any) -> Any:
    """The env itself if an instance was given, else a fresh one."""
    return env_or_factory if _is_env(env_or_factory) else _env_factory(env_or_factory)()


def _sample(space: Any, seed: int) -> Any:
    space.seed(seed)
    return space.sample()


def _is_empty(action: Any) -> bool:
    return action is None or (isinstance(action, str) and action == "")


def _sample_actions(env: Any, step: int) -> dict[str, Any]:
    """Seeded actions for every live seat (the off-turn one is ignored by the env)."""
    return {agent: _sample(env.action_space(agent), 1000 * step + i) for i, agent in enumerate(env.agents)}


def _transcript(env: Any) -> list[tuple[Any, ...]]:
    return [(t.seat, t.text, t.act) for t in getattr(env, "transcript", [])]


def _reset(check: str, env: Any, seed: int | None, options: dict[str, Any] | None = None) -> tuple[Any, Any]:
    with _calling(check, f"reset(seed={seed}, options={options})", "reset must accept seed= and options="):
        return env.reset(seed=seed, options=options)


def _step(check: str, env: Any, actions: dict[str, Any]) -> tuple[Any, ...]:
    with _calling(check, f"step({_short(actions)})", "a valid step must not raise"):
        return env.step(actions)


def _play_to_end(check: str, env: Any, first_step: int = 0) -> int:
    """Step ``env`` with sampled actions until the episode ends; return the number of steps taken."""
    cap = int(getattr(env, "max_steps", _MAX_EPISODE_STEPS))
    for n in range(cap + 1):
        if not env.agents:
            return n
        _step(check, env, _sample_actions(env, first_step + n))
    _fail(check, f"the episode did not end within {cap} steps (env.max_steps) of sampled actions",
          "end the episode (truncated=True) once max_steps steps have been taken")


def _json_view(observation: Any) -> dict[str, Any] | None:
    """A text observation decoded from JSON, or None if it is not one."""
    if not isinstance(observation, str):
        return None
    try:
        view = json.loads(observation)
    except ValueError:
        return None
    return view if isinstance(view, dict) else None


# ============================================================================================ env checks
def check_seats(env_or_factory: Any, *, seed: int = 0) -> None:
    """Exactly two seats, named ``policy_seat`` and ``user_seat`` in ``possible_agents``; ``to_act`` is one.

    Raises:
        AssertionError: If the seats do not follow the contract.
    """
    name = "check_seats"
    env = _make_env(name, _env_factory(env_or_factory))
    agents = list(getattr(env, "possible_agents", []))
    policy, user = getattr(env, "policy_seat", None), getattr(env, "user_seat", None)
    if len(agents) != 2 or len(set(agents)) != 2:
        _fail(name, f"possible_agents is {agents!r}, not two distinct seats",
              "a dialogue env has exactly two seats: possible_agents = [policy_seat, user_seat]")
    if policy is None or user is None or policy == user or {policy, user} != set(agents):
        _fail(name, f"policy_seat={policy!r} and user_seat={user!r} do not name the two seats {agents!r}",
              "set the class attributes policy_seat and user_seat to the two (different) seat names")
    _reset(name, env, seed)
    if sorted(env.agents) != sorted(agents):
        _fail(name, f"after reset() agents is {env.agents!r}, not both seats {agents!r}",
              "reset() must make both seats live (self.agents = list(self.possible_agents))")
    if getattr(env, "to_act", None) not in agents:
        _fail(name, f"after reset() to_act is {getattr(env, 'to_act', None)!r}, not a seat",
              "set env.to_act to the seat that acts first (DialogueEnv does this from first_seat)")


def check_spaces_memoised(env_or_factory: Any, *, seed: int = 0) -> None:
    """``observation_space(a)`` / ``action_space(a)`` return the same object every call, before and after reset.

    Raises:
        AssertionError: If a space is rebuilt.
    """
    name = "check_spaces_memoised"
    env = _make_env(name, _env_factory(env_or_factory))
    fix = "build the spaces once (in __init__) and return the stored objects (PettingZoo requires memoised spaces)"
    before = {}
    for agent in env.possible_agents:
        for kind in ("observation_space", "action_space"):
            getter = getattr(env, kind)
            first = getter(agent)
            if getter(agent) is not first:
                _fail(name, f"{kind}({agent!r}) returned a new object on the second call", fix)
            before[kind, agent] = first
    _reset(name, env, seed)
    _step(name, env, _sample_actions(env, 0))
    for (kind, agent), space in before.items():
        if getattr(env, kind)(agent) is not space:
            _fail(name, f"{kind}({agent!r}) returned a different object after reset() and step()", fix)


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
    env = _make_env(name, _env_factory(env_or_factory))
    for i, agent in enumerate(env.possible_agents):
        env.action_space(agent).seed(seed + i)
    seen: list[tuple[str, dict[str, Any], dict[str, Any]]] = []
    step, reset, steps = env.step, env.reset, itertools.count()

    def recording_step(actions: dict[str, Any]) -> tuple[Any, ...]:
        out = step(actions)
        seen.append((f"step {next(steps)} of PettingZoo's run", out[0], out[1]))
        return out

    def recording_reset(*args: Any, **kwargs: Any) -> tuple[Any, Any]:
        out = reset(*args, **kwargs)
        seen.append(("reset", out[0], {}))
        return out

    # Instance attributes shadow the methods for PettingZoo's run only (the env is a fresh one of ours).
    env.step, env.reset = recording_step, recording_reset
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # PettingZoo's test passes a made-up reset option on purpose; DialogueEnv warns about it.
        warnings.filterwarnings("ignore", message="ignoring unknown reset options")
        with _calling(name, "pettingzoo.test.parallel_api_test", "follow the PettingZoo ParallelEnv API "
                      "(see the traceback; DialogueEnv's base class handles most of it)"):
            parallel_api_test(env, num_cycles=num_cycles)
    del env.step, env.reset
    found = [str(w.message).splitlines()[0] for w in caught if str(w.message).startswith(_PETTINGZOO_WARNINGS)]
    if found:
        _fail(name, f"PettingZoo's parallel_api_test warned: {'; '.join(dict.fromkeys(found))}",
              "return observations, rewards, terminations, truncations and infos for exactly the live seats")
    for when, observations, rewards in seen:
        for agent, observation in observations.items():
            space = env.observation_space(agent)
            if not space.contains(observation):
                _fail(name, f"{when}: the observation for {agent!r}, {_short(observation)}, is not in its "
                      f"observation space {space}",
                      "return observations inside observation_space(seat) (dtype, shape, bounds)")
        bad = {a: r for a, r in rewards.items() if not isinstance(r, (float, int, np.floating, np.integer))}
        if bad:
            _fail(name, f"{when}: rewards {_short(bad)} are not numbers", "return float rewards per seat")


_Record = list[tuple[str, int, tuple[Any, ...]]]


def _rollout(check: str, env: Any, seed: int, steps: int) -> _Record:
    """Reset with ``seed`` and take ``steps`` seeded steps (resetting with new seeds after an episode ends).

    Returns:
        Records ``(kind, iteration, values)``, with values named by :data:`_RECORD_FIELDS`.
    """
    obs, infos = _reset(check, env, seed)
    record: _Record = [("reset", -1, (obs, infos, getattr(env, "user_seed", None)))]
    for step in range(steps):
        if not env.agents:
            record.append(("transcript", step, (_transcript(env),)))
            obs, infos = _reset(check, env, seed + step + 1)
            record.append(("reset", step, (obs, infos, getattr(env, "user_seed", None))))
            continue
        actions = _sample_actions(env, step)
        record.append(("step", step, (actions, *_step(check, env, actions))))
    record.append(("transcript", steps, (_transcript(env),)))
    return record


def _rollout_difference(a: _Record, b: _Record) -> str | None:
    """Where two rollouts first differ, as ``iteration 3 (step), rewards['persuader']: 0.0 != 1.0``."""
    for (kind, step, x), (other, _, y) in zip(a, b, strict=False):
        where = "the first reset" if step < 0 else f"iteration {step} ({kind})"
        if kind != other:
            return f"{where}: one env did {kind}, the other {other}"
        found = _fields_difference(x, y, _RECORD_FIELDS[kind])
        if found:
            return f"{where}, {found}"
    return None if len(a) == len(b) else f"the number of records: {len(a)} != {len(b)}"


def check_determinism(env_or_factory: Any, *, seed: int = 0, steps: int = 12, min_steps: int | None = None) -> None:
    """Two fresh envs, same seed and same seeded actions for ``steps`` steps: identical records.

    The record holds every reset's observations, infos and ``user_seed``, every step's five results and
    the transcripts. After an episode ends the env is reset with a new seed (counted as one of ``steps``).

    Args:
        env_or_factory: The env (factory, id or instance).
        seed: The reset seed.
        steps: Steps (and resets) to take.
        min_steps: How many of them must be steps rather than resets (default: all but two), so that
            the check sees transitions and not only resets.

    Raises:
        AssertionError: On the first difference, or if too few steps were taken.
    """
    name = "check_determinism"
    factory = _env_factory(env_or_factory)
    a = _rollout(name, _make_env(name, factory), seed, steps)
    b = _rollout(name, _make_env(name, factory), seed, steps)
    found = _rollout_difference(a, b)
    if found:
        _fail(name, f"two envs reset with seed={seed} and given the same actions differ at {found}",
              "draw every random choice from the generator seeded by reset(seed=...) (self.np_random or "
              "generators derived from it); no global random/np.random, unseeded generators, clocks or set order")
    taken = sum(1 for kind, *_ in a if kind == "step")
    needed = max(1, steps - 2) if min_steps is None else min_steps
    if taken < needed:
        _fail(name, f"only {taken} of {steps} iterations were steps (episodes ended too early); need {needed}",
              "episodes of sampled actions should last several steps; or pass a smaller min_steps")


def check_pickle(env_or_factory: Any, *, seed: int = 0) -> None:
    """A mid-episode env survives ``pickle``: same transcript, and the clone's next step equals the original's.

    Raises:
        AssertionError: If pickling fails or the clone diverges.
    """
    name = "check_pickle"
    env = _make_env(name, _env_factory(env_or_factory))
    for attempt in range(8):  # a sampled first action may end the episode (a lucky guess): try other samples
        _reset(name, env, seed + attempt)
        _step(name, env, _sample_actions(env, attempt))
        if env.agents:
            break
    else:
        _fail(name, "every sampled first step ended the episode, so no mid-episode env could be pickled",
              "episodes of sampled actions should last several steps")
    with _calling(name, "pickle.loads(pickle.dumps(env))", "keep only picklable state on the env (no open "
                  "files, locks, lambdas or live processes), or implement __getstate__/__setstate__"):
        clone = pickle.loads(pickle.dumps(env))
    if _transcript(clone) != _transcript(env):
        _fail(name, "the unpickled env has a different transcript", "pickle the transcript with the env")
    actions = _sample_actions(env, 1)
    found = _fields_difference(_step(name, clone, actions), _step(name, env, actions), _STEP_FIELDS)
    if found:
        _fail(name, f"after the same action the clone and the original differ: {found}",
              "pickle every piece of episode state, including random generators")


def check_scenarios(env_or_factory: Any, *, seed: int = 0) -> None:
    """``scenario_ids()`` is non-empty and unique; ``reset(options={"scenario_id": i})`` selects it; unknown ids raise.

    Raises:
        AssertionError: If scenario selection does not follow the contract.
    """
    name = "check_scenarios"
    env = _make_env(name, _env_factory(env_or_factory))
    with _calling(name, "scenario_ids()", "implement scenario_ids() returning a list of ids"):
        ids = list(env.scenario_ids())
    if not ids or len(set(ids)) != len(ids):
        _fail(name, f"scenario_ids() returned {len(ids)} ids, {len(set(ids))} distinct",
              "return every scenario id once, in a stable order")
    for scenario_id in dict.fromkeys([ids[-1], ids[0]]):
        _reset(name, env, seed, {"scenario_id": scenario_id})
        got = getattr(env.scenario, "id", None)
        if got != scenario_id:
            _fail(name, f"reset(options={{'scenario_id': {scenario_id!r}}}) gave scenario {got!r}",
                  "load the requested scenario (and expose it as env.scenario with .id)")
    try:
        env.reset(seed=seed, options={"scenario_id": "no-such-scenario"})
    except KeyError as exc:
        if "scenario_id" not in str(exc):
            _fail(name, f"the KeyError for an unknown scenario does not say 'scenario_id': {exc}",
                  "say which option was wrong and where the valid ids are (env.scenario_ids())")
    except Exception as exc:  # noqa: BLE001
        _fail(name, f"an unknown scenario_id raised {type(exc).__name__}: {exc}", "raise KeyError naming scenario_id")
    else:
        _fail(name, "reset(options={'scenario_id': 'no-such-scenario'}) did not raise",
              "raise KeyError naming scenario_id for an unknown scenario id")


def check_off_turn_ignored(env_or_factory: Any, *, seed: int = 0, steps: int = 4) -> None:
    """An action from the seat that is not to act changes nothing but is flagged in its info.

    Two envs reset with ``seed`` are stepped with the same acting-seat actions, one of them also with a
    non-empty action for the other seat; their results must match except for
    ``info[other]["off_turn_action_ignored"] is True``.

    Raises:
        AssertionError: If the off-turn action has an effect or is not flagged.
    """
    name = "check_off_turn_ignored"
    factory = _env_factory(env_or_factory)
    plain, noisy = _make_env(name, factory), _make_env(name, factory)
    _reset(name, plain, seed)
    _reset(name, noisy, seed)
    for step in range(steps):
        if not plain.agents:
            break
        seat = plain.to_act
        other = next(a for a in plain.possible_agents if a != seat)
        action = _sample(plain.action_space(seat), 1000 * step)
        extra = next((x for k in range(20) if not _is_empty(x := _sample(plain.action_space(other), 7 + step + k))),
                     None)
        a = _step(name, plain, {seat: action})
        b = _step(name, noisy, {seat: action, other: extra})
        flag = b[4].get(other, {}).get("off_turn_action_ignored")
        if extra is not None and flag is not True:
            _fail(name, f"step {step}: {other!r} acted out of turn with {_short(extra)} but "
                  f"info[{other!r}]['off_turn_action_ignored'] is {flag!r}",
                  "set info[seat]['off_turn_action_ignored'] = True for a non-empty action of the seat not to act")
        if "off_turn_action_ignored" in a[4].get(other, {}):
            _fail(name, f"step {step}: info[{other!r}] flags an off-turn action although none was given",
                  "only flag non-empty actions of the seat not to act")
        b[4].get(other, {}).pop("off_turn_action_ignored", None)
        found = _fields_difference(a, b, _STEP_FIELDS) or _first_difference(
            _transcript(plain), _transcript(noisy), "transcript")
        if found:
            _fail(name, f"step {step}: an off-turn action by {other!r} changed {found}",
                  "ignore every action but the acting seat's (env.to_act)")


def check_misuse_raises(env_or_factory: Any, *, seed: int = 0) -> None:
    """Misuse of ``step`` raises a clear error instead of being accepted.

    Stepping before ``reset`` or after the episode ended raises ``RuntimeError`` (saying "reset"),
    omitting the acting seat ``ValueError`` (naming it), naming an unknown seat ``KeyError`` (naming it).

    Raises:
        AssertionError: If misuse is silently accepted or raises the wrong error.
    """
    name = "check_misuse_raises"
    env = _make_env(name, _env_factory(env_or_factory))

    def expect(error: type[Exception], actions: dict[str, Any], when: str, says: str, fix: str) -> None:
        try:
            env.step(actions)
        except error as exc:
            if says.lower() not in str(exc).lower():
                _fail(name, f"step() {when} raised {error.__name__} without saying {says!r}: {exc}", fix)
        except Exception as exc:  # noqa: BLE001
            _fail(name, f"step() {when} raised {type(exc).__name__} ({exc}), expected {error.__name__}", fix)
        else:
            _fail(name, f"step() {when} did not raise", fix)

    seat = env.possible_agents[0]
    expect(RuntimeError, {seat: _sample(env.action_space(seat), seed)}, "before reset()", "reset",
           "raise RuntimeError telling the caller to call reset() first")
    _reset(name, env, seed)
    seat = env.to_act
    other = next(a for a in env.possible_agents if a != seat)
    expect(ValueError, {other: _sample(env.action_space(other), seed)}, f"without the acting seat {seat!r}", seat,
           "raise ValueError naming the seat whose turn it is")
    expect(KeyError, {seat: _sample(env.action_space(seat), seed), "no-such-seat": None}, "naming an unknown seat",
           "no-such-seat", "raise KeyError naming the unknown seat(s)")
    _play_to_end(name, env)
    expect(RuntimeError, {seat: _sample(env.action_space(seat), seed)}, "after the episode ended", "reset",
           "raise RuntimeError telling the caller to call reset() first")


def check_bad_action(env_or_factory: Any, *, seed: int = 0, steps: int = 12, bad_action: Any = NOT_AN_ACTION) -> None:
    """A bad action is rejected without an exception, for each seat that gets a turn within ``steps`` steps.

    The acting seat's info has a non-empty ``invalid_action`` string, the transcript is unchanged, the
    step counts towards the cap, the same seat acts again (unless the episode ended) and a JSON text
    observation carries the error in its ``error`` field.

    Args:
        env_or_factory: The env (factory, id or instance).
        seed: The reset seed.
        steps: Seeded steps allowed for reaching the second seat's turn.
        bad_action: The action to send (default: an object of a type no space contains).

    Raises:
        AssertionError: If a bad action raises or is not flagged.
    """
    name = "check_bad_action"
    env = _make_env(name, _env_factory(env_or_factory))
    _reset(name, env, seed)
    tested: set[str] = set()
    for step in range(steps + 1):
        if not env.agents:
            _reset(name, env, seed + step + 1)
        seat = env.to_act
        if seat not in tested:
            tested.add(seat)
            before, count = _transcript(env), getattr(env, "steps", None)
            with _calling(name, f"step({{{seat!r}: {bad_action!r}}})", "reject bad actions in _validate (return "
                          "why) instead of raising: the seat gets an error observation and info['invalid_action']"):
                obs, _, terms, truncs, infos = env.step({seat: bad_action})
            why = infos.get(seat, {}).get("invalid_action")
            if not isinstance(why, str) or not why:
                _fail(name, f"{seat!r} sent {bad_action!r} but info[{seat!r}]['invalid_action'] is {why!r}",
                      "flag a rejected action with info[seat]['invalid_action'] = <why, and what to send instead>")
            if _transcript(env) != before:
                _fail(name, "a rejected action was added to the transcript", "apply only valid actions")
            if count is not None and env.steps != count + 1:
                _fail(name, f"a rejected action moved env.steps from {count} to {env.steps}",
                      "count a rejected action as one step towards the cap")
            ended = terms.get(seat) or truncs.get(seat)
            if not ended and env.to_act != seat:
                _fail(name, f"after a rejected action by {seat!r}, to_act is {env.to_act!r}",
                      "let the seat whose action was rejected act again")
            view = _json_view(obs.get(seat))
            if view is not None and "error" in view and not view["error"]:
                _fail(name, f"the text observation for {seat!r} after a rejected action has error={view['error']!r}",
                      "show the rejection in the seat's next observation (text_observation does, from last_error)")
            if len(tested) == len(env.possible_agents):
                return
            continue
        if step < steps and env.agents:
            _step(name, env, _sample_actions(env, step))


def check_single_agent_view(env_or_factory: Any, simulator: Any, *, seed: int = 0) -> None:
    """Gymnasium's ``env_checker`` on ``UserSeat(env, simulator)``, the policy seat's single-agent view.

    Args:
        env_or_factory: The env (used as is if an instance; else a fresh one).
        simulator: The user-seat simulator, or a factory called with the env (see the module docstring).
        seed: Seed for the view's action space.

    Raises:
        AssertionError: With Gymnasium's finding.
    """
    from gymnasium.utils.env_checker import check_env

    from simpop.envs.wrappers import UserSeat

    name = "check_single_agent_view"
    env = _env(env_or_factory)
    sim = _simulator_factory(simulator)(env)
    with _calling(name, "UserSeat(env, simulator)", "the env must offer policy_seat/user_seat and its spaces"):
        view = UserSeat(env, sim)
    view.action_space.seed(seed)
    with _calling(name, "gymnasium.utils.env_checker.check_env(UserSeat(env, simulator))",
                  "follow the Gymnasium Env API for the policy seat (see the traceback)"):
        check_env(view, skip_render_check=True)


#: The env checks :func:`check_dialogue_env` runs (all but the single-agent view), by name; each takes
#: ``(env_or_factory, *, seed=...)``.
ENV_CHECKS: dict[str, Callable[..., None]] = {
    "seats": check_seats,
    "spaces_memoised": check_spaces_memoised,
    "parallel_api": check_parallel_api,
    "scenarios": check_scenarios,
    "determinism": check_determinism,
    "pickle": check_pickle,
    "off_turn_ignored": check_off_turn_ignored,
    "misuse_raises": check_misuse_raises,
    "bad_action": check_bad_action,
}


#: The checks in :data:`ENV_CHECKS` that take ``steps``.
_TAKES_STEPS = frozenset({"determinism", "off_turn_ignored", "bad_action"})


def check_dialogue_env(env_or_factory: Any, *, seed: int = 0, steps: int = 12,
                       single_agent_simulator: Any = None) -> list[str]:
    """Run every env-contract check (:data:`ENV_CHECKS`, plus the single-agent view if a simulator is given).

    Args:
        env_or_factory: A zero-argument env factory (best), a registered env id, or an env instance.
        seed: Seed for resets and sampled actions.
        steps: Steps for the determinism, off-turn and bad-action checks.
        single_agent_simulator: A simulator (or factory called with the env) for the user seat: if given,
            Gymnasium's checker runs on ``UserSeat(env, simulator)``.

    Returns:
        The names of the checks that ran (all passed).

    Raises:
        AssertionError: From the first failing check, naming it and what to fix.
    """
    ran = []
    for key, check in ENV_CHECKS.items():
        check(env_or_factory, seed=seed, **({"steps": steps} if key in _TAKES_STEPS else {}))
        ran.append(key)
    if single_agent_simulator is not None:
        check_single_agent_view(env_or_factory, single_agent_simulator, seed=seed)
        ran.append("single_agent_view")
    return ran


# ============================================================================================ simulator checks
def _is_simulator(obj: Any) -> bool:
    return not isinstance(obj, type) and callable(getattr(obj, "reset_batch", None)) and \
        callable(getattr(obj, "act_batch", None))


def _simulator_factory(simulator_or_factory: Any) -> Callable[[Any], Any]:
    """``factory(env) -> simulator``: the instance itself, a class called with no arguments, or the factory."""
    if _is_simulator(simulator_or_factory):
        return lambda env: simulator_or_factory
    if isinstance(simulator_or_factory, type):
        return lambda env: simulator_or_factory()
    if callable(simulator_or_factory):
        return simulator_or_factory
    raise TypeError(f"expected a simulator, a simulator class or a factory(env), got {simulator_or_factory!r}")


def _new_simulator(check: str, factory: Callable[[Any], Any], env: Any) -> Any:
    with _calling(check, "building the simulator", "the simulator factory is called with the env"):
        sim = factory(env)
    if not _is_simulator(sim):
        _fail(check, f"the factory returned {_short(sim)}, which has no reset_batch/act_batch",
              "return a Simulator (reset_batch, act_batch, reset, act, feedback, member, spec)")
    return sim


def _default_policy(observation: Any, action_space: Any, rng: np.random.Generator) -> Any:
    return _sample(action_space, int(rng.integers(2**31 - 1)))


def _user_rng(env: Any) -> np.random.Generator:
    if callable(getattr(env, "user_rng", None)):
        return env.user_rng()
    return np.random.default_rng(getattr(env, "user_seed", 0))


def _check_action(check: str, env: Any, action: Any, where: str) -> None:
    space = env.action_space(env.user_seat)
    if not space.contains(action):
        _fail(check, f"{where}: the simulator answered {_short(action)}, which is not in the user seat's "
              f"action space {space}", "return actions from env.action_space(env.user_seat)")


def _policy_step(check: str, env: Any, obs: dict[str, Any], policy: Policy, rng: np.random.Generator) -> tuple:
    seat = env.policy_seat
    with _calling(check, "the policy", "pass a policy(observation, action_space, rng) that returns an action"):
        action = policy(obs[seat], env.action_space(seat), rng)
    return _step(check, env, {seat: action})


class _Run:
    """What one batched run recorded: every user action, per episode and slot."""

    def __init__(self) -> None:
        self.actions: list[tuple[int, int, int, Any]] = []
        self.user_turns = 0


def _batched_run(check: str, sim: Any, envs: list[Any], *, seed: int, episodes: int, policy: Policy) -> _Run:
    """Drive ``len(envs)`` dialogues per episode through one simulator's slots, acting on subsets of slots.

    Each round the policy moves in every dialogue where the policy seat is to act; then the simulator
    answers the pending user-seat dialogues, leaving one out (round robin) when several are pending and
    passing the slots in reverse order every other round. Finished dialogues get :meth:`feedback`.
    """
    run = _Run()
    n = len(envs)
    fix_batch = "act_batch(observations, slots) returns one action per slot, in the order of slots"
    for episode in range(episodes):
        obs = [_reset(check, env, seed + 1000 * episode + i)[0] for i, env in enumerate(envs)]
        rngs = [np.random.default_rng([seed, episode, i]) for i in range(n)]
        with _calling(check, f"reset_batch(<{n} scenarios>, <{n} generators>)",
                      "reset_batch(scenarios, rngs) starts one dialogue per slot"):
            sim.reset_batch([env.scenario for env in envs], [_user_rng(env) for env in envs])
        for slot in range(n):
            with _calling(check, f"member({slot})", "member(slot) returns the simulator driving the slot"):
                member = sim.member(slot)
            if not _is_simulator(member):
                _fail(check, f"member({slot}) returned {_short(member)}, not a simulator",
                      "return the simulator that drives the slot (self, except in populations)")
        returns, turns, finished = [0.0] * n, [0] * n, set()
        for rounds in range(_MAX_EPISODE_STEPS):
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
                with _calling(check, f"act_batch(<{len(pending)} observations>, {pending})", fix_batch):
                    actions = sim.act_batch([obs[i][user] for i in pending], list(pending))
                if not isinstance(actions, (list, tuple)) or len(actions) != len(pending):
                    _fail(check, f"act_batch(..., slots={pending}) returned {_short(actions)}, "
                          f"not {len(pending)} actions", fix_batch)
                for i, action in zip(pending, actions, strict=True):
                    _check_action(check, envs[i], action, f"episode {episode}, slot {i}, user turn {turns[i]}")
                    run.actions.append((episode, i, turns[i], action))
                    turns[i] += 1
                    obs[i], rewards, *_ = _step(check, envs[i], {user: action})
                    returns[i] += float(rewards.get(envs[i].policy_seat, 0.0))
                run.user_turns += len(pending)
            done = [i for i, env in enumerate(envs) if not env.agents and i not in finished]
            if done:
                with _calling(check, f"feedback({done}, <rewards>)", "feedback(slots, rewards) takes float rewards"):
                    sim.feedback(done, [returns[i] for i in done])
                finished.update(done)
            if len(finished) == n:
                break
        else:
            _fail(check, f"episode {episode} did not end within {_MAX_EPISODE_STEPS} rounds",
                  "the env must end episodes (max_steps)")
    return run


def _make_envs(check: str, env_id_or_factory: Any, n: int) -> list[Any]:
    factory = _env_factory(env_id_or_factory)
    return [_make_env(check, factory) for _ in range(n)]


def _require_user_turns(check: str, turns: int) -> None:
    if turns == 0:
        _fail(check, "the user seat never acted: every dialogue ended before the simulator's turn",
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
    factory = _simulator_factory(simulator_or_factory)
    envs = _make_envs(name, env_id_or_factory, slots)
    sim = _new_simulator(name, factory, envs[0])
    with _calling(name, "simulator.spec", "spec is a property returning a SimulatorSpec"):
        spec = sim.spec
    missing = [a for a in ("kind", "model", "personas", "decoding") if not hasattr(spec, a)]
    if missing:
        _fail(name, f"spec {_short(spec)} has no {', '.join(missing)}",
              "return a SimulatorSpec(kind=..., model=..., personas=..., decoding=...) from the spec property")
    if not isinstance(spec.kind, str) or not spec.kind:
        _fail(name, f"spec.kind is {spec.kind!r}", "name the simulator's kind (e.g. 'native', 'frozen', 'custom')")
    text = str(spec)
    fix = "build the spec only from settings that define the simulator (no counters, ids or addresses)"
    if " at 0x" in text:
        _fail(name, f"str(spec) contains an object address: {text!r}", fix)
    if str(sim.spec) != text:
        _fail(name, f"str(spec) changed between two accesses: {text!r} then {str(sim.spec)!r}", fix)
    _batched_run(name, sim, envs, seed=seed, episodes=episodes, policy=policy or _default_policy)
    if str(sim.spec) != text:
        _fail(name, f"str(spec) changed after playing: {text!r} then {str(sim.spec)!r}", fix)
    other = _new_simulator(name, factory, envs[0])
    if str(other.spec) != text:
        _fail(name, f"two simulators from the same factory have different specs: {text!r} and {str(other.spec)!r}",
              fix)


def check_simulator_batch(simulator_or_factory: Any, env_id_or_factory: Any, *, seed: int = 0, episodes: int = 2,
                          slots: int = 3, policy: Policy | None = None) -> None:
    """Full dialogues through ``slots`` slots: ``reset_batch``, ``act_batch`` on subsets, ``member``, ``feedback``.

    Every answer must be one action per requested slot, contained in the env's user action space.

    Raises:
        AssertionError: If a slot call fails or returns a wrong or out-of-space action.
    """
    name = "check_simulator_batch"
    envs = _make_envs(name, env_id_or_factory, slots)
    sim = _new_simulator(name, _simulator_factory(simulator_or_factory), envs[0])
    run = _batched_run(name, sim, envs, seed=seed, episodes=episodes, policy=policy or _default_policy)
    _require_user_turns(name, run.user_turns)


def _single_run(check: str, sim: Any, env: Any, *, seed: int, batch: bool, policy: Policy) -> list[Any]:
    """One dialogue through ``reset``/``act`` (or ``reset_batch``/``act_batch`` slot 0); the user actions."""
    obs, _ = _reset(check, env, seed)
    rng = np.random.default_rng([seed, 0, 0])
    call = "reset_batch([scenario], [rng])" if batch else "reset(scenario, rng)"
    with _calling(check, call, "start one dialogue in slot 0"):
        if batch:
            sim.reset_batch([env.scenario], [_user_rng(env)])
        else:
            sim.reset(env.scenario, _user_rng(env))
    actions: list[Any] = []
    user = env.user_seat
    for _ in range(_MAX_EPISODE_STEPS):
        if not env.agents:
            return actions
        if env.to_act != user:
            obs, *_ = _policy_step(check, env, obs, policy, rng)
            continue
        call = "act_batch([observation], [0])" if batch else "act(observation)"
        with _calling(check, call, "answer slot 0's observation"):
            action = sim.act_batch([obs[user]], [0])[0] if batch else sim.act(obs[user])
        _check_action(check, env, action, f"{call}, user turn {len(actions)}")
        actions.append(action)
        obs, *_ = _step(check, env, {user: action})
    _fail(check, f"the episode did not end within {_MAX_EPISODE_STEPS} steps", "the env must end episodes")


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
    factory = _simulator_factory(simulator_or_factory)
    env_factory = _env_factory(env_id_or_factory)
    policy = policy or _default_policy
    turns = 0
    for episode in range(episodes):
        runs = []
        for batch in (False, True):
            env = _make_env(name, env_factory)
            runs.append(_single_run(name, _new_simulator(name, factory, env), env, seed=seed + episode, batch=batch,
                                    policy=policy))
        found = _first_difference(runs[0], runs[1], "user actions")
        if found:
            _fail(name, f"seed {seed + episode}: act() and act_batch(..., [0]) answered differently: {found}",
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
    factory = _simulator_factory(simulator_or_factory)
    runs = []
    for _ in range(2):
        envs = _make_envs(name, env_id_or_factory, slots)
        runs.append(_batched_run(name, _new_simulator(name, factory, envs[0]), envs, seed=seed, episodes=episodes,
                                 policy=policy or _default_policy))
    first, second = runs[0].actions, runs[1].actions
    found = next((f"(episode, slot, user turn) = {x[:3]}: {d}" for x, y in zip(first, second, strict=False)
                  if (d := _first_difference(x[3], y[3], "action") or _first_difference(x[:3], y[:3], "order"))), None)
    if found is None and len(first) != len(second):
        found = f"the end: {len(first)} user actions != {len(second)}"
    if found:
        _fail(name, f"two runs with seed={seed} differ at {found}",
              "draw every random choice from the generators given to reset_batch/reset (no global random/np.random, "
              "unseeded generators or clocks) and discard all per-dialogue state in reset_batch")
    _require_user_turns(name, runs[0].user_turns)


def check_simulator_bad_slot(simulator_or_factory: Any, env_id_or_factory: Any, *, seed: int = 0, episodes: int = 1,
                             slots: int = 3, policy: Policy | None = None) -> None:
    """``act_batch`` for a slot that ``reset_batch`` did not start raises ``IndexError`` or ``ValueError``.

    After ``reset_batch`` starts ``slots`` slots, the first user-seat observation is sent for slot ``slots``.
    (``episodes`` is accepted for a signature shared with the other simulator checks.)

    Raises:
        AssertionError: If the bad slot is answered or raises another error.
    """
    name = "check_simulator_bad_slot"
    env = _make_env(name, _env_factory(env_id_or_factory))
    obs, _ = _reset(name, env, seed)
    rng = np.random.default_rng(seed)
    for _ in range(_MAX_EPISODE_STEPS):
        if not env.agents or env.to_act == env.user_seat:
            break
        obs, *_ = _policy_step(name, env, obs, policy or _default_policy, rng)
    if not env.agents:
        _require_user_turns(name, 0)
    sim = _new_simulator(name, _simulator_factory(simulator_or_factory), env)
    with _calling(name, f"reset_batch(<{slots} scenarios>, <{slots} generators>)", "start one dialogue per slot"):
        sim.reset_batch([env.scenario] * slots, [np.random.default_rng([seed, i]) for i in range(slots)])
    fix = (f"raise IndexError (or ValueError) saying which slots exist, e.g. 'slot {slots} was not started: "
           f"reset_batch() started {slots} slots'")
    try:
        answer = sim.act_batch([obs[env.user_seat]], [slots])
    except (IndexError, ValueError) as exc:
        if not str(exc):
            _fail(name, f"act_batch for slot {slots} raised {type(exc).__name__} with no message", fix)
    except Exception as exc:  # noqa: BLE001
        _fail(name, f"act_batch for slot {slots} (of {slots}) raised {type(exc).__name__}: {exc}", fix)
    else:
        _fail(name, f"act_batch for slot {slots} after reset_batch started {slots} slots answered {_short(answer)}",
              fix)


#: The simulator checks :func:`check_simulator` runs, by name; each takes
#: ``(simulator_or_factory, env_id_or_factory, *, seed=..., episodes=..., slots=..., policy=...)``.
SIMULATOR_CHECKS: dict[str, Callable[..., None]] = {
    "spec": check_simulator_spec,
    "batch": check_simulator_batch,
    "slot0": check_simulator_slot0,
    "determinism": check_simulator_determinism,
    "bad_slot": check_simulator_bad_slot,
}


def check_simulator(simulator_or_factory: Any, env_id_or_factory: Any, *, seed: int = 0, episodes: int = 2,
                    slots: int = 3, policy: Policy | None = None) -> list[str]:
    """Run every Simulator-contract check (:data:`SIMULATOR_CHECKS`) with the simulator in the env's user seat.

    Args:
        simulator_or_factory: A simulator, a simulator class, or a factory called with the env (fresh
            simulators make the determinism check meaningful).
        env_id_or_factory: A registered env id, a zero-argument env factory, or an env instance.
        seed: Seed for env resets, the policy and the generators handed to the simulator.
        episodes: Episodes per run (each batched run starts ``slots`` dialogues per episode).
        slots: Slots in the batched runs.
        policy: ``policy(observation, action_space, rng) -> action`` for the policy seat (default: sample
            the policy seat's action space).

    Returns:
        The names of the checks that ran (all passed).

    Raises:
        AssertionError: From the first failing check, naming it and what to fix.
    """
    common: dict[str, Any] = {"seed": seed, "policy": policy}
    check_simulator_spec(simulator_or_factory, env_id_or_factory, episodes=1, slots=min(slots, 2), **common)
    check_simulator_batch(simulator_or_factory, env_id_or_factory, episodes=episodes, slots=slots, **common)
    check_simulator_slot0(simulator_or_factory, env_id_or_factory, episodes=episodes, **common)
    check_simulator_determinism(simulator_or_factory, env_id_or_factory, episodes=episodes, slots=slots, **common)
    check_simulator_bad_slot(simulator_or_factory, env_id_or_factory, slots=slots, **common)
    return list(SIMULATOR_CHECKS)
