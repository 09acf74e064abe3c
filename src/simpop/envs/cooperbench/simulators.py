"""CooperBench's native simulators: teammates for the second seat (or either seat).

- :class:`ScriptedTeammate` announces the files it will touch, writes its feature's gold patch
  file by file and submits. Failure modes, fixed or drawn per episode: ``silent`` (no
  announcement), ``breaks_announcement`` (announces other files than it then touches) and
  ``late`` (announces, then spends ``delay_turns`` turns before working and submitting).
- :class:`CooperBenchFormat` lets any LLM simulator kind play a seat through the action language: its
  output is parsed leniently (:func:`~simpop.envs.cooperbench.actions.find_action`); output with no
  action in it becomes a message to the other seat and is counted in ``stats["unparsed_actions"]``.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from simpop.agents.base import Chat
from simpop.envs.cooperbench.actions import Action, find_action
from simpop.envs.cooperbench.evaluator import patched_files
from simpop.envs.cooperbench.patches import touched_paths
from simpop.envs.cooperbench.scenario import FeaturePair
from simpop.envs.dialogue import parse_observation
from simpop.seat import Simulator

MODES = ("cooperative", "silent", "breaks_announcement", "late")
_MESSAGE_CAP = 3_000


class ScriptedTeammate(Simulator):
    """Plays one seat with its feature's gold patch.

    Args:
        seat: The seat it plays (``agent2``: the user seat; ``agent1`` to replay gold on both sides).
        mode: One of :data:`MODES`, or ``{mode: weight}`` to draw one per episode with the slot's
            generator.
        delay_turns: Turns a ``late`` teammate spends before writing its files.
        name: Name in logs and populations.

    Attributes:
        modes: The mode each slot plays this episode.
    """

    def __init__(self, seat: str = "agent2", mode: str | dict[str, float] = "cooperative", delay_turns: int = 4,
                 name: str | None = None):
        if seat not in ("agent1", "agent2"):
            raise ValueError(f"seat must be 'agent1' or 'agent2', got {seat!r}")
        weights = {mode: 1.0} if isinstance(mode, str) else dict(mode)
        unknown = set(weights) - set(MODES)
        if unknown or not weights or any(w < 0 for w in weights.values()) or sum(weights.values()) <= 0:
            raise ValueError(f"mode must be one of {MODES} or a dict of non-negative weights over them, got {mode!r}")
        if delay_turns < 0:
            raise ValueError(f"delay_turns must be >= 0, got {delay_turns}")
        self.seat = seat
        self.weights = weights
        self.delay_turns = delay_turns
        self.name = name or ("scripted-" + (mode if isinstance(mode, str) else "mix"))
        self.modes: list[str] = []
        self._plans: list[list[Action]] = []
        self._gold: dict[tuple[str, int], dict[str, str | None]] = {}

    def reset_batch(self, scenarios: list[Any], rngs: list[np.random.Generator]) -> None:
        if len(scenarios) != len(rngs):
            raise ValueError(f"reset_batch got {len(scenarios)} scenarios but {len(rngs)} generators")
        names = list(self.weights)
        probs = np.array([self.weights[m] for m in names], dtype=float)
        self.modes = [names[int(rng.choice(len(names), p=probs / probs.sum()))] for rng in rngs]
        self._plans = [self._plan(s, m, r) for s, m, r in zip(scenarios, self.modes, rngs)]

    def act_batch(self, observations: list[Any], slots: list[int]) -> list[str]:
        actions = []
        for slot in slots:
            plan = self._plans[slot]
            actions.append((plan.pop(0) if plan else Action("submit")).to_json())
        return actions

    def gold_files(self, pair: FeaturePair) -> dict[str, str | None]:
        """The files this seat's gold patch touches, as they read after it (cached per feature)."""
        feature = pair.feature(self.seat)
        key = (pair.task.key, feature.id)
        if key not in self._gold:
            self._gold[key] = patched_files(pair.task, feature.patch)
        return self._gold[key]

    def _plan(self, pair: FeaturePair, mode: str, rng: np.random.Generator) -> list[Action]:
        feature = pair.feature(self.seat)
        files = self.gold_files(pair)
        work = [Action("write", path=p, content=c) if c is not None else Action("delete", path=p)
                for p, c in files.items()]
        touched = sorted(files)
        plan: list[Action] = []
        if mode in ("cooperative", "late"):
            plan.append(Action("message", text=_announcement(feature.id, touched)))
        elif mode == "breaks_announcement":
            plan.append(Action("message", text=_announcement(feature.id, _decoy(pair, touched, rng))))
        if mode == "late":
            plan += [Action("message", text="Still working on my part; I'll submit soon.")
                     if i % 2 else Action("view", path=touched[0] if touched else ".")
                     for i in range(self.delay_turns)]
        return plan + work + [Action("submit")]


class CooperBenchFormat:
    """How an LLM plays a CooperBench seat (a :class:`~simpop.seat.TextFormat`; ``CooperBenchEnv.text_format``).

    The chat is the seat's instructions, its dialogue so far (consecutive messages of one role merged), and
    the current state (files, inbox, steps left, whether the teammate submitted) as the last user turn. The
    model's reply is parsed leniently (:func:`~simpop.envs.cooperbench.actions.find_action`); a reply with
    no action in it becomes a message to the other seat and is counted in ``stats["unparsed_actions"]``.
    Every LLM simulator kind (``frozen:MODEL``, ``verbalized:MODEL``, ``trainable:MODEL``) uses it on
    CooperBench.

    Args:
        seat: The seat the model plays (``agent2``: the user seat; ``agent1`` for an LLM agent).
    """

    counters = ("unparsed_actions",)

    def __init__(self, seat: str = "agent2"):
        if seat not in ("agent1", "agent2"):
            raise ValueError(f"seat must be 'agent1' or 'agent2', got {seat!r}")
        self.seat = seat

    def chat(self, observation: str, scenario: Any, instructions_suffix: str = "") -> Chat:
        """The seat's chat: its instructions as the system message, its view of the dialogue, then its state and the
        request for one JSON action.
        """
        view = parse_observation(observation)
        chat: Chat = [{"role": "system", "content": scenario.instructions(self.seat) + instructions_suffix}]
        for message in view["messages"]:
            if chat[-1]["role"] == message["role"]:
                chat[-1] = {"role": message["role"], "content": chat[-1]["content"] + "\n" + message["content"]}
            else:
                chat.append({"role": message["role"], "content": message["content"]})
        state = {"files": view["files"][:60], "inbox": view["inbox"], "steps_left": view["steps_left"],
                 "teammate_submitted": view["submitted"]["agent2" if self.seat == "agent1" else "agent1"]}
        if view.get("error"):
            state["your_last_action_was_rejected"] = view["error"]
        turn = "State: " + json.dumps(state, ensure_ascii=False) + "\nYour turn: reply with one JSON action."
        if chat[-1]["role"] == "user":
            chat[-1] = {"role": "user", "content": chat[-1]["content"] + "\n" + turn}
        else:
            chat.append({"role": "user", "content": turn})
        return chat

    def to_action(self, text: str, stats: dict[str, int]) -> str:
        """The action in ``text``, or ``text`` as a message to the other seat (counted)."""
        action = find_action(text)
        if action is None:
            stats["unparsed_actions"] = stats.get("unparsed_actions", 0) + 1
            action = Action("message", text=text.strip()[:_MESSAGE_CAP] or "(no reply)")
        return action.to_json()


def default_teammate(env: Any) -> ScriptedTeammate:
    """The native simulator for the user seat: a cooperative scripted teammate."""
    return ScriptedTeammate(seat=env.user_seat)


def _announcement(feature_id: int, paths: list[str]) -> str:
    files = ", ".join(paths) if paths else "no files"
    return (f"Hi, I'm implementing feature {feature_id}. I will only change these files: {files}. "
            "Please keep your changes out of them (or tell me which lines you need).")


def _decoy(pair: FeaturePair, touched: list[str], rng: np.random.Generator) -> list[str]:
    """Files to announce instead of the real ones: the gold files minus one, or another source file."""
    if len(touched) > 1:
        keep = sorted(rng.choice(len(touched), size=len(touched) - 1, replace=False).tolist())
        return [touched[i] for i in keep]
    gold_paths = set(touched)
    others = sorted({p for f in pair.task.features.values() for p in touched_paths(f.patch)} - gold_paths)
    return [others[int(rng.integers(len(others)))]] if others else ["README.md"]
