"""P4G's reference persuader: what ``simpop eval --policy reference`` plays on the persuasion envs."""

from __future__ import annotations

from typing import Any

import numpy as np

from simpop.envs.persuasion.acts import PERSUADER_ACTS, render_persuader
from simpop.envs.persuasion.model import reference_persuader
from simpop.seat import Player


class ReferencePersuader(Player):
    """Each dialogue plays one act sequence of :func:`~simpop.envs.persuasion.model.reference_persuader`
    (greeting, strategies at corpus frequencies, the proposition at a uniform turn of the second half), drawn
    with its slot's generator when the dialogue starts. Act level it returns the act's index; text level one
    phrasing of the act (:func:`~simpop.envs.persuasion.acts.render_persuader`).

    Args:
        text: Play the text env (phrasings) instead of the act env (act indices).
        max_turns: The env's ``max_turns`` (the plans' length).
    """

    name = "reference-persuader"

    def __init__(self, text: bool, max_turns: int):
        self.text, self.max_turns = text, max_turns
        self._plans: list[list[str]] = []

    def reset_batch(self, scenarios: list[Any], rngs: list[np.random.Generator]) -> None:
        super().reset_batch(scenarios, rngs)
        self._plans = [list(reference_persuader(rng, self.max_turns)) for rng in self.rngs]

    def act_batch(self, observations: list[Any], slots: list[int]) -> list[Any]:
        acts = [self._plans[slot].pop(0) if self._plans[slot] else "closing" for slot in slots]
        if self.text:
            return [render_persuader(act, self.rngs[slot]) for act, slot in zip(acts, slots)]
        return [PERSUADER_ACTS.index(act) for act in acts]
