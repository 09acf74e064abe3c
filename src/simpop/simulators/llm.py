"""The frozen LLM simulator: a persona prompt, a backend and fixed decoding settings.

The system prompt is the scenario's own ``user_instructions()`` (so the simulator is benchmark-agnostic);
the chat is the user seat's view of the dialogue from the env's JSON text observation (the simulator's
own turns are ``assistant``). Greedy decoding is the default: it is the mode-collapsed baseline that
single-simulator RL overfits to.

Each :meth:`LLMSimulator.act_batch` makes one backend call for all given slots. The call's seed is
drawn from the slots' random generators, so a run with the same seeds is reproducible (a slot's
sample also depends on which slots share its call, because the backend samples a batch with one
generator). Greedy calls send each distinct chat once.

Empty or whitespace-only replies (a known failure of greedy user models, e.g. in τ²) are replaced by
:data:`FALLBACK_REPLY` and counted in ``stats["empty_replies"]``, so an episode never receives an
empty message.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from simpop.agents.base import Backend, Chat, SamplingParams
from simpop.envs.dialogue import parse_observation
from simpop.seat import SCENARIO_PERSONAS, BuildContext, Simulator, SimulatorSpec, TextFormat

logger = logging.getLogger(__name__)

#: Sent instead of an empty reply: it keeps the dialogue going without deciding anything.
FALLBACK_REPLY = "Sorry, could you say that again?"


class DialogueFormat:
    """The default :class:`~simpop.seat.TextFormat`: the scenario's user instructions + the dialogue."""

    counters: tuple[str, ...] = ()

    def chat(self, observation: str, scenario: Any, instructions_suffix: str = "") -> Chat:
        view = parse_observation(observation)
        chat: Chat = [{"role": "system", "content": scenario.user_instructions() + instructions_suffix}]
        chat += [{"role": m["role"], "content": m["content"]} for m in view["messages"]]
        if view.get("error"):
            # The env rejected our last message; say why so that the model can repair it.
            chat.append({"role": "user", "content": f"(Your last message was not accepted: {view['error']} "
                                                    f"Please answer again.)"})
        return chat

    def to_action(self, text: str, stats: dict[str, int]) -> str:
        return text


def sampling(spec: SimulatorSpec) -> SamplingParams:
    """The sampling settings a spec's decoding names (temperature, top_p, max_new_tokens)."""
    d = dict(spec.decoding)
    return SamplingParams(max_new_tokens=d["max_new_tokens"], temperature=d["temperature"], top_p=d["top_p"])


def env_format(context: BuildContext) -> TextFormat | None:
    """The env's own :class:`~simpop.seat.TextFormat` (``env.text_format``), or None for the default."""
    return getattr(context.env, "text_format", None)


class LLMSimulator(Simulator):
    """A frozen LLM in the user seat.

    Args:
        backend: The model.
        params: Decoding settings (default: greedy, 64 new tokens). ``seed`` is ignored: each call's
            seed comes from the slots' generators.
        name: Name in logs and populations (default ``frozen:<backend name>``).
        personas: If given, each dialogue plays a persona drawn (with the slot's generator) from these
            instead of the scenario's own; the scenario must be a dataclass with a ``persona`` field.
        persona_set: The name of ``personas`` (part of :attr:`spec`; panels compare it).
        fallback_reply: Sent instead of an empty reply.
        text_format: How observations become chats and replies become actions (default
            :class:`DialogueFormat`; envs with their own expose ``env.text_format``).

    Attributes:
        stats: ``backend_calls``, ``replies``, ``empty_replies`` since construction.
    """

    kind = "frozen"

    def __init__(self, backend: Backend, params: SamplingParams | None = None, *, name: str | None = None,
                 personas: Sequence[Any] | None = None, persona_set: str | None = None,
                 fallback_reply: str = FALLBACK_REPLY, text_format: TextFormat | None = None):
        if personas is not None and not personas:
            raise ValueError("personas is empty; pass None to play the scenario's own persona")
        if personas is not None and (persona_set is None or persona_set == SCENARIO_PERSONAS):
            raise ValueError("name the persona set you pass (persona_set=...), so panels can compare it")
        if not fallback_reply.strip():
            raise ValueError("fallback_reply must not be empty: it replaces empty replies")
        self.backend = backend
        self.params = dataclasses.replace(params or SamplingParams(max_new_tokens=64), seed=None)
        self.name = name or f"{self.kind}:{backend.name}"
        self.personas = list(personas) if personas is not None else None
        self.persona_set = persona_set or SCENARIO_PERSONAS
        self.fallback_reply = fallback_reply
        self.text_format = text_format or DialogueFormat()
        self.stats: dict[str, int] = {"backend_calls": 0, "replies": 0, "empty_replies": 0,
                                      **{name: 0 for name in self.text_format.counters}}
        self._scenarios: list[Any] = []
        self._rngs: list[np.random.Generator] = []

    @classmethod
    def from_spec(cls, spec: SimulatorSpec, context: BuildContext) -> LLMSimulator:
        """Build from a parsed spec (see :func:`simpop.simulators.registry.build_simulator`)."""
        personas = context.personas(spec.personas)
        return cls(context.backend(spec.model), sampling(spec), personas=personas, persona_set=spec.personas,
                   text_format=env_format(context))

    @property
    def spec(self) -> SimulatorSpec:
        return SimulatorSpec(self.kind, self.backend.name, self.persona_set, self._decoding())

    def _decoding(self) -> dict[str, Any]:
        p = self.params
        return {"temperature": float(p.temperature), "top_p": float(p.top_p), "max_new_tokens": p.max_new_tokens}

    def snapshot(self) -> LLMSimulator:
        """A copy sharing the (frozen) backend, with its own slots and counters."""
        clone = copy.copy(self)
        clone.stats = {key: 0 for key in self.stats}
        clone._scenarios, clone._rngs = [], []
        return clone

    # ----------------------------------------------------------------- slots
    def reset_batch(self, scenarios: list[Any], rngs: list[np.random.Generator]) -> None:
        if len(scenarios) != len(rngs):
            raise ValueError(f"reset_batch got {len(scenarios)} scenarios but {len(rngs)} generators")
        self._rngs = list(rngs)
        self._scenarios = [self._with_persona(s, r) for s, r in zip(scenarios, rngs)]

    def _with_persona(self, scenario: Any, rng: np.random.Generator) -> Any:
        if self.personas is None:
            return scenario
        if not dataclasses.is_dataclass(scenario) or "persona" not in {f.name for f in dataclasses.fields(scenario)}:
            raise TypeError(f"persona set {self.persona_set!r} needs scenarios that are dataclasses with a "
                            f"'persona' field; got {type(scenario).__name__}")
        return dataclasses.replace(scenario, persona=self.personas[int(rng.integers(len(self.personas)))])

    def scenario(self, slot: int) -> Any:
        """The scenario slot ``slot`` plays (with the persona this simulator chose)."""
        return self._scenarios[slot]

    def act_batch(self, observations: list[Any], slots: list[int]) -> list[str]:
        chats = [self.chat(obs, slot) for obs, slot in zip(observations, slots)]
        return [self.text_format.to_action(text, self.stats) for text in self.generate(chats, slots, self.params)]

    # ----------------------------------------------------------------- helpers for subclasses
    def chat(self, observation: str, slot: int, instructions_suffix: str = "") -> Chat:
        """The chat for ``slot``'s observation (:attr:`text_format`; ``instructions_suffix`` ends the brief)."""
        if not 0 <= slot < len(self._scenarios):
            raise IndexError(f"slot {slot} was not started: reset_batch() started {len(self._scenarios)} slots")
        return self.text_format.chat(observation, self._scenarios[slot], instructions_suffix)

    def call_seed(self, slots: list[int]) -> int:
        """A seed for one backend call, drawn from the generators of the slots it serves."""
        draws = [int(self._rngs[s].integers(2**31)) for s in slots]
        return int(np.random.SeedSequence(draws).generate_state(1)[0] & 0x7FFFFFFF)

    def generate(self, chats: list[Chat], slots: list[int], params: SamplingParams) -> list[str]:
        """One backend call for ``chats`` (one per slot); empty replies replaced and counted."""
        if not chats:
            return []
        params = dataclasses.replace(params, seed=self.call_seed(slots))
        texts = self.raw_generate(chats, params)
        replies = []
        for text in texts:
            text = text.strip()
            if not text:
                self.stats["empty_replies"] += 1
                logger.debug("%s: empty reply replaced by %r", self.name, self.fallback_reply)
                text = self.fallback_reply
            replies.append(text)
        self.stats["replies"] += len(replies)
        return replies

    def raw_generate(self, chats: list[Chat], params: SamplingParams) -> list[str]:
        """The backend's texts for ``chats`` in one call; greedy calls send each distinct chat once."""
        self.stats["backend_calls"] += 1
        if not params.greedy:
            return [g.text for g in self.backend.generate(chats, params)]
        keys = [json.dumps(c, sort_keys=True) for c in chats]
        unique = list(dict.fromkeys(keys))
        first = {key: chats[keys.index(key)] for key in unique}
        texts = dict(zip(unique, (g.text for g in self.backend.generate([first[k] for k in unique], params))))
        return [texts[k] for k in keys]
