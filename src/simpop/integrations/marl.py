"""What a multi-agent RL library needs from a turn-based simpop env to train *both* seats.

Libraries that take PettingZoo parallel envs (TorchRL's ``PettingZooWrapper``, RLlib's ``ParallelPettingZooEnv``)
ask every seat for an action at every step and turn infos into tensors. A :class:`~simpop.envs.dialogue.DialogueEnv`
has exactly one seat acting per step, string-valued infos, and no reward for the user seat (the benchmark rewards
the policy). :class:`MarlView`, a PettingZoo ``BaseParallelWrapper``, adds the missing pieces and nothing else:

- **numeric infos**: ``acting`` (1.0 for the seat to act; the env ignores the other seat's action),
  ``invalid_action`` (1.0 when the env rejected the seat's action this step; the reason is in
  ``view.dialogue.last_error``) and ``action_mask`` (all ones, except the user seat's realism mask on its turns);
- **a user reward** (optional, ``realism=``): on each of its turns the user seat earns the log-probability of its
  reply under a reference simulator (a ``DistributionalSimulator``, e.g. ``"persuadee"``), and its action mask
  allows only the replies the reference could give there (161 acts x amounts shrink to the ~20 plausible ones, as
  a legal-move mask does in a board game). Maximised with an entropy bonus of 1 this is ``-KL(user || reference)``:
  the user seat learns to reply like the reference population while the policy seat learns to win against it
  (simpop's ``realism`` co-training objective, with a simulator for the corpus; ``docs/integrations/torchrl.md``).

**Invalid actions** (out of range, ``-1``, a float, an array: what a loop that ignores the masks may send) follow
one rule in both seats: *an invalid action earns its seat the least a valid action can earn on that step, and the
dialogue stays put* (the env's rule: the same seat acts again and the step counts towards the turn cap). The
realism-rewarded user seat earns ``log(floor)``, the reward of a reply the reference never gives (the reference
gives no invalid reply); a seat rewarded by the benchmark earns what the env pays any step that decides nothing
(0, or the truncation outcome at the cap), which in P4G is the least a step earns (outcomes are 0 or 1). So no
seat gains by sending one, and a seat that sends only invalid actions plays to the turn cap on the lowest return
it can have: the user seat ``(2 max_turns - 1) log(floor)`` where replying earns at least ``max_turns log(floor)``,
the persuader 0.

The act-level envs (``simpop/PersuasionAct-v0``) have ``Discrete`` actions, which is what masks need.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import Any

import numpy as np
from gymnasium import spaces
from pettingzoo.utils.wrappers import BaseParallelWrapper

from simpop.envs.dialogue import DialogueEnv
from simpop.seat import DistributionalSimulator, Simulator
from simpop.simulators.registry import build_simulator

#: The replies a reference gives with at least this probability are the ones the user seat may choose.
FLOOR = 0.02


class MarlView(BaseParallelWrapper):
    """A dialogue env as a MARL library's parallel env: numeric infos, optionally a user reward and its mask.

    Args:
        env: A :class:`DialogueEnv` with ``Discrete`` action spaces (``simpop.make("simpop/PersuasionAct-v0")``).
        realism: A reference simulator (or its spec) whose reply distribution rewards the user seat; None leaves
            the user seat's reward as the env gives it (0 in P4G).
        floor: The least probability of a reply the realism mask allows.
    """

    def __init__(self, env: DialogueEnv, realism: Simulator | str | None = None, floor: float = FLOOR):
        super().__init__(env)
        unwrapped = env.unwrapped
        if not isinstance(unwrapped, DialogueEnv):
            raise TypeError(f"MarlView wraps a simpop DialogueEnv, got {type(unwrapped).__name__}")
        for seat in unwrapped.possible_agents:
            if not isinstance(env.action_space(seat), spaces.Discrete):
                raise TypeError(f"MarlView needs Discrete actions (action masks); seat {seat!r} of "
                                f"{type(unwrapped).__name__} has {env.action_space(seat)} (use an act-level env)")
        if not 0.0 < floor < 1.0:
            raise ValueError(f"floor must be in (0, 1), got {floor}")
        if isinstance(realism, str):
            realism = build_simulator(realism, env=unwrapped)
        if realism is not None and not isinstance(realism, DistributionalSimulator):
            raise TypeError(f"realism= needs a simulator with a reply distribution (distribution/commit), "
                            f"got {type(realism).__name__}")
        self.dialogue = unwrapped
        self.realism = realism
        self.floor = floor
        self.possible_agents = list(unwrapped.possible_agents)
        self.agents: list[str] = []
        self._observations: dict[str, Any] = {}
        #: The reference's reply distribution (action -> probability) at the user seat's latest turn.
        self.reference: dict[int, float] = {}

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None):
        """Reset the env (and the realism reference); infos are numeric: ``acting`` (1.0 for the seat to act),
        ``invalid_action`` (0.0 here) and ``action_mask`` (the realism mask for the acting user seat, else all
        ones)."""
        observations, _ = self.env.reset(seed=seed, options=options)
        if self.realism is not None:
            self.realism.reset_batch([self.dialogue.scenario], [self.dialogue.user_rng()])
        self.agents = list(self.dialogue.agents)
        self._observations = observations
        return observations, self._infos()

    def step(self, actions: dict[str, Any]):
        """Step the env with every seat's action (only the acting seat's counts); with ``realism`` set, a user reply
        earns the log of its reference probability, at least ``log(floor)``, which an invalid reply earns."""
        user, seat = self.dialogue.user_seat, self.dialogue.to_act
        observations, rewards, terminations, truncations, infos = self.env.step(actions)
        rejected = {s for s, info in infos.items() if "invalid_action" in info}
        if self.realism is not None and seat == user:
            # The mask kept the reply in the reference's support; a reply outside it (an invalid one included:
            # the reference never gives one) earns log(floor), the least any reply earns.
            p = 0.0 if user in rejected else self.reference.get(int(actions[user]), 0.0)
            rewards[user] += math.log(max(p, self.floor))
            if user not in rejected:
                self.realism.commit(self._observations[user], 0, actions[user])
        self.agents = list(self.dialogue.agents)
        self._observations = observations
        return observations, rewards, terminations, truncations, self._infos(list(observations), rejected)

    def _infos(self, seats: list[str] | None = None, rejected: Collection[str] = ()) -> dict[str, dict[str, Any]]:
        """Every seat's numeric infos, the same keys at every step (TorchRL builds its info spec at reset)."""
        infos = {}
        for seat in seats if seats is not None else self.agents:
            n = self.env.action_space(seat).n
            acting = self.dialogue.to_act == seat
            if acting and self.realism is not None and seat == self.dialogue.user_seat:
                self.reference = {int(a): p for a, p in self.realism.distribution(self._observations[seat], 0)}
                mask = np.zeros(n, np.int8)
                mask[[a for a, p in self.reference.items() if p >= self.floor]] = 1
            else:
                mask = np.ones(n, np.int8)
            infos[seat] = {"acting": float(acting), "invalid_action": float(seat in rejected), "action_mask": mask}
        return infos
