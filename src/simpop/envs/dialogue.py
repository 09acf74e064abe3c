"""Turn-based two-seat dialogue environments (the shared PettingZoo base).

Every simpop benchmark is a :class:`DialogueEnv`: a PettingZoo ``ParallelEnv`` with exactly two seats,
one played by the policy and one by a user simulator (or teammate). Exactly one seat acts per step;
the other seat's action is ignored (and flagged in its info if it was not empty).

Contract (DESIGN.md §3):
- ``reset(seed=..., options={"scenario_id": ...})`` draws every random choice from one generator:
  first the scenario (unless given), then :attr:`DialogueEnv.user_seed`, the seed for whoever drives
  the user seat.
- ``terminated`` means the task ended (the benchmark decided an outcome); ``truncated`` means the
  step cap was hit first.
- A bad action (wrong type, empty, overlong, unparsable, nested too deeply to parse) is rejected: the
  acting seat gets an error in its next observation, ``info[seat]["invalid_action"]`` says why, the step
  still counts towards the cap, and the same seat acts again. Misuse (stepping a finished episode,
  omitting the acting seat, naming an unknown seat) raises a clear error.
"""

from __future__ import annotations

import json
import string
import warnings
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv

#: Why an action whose validation overflowed the recursion limit (``"[" * 50_000`` read as JSON) is rejected.
NESTED_TOO_DEEP = "the action is nested too deeply to be read (thousands of '[' or '{'); write a flatter one"
#: Why a text action with unpaired surrogates is rejected (it would break UTF-8 output downstream).
NOT_UNICODE = "the action is not valid Unicode text (it holds unpaired surrogates)"


def is_unicode(*texts: str | None) -> bool:
    """Whether every text encodes as UTF-8 (no unpaired surrogates); None counts as empty."""
    try:
        for text in texts:
            (text or "").encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


#: Characters used when *sampling* text; any string is *contained* in a :class:`TextSpace`.
SAMPLE_CHARSET = string.ascii_letters + string.digits + string.punctuation + " "


class TextSpace(spaces.Text):
    """A text space that contains every string within its length bounds.

    Gymnasium's ``Text`` only accepts characters from its charset (alphanumeric by default); chat
    messages use the full Unicode range, so membership here only checks type and length. Sampling
    draws from :data:`SAMPLE_CHARSET`.
    """

    def __init__(self, max_length: int, min_length: int = 0, seed: int | None = None):
        super().__init__(max_length, min_length=min_length, charset=SAMPLE_CHARSET, seed=seed)

    def contains(self, x: Any) -> bool:
        """Whether ``x`` is a string within the length bounds (any characters)."""
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"TextSpace({self.min_length}, {self.max_length})"


#: Most steps of one dialogue (a longer one is a typo, and the rollout buffers grow with it).
MAX_STEPS = 10_000


class Scenario(Protocol):
    """What a benchmark's scenario must offer the base: a stable identifier."""

    id: str


@dataclass
class Turn:
    """One accepted action in the transcript.

    Attributes:
        seat: Who acted.
        text: The message as shown to the other seat (for act-level envs: a rendering of the act).
        act: The dialogue act, where the env has acts.
        data: Benchmark-specific extras (tool calls and results, patches, ...).
    """

    seat: str
    text: str
    act: str | None = None
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class Outcome:
    """The end of a task: per-seat rewards and the info that explains them."""

    rewards: dict[str, float]
    info: dict[str, Any] = field(default_factory=dict)


class DialogueEnv(ParallelEnv, ABC):
    """Base class for turn-based two-seat dialogue envs.

    Subclasses set :attr:`policy_seat`, :attr:`user_seat` and :attr:`first_seat`, build their spaces
    in :meth:`_make_spaces`, and implement the hooks marked abstract. The base owns turn order, the
    transcript, the step cap, seeding, validation of the step call and the reward/info bookkeeping.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi", "human"], "name": "dialogue_v0",
                                         "is_parallelizable": True}
    policy_seat: ClassVar[str]
    user_seat: ClassVar[str]
    first_seat: ClassVar[str]

    def __init__(self, max_steps: int, render_mode: str | None = None):
        if not 1 <= max_steps <= MAX_STEPS:
            raise ValueError(f"max_steps must be from 1 to {MAX_STEPS}, got {max_steps}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']}, got {render_mode!r}")
        self.possible_agents = [self.policy_seat, self.user_seat]
        self.agents: list[str] = []
        self.max_steps = max_steps
        self.render_mode = render_mode
        self.np_random = np.random.default_rng()
        self.scenario: Any = None
        self.user_seed: int = 0
        self.transcript: list[Turn] = []
        self.steps = 0
        self.to_act: str | None = None
        self._errors: dict[str, str] = {}
        self._observation_spaces, self._action_spaces = self._make_spaces()

    # ----------------------------------------------------------------- hooks for subclasses
    @abstractmethod
    def _make_spaces(self) -> tuple[dict[str, spaces.Space], dict[str, spaces.Space]]:
        """Build (observation spaces, action spaces) per seat, once."""

    @abstractmethod
    def scenario_ids(self) -> list[str]:
        """Identifiers of every scenario this env can run, in a stable order."""

    @abstractmethod
    def load_scenario(self, scenario_id: str) -> Any:
        """Return the scenario object for ``scenario_id`` (raise ``KeyError`` if unknown)."""

    def _start(self) -> None:
        """Prepare per-episode state after :attr:`scenario` is set (override if needed)."""

    @abstractmethod
    def _validate(self, seat: str, action: Any) -> str | None:
        """Return why ``action`` is invalid for ``seat`` now, or None if it is acceptable."""

    @abstractmethod
    def _apply(self, seat: str, action: Any) -> str:
        """Apply a valid action (append to :attr:`transcript` etc.) and return the next seat to act."""

    @abstractmethod
    def _outcome(self) -> Outcome | None:
        """The outcome if the task has ended, else None."""

    def _truncated_outcome(self) -> Outcome:
        """Rewards and info when the step cap ends the episode first (default: all zero)."""
        return Outcome({a: 0.0 for a in self.possible_agents})

    @abstractmethod
    def _observe(self, seat: str) -> Any:
        """The observation for ``seat`` (use :attr:`last_error` to show a rejected action)."""

    # ----------------------------------------------------------------- PettingZoo API
    def observation_space(self, agent: str) -> spaces.Space:
        """The observation space of seat ``agent`` (built once, in ``_make_spaces``)."""
        return self._observation_spaces[agent]

    def action_space(self, agent: str) -> spaces.Space:
        """The action space of seat ``agent`` (built once, in ``_make_spaces``)."""
        return self._action_spaces[agent]

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None):
        """Start a dialogue (module docstring): ``options={"scenario_id": ...}`` picks the scenario, else the seed
        does.

        Returns:
            Observations and infos per seat.

        Raises:
            KeyError: An unknown ``scenario_id``.
        """
        if seed is not None:
            self.np_random = np.random.default_rng(seed)
        options = dict(options or {})
        scenario_id = options.pop("scenario_id", None)
        if options:
            # PettingZoo's API test passes arbitrary options, so unknown ones are reported, not fatal.
            warnings.warn(f"ignoring unknown reset options {sorted(options)}; supported: 'scenario_id'",
                          stacklevel=2)
        ids = self.scenario_ids()
        if scenario_id is None:
            scenario_id = ids[int(self.np_random.integers(len(ids)))]
        elif scenario_id not in ids:
            preview = ", ".join(ids[:5]) + (", ..." if len(ids) > 5 else "")
            raise KeyError(f"unknown scenario_id {scenario_id!r} for {type(self).__name__}; "
                           f"see env.scenario_ids() ({len(ids)} ids: {preview})")
        self._begin(self.load_scenario(scenario_id))
        infos = {a: self._base_info(a) for a in self.agents}
        return {a: self._observe(a) for a in self.agents}, infos

    def _begin(self, scenario: Any) -> None:
        """Start a dialogue on ``scenario``: draw the user's seed from ``np_random``, clear the dialogue state
        (what :meth:`reset` does once the scenario is chosen; array waves call it for each of their envs)."""
        self.scenario = scenario
        self.user_seed = int(self.np_random.integers(2**63 - 1))
        self.agents = list(self.possible_agents)
        self.transcript = []
        self.steps = 0
        self.to_act = self.first_seat
        self._errors = {}
        self._start()

    def step(self, actions: dict[str, Any]):
        """Apply the acting seat's action (the other seat's is ignored and flagged if not empty).

        Returns:
            PettingZoo's per-seat observations, rewards, terminations, truncations and infos.

        Raises:
            RuntimeError: The episode has ended (or was never reset).
            KeyError: An unknown seat.
            ValueError: No action for the seat whose turn it is.
        """
        if not self.agents:
            raise RuntimeError("step() called on a finished episode (or before reset()); call reset() first")
        unknown = set(actions) - set(self.possible_agents)
        if unknown:
            raise KeyError(f"actions name unknown seats {sorted(unknown)}; seats are {self.possible_agents}")
        seat = self.to_act
        assert seat is not None
        if seat not in actions:
            raise ValueError(f"it is {seat!r}'s turn: actions must include an action for {seat!r}")
        infos = {a: self._base_info(a) for a in self.agents}
        for other, action in actions.items():
            if other != seat and not _is_empty(action):
                infos[other]["off_turn_action_ignored"] = True
        self._errors = {}
        try:
            error = self._validate(seat, actions[seat])
        except RecursionError:  # a recursive parser (JSON) met deeply nested text: the action's fault, not the env's
            error = NESTED_TOO_DEEP
        self.steps += 1
        if error is None:
            self.to_act = self._apply(seat, actions[seat])
        else:
            self._errors[seat] = error
            infos[seat]["invalid_action"] = error

        outcome = self._outcome()
        terminated = outcome is not None
        truncated = not terminated and self.steps >= self.max_steps
        if truncated:
            outcome = self._truncated_outcome()
        rewards = {a: 0.0 for a in self.agents}
        if outcome is not None:
            rewards.update({a: float(outcome.rewards.get(a, 0.0)) for a in self.agents})
            for a in self.agents:
                infos[a].update(outcome.info)
        live = list(self.agents)
        if terminated or truncated:
            self.to_act = None
        observations = {a: self._observe(a) for a in live}
        for a in live:
            infos[a]["to_act"] = self.to_act
        if terminated or truncated:
            self.agents = []
        if self.render_mode == "human":
            print(self.render())
        return (observations, rewards, {a: terminated for a in live}, {a: truncated for a in live}, infos)

    def render(self) -> str | None:
        """The transcript as ``[seat] text`` lines (None without a render mode)."""
        if self.render_mode is None:
            return None
        return "\n".join(f"[{t.seat}] {t.text}" for t in self.transcript)

    def close(self) -> None:
        """Release resources (the base holds none)."""

    def aec(self):
        """This env's AEC view (PettingZoo ``parallel_to_aec``; :mod:`simpop.envs.aec`)."""
        from simpop.envs.aec import to_aec

        return to_aec(self)

    # ----------------------------------------------------------------- helpers for subclasses
    @property
    def last_error(self) -> dict[str, str]:
        """Why the last step's action was rejected, keyed by seat (empty if it was accepted)."""
        return self._errors

    @property
    def done(self) -> bool:
        return not self.agents

    def user_rng(self) -> np.random.Generator:
        """A generator for whoever drives the user seat this episode, derived from the reset seed."""
        return np.random.default_rng(self.user_seed)

    def _base_info(self, seat: str) -> dict[str, Any]:
        return {"to_act": self.to_act, "scenario_id": getattr(self.scenario, "id", None)}

    def chat_view(self, seat: str) -> list[dict[str, str]]:
        """The transcript as chat messages from ``seat``'s point of view (its own turns are "assistant")."""
        return [{"role": "assistant" if t.seat == seat else "user", "content": t.text} for t in self.transcript]

    def text_observation(self, seat: str, **extra: Any) -> str:
        """The standard JSON text observation: whose turn it is, the chat so far, and any error."""
        payload = {"seat": seat, "to_act": self.to_act, "step": self.steps,
                   "messages": self.chat_view(seat), "error": self._errors.get(seat), **extra}
        return json.dumps(payload, ensure_ascii=False)


def parse_observation(observation: str) -> dict[str, Any]:
    """Decode a text observation produced by :meth:`DialogueEnv.text_observation`."""
    return json.loads(observation)


def _is_empty(action: Any) -> bool:
    return action is None or (isinstance(action, str) and action == "")
