"""The two P4G envs: free text (``simpop/Persuasion-v0``) and dialogue acts (``simpop/PersuasionAct-v0``).

Both share scenarios (personas + the $2 donation context, from :mod:`.scenario`), seats (``persuader``
= policy, speaks first; ``persuadee`` = user) and the outcome: the episode terminates when the persuadee
states a decision (reward 1 to the persuader if the amount is > 0, else 0) and is truncated after
``max_turns`` persuader–persuadee exchanges (``max_steps = 2 · max_turns``; rejected actions count).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from gymnasium import spaces

from simpop.envs.dialogue import DialogueEnv, Outcome, TextSpace, Turn
from simpop.envs.persuasion.acts import (DONATING_ACTS, PERSUADEE_ACTS, PERSUADER_ACTS, REFUSING_ACTS,
                                         classify_persuader, render_persuadee, render_persuader)
from simpop.envs.persuasion.model import AMOUNT_LEVELS
from simpop.envs.persuasion.outcome import parse_donation
from simpop.envs.persuasion.personas import Persona
from simpop.envs.persuasion.scenario import PersuasionScenario, corpus_scenarios, default_scenarios, persona_set


class _PersuasionEnv(DialogueEnv):
    """Shared scenarios, seats and outcome of the two P4G envs."""

    policy_seat = "persuader"
    user_seat = "persuadee"
    first_seat = "persuader"

    def __init__(self, max_turns: int = 10, n_scenarios: int = 200, scenario_seed: int = 2019,
                 corpus_dir: str | Path | None = None, render_mode: str | None = None):
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        if corpus_dir is None and n_scenarios < 1:
            raise ValueError(f"n_scenarios must be >= 1, got {n_scenarios}")
        self.max_turns = max_turns
        scenarios = (corpus_scenarios(str(Path(corpus_dir).resolve())) if corpus_dir is not None
                     else default_scenarios(n_scenarios, scenario_seed))
        self._scenarios = {s.id: s for s in scenarios}
        self.donation: float | None = None
        super().__init__(max_steps=2 * max_turns, render_mode=render_mode)

    def scenario_ids(self) -> list[str]:
        return list(self._scenarios)

    def persona_set(self, name: str) -> tuple[Persona, ...]:
        """Named persona sets for simulator specs (``personas=NAME``).

        - ``modal``: the persona sampler's modal persona alone (the mode-collapsed population).
        - ``heldout`` = ``heldout-300-4242``; ``heldout-<n>-<seed>``: ``n`` draws from the persona sampler with
          ``seed``, minus every persona of this env's scenarios and the modal persona (people training never sees).
        """
        return persona_set(name, tuple(s.persona for s in self._scenarios.values()))

    def load_scenario(self, scenario_id: str) -> PersuasionScenario:
        return self._scenarios[scenario_id]

    def _start(self) -> None:
        self.donation = None

    def _outcome(self) -> Outcome | None:
        if self.donation is None:
            return None
        donated = self.donation > 0
        return Outcome({self.policy_seat: float(donated), self.user_seat: 0.0},
                       {"donation": self.donation, "donated": donated})

    def _truncated_outcome(self) -> Outcome:
        return Outcome({a: 0.0 for a in self.possible_agents}, {"donation": None, "donated": False})

    def _base_info(self, seat: str) -> dict[str, Any]:
        info = super()._base_info(seat)
        info.update(donation=self.donation, donated=bool(self.donation))
        return info


class PersuasionEnv(_PersuasionEnv):
    """P4G with free-text messages.

    Observations are JSON text (:meth:`DialogueEnv.text_observation`) with an extra ``instructions``
    field: the persuader's task (never the persona) or the persuadee's role prompt with its persona.
    Actions are messages of 1..``max_message_chars`` characters. Each persuadee message is read with
    :func:`parse_donation`; the first stated decision ends the episode.

    Args:
        max_turns: Persuader–persuadee exchanges before truncation.
        max_message_chars: Longest accepted message.
        n_scenarios, scenario_seed: Size and seed of the default persona set.
        corpus_dir: Use the P4G corpus's persuadee personas instead (see ``corpus.py``).
        render_mode: ``"ansi"`` or ``"human"``.
    """

    metadata = {**DialogueEnv.metadata, "name": "persuasion_v0"}

    def __init__(self, max_turns: int = 10, max_message_chars: int = 1000, n_scenarios: int = 200,
                 scenario_seed: int = 2019, corpus_dir: str | Path | None = None, render_mode: str | None = None):
        if max_message_chars < 1:
            raise ValueError(f"max_message_chars must be >= 1, got {max_message_chars}")
        self.max_message_chars = max_message_chars
        super().__init__(max_turns, n_scenarios, scenario_seed, corpus_dir, render_mode)

    def _make_spaces(self):
        # JSON escapes a control character as 6 characters; instructions take a few thousand.
        obs_limit = 20_000 + self.max_steps * (6 * self.max_message_chars + 64)
        obs = {a: TextSpace(obs_limit) for a in self.possible_agents}
        act = {a: TextSpace(self.max_message_chars, min_length=1) for a in self.possible_agents}
        return obs, act

    def _validate(self, seat: str, action: Any) -> str | None:
        if not isinstance(action, str):
            return f"action must be a str (the message), got {type(action).__name__}"
        if not action.strip():
            return "empty message: write something"
        if len(action) > self.max_message_chars:
            return f"message has {len(action)} characters; the limit is {self.max_message_chars}"
        return None

    def _apply(self, seat: str, action: str) -> str:
        if seat == self.policy_seat:
            self.transcript.append(Turn(seat, action, act=classify_persuader(action)))
            return self.user_seat
        donation = parse_donation(action)
        self.transcript.append(Turn(seat, action, data={"donation": donation}))
        if donation is not None:
            self.donation = donation
        return self.policy_seat

    def _observe(self, seat: str) -> str:
        instructions = (self.scenario.policy_instructions(self.max_turns) if seat == self.policy_seat
                        else self.scenario.user_instructions())
        return self.text_observation(seat, instructions=instructions)


# ---------------------------------------------------------------------------------------------- act level
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


def last_persuader_act(observation: np.ndarray) -> str | None:
    """The persuader act a persuadee observation reports as the latest (None before the first)."""
    index = int(np.argmax(observation[:len(PERSUADER_ACTS) + 1]))
    return PERSUADER_ACTS[index] if index < len(PERSUADER_ACTS) else None


class PersuasionActEnv(_PersuasionEnv):
    """P4G over dialogue acts: a fast, Box-observation view for RL (SB3 PPO trains on it unmodified).

    Persuader: ``Discrete(14)`` over :data:`PERSUADER_ACTS`; observation ``Box(0, 1, (40,))`` (see
    :data:`PERSUADER_OBS_DIM`; the persona is hidden). Persuadee: ``Discrete(23 · 7)`` =
    :data:`PERSUADEE_ACTS` × :data:`AMOUNT_LEVELS` (the amount matters only for donating acts; see
    :func:`encode_persuadee_action`); observation ``Box(0, 1, (31,))``. A donating act ends the episode
    with its amount, a refusing act with $0. Transcript turns hold the act name and a templated text.

    Args: as :class:`PersuasionEnv`, without ``max_message_chars``.
    """

    metadata = {**DialogueEnv.metadata, "name": "persuasion_act_v0"}

    def _make_spaces(self):
        obs = {self.policy_seat: spaces.Box(0.0, 1.0, (PERSUADER_OBS_DIM,), np.float32),
               self.user_seat: spaces.Box(0.0, 1.0, (PERSUADEE_OBS_DIM,), np.float32)}
        act = {self.policy_seat: spaces.Discrete(len(PERSUADER_ACTS)),
               self.user_seat: spaces.Discrete(len(PERSUADEE_ACTS) * N_AMOUNTS)}
        return obs, act

    def _start(self) -> None:
        super()._start()
        # Phrasings come from the reset seed too, so transcripts are reproducible.
        self._text_rng = np.random.default_rng(int(self.np_random.integers(2**63 - 1)))
        # Kept up to date in _apply so observations need no pass over the transcript.
        self._counts = np.zeros(len(PERSUADER_ACTS), np.float32)
        self._last = {self.policy_seat: len(PERSUADER_ACTS), self.user_seat: len(PERSUADEE_ACTS)}

    def _validate(self, seat: str, action: Any) -> str | None:
        space = self.action_space(seat)
        if isinstance(action, (bool, np.bool_)) or not space.contains(action):
            return f"action must be an int in [0, {space.n}), got {action!r}"
        return None

    def _apply(self, seat: str, action: Any) -> str:
        if seat == self.policy_seat:
            act = PERSUADER_ACTS[int(action)]
            self.transcript.append(Turn(seat, render_persuader(act, self._text_rng), act=act))
            self._counts[int(action)] += 1
            self._last[seat] = int(action)
            return self.user_seat
        self._last[seat] = int(action) // N_AMOUNTS
        act, amount = decode_persuadee_action(int(action))
        text = render_persuadee(act, amount if act in DONATING_ACTS else None, self._text_rng)
        self.transcript.append(Turn(seat, text, act=act, data={"donation": amount}))
        if act in DONATING_ACTS or act in REFUSING_ACTS:
            self.donation = amount
        return self.policy_seat

    def _observe(self, seat: str) -> np.ndarray:
        # The persuader sees the persuadee's last act and vice versa (one-hot; the extra slot = none yet).
        other = self.user_seat if seat == self.policy_seat else self.policy_seat
        head = np.zeros((len(PERSUADEE_ACTS) if other == self.user_seat else len(PERSUADER_ACTS)) + 1, np.float32)
        head[self._last[other]] = 1.0
        tail = np.array([self._counts.sum() / self.max_turns, float(self.to_act == seat)], np.float32)
        return np.concatenate([head, self._counts / self.max_turns, tail])
