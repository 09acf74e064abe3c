"""τ²'s native simulators: scripted participants for tests and baselines. :class:`ScriptedUser` replays its
task's instructions (:func:`scripted_user` makes it the single-agent view's default user); :class:`GoldAgent`
replays the task's gold actions (:func:`play_gold` runs one task with it). Neither needs a model or imports τ².
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from simpop.envs.dialogue import parse_observation
from simpop.envs.tau2.tool_calls import format_tool_call
from simpop.seat import Simulator

#: τ²'s user stop tokens (``tau2.user.base``), repeated here so this module does not import τ².
STOP, TRANSFER = "###STOP###", "###TRANSFER###"
#: What τ²'s airline and retail policies tell the agent to say after ``transfer_to_human_agents``.
TRANSFER_MESSAGE = "YOU ARE BEING TRANSFERRED TO A HUMAN AGENT. PLEASE HOLD ON."
_TRANSFERRED = re.compile(r"transfer(?:red|ring)?\s+(?:you\s+)?to\s+(?:a\s+)?human", re.IGNORECASE)


def _script(scenario: Any) -> list[str]:
    """The user's lines: the task's instructions, part by part (reason, known info, task instructions)."""
    instructions = scenario.task.user_scenario.instructions
    if isinstance(instructions, str):
        return [instructions.strip()]
    parts = (instructions.reason_for_call, instructions.known_info, instructions.task_instructions)
    return [p.strip() for p in parts if p and p.strip()]


def _gold_actions(scenario: Any, requestor: str) -> list[tuple[str, dict[str, Any]]]:
    criteria = scenario.task.evaluation_criteria
    actions = (criteria.actions if criteria is not None else None) or []
    return [(a.name, dict(a.arguments)) for a in actions if a.requestor == requestor]


@dataclass
class _UserSlot:
    lines: list[str]
    actions: list[tuple[str, dict[str, Any]]]
    said: int = 0


class ScriptedUser(Simulator):
    """A τ² user that replays its task's instructions, one part per turn, then sends ``###STOP###``.

    It answers ``###TRANSFER###`` as soon as the agent says it is transferring the user to a human
    (τ²'s rule for user simulators). Deterministic: the random generator is not used.

    Args:
        perform_gold_user_actions: After its first message, also make the task's gold *user* tool calls
            (telecom's device actions), one per step, before speaking again. Off by default: with it on,
            the user fixes its own device whatever the agent does.
    """

    name = "tau2-scripted"

    def __init__(self, perform_gold_user_actions: bool = False):
        self.perform_gold_user_actions = perform_gold_user_actions
        self._slots: list[_UserSlot] = []

    def reset_batch(self, scenarios: list[Any], rngs: list[np.random.Generator]) -> None:
        self._slots = [_UserSlot(_script(s), _gold_actions(s, "user") if self.perform_gold_user_actions else [])
                       for s in scenarios]

    def act_batch(self, observations: list[Any], slots: list[int]) -> list[str]:
        return [self._act(parse_observation(o), self._slots[s]) for o, s in zip(observations, slots)]

    @staticmethod
    def _act(view: dict[str, Any], slot: _UserSlot) -> str:
        heard = [m["content"] for m in view["messages"] if m["role"] == "user"]
        if heard and _TRANSFERRED.search(heard[-1]):
            return TRANSFER
        if slot.said and slot.actions:
            name, arguments = slot.actions.pop(0)
            return format_tool_call(name, arguments)
        if slot.said < len(slot.lines):
            slot.said += 1
            return slot.lines[slot.said - 1]
        return STOP


def scripted_user(env: Any) -> ScriptedUser:
    """The registry's default simulator for the τ² ids (``factory(env)``)."""
    return ScriptedUser()


def gold_unreachable(task: Any) -> str | None:
    """Why replaying ``task``'s gold actions (:class:`GoldAgent`) cannot solve it, or None.

    A task that lists no gold agent actions but is scored by an environment assertion states the end state
    (e.g. mock ``update_task_with_history_and_env_assertions``: "task_2 is completed"), not the tool calls that
    reach it; a replay makes no call, so the assertion fails. Every other task of the mock, airline and retail
    domains is solved by its replay; telecom tasks also need the user to make the gold user (device) actions.
    """
    criteria = task.evaluation_criteria
    if criteria is None or any(a.requestor == "assistant" for a in criteria.actions or []):
        return None
    if "ENV_ASSERTION" in {getattr(b, "value", b) for b in criteria.reward_basis or []} and any(
            a.env_type == "assistant" for a in criteria.env_assertions or []):
        return "no gold agent actions, only an environment assertion (the end state, not the calls that reach it)"
    return None


class GoldAgent:
    """An agent that replays its task's gold agent actions, then says what τ² checks it communicated.

    On its first turn it makes every gold tool call (one per step, as JSON), then sends one message:
    τ²'s transfer message if a gold action was ``transfer_to_human_agents``, followed by the task's
    ``communicate_info``. Afterwards it only asks whether there is anything else. It cannot solve the tasks
    :func:`gold_unreachable` names (one of the mock domain's nine).
    """

    def __init__(self, scenario: Any):
        self.actions = _gold_actions(scenario, "assistant")
        criteria = scenario.task.evaluation_criteria
        info = list((criteria.communicate_info if criteria is not None else None) or [])
        transfer = any(name == "transfer_to_human_agents" for name, _ in self.actions)
        self.summary = " ".join([TRANSFER_MESSAGE] * transfer + info) or "Your request has been completed."
        self._said = False

    def act(self, observation: str) -> str:
        """The next gold action as a tool call; once they are done, the task's summary message, then a closing
        question.
        """
        if self.actions:
            name, arguments = self.actions.pop(0)
            return json.dumps({"name": name, "arguments": arguments})
        if not self._said:
            self._said = True
            return self.summary
        return "Is there anything else I can help you with?"


def play_gold(seat: Any, task_id: str, seed: int | None = None) -> tuple[float, bool, dict[str, Any]]:
    """Play ``task_id`` with a :class:`GoldAgent` in the policy seat of ``seat`` (a ``UserSeat``).

    Returns:
        The last step's reward, whether the episode terminated (not truncated), and the last info.
    """
    obs, _ = seat.reset(seed=seed, options={"scenario_id": task_id})
    agent, done = GoldAgent(seat.env.scenario), False
    while not done:
        obs, reward, terminated, truncated, info = seat.step(agent.act(obs))
        done = terminated or truncated
    return reward, terminated, info
