"""Property-based fuzzing of every registered env: random actions of every type from both seats.

Each registered id (``simpop.ids()``, none skipped; heavy ones at their smallest settings) is driven
through many steps by Hypothesis: at each step the seat to act gets a valid action, one of the wrong
type, an empty one, a huge one, one holding lone surrogates, random JSON or random text, and the other
seat sometimes gets one too (it must be ignored). The properties: ``step`` never raises; every return
is consistent (the same termination flags for both seats, never terminated and truncated at once, a
finished episode has no agents and no seat to act, a rejected action says why and leaves the turn with
the same seat, rewards are finite, observations lie in their spaces and text observations are JSON
that encodes as UTF-8); the step cap holds; a finished episode refuses another step with a clear
``RuntimeError``; and ``reset`` always starts a fresh episode again.
"""

from __future__ import annotations

import json
import math
import warnings
from typing import Any

import numpy as np
import pytest
from gymnasium import spaces
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import simpop
from simpop.envs.registration import spec
from tests.envs.registry_kwargs import SAME_ENV, kwargs_for
from tests.hypothesis_budget import examples as budget

IDS = simpop.ids()

#: The smallest settings of each benchmark (fewer scenarios, turns and steps); CooperBench runs real tests
#: at ``test``, ``submit`` and the end of an episode, so it gets the fewest steps and examples.
SMALL: dict[str, dict[str, Any]] = {
    "simpop.envs.persuasion.env:PersuasionEnv": {"max_turns": 2, "n_scenarios": 3},
    "simpop.envs.persuasion.env:PersuasionActEnv": {"max_turns": 2, "n_scenarios": 3},
    "simpop.envs.tau2.env:Tau2Env": {"max_steps": 8, "max_errors": 3},
    "simpop.envs.cooperbench.env:CooperBenchEnv": {"max_steps": 4},
}
#: Hypothesis examples (the thorough budget: tests/hypothesis_budget.py) and steps per example, by entry point.
BUDGET: dict[str, tuple[int, int]] = {
    "simpop.envs.persuasion.env:PersuasionEnv": (100, 30),
    "simpop.envs.persuasion.env:PersuasionActEnv": (100, 30),
    "simpop.envs.tau2.env:Tau2Env": (25, 20),
    "simpop.envs.cooperbench.env:CooperBenchEnv": (5, 8),
}
#: Ids whose reset is slow (τ² validates the airline and retail databases at every reset: ~0.25 s).
BUDGET_BY_ID: dict[str, tuple[int, int]] = {"simpop/Tau2-airline-v0": (4, 16), "simpop/Tau2-retail-v0": (6, 16)}

_HUGE_TEXT = "x" * 200_001
#: Deep nesting (a recursive parser would overflow) and other hostile strings.
_HOSTILE = ["[" * 50_000, '{"a":' * 50_000, "[" * 5_000, '{"a":' * 1_500,
            '<tool_call>{"name": "x", "arguments": ' + '{"a":' * 1_500 + "</tool_call>",
            '{"type": "write", "path": "x.py", "content": ' + "[" * 5_000, "\0", "\ufeff{}",
            '```json\n{"type": "submit"\n```', "🙂" * 3000, "-" * 70_000 + "\n"]
LONE_SURROGATES = st.sampled_from(["\ud800", "hello \udfff", "\udc80\udc81", '{"type": "message", "text": "\ud83d"}',
                                   '{"name": "x", "arguments": {"a": "\udbff"}}', "I'll donate $1 \ud800"])
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12)
WRONG_TYPE = st.one_of(
    st.none(), st.booleans(), st.integers(-10**30, 10**30), st.floats(), st.binary(max_size=20),
    st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
    st.sampled_from([np.int64(1), np.float32(0.5), np.array([1, 2]), np.array(3), np.bool_(True), (1,), {1, 2},
                     object()]))
EMPTY = st.sampled_from(["", " ", "\n\t ", None, [], {}])
HUGE = st.sampled_from([_HUGE_TEXT, 10**40, -10**40, 2**63, float("inf"), *_HOSTILE])
RANDOM_JSON = JSON_VALUES.map(lambda v: json.dumps(v, allow_nan=True))
RANDOM_TEXT = st.text(max_size=300)


def _valid_text(env: Any, seat: str, observation: Any) -> st.SearchStrategy:
    """Actions the env should accept (or that reach its deeper code paths), by benchmark."""
    name = type(env).__name__
    if name == "PersuasionEnv":
        return st.one_of(RANDOM_TEXT.filter(str.strip), st.sampled_from(
            ["Would you donate to Save the Children?", "I'll donate $1.", "No thanks, I won't donate.",
             "I donate $0.50", "I donate nothing", "$5", "maybe 50 cents", "[DONATE $2]", "I'll give -$1"]))
    if name == "Tau2Env":
        tools = [t["function"]["name"] for t in json.loads(observation).get("tools", []) if "function" in t]
        call = st.builds(lambda n, a: json.dumps({"name": n, "arguments": a}),
                         st.sampled_from(tools or ["done"]) | st.text(max_size=10),
                         st.dictionaries(st.text(max_size=8), JSON_VALUES, max_size=3))
        tagged = call.map(lambda c: f"Let me check.\n<tool_call>{c}</tool_call>")
        return st.one_of(RANDOM_TEXT.filter(str.strip), call, tagged, st.sampled_from(
            ["Hi, I need help with my booking.", "###STOP###", "###TRANSFER###", "###OUT-OF-SCOPE###",
             "<tool_call>not json</tool_call>", '{"name": "done", "arguments": {}}',
             '{"type": "function", "function": {"name": "done", "arguments": "{}"}}']))
    if name == "CooperBenchEnv":
        files = json.loads(observation).get("files", [])[:50] or ["README.md"]
        path = st.sampled_from(files) | st.text(max_size=40) | st.sampled_from(
            ["../x", "/etc/passwd", ".git/config", "a/" * 40 + "x", "n" * 300, "dir/", "", "x\0y", "tests/"])
        action = st.one_of(
            st.builds(lambda t: {"type": "message", "text": t}, RANDOM_TEXT),
            st.builds(lambda p: {"type": "view", "path": p}, path),
            st.builds(lambda p, c: {"type": "write", "path": p, "content": c}, path, RANDOM_TEXT),
            st.builds(lambda p: {"type": "delete", "path": p}, path),
            st.just({"type": "test"}), st.just({"type": "submit"}))
        return st.one_of(action.map(json.dumps), st.sampled_from(["submit", "test"]))
    return RANDOM_TEXT


def action_strategy(env: Any, seat: str, observation: Any) -> st.SearchStrategy:
    """Any kind of action for ``seat``: valid, wrong type, empty, huge, lone surrogates, random JSON or text."""
    space = env.action_space(seat)
    if isinstance(space, spaces.Discrete):
        valid = st.integers(int(space.start), int(space.start + space.n - 1))
        valid = valid | valid.map(np.int64)
        text_like = st.one_of(RANDOM_TEXT, valid.map(str))
    else:
        valid = _valid_text(env, seat, observation)
        text_like = RANDOM_TEXT
    kinds = {"valid": valid, "wrong_type": WRONG_TYPE, "empty": EMPTY, "huge": HUGE, "surrogates": LONE_SURROGATES,
             "json": RANDOM_JSON, "text": text_like,
             "out_of_range": st.integers(-(2**70), 2**70) if isinstance(space, spaces.Discrete) else HUGE}
    return st.sampled_from(sorted(kinds)).flatmap(lambda kind: kinds[kind])


def check_observation(env: Any, seat: str, observation: Any) -> None:
    assert env.observation_space(seat).contains(observation), f"{seat}'s observation is outside its space"
    if isinstance(observation, str):
        observation.encode("utf-8")  # downstream writers (logs, HTTP, tokenizers) need valid UTF-8
        assert isinstance(json.loads(observation), dict)


def check_step(env: Any, seat: str, before_steps: int, result: tuple, phase: str | None = None) -> bool:
    """Check one step's return (``phase``: the text P4G env's phase before the step); True if the episode ended."""
    observations, rewards, terminations, truncations, infos = result
    live = set(observations)
    assert live == set(env.possible_agents)
    assert set(rewards) == set(terminations) == set(truncations) == set(infos) == live
    assert len(set(terminations.values())) == 1 and len(set(truncations.values())) == 1, "seats disagree on the end"
    terminated, truncated = next(iter(terminations.values())), next(iter(truncations.values()))
    assert not (terminated and truncated)
    assert env.steps == before_steps + 1 <= env.max_steps
    for agent in live:
        assert isinstance(rewards[agent], float) and math.isfinite(rewards[agent])
        assert infos[agent]["to_act"] == env.to_act
        check_observation(env, agent, observations[agent])
    if terminated or truncated:
        assert env.done and env.agents == [] and env.to_act is None
        return True
    assert env.to_act in env.possible_agents and env.agents == env.possible_agents
    error = infos[seat].get("invalid_action")
    if error is not None:
        assert isinstance(error, str) and error
        # The same seat acts again, except when P4G's closing survey begins (it is the persuadee's turn then).
        began_survey = phase == "dialogue" and getattr(env, "phase", None) == "survey"
        assert env.to_act == (env.user_seat if began_survey else seat), "a rejected action must keep the turn"
    assert all(rewards[a] == 0.0 for a in live), "only the end of an episode is rewarded"
    return False


def check_reset(env: Any, seed: int) -> dict[str, Any]:
    observations, infos = env.reset(seed=seed)
    assert set(observations) == set(infos) == set(env.possible_agents) == set(env.agents)
    assert env.to_act in env.possible_agents and env.steps == 0 and not env.done
    for agent, observation in observations.items():
        check_observation(env, agent, observation)
    return observations


def _is_empty(action: Any) -> bool:
    return action is None or (isinstance(action, str) and action == "")


def make_small(env_id: str) -> Any:
    entry = spec(env_id).entry_point
    return simpop.make(env_id, **{**kwargs_for(env_id), **SMALL.get(entry, {})})


def test_cooperbench_without_a_dataset_refuses_construction_clearly():
    # CooperBench-v0 needs the benchmark's dataset folder: without one it is refused up front, naming the fix.
    with pytest.raises(ValueError, match="dataset=") as error:
        simpop.make("simpop/CooperBench-v0")
    assert "simpop/CooperBench-mini-v0" in str(error.value)
    import gymnasium

    with pytest.raises(ValueError, match="dataset="):
        gymnasium.make("simpop/CooperBench-v0")


def test_every_registered_id_is_fuzzed():
    # No id is left out: each (or the id in SAME_ENV whose env it builds) has its smallest settings and a budget.
    for env_id in IDS:
        entry = spec(env_id).entry_point
        assert entry in SMALL and entry in BUDGET, f"{env_id}: add its smallest settings and budget to test_fuzz.py"


@pytest.mark.parametrize("env_id", [i for i in IDS if i not in SAME_ENV])  # SAME_ENV: fuzzed as the other id
def test_random_actions_from_both_seats_never_crash_and_end_consistently(env_id):
    env = make_small(env_id)
    thorough, max_steps = BUDGET_BY_ID.get(env_id, BUDGET[spec(env_id).entry_point])
    examples = budget(thorough)

    counts = {"steps": 0, "accepted": 0, "rejected": 0, "episodes": 0}

    @settings(max_examples=examples, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example])
    @given(data=st.data(), seed=st.integers(0, 2**32 - 1))
    def drive(data: st.DataObject, seed: int) -> None:
        observations = check_reset(env, seed)
        episodes = 0
        for _ in range(max_steps):
            seat = env.to_act
            other = next(a for a in env.possible_agents if a != seat)
            actions = {seat: data.draw(action_strategy(env, seat, observations[seat]), label=f"{seat} action")}
            if data.draw(st.booleans(), label="other seat acts too"):
                actions[other] = data.draw(action_strategy(env, other, observations[other]), label=f"{other} action")
            before, phase = env.steps, getattr(env, "phase", None)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # survey fallbacks are logged; that is not a failure
                result = env.step(actions)
            if other in actions and not _is_empty(actions[other]):
                assert result[4][other].get("off_turn_action_ignored") is True, "an off-turn action must be flagged"
            counts["steps"] += 1
            counts["rejected" if "invalid_action" in result[4][seat] else "accepted"] += 1
            if check_step(env, seat, before, result, phase):
                episodes += 1
                counts["episodes"] += 1
                with pytest.raises(RuntimeError, match="reset"):
                    env.step({seat: actions[seat]})
                observations = check_reset(env, seed + episodes)
            else:
                observations = result[0]

    try:
        drive()
    finally:
        env.close()
    # The run did fuzz: every example stepped, and both accepted and rejected actions were seen.
    assert counts["steps"] >= examples * max_steps and counts["rejected"] > 0, counts
    if examples * max_steps >= 200:
        assert counts["accepted"] > 0 and counts["episodes"] > 0, counts
