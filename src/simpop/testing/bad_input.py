"""Bad input: an action out of turn is ignored, misuse of ``step`` raises, a bad action is flagged, not raised."""

from __future__ import annotations

import json
from typing import Any

from simpop.testing.harness import (STEP_FIELDS, calling, expect_error, fail, fields_difference, first_difference,
                                  fresh_env, play_to_end, reset, sample, sample_actions, short, step, transcript)


class _NotAnAction:
    """The bad action :func:`check_bad_action` sends: an object of a type no action space contains."""

    def __repr__(self) -> str:
        return "<simpop.testing.NOT_AN_ACTION>"


#: An action no env should accept (its type is private to this module).
NOT_AN_ACTION = _NotAnAction()


def check_off_turn_ignored(env_or_factory: Any, *, seed: int = 0, steps: int = 4) -> None:
    """An action from the seat that is not to act changes nothing but is flagged in its info.

    Two envs reset with ``seed`` are stepped with the same acting-seat actions, one of them also with a
    non-empty action for the other seat; their results must match except for
    ``info[other]["off_turn_action_ignored"] is True``.

    Raises:
        AssertionError: If the off-turn action has an effect or is not flagged.
    """
    name = "check_off_turn_ignored"
    plain, noisy = fresh_env(name, env_or_factory), fresh_env(name, env_or_factory)
    reset(name, plain, seed)
    reset(name, noisy, seed)
    for n in range(steps):
        if not plain.agents:
            break
        seat = plain.to_act
        other = next(a for a in plain.possible_agents if a != seat)
        action = sample(plain.action_space(seat), 1000 * n)
        extra = next((x for k in range(20) if not _is_empty(x := sample(plain.action_space(other), 7 + n + k))), None)
        a = step(name, plain, {seat: action})
        b = step(name, noisy, {seat: action, other: extra})
        flag = b[4].get(other, {}).get("off_turn_action_ignored")
        if extra is not None and flag is not True:
            fail(name, f"step {n}: {other!r} acted out of turn with {short(extra)} but "
                 f"info[{other!r}]['off_turn_action_ignored'] is {flag!r}",
                 "set info[seat]['off_turn_action_ignored'] = True for a non-empty action of the seat not to act")
        if "off_turn_action_ignored" in a[4].get(other, {}):
            fail(name, f"step {n}: info[{other!r}] flags an off-turn action although none was given",
                 "only flag non-empty actions of the seat not to act")
        b[4].get(other, {}).pop("off_turn_action_ignored", None)
        found = fields_difference(a, b, STEP_FIELDS) or first_difference(
            transcript(plain), transcript(noisy), "transcript")
        if found:
            fail(name, f"step {n}: an off-turn action by {other!r} changed {found}",
                 "ignore every action but the acting seat's (env.to_act)")


def _is_empty(action: Any) -> bool:
    return action is None or (isinstance(action, str) and action == "")


def check_misuse_raises(env_or_factory: Any, *, seed: int = 0) -> None:
    """Misuse of ``step`` raises a clear error instead of being accepted.

    Stepping before ``reset`` or after the episode ended raises ``RuntimeError`` (saying "reset"),
    omitting the acting seat ``ValueError`` (naming it), naming an unknown seat ``KeyError`` (naming it).

    Raises:
        AssertionError: If misuse is silently accepted or raises the wrong error.
    """
    name = "check_misuse_raises"
    env = fresh_env(name, env_or_factory)

    def expect(error: type[Exception], actions: dict[str, Any], when: str, says: str, fix: str) -> None:
        expect_error(name, f"step() {when}", lambda: env.step(actions), (error,), says, fix)

    seat = env.possible_agents[0]
    expect(RuntimeError, {seat: sample(env.action_space(seat), seed)}, "before reset()", "reset",
           "raise RuntimeError telling the caller to call reset() first")
    reset(name, env, seed)
    seat = env.to_act
    other = next(a for a in env.possible_agents if a != seat)
    expect(ValueError, {other: sample(env.action_space(other), seed)}, f"without the acting seat {seat!r}", seat,
           "raise ValueError naming the seat whose turn it is")
    expect(KeyError, {seat: sample(env.action_space(seat), seed), "no-such-seat": None}, "naming an unknown seat",
           "no-such-seat", "raise KeyError naming the unknown seat(s)")
    play_to_end(name, env)
    expect(RuntimeError, {seat: sample(env.action_space(seat), seed)}, "after the episode ended", "reset",
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
    env = fresh_env(name, env_or_factory)
    reset(name, env, seed)
    tested: set[str] = set()
    for n in range(steps + 1):
        if not env.agents:
            reset(name, env, seed + n + 1)
        seat = env.to_act
        if seat not in tested:
            tested.add(seat)
            before, count = transcript(env), getattr(env, "steps", None)
            with calling(name, f"step({{{seat!r}: {bad_action!r}}})", "reject bad actions in _validate (return "
                         "why) instead of raising: the seat gets an error observation and info['invalid_action']"):
                obs, _, terms, truncs, infos = env.step({seat: bad_action})
            why = infos.get(seat, {}).get("invalid_action")
            if not isinstance(why, str) or not why:
                fail(name, f"{seat!r} sent {bad_action!r} but info[{seat!r}]['invalid_action'] is {why!r}",
                     "flag a rejected action with info[seat]['invalid_action'] = <why, and what to send instead>")
            if transcript(env) != before:
                fail(name, "a rejected action was added to the transcript", "apply only valid actions")
            if count is not None and env.steps != count + 1:
                fail(name, f"a rejected action moved env.steps from {count} to {env.steps}",
                     "count a rejected action as one step towards the cap")
            ended = terms.get(seat) or truncs.get(seat)
            if not ended and env.to_act != seat:
                fail(name, f"after a rejected action by {seat!r}, to_act is {env.to_act!r}",
                     "let the seat whose action was rejected act again")
            view = _json_view(obs.get(seat))
            if view is not None and "error" in view and not view["error"]:
                fail(name, f"the text observation for {seat!r} after a rejected action has error={view['error']!r}",
                     "show the rejection in the seat's next observation (text_observation does, from last_error)")
            if len(tested) == len(env.possible_agents):
                return
            continue
        if n < steps and env.agents:
            step(name, env, sample_actions(env, n))


def _json_view(observation: Any) -> dict[str, Any] | None:
    """A text observation decoded from JSON, or None if it is not one."""
    try:
        view = json.loads(observation) if isinstance(observation, str) else None
    except ValueError:
        return None
    return view if isinstance(view, dict) else None
