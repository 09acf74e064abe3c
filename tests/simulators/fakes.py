"""Small deterministic stand-ins for backends, scenarios and simulators in simulator tests."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from simpop.agents.base import Chat, Generation, SamplingParams
from simpop.seat import Simulator
from simpop.seat import SimulatorSpec

PHRASES = ["Sure, tell me more.", "I am not convinced.", "How much would help?", "Maybe later.", "No thanks."]


def default_respond(chat: Chat, params: SamplingParams, rng: np.random.Generator) -> str:
    """Greedy: always the first phrase (a collapsed mode); sampling: a phrase drawn with the call's rng."""
    return PHRASES[0] if params.greedy else PHRASES[int(rng.integers(len(PHRASES)))]


@dataclass
class FakeBackend:
    """A backend whose replies come from ``respond(chat, params, rng)``; the rng is seeded by the call."""

    name: str = "fake"
    respond: Callable[[Chat, SamplingParams, np.random.Generator], str] = default_respond
    calls: list[tuple[list[Chat], SamplingParams]] = field(default_factory=list)

    def generate(self, chats: list[Chat], params: SamplingParams) -> list[Generation]:
        self.calls.append((chats, params))
        rng = np.random.default_rng(params.seed)
        return [Generation(self.respond(chat, params, rng)) for chat in chats]


@dataclass(frozen=True)
class FakeScenario:
    id: str = "s0"
    persona: str = "a careful student"

    def user_instructions(self) -> str:
        return f"You are {self.persona}. End with [DONATE $N] when you decide."


def observation(*texts: str, error: str | None = None) -> str:
    """A user-seat text observation whose messages alternate, starting with the other seat."""
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(texts)]
    return json.dumps({"seat": "persuadee", "to_act": "persuadee", "step": len(texts),
                       "messages": messages, "error": error})


def verbalized_json(*pairs: tuple[str, float]) -> str:
    return json.dumps({"responses": [{"text": t, "probability": p} for t, p in pairs]})


class EchoSimulator(Simulator):
    """Answers ``<name>:<slot>`` and records its calls; ``level`` is a parameter that snapshots freeze."""

    def __init__(self, name: str, model: str = "m", personas: str = "p", decoding: dict | None = None):
        self.name = name
        self.model, self.personas, self.decoding = model, personas, decoding or {"temperature": 0.0}
        self.calls: list[list[int]] = []
        self.rewards: list[tuple[int, float]] = []
        self.level = np.zeros(2)
        self.slots = 0

    def reset_batch(self, scenarios: list[Any], rngs: list[np.random.Generator]) -> None:
        self.slots = len(scenarios)

    def act_batch(self, observations: list[Any], slots: list[int]) -> list[str]:
        assert all(0 <= s < self.slots for s in slots)
        self.calls.append(list(slots))
        return [f"{self.name}:{s}" for s in slots]

    def feedback(self, slots: list[int], rewards: list[float]) -> None:
        self.rewards.extend(zip(slots, rewards))

    @property
    def spec(self) -> SimulatorSpec:
        return SimulatorSpec("scripted", self.model, self.personas, self.decoding)


@dataclass
class FakeTrainableBackend(FakeBackend):
    """A :class:`FakeBackend` with a trainable backend's adapter bookkeeping (enough to build ``trainable:MODEL``).

    ``adapters`` maps each added adapter's name to its ``(r, alpha)``.
    """

    adapters: dict[str, tuple[int, int]] = field(default_factory=dict)
    active_adapter: str | None = None

    @property
    def adapter_names(self) -> list[str]:
        return list(self.adapters)

    def add_adapter(self, name: str, r: int = 8, alpha: int = 16, **options: Any) -> None:
        self.adapters[name] = (r, alpha)
        self.active_adapter = name

    def set_adapter(self, name: str) -> None:
        self.active_adapter = name


class SpecEcho(EchoSimulator):
    """A simulator of a kind registered by a test: built by :meth:`from_spec`, its spec is the one it was built from."""

    def __init__(self, built_from: SimulatorSpec, env: Any):
        super().__init__("spec-echo")
        self.built_from, self.env = built_from, env

    @classmethod
    def from_spec(cls, spec: SimulatorSpec, context: Any) -> SpecEcho:
        return cls(spec, context.env)

    @property
    def spec(self) -> SimulatorSpec:
        return self.built_from
