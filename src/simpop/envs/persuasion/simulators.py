"""Native P4G persuadee simulators built on :mod:`~simpop.envs.persuasion.model`.

- :class:`ActPersuadee` fills the act-level env's persuadee seat and can state its full action
  distribution.
- :class:`TextPersuadee` fills the text env's seat: it classifies the persuader's message into an act,
  lets the model answer, and realises the answer as text (decisions as natural phrasings that
  :func:`parse_donation` reads, without a ``[DONATE $N]`` tag).

Decoding ``"sample"`` draws from the model at ``temperature``; ``"greedy"`` takes every argmax (and the
canonical phrasing): with ``persona_override=modal_persona()`` it is the mode-collapsed frozen simulator.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from simpop.envs.dialogue import parse_observation
from simpop.envs.persuasion.acts import DONATING_ACTS, classify_persuader, render_persuadee
from simpop.envs.persuasion.env import encode_persuadee_action, last_persuader_act
from simpop.envs.persuasion.model import Outcome, PersuadeeModel, PersuadeeParams, PersuadeeState
from simpop.envs.persuasion.personas import Persona
from simpop.simulators.base import DistributionalSimulator, Simulator

DECODINGS = ("sample", "greedy")


@dataclass
class _Slot:
    state: PersuadeeState
    rng: np.random.Generator


class _ModelPersuadee(Simulator):
    """Per-slot model state shared by the act and text simulators."""

    def __init__(self, params: PersuadeeParams | None = None, decoding: str = "sample", temperature: float = 1.0,
                 persona_override: Persona | None = None, name: str | None = None):
        if decoding not in DECODINGS:
            raise ValueError(f"decoding must be one of {DECODINGS}, got {decoding!r}")
        if decoding == "sample" and temperature <= 0:
            raise ValueError(f"temperature must be > 0 for sampling (use decoding='greedy'), got {temperature}")
        self.model = PersuadeeModel(params)
        self.decoding = decoding
        self.temperature = 0.0 if decoding == "greedy" else float(temperature)
        self.persona_override = persona_override
        self.name = name or f"{type(self).__name__.lower()}-{decoding}{'-modal' if persona_override else ''}"
        self._slots: list[_Slot] = []

    def reset_batch(self, scenarios: list[Any], rngs: list[np.random.Generator]) -> None:
        self._slots = [_Slot(self.model.initial_state(self.persona_override or s.persona), rng)
                       for s, rng in zip(scenarios, rngs, strict=True)]

    def _reply(self, slot: int, act: str, commit: bool) -> tuple[PersuadeeState, Outcome]:
        state = self.model.update(self._slots[slot].state, act)
        outcome = self.model.respond(state, act, self._slots[slot].rng, self.temperature)
        if commit:
            self._slots[slot].state = state
        return state, outcome

    def state(self, slot: int = 0) -> PersuadeeState:
        """The persuadee's current state in ``slot`` (inclination, rapport, act counts)."""
        return self._slots[slot].state


class ActPersuadee(_ModelPersuadee, DistributionalSimulator):
    """Act-level persuadee for ``simpop/PersuasionAct-v0``: actions are ``Discrete(23 · 7)`` indices.

    Args:
        params: Model parameters (default: the calibrated defaults).
        decoding: ``"sample"`` or ``"greedy"``.
        temperature: Sampling temperature (ignored when greedy).
        persona_override: Play this persona in every scenario (e.g. ``modal_persona()``).
        name: Identifier in populations and reports.
    """

    def act_batch(self, observations: list[Any], slots: list[int]) -> list[int]:
        return [encode_persuadee_action(*self._reply(slot, _heard(obs), commit=True)[1])
                for obs, slot in zip(observations, slots, strict=True)]

    def distribution(self, observation: Any, slot: int = 0) -> list[tuple[int, float]]:
        act = _heard(observation)
        state = self.model.update(self._slots[slot].state, act)
        return [(encode_persuadee_action(*o), p) for o, p in self.model.distribution(state, act, self.temperature)]


class TextPersuadee(_ModelPersuadee):
    """Text persuadee for ``simpop/Persuasion-v0`` (same arguments as :class:`ActPersuadee`)."""

    def act_batch(self, observations: list[Any], slots: list[int]) -> list[str]:
        replies = []
        for obs, slot in zip(observations, slots, strict=True):
            messages = parse_observation(obs)["messages"]
            heard = next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")
            (act, amount) = self._reply(slot, classify_persuader(heard), commit=True)[1]
            rng = None if self.decoding == "greedy" else self._slots[slot].rng
            replies.append(render_persuadee(act, amount if act in DONATING_ACTS else None, rng))
        return replies


def _heard(observation: Any) -> str:
    act = last_persuader_act(np.asarray(observation))
    if act is None:
        raise ValueError("the persuadee observation reports no persuader act yet; the persuader speaks first")
    return act


def native_act(env: Any) -> ActPersuadee:
    """Default simulator of ``simpop/PersuasionAct-v0``: the calibrated model, sampled."""
    return ActPersuadee()


def native_text(env: Any) -> TextPersuadee:
    """Default simulator of ``simpop/Persuasion-v0``: the calibrated model, sampled, realised as text."""
    return TextPersuadee()
