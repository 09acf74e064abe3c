"""The act-level P4G env's codec: persuadee action indices and the observation layout both seats read.

A persuadee action is one ``Discrete(23 · 7)`` index: the act, and for donating acts the amount level
(:func:`encode_persuadee_action`, :func:`decode_persuadee_action`). An observation is a flat vector whose first
entries one-hot the other seat's latest act (:func:`last_persuader_acts` reads the persuadee's).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from simpop.envs.persuasion.acts import DONATING_ACTS, PERSUADEE_ACTS, PERSUADER_ACTS, REFUSING_ACTS
from simpop.envs.persuasion.model import AMOUNT_LEVELS

N_AMOUNTS = len(AMOUNT_LEVELS)
#: Persuader observation: last persuadee act one-hot (+ "none yet"), persuader act counts / max_turns,
#: persuader turns / max_turns, 1 if the persuader is to act.
PERSUADER_OBS_DIM = len(PERSUADEE_ACTS) + 1 + len(PERSUADER_ACTS) + 2
#: Persuadee observation: last persuader act one-hot (+ "none yet"), the same counts, turn fraction, flag.
PERSUADEE_OBS_DIM = len(PERSUADER_ACTS) + 1 + len(PERSUADER_ACTS) + 2


def encode_persuadee_action(act: str, amount: float | None = None) -> int:
    """The ``Discrete(23 · 7)`` index of persuadee ``act`` (donating acts: with ``amount``, one of AMOUNT_LEVELS)."""
    level = 0
    if act in DONATING_ACTS:
        matches = [i for i, a in enumerate(AMOUNT_LEVELS) if amount is not None and abs(a - amount) < 1e-9]
        if not matches:
            raise ValueError(f"{act!r} needs an amount from {AMOUNT_LEVELS}, got {amount!r}")
        level = matches[0]
    return PERSUADEE_ACTS.index(act) * N_AMOUNTS + level


def decode_persuadee_action(action: int) -> tuple[str, float | None]:
    """(act, amount): the donation for donating acts, 0.0 for refusals, None otherwise."""
    act = PERSUADEE_ACTS[int(action) // N_AMOUNTS]
    if act in DONATING_ACTS:
        return act, AMOUNT_LEVELS[int(action) % N_AMOUNTS]
    return act, 0.0 if act in REFUSING_ACTS else None


def last_persuader_acts(observations: Sequence[np.ndarray]) -> list[str | None]:
    """The persuader act each persuadee observation reports as the latest (None before the first), one argmax over
    the stacked rows."""
    if not len(observations):
        return []
    index = np.argmax(np.asarray(observations)[:, :len(PERSUADER_ACTS) + 1], axis=1)
    return [PERSUADER_ACTS[i] if i < len(PERSUADER_ACTS) else None for i in index.tolist()]


def last_persuader_act(observation: np.ndarray) -> str | None:
    """:func:`last_persuader_acts` of one observation."""
    return last_persuader_acts([observation])[0]
