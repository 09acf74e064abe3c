"""Cheap deterministic policies for the study tests (``module:attr`` policy specs)."""

from __future__ import annotations

import json
import threading

from simpop.agents.base import Generation
from simpop.evaluation.policies import TextPolicy
from simpop.seat import Player


class Asker(Player):
    """A P4G persuader that numbers its turns and asks for a donation (instant, deterministic)."""

    def act_batch(self, observations: list[str], slots: list[int]) -> list[str]:
        turns = [sum(m["role"] == "assistant" for m in json.loads(o)["messages"]) for o in observations]
        return [f"Message {n + 1}: would you give part of your $2 to Save the Children?" for n in turns]


class Payload(Player):
    """A persuader whose messages are HTML/script payloads (they must show as text)."""

    TEXT = '<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script><b>bold?</b>'

    def act_batch(self, observations: list[str], slots: list[int]) -> list[str]:
        return [self.TEXT for _ in observations]


class Slow(Player):
    """A persuader that thinks until the test opens ``Slow.done`` (a slow model, without sleeping)."""

    done = threading.Event()

    def act_batch(self, observations: list[str], slots: list[int]) -> list[str]:
        Slow.done.wait(60)
        return ["Would you give part of your $2?" for _ in observations]


class RecordingBackend:
    """A text model that records every chat it is given (the policy's whole input) and asks for a donation."""

    name = "recording"

    def __init__(self) -> None:
        self.chats: list[list[dict[str, str]]] = []

    def generate(self, chats, params):
        self.chats.extend(chats)
        return [Generation(text="Would you give part of your $2 to Save the Children?") for _ in chats]


def recording_text_policy() -> TextPolicy:
    """simpop's own text policy on a :class:`RecordingBackend` (``module:attr`` factory)."""
    return TextPolicy(RecordingBackend(), name="recording")
