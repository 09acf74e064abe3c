"""The human seat: a :class:`~simpop.seat.Simulator` whose replies come from a person through the web app.

The dialogue runs in the :class:`~simpop.rollout.RolloutEngine` exactly as in training and ``simpop eval``
(same env, same stepping, same scoring); only the user seat's ``act_batch`` differs: it publishes the seat's
observation (the person's turn) and blocks until :meth:`HumanSeat.reply` hands it the person's message, or
until ``idle_timeout_s`` passes (:class:`Abandoned`). One seat plays one dialogue (slot 0).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from simpop.seat import Simulator, SimulatorSpec


class Abandoned(RuntimeError):
    """The person did not answer within the idle timeout (or the chat was closed)."""


class HumanSeat(Simulator):
    """The user seat played by a person, one dialogue at a time.

    Args:
        idle_timeout_s: How long to wait for the person's reply before the dialogue is abandoned.

    Attributes:
        observation: The seat's pending observation while it is the person's turn, else None.
        turn_s: Per answered turn, seconds from the seat being asked to the reply.
        asks: How many times the seat has been asked (a waiter compares it to see a new turn).
    """

    name = "human"

    def __init__(self, idle_timeout_s: float = 900.0):
        if idle_timeout_s <= 0:
            raise ValueError(f"idle_timeout_s must be > 0, got {idle_timeout_s}")
        self.idle_timeout_s = idle_timeout_s
        self.observation: Any = None
        self.turn_s: list[float] = []
        self.asks = 0
        self._changed = threading.Condition()
        self._listeners: list[Callable[[], None]] = []
        self._reply: str | None = None
        self._closed = False

    @property
    def spec(self) -> SimulatorSpec:
        return SimulatorSpec(kind="custom", model="human")

    def reset_batch(self, scenarios: list[Any], rngs: list[np.random.Generator]) -> None:
        if len(scenarios) != 1:
            raise ValueError(f"a human plays one dialogue at a time, got {len(scenarios)}")

    def act_batch(self, observations: list[Any], slots: list[int]) -> list[Any]:
        if slots != [0]:
            raise ValueError(f"a human plays slot 0 only, got slots {slots}")
        asked = time.monotonic()
        with self._changed:
            self.observation, self._reply = observations[0], None
            self.asks += 1
            self._notify_all()
            if not self._changed.wait_for(lambda: self._reply is not None or self._closed,
                                          timeout=self.idle_timeout_s) or self._closed:
                self.observation = None
                raise Abandoned("closed" if self._closed else f"no reply within {self.idle_timeout_s:.0f} s")
            reply, self._reply, self.observation = self._reply, None, None
            self._notify_all()
        self.turn_s.append(time.monotonic() - asked)
        return [reply]

    def reply(self, text: str) -> None:
        """Answer the pending observation (raises ``RuntimeError`` when it is not the person's turn)."""
        with self._changed:
            if self.observation is None or self._reply is not None:
                raise RuntimeError("it is not your turn")
            self._reply = text
            self._notify_all()

    def close(self) -> None:
        """Abandon a pending turn (the engine's ``act_batch`` raises :class:`Abandoned`)."""
        with self._changed:
            self._closed = True
            self._notify_all()

    def wait(self, until: Any, timeout_s: float) -> bool:
        """Wait until ``until()`` holds (checked whenever the seat's state changes); False on timeout."""
        with self._changed:
            return self._changed.wait_for(until, timeout=timeout_s)

    def notify(self) -> None:
        """Wake waiters (the dialogue ended)."""
        with self._changed:
            self._notify_all()

    def listen(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` (in the changing thread, so it must be quick) whenever the seat's state changes, as
        :meth:`wait` would wake; returns the function that stops it. An event loop waits this way, holding no
        thread."""
        with self._changed:
            self._listeners.append(callback)

        def stop() -> None:
            with self._changed:
                self._listeners.remove(callback)

        return stop

    def _notify_all(self) -> None:  # called holding self._changed
        self._changed.notify_all()
        for callback in self._listeners:
            callback()
