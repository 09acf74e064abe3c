"""The AEC (agent-environment cycle) view of a two-seat dialogue env, through PettingZoo's ``parallel_to_aec``.

``simpop.make(id, api="aec")`` and ``env.aec()`` return it. The AEC view cycles through the seats in
``possible_agents`` order; one full cycle (every live seat steps once) is one step of the underlying
:class:`~simpop.envs.dialogue.DialogueEnv`. Only the seat whose turn it is acts: ``infos[seat]["to_act"]``
names it (and ``env.unwrapped.to_act``); the other seat's action in that cycle is ignored, so pass None (a
non-empty off-turn action is flagged ``off_turn_action_ignored`` in its info, as in the parallel API).

Text observations come as :class:`TextObservation`: a ``str`` that also states its NumPy dtype (``<U``, the
dtype of the seat's text space), which PettingZoo's ``api_test`` reads off every observation. Act-level
observations are the env's NumPy arrays unchanged.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from pettingzoo.utils.conversions import parallel_to_aec
from pettingzoo.utils.wrappers import BaseParallelWrapper

_TEXT_DTYPE = np.dtype(str)


class TextObservation(str):
    """A text observation that states its dtype (``<U``) like a NumPy observation; otherwise a plain ``str``."""

    __slots__ = ()
    dtype = _TEXT_DTYPE

    def __reduce__(self) -> tuple[Any, ...]:
        return TextObservation, (str(self),)


class _TextObservations(BaseParallelWrapper):
    """Hands text observations on as :class:`TextObservation` (everything else unchanged)."""

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None):
        observations, infos = self.env.reset(seed=seed, options=options)
        return _typed(observations), infos

    def step(self, actions: dict[str, Any]):
        observations, *rest = self.env.step(actions)
        return (_typed(observations), *rest)


def _typed(observations: dict[str, Any]) -> dict[str, Any]:
    return {seat: TextObservation(o) if isinstance(o, str) else o for seat, o in observations.items()}


def to_aec(env: Any) -> Any:
    """The AEC view of the parallel dialogue env ``env`` (module docstring)."""
    return parallel_to_aec(_TextObservations(env))
