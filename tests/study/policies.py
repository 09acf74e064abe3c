"""Cheap deterministic policies for the study tests (``module:attr`` policy specs)."""

from __future__ import annotations

import json
import threading

import numpy as np


class Asker:
    """A P4G persuader that numbers its turns and asks for a donation (instant, deterministic)."""

    def act_batch(self, observations: list[str], rng: np.random.Generator) -> list[str]:
        turns = [sum(m["role"] == "assistant" for m in json.loads(o)["messages"]) for o in observations]
        return [f"Message {n + 1}: would you give part of your $2 to Save the Children?" for n in turns]


class Payload:
    """A persuader whose messages are HTML/script payloads (they must show as text)."""

    TEXT = '<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script><b>bold?</b>'

    def act_batch(self, observations: list[str], rng: np.random.Generator) -> list[str]:
        return [self.TEXT for _ in observations]


class Slow:
    """A persuader that thinks until the test opens ``Slow.done`` (a slow model, without sleeping)."""

    done = threading.Event()

    def act_batch(self, observations: list[str], rng: np.random.Generator) -> list[str]:
        Slow.done.wait(60)
        return ["Would you give part of your $2?" for _ in observations]
