"""The Simulator protocol: whatever fills the user seat (or the teammate seat).

A simulator drives many dialogues at once through *slots*: :meth:`Simulator.reset_batch` starts one
dialogue per slot (scenario + random generator), :meth:`Simulator.act_batch` answers the pending
observations of some slots in one call. The single-dialogue methods :meth:`reset` / :meth:`act` are
slot 0 of a batch of one, which is what the single-agent ``UserSeat`` view uses.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    from simpop.simulators.spec import SimulatorSpec


class Simulator(ABC):
    """Base class for user simulators.

    Attributes:
        name: A short identifier, unique within a population (used in logs and reports).
    """

    name: str = "simulator"

    def reset(self, scenario: Any, rng: np.random.Generator) -> None:
        """Start one dialogue in slot 0."""
        self.reset_batch([scenario], [rng])

    def act(self, observation: Any) -> Any:
        """The action for slot 0's pending observation."""
        return self.act_batch([observation], [0])[0]

    @abstractmethod
    def reset_batch(self, scenarios: list[Any], rngs: list[np.random.Generator]) -> None:
        """Start ``len(scenarios)`` dialogues in slots ``0..n-1``, discarding earlier slots."""

    @abstractmethod
    def act_batch(self, observations: list[Any], slots: list[int]) -> list[Any]:
        """Actions for the given slots' pending observations, computed together where possible."""

    def feedback(self, slots: list[int], rewards: list[float]) -> None:
        """Hear the policy's final reward for finished dialogues (populations track failure rates)."""

    def member(self, slot: int) -> "Simulator":
        """The concrete simulator driving ``slot`` (itself, except in populations)."""
        return self

    @property
    def spec(self) -> "SimulatorSpec":
        """What this simulator is (kind, model, persona set, decoding), compared by held-out panels.

        The default names the class as the model; simulators with parameters that matter override it.
        """
        from simpop.simulators.spec import SimulatorSpec

        return SimulatorSpec(kind="custom", model=f"{type(self).__module__}.{type(self).__qualname__}")


@runtime_checkable
class DistributionalSimulator(Protocol):
    """A simulator that can state its full action distribution for a slot's observation."""

    def distribution(self, observation: Any, slot: int = 0) -> list[tuple[Any, float]]:
        """``[(action, probability), ...]`` summing to one."""
        ...
