"""Tiny deterministic stand-ins for rollout-engine tests: a text env, a token backend, a simulator."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from simpop.agents.base import Chat, Generation, SamplingParams
from simpop.agents.policy import ServedPolicy
from simpop.envs.dialogue import DialogueEnv, Outcome, TextSpace, Turn
from simpop.seat import Simulator


@dataclass(frozen=True)
class ToyScenario:
    id: str

    def policy_instructions(self) -> str:
        return f"Persuade ({self.id})."

    def user_instructions(self) -> str:
        return f"Be persuaded ({self.id})."


class ToyTextEnv(DialogueEnv):
    """``agent`` speaks first; after ``turns`` agent messages the episode ends.

    Reward 1 if the agent's last message contains ``"yes"``; empty agent messages are rejected.
    """

    policy_seat, user_seat, first_seat = "agent", "user", "agent"

    def __init__(self, turns: int = 3, max_steps: int = 20):
        self.turns = turns
        super().__init__(max_steps)

    def _make_spaces(self):
        text = TextSpace(10_000)
        return {a: text for a in ("agent", "user")}, {a: text for a in ("agent", "user")}

    def scenario_ids(self) -> list[str]:
        return ["s0", "s1", "s2", "s3"]

    def load_scenario(self, scenario_id: str) -> ToyScenario:
        if scenario_id not in self.scenario_ids():
            raise KeyError(scenario_id)
        return ToyScenario(scenario_id)

    def _validate(self, seat: str, action: Any) -> str | None:
        return None if isinstance(action, str) and action.strip() else "empty message"

    def _apply(self, seat: str, action: Any) -> str:
        self.transcript.append(Turn(seat, action))
        return "user" if seat == "agent" else "agent"

    def _outcome(self) -> Outcome | None:
        said = [t.text for t in self.transcript if t.seat == "agent"]
        if len(said) < self.turns:
            return None
        won = "yes" in said[-1]
        return Outcome({"agent": float(won), "user": 0.0}, {"success": won})

    def _observe(self, seat: str) -> str:
        scenario = self.scenario
        return self.text_observation(seat, instructions=scenario.policy_instructions() if seat == "agent"
                                     else scenario.user_instructions())


class PrefilledToyEnv(ToyTextEnv):
    """ToyTextEnv whose transcript also holds ``agent`` messages the policy never wrote: a greeting
    before the user's first message and a note after each user message (like τ²'s greeting and
    pre-filled task histories)."""

    first_seat = "user"

    def _start(self) -> None:
        self.transcript.append(Turn("agent", "Hello!", data={"env": True}))

    def _apply(self, seat: str, action: Any) -> str:
        following = super()._apply(seat, action)
        if seat == "user":
            self.transcript.append(Turn("agent", f"(note {len(self.transcript)})", data={"env": True}))
        return following

    def _outcome(self) -> Outcome | None:
        said = [t.text for t in self.transcript if t.seat == "agent" and not t.data]
        if len(said) < self.turns:
            return None
        return Outcome({"agent": float("yes" in said[-1]), "user": 0.0}, {"success": "yes" in said[-1]})


#: Special tokens of the toy ChatML template.
IM_START, IM_END, MERGED_AB = 1000, 1001, 2000


@dataclass
class ToyTokenBackend:
    """A character-level "model" with a ChatML template and one merge ("ab" -> one token).

    Replies are spelled with *unmerged* characters (``a``, ``b`` as two tokens), as a sampler may
    do, so re-encoding a reply's text would give different ids than were generated. ``replies(i, k)``
    gives the text of prompt ``i``'s reply in call ``k``; an empty string makes an empty reply.
    """

    name: str = "toy"
    replies: Any = None
    encoded: list[Chat] = field(default_factory=list)
    calls: list[int] = field(default_factory=list)

    def tokenize(self, text: str) -> list[int]:
        out, i = [], 0
        while i < len(text):
            if text.startswith("ab", i):
                out.append(MERGED_AB)
                i += 2
            else:
                out.append(ord(text[i]))
                i += 1
        return out

    def decode(self, ids: list[int]) -> str:
        names = {IM_START: "<|im_start|>", IM_END: "<|im_end|>", MERGED_AB: "ab"}
        return "".join(names.get(i, chr(i) if i < 1000 else "") for i in ids)

    def render(self, chat: Chat, add_generation_prompt: bool) -> str:
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in chat)
        return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")

    def encode_chat(self, chat: Chat, add_generation_prompt: bool = True) -> list[int]:
        self.encoded.append(list(chat))
        text = self.render(chat, add_generation_prompt)
        ids: list[int] = []
        for part in re.split(r"(<\|im_start\|>|<\|im_end\|>)", text):
            ids += [IM_START] if part == "<|im_start|>" else [IM_END] if part == "<|im_end|>" else self.tokenize(part)
        return ids

    def generate(self, chats: list[Chat], params: SamplingParams) -> list[Generation]:
        return self.generate_ids([self.encode_chat(c) for c in chats], params)

    def generate_ids(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        call = len(self.calls)
        self.calls.append(len(prompts))
        out = []
        for i, prompt in enumerate(prompts):
            text = self.replies(i, call) if self.replies else f"ab yes {call}"
            ids = [ord(c) for c in text] + [IM_END]  # unmerged spelling + end of turn
            out.append(Generation(text, ids, list(prompt), [-0.25 - 0.01 * j for j in range(len(ids))]))
        return out


@dataclass
class ToyTextPolicy(ServedPolicy):
    """A TokenPolicy over a ToyTokenBackend."""

    sampling: SamplingParams = SamplingParams(max_new_tokens=8, temperature=1.0)


class CountingSimulator(Simulator):
    """Replies ``"reply <slot> <n>"``; records batch sizes, resets and feedback."""

    name = "counting"

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.feedbacks: list[tuple[int, float]] = []
        self.resets: list[list[str]] = []
        self._counts: list[int] = []

    def reset_batch(self, scenarios: list[Any], rngs: list[np.random.Generator]) -> None:
        self.resets.append([s.id for s in scenarios])
        self._counts = [0] * len(scenarios)

    def act_batch(self, observations: list[Any], slots: list[int]) -> list[str]:
        self.batches.append(list(slots))
        out = []
        for s in slots:
            self._counts[s] += 1
            out.append(f"reply {s} {self._counts[s]}")
        return out

    def feedback(self, slots: list[int], rewards: list[float]) -> None:
        self.feedbacks.extend(zip(slots, rewards))
