"""A scripted backend for server and client tests: instant (or slow) echoes, with a record of its calls."""

from __future__ import annotations

import threading
import time

from simpop.agents.base import Chat, Generation, SamplingParams


class EchoBackend:
    """Answers ``echo: <last message>`` with token ids ``[3, 4, 2]``; records each call's size and seed.

    Args:
        delay_s: Seconds every call sleeps (a slow model).
        fail_first: How many calls raise RuntimeError before calls succeed (a flaky model).
        reject: Last-message contents that raise ValueError (input the model cannot take).
    """

    name = "echo"

    def __init__(self, delay_s: float = 0.0, fail_first: int = 0, reject: tuple[str, ...] = ()) -> None:
        self.delay_s, self.fail_first, self.reject = delay_s, fail_first, reject
        self.calls: list[tuple[int, int | None]] = []  # (rows, seed) per call
        self._lock = threading.Lock()

    def generate(self, chats: list[Chat], params: SamplingParams) -> list[Generation]:
        with self._lock:
            self.calls.append((len(chats), params.seed))
            failing = len(self.calls) <= self.fail_first
        time.sleep(self.delay_s)
        if failing:
            raise RuntimeError("the model crashed")
        if any(chat[-1]["content"] in self.reject for chat in chats):
            raise ValueError("this prompt is too long for the model")
        return [
            Generation(
                text=f"echo: {chat[-1]['content']}",
                token_ids=[3, 4, 2],
                prompt_ids=list(range(len(chat))),
                logprobs=[-0.5, -0.25, -0.125] if params.logprobs else None,
            )
            for chat in chats
        ]
