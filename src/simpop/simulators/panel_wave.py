"""Every member of a panel in one rollout wave (``simpop eval``).

:class:`PanelWave` is a :class:`~simpop.seat.Simulator` whose slots are driven by panel members in a fixed
assignment (:meth:`PanelWave.assign`): the rollout engine then runs all members' dialogues side by side and
asks the policy once per tick for all of them. Each member starts its own slots in wave order (the same
scenarios and generators, in the same order, as a wave of that member alone), so a member's replies do not
depend on which other members share the wave. Per tick each member with pending slots gets one ``act_batch``
call; with ``concurrent=True`` those calls run side by side in threads, so members whose model runs on one
server (``simpop eval --sim-generator vllm:...``) reach it together and are batched there as one. A member's
call that raises ends the wave with a :class:`MemberError` naming the member, so that a runner can rerun the
others together and only that member's dialogues one by one.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from simpop.agents.openai_backend import BackendUnavailable
from simpop.seat import Simulator


class MemberError(RuntimeError):
    """Panel member ``member`` (an index into :attr:`PanelWave.members`) raised during a wave (the error is the
    ``__cause__``)."""

    def __init__(self, member: int, name: str, error: BaseException):
        super().__init__(f"panel member {name!r} raised {type(error).__name__}: {error}")
        self.member = member


class PanelWave(Simulator):
    """Panel members sharing one wave.

    Args:
        members: The members (distinct objects).
        concurrent: Run the members' calls of a tick in threads (for members that generate on a server).
    """

    name = "panel-wave"

    def __init__(self, members: Sequence[Simulator], concurrent: bool = False):
        if not members:
            raise ValueError("a panel wave needs at least one member")
        if len({id(m) for m in members}) != len(members):
            raise ValueError("panel wave members must be distinct simulator objects")
        self.members = list(members)
        self.concurrent = concurrent
        self._assignment: list[int] = []
        self._slots: list[tuple[int, int]] = []  # wave slot -> (member index, the member's own slot)

    def assign(self, members: Sequence[int]) -> None:
        """Which member drives each slot of the next wave (indices into :attr:`members`)."""
        if any(not 0 <= m < len(self.members) for m in members):
            raise ValueError(f"member indices must be in [0, {len(self.members)}), got {list(members)}")
        self._assignment = list(members)

    def reset_batch(self, scenarios: list[Any], rngs: list[np.random.Generator]) -> None:
        if not len(scenarios) == len(rngs) == len(self._assignment):
            raise ValueError(f"reset_batch got {len(scenarios)} scenarios and {len(rngs)} generators for "
                             f"{len(self._assignment)} assigned slots; call assign() for each wave")
        self._slots = []
        counts = [0] * len(self.members)
        for m in self._assignment:
            self._slots.append((m, counts[m]))
            counts[m] += 1
        for m, member in enumerate(self.members):
            mine = [i for i, a in enumerate(self._assignment) if a == m]
            if mine:
                member.reset_batch([scenarios[i] for i in mine], [rngs[i] for i in mine])

    def act_batch(self, observations: list[Any], slots: list[int]) -> list[Any]:
        groups: dict[int, list[int]] = {}
        for i, slot in enumerate(slots):
            groups.setdefault(self._slot(slot)[0], []).append(i)

        def call(m: int) -> list[Any]:
            indices = groups[m]
            try:
                return self.members[m].act_batch([observations[i] for i in indices],
                                                 [self._slot(slots[i])[1] for i in indices])
            except BackendUnavailable:  # the server is gone: no member's fault, the runner stops
                raise
            except Exception as error:
                raise MemberError(m, self.members[m].name, error) from error

        if self.concurrent and len(groups) > 1:
            pool = ThreadPoolExecutor(max_workers=len(groups))
            try:
                answers = dict(zip(groups, pool.map(call, groups)))
            finally:  # an error or Ctrl-C does not wait here for the other members' requests in flight
                pool.shutdown(wait=False, cancel_futures=True)
        else:
            answers = {m: call(m) for m in groups}
        actions: list[Any] = [None] * len(slots)
        for m, indices in groups.items():
            if len(answers[m]) != len(indices):
                raise RuntimeError(f"member {self.members[m].name!r} returned {len(answers[m])} actions for "
                                   f"{len(indices)} observations")
            for i, answer in zip(indices, answers[m]):
                actions[i] = answer
        return actions

    def feedback(self, slots: list[int], rewards: list[float]) -> None:
        for slot, reward in zip(slots, rewards):
            m, own = self._slot(slot)
            self.members[m].feedback([own], [reward])

    def member(self, slot: int) -> Simulator:
        m, own = self._slot(slot)
        return self.members[m].member(own)

    def _slot(self, slot: int) -> tuple[int, int]:
        if not 0 <= slot < len(self._slots):
            raise IndexError(f"slot {slot} was not started: reset_batch() started {len(self._slots)} slots")
        return self._slots[slot]
