"""τ²'s reference agent: what ``simpop eval --policy reference`` plays on the τ² envs."""

from __future__ import annotations

from typing import Any

import numpy as np

from simpop.envs.tau2.simulators import GoldAgent
from simpop.seat import Player


class GoldTau2Agent(Player):
    """A :class:`~simpop.envs.tau2.simulators.GoldAgent` per dialogue: the task's gold actions, then what τ²
    checks was communicated. It draws nothing."""

    name = "tau2-gold"
    rng_free = True

    def reset_batch(self, scenarios: list[Any], rngs: list[np.random.Generator]) -> None:
        super().reset_batch(scenarios, rngs)
        self._agents = [GoldAgent(scenario) for scenario in scenarios]

    def act_batch(self, observations: list[Any], slots: list[int]) -> list[Any]:
        return [self._agents[slot].act(observation) for observation, slot in zip(observations, slots)]
