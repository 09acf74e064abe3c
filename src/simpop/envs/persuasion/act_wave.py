"""Act-level P4G dialogues as arrays, one row per dialogue: the act env's one stepping path.

:class:`ActWave` holds what an act-level dialogue is (whose turn, steps, the persuader's act counts, each seat's last
act, the decision, a log of every step and of each seat's observations) for many dialogues at once and steps them with
array operations: observations, validation, the acts' effects, rewards and termination.
:class:`~simpop.envs.persuasion.env.PersuasionActEnv` keeps its dialogue in a row (of a wave of its own, or of the
wave that plays it) and every ``env.step`` is :meth:`ActWave.step` on that row; the rollout engine plays a whole wave of
envs at once (``env.vector_wave(envs)``), stepping their rows together. Both run this code, so the trajectories are the
same; when a wave ends (:meth:`finish`) each env takes its row's progress (:meth:`PersuasionActEnv.sync`), so callers
that read an env after its dialogue (evaluation records) see no difference. ``tests/envs/persuasion/test_act_wave.py``
checks the rollout engine's two paths against each other under several seeds.

Seats are numbered 0 (the persuader, the policy) and 1 (the persuadee); ``to_act`` is -1 once a dialogue is over.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium import spaces

from simpop.envs.persuasion.acts import DONATING_ACTS, PERSUADEE_ACTS, PERSUADER_ACTS, REFUSING_ACTS
from simpop.envs.persuasion.codec import N_AMOUNTS, PERSUADEE_OBS_DIM, PERSUADER_OBS_DIM
from simpop.envs.persuasion.model import AMOUNT_LEVELS

logger = logging.getLogger(__name__)

POLICY, USER, DONE = 0, 1, -1
_N_ER, _N_EE = len(PERSUADER_ACTS), len(PERSUADEE_ACTS)
_IS_DONATING = np.array([a in DONATING_ACTS for a in PERSUADEE_ACTS])
_IS_DECISION = np.array([a in DONATING_ACTS or a in REFUSING_ACTS for a in PERSUADEE_ACTS])
_LEVELS = np.array(AMOUNT_LEVELS)
OBS_DIMS = (PERSUADER_OBS_DIM, PERSUADEE_OBS_DIM)


def why_invalid(action: Any, space: spaces.Discrete) -> str | None:
    """Why the act env rejects ``action`` in a seat with action space ``space`` (None: accepted)."""
    if isinstance(action, (bool, np.bool_)):
        ok = False
    elif isinstance(action, (int, np.integer)):  # the common case, without gymnasium's general check
        ok = bool(0 <= action < space.n)
    else:
        ok = space.contains(action)
    return None if ok else f"action must be an int in [0, {space.n}), got {action!r}"


class ActWave:
    """The dialogues of one wave, one per env of ``envs`` (all built alike: the same ``max_turns``).

    Args:
        envs: The envs (``PersuasionActEnv``, which owns this module: it is not imported back); row ``i`` is played
            in ``envs[i]``.
    """

    def __init__(self, envs: Sequence[Any]):
        if not envs:
            raise ValueError("a wave needs at least one env")
        first = envs[0]
        if any(e.max_turns != first.max_turns for e in envs):
            raise ValueError("the envs of a wave must share max_turns")
        self.envs = list(envs)
        self.max_turns, self.max_steps = first.max_turns, first.max_steps
        self.seats = (first.policy_seat, first.user_seat)
        self.spaces = tuple(first.action_space(seat) for seat in self.seats)
        n = len(self.envs)
        self.to_act = np.full(n, POLICY, np.int64)
        self.steps = np.zeros(n, np.int64)
        self.counts = np.zeros((n, _N_ER), np.float32)
        self.n_acts = np.zeros(n, np.int64)
        # The last act of each seat, in the other seat's one-hot (the extra slot = none yet).
        self.last = (np.full(n, _N_ER, np.int64), np.full(n, _N_EE, np.int64))
        self.donation = np.full(n, np.nan)
        self.terminated = np.zeros(n, bool)
        # History, one column per step: who acted, the action's code (-1 if rejected), the observations acted on.
        self.seat_log = np.zeros((n, self.max_steps), np.int8)
        self.code_log = np.zeros((n, self.max_steps), np.int64)
        self.obs_log = tuple(np.zeros((n, self.max_steps, dim), np.float32) for dim in OBS_DIMS)
        self.obs_count = (np.zeros(n, np.int64), np.zeros(n, np.int64))
        #: (row, step) -> why the action was rejected; (row, step) -> an action that is not a plain int, as given.
        self.errors: dict[tuple[int, int], str] = {}
        self.raw: dict[tuple[int, int], Any] = {}
        self._errors_by_row: dict[int, list[tuple[int, str]]] | None = None

    def start(self, row: int) -> None:
        """Clear row ``row`` for a new dialogue (the persuader speaks first)."""
        self.to_act[row], self.steps[row], self.n_acts[row], self.obs_count[0][row], self.obs_count[1][row] = (
            POLICY, 0, 0, 0, 0)
        self.counts[row] = 0.0
        self.last[POLICY][row], self.last[USER][row] = _N_ER, _N_EE
        self.donation[row], self.terminated[row] = np.nan, False
        if self.errors or self.raw:
            self.errors = {k: v for k, v in self.errors.items() if k[0] != row}
            self.raw = {k: v for k, v in self.raw.items() if k[0] != row}
            self._errors_by_row = None

    def reset(self, seeds: Sequence[int], scenario_ids: Sequence[str]) -> None:
        """Start row ``i``'s dialogue in ``envs[i]`` as ``env.reset(seed=seeds[i], options={"scenario_id": ...})``
        would (the same generator draws, in the same order)."""
        if not len(seeds) == len(scenario_ids) == len(self.envs):
            raise ValueError(f"reset needs one seed and one scenario per env ({len(self.envs)}), got {len(seeds)}, "
                             f"{len(scenario_ids)}")
        for row, (env, seed, scenario_id) in enumerate(zip(self.envs, seeds, scenario_ids)):
            env.play_in(self, row, seed, scenario_id)

    def user_rngs(self) -> list[np.random.Generator]:
        """Each row's user-seat generator (``env.user_rng()``), for the simulator's ``reset_batch``."""
        return [env.user_rng() for env in self.envs]

    def pending(self, seat: int) -> np.ndarray:
        """The rows whose dialogue awaits ``seat``, in row order."""
        return np.flatnonzero(self.to_act == seat)

    def observation(self, rows: np.ndarray, seat: int) -> np.ndarray:
        """``seat``'s observations in ``rows``, ``[len(rows), dim]``, with the to-act flag set where it is its turn."""
        head = (_N_EE if seat == POLICY else _N_ER) + 1
        out = np.zeros((len(rows), OBS_DIMS[seat]), np.float32)
        out[np.arange(len(rows)), self.last[1 - seat][rows]] = 1.0
        np.divide(self.counts[rows], self.max_turns, out=out[:, head:head + _N_ER])
        out[:, -2] = self.n_acts[rows].astype(np.float32) / np.float32(self.max_turns)
        out[:, -1] = self.to_act[rows] == seat
        return out

    def observe(self, rows: np.ndarray, seat: int) -> np.ndarray:
        """``seat``'s observations in ``rows`` (all to act), kept as the observations the seat acted on."""
        out = self.observation(rows, seat)
        self.obs_log[seat][rows, self.obs_count[seat][rows]] = out
        self.obs_count[seat][rows] += 1
        return out

    def step(self, rows: np.ndarray, seat: int, actions: Sequence[Any]) -> np.ndarray:
        """Apply ``seat``'s ``actions`` in ``rows``; the rows whose dialogue just ended."""
        codes, ok = self._validate(rows, seat, actions)
        k = self.steps[rows]
        self.seat_log[rows, k] = seat
        self.code_log[rows, k] = np.where(ok, codes, -1)
        self.steps[rows] = k + 1
        good, codes = rows[ok], codes[ok]
        if seat == POLICY:
            self.counts[good, codes] += 1
            self.n_acts[good] += 1
            self.last[POLICY][good] = codes
            self.to_act[good] = USER
        else:
            acts = codes // N_AMOUNTS
            self.last[USER][good] = acts
            self.to_act[good] = POLICY
            decided = _IS_DECISION[acts]
            self.donation[good[decided]] = np.where(_IS_DONATING[acts], _LEVELS[codes % N_AMOUNTS], 0.0)[decided]
            self.terminated[good[decided]] = True
        ended = rows[self.terminated[rows] | (self.steps[rows] >= self.max_steps)]
        self.to_act[ended] = DONE
        return ended

    def _validate(self, rows: np.ndarray, seat: int, actions: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
        """Each action's code and whether it is accepted (:func:`why_invalid`); rejections are kept in :attr:`errors`."""
        if len(actions) != len(rows):
            raise ValueError(f"got {len(actions)} actions for {len(rows)} dialogues")
        n = self.spaces[seat].n
        codes, ok = np.zeros(len(rows), np.int64), np.ones(len(rows), bool)
        for j, action in enumerate(actions):
            if type(action) is int and 0 <= action < n:  # the common case
                codes[j] = action
                continue
            row, step = int(rows[j]), int(self.steps[rows[j]])
            self.raw[row, step] = action
            error = why_invalid(action, self.spaces[seat])
            if error is None:
                codes[j] = int(action)
            else:
                ok[j] = False
                self.errors[row, step] = error
                self._errors_by_row = None
                if seat == USER:
                    logger.debug("user-seat action rejected (%s): %.200r", error, action)
        return codes, ok

    def accepted(self, row: int, start: int = 0) -> list[tuple[str, int]]:
        """Row ``row``'s accepted ``(seat, action)`` pairs from step ``start`` on, in order."""
        n = int(self.steps[row])
        return [(self.seats[s], c) for s, c in zip(self.seat_log[row, start:n].tolist(),
                                                   self.code_log[row, start:n].tolist()) if c >= 0]

    def last_error(self, row: int) -> dict[str, str]:
        """Why row ``row``'s last step's action was rejected, keyed by seat (empty if it was accepted)."""
        n = int(self.steps[row])
        error = self.errors.get((row, n - 1))
        return {self.seats[int(self.seat_log[row, n - 1])]: error} if error else {}

    def policy_return(self, rows: np.ndarray) -> list[float]:
        """The persuader's return in ``rows`` (1 for a dialogue that ended with a donation, else 0)."""
        return [float(d > 0) for d in self.donation[rows]]

    def episode(self, row: int) -> dict[str, Any]:
        """Row ``row``'s dialogue as the rollout engine records it from ``env.step``: per seat the observations
        acted on, the actions and the rewards; the policy seat's info after each step; how it ended."""
        n = int(self.steps[row])
        seats = self.seat_log[row, :n].tolist()
        codes = self.code_log[row, :n].tolist()
        if self.raw:  # actions as given where they were not plain ints (rejected ones are all in raw)
            codes = [self.raw.get((row, step), code) for step, code in enumerate(codes)]
        actions = {self.seats[POLICY]: [c for s, c in zip(seats, codes) if s == POLICY],
                   self.seats[USER]: [c for s, c in zip(seats, codes) if s == USER]}
        observations = {name: list(self.obs_log[s][row, :int(self.obs_count[s][row])])
                        for s, name in enumerate(self.seats)}
        terminated = bool(self.terminated[row])
        donation = float(self.donation[row]) if terminated else None
        reward = float(donation is not None and donation > 0)
        base = {"scenario_id": self.envs[row].scenario.id, "donation": None, "donated": False, "outcome_source": None}
        by_seat = [{"to_act": name, **base} for name in self.seats]
        infos = [by_seat[seat].copy() for seat in seats[1:]]
        end = {"donation": donation, "donated": reward > 0,
               "outcome_source": "decided_in_dialogue" if terminated else None}
        infos.append({"to_act": None, **base, **end})
        user_rejected = 0
        for step, error in self._errors_of(row):
            if seats[step] == POLICY:
                infos[step]["invalid_action"] = error
            else:
                user_rejected += 1
        return {"observations": observations, "actions": actions,
                "rewards": {self.seats[POLICY]: [0.0] * (n - 1) + [reward], self.seats[USER]: [0.0] * n},
                "total_reward": reward, "success": reward > 0, "infos": infos, "terminated": terminated,
                "truncated": not terminated, "user_rejected": user_rejected}

    def _errors_of(self, row: int) -> list[tuple[int, str]]:
        """Row ``row``'s rejected actions, ``[(step, why)]`` (grouped once per wave: ``errors`` is keyed by row and
        step)."""
        if self._errors_by_row is None:
            self._errors_by_row = {}
            for (r, step), error in self.errors.items():
                self._errors_by_row.setdefault(r, []).append((step, error))
        return self._errors_by_row.get(row, [])

    def finish(self) -> None:
        """Leave every env as stepping it would have, also when the wave stopped early (a policy or simulator
        raised): each env takes its row's progress (its transcript is rendered from the row when first read)."""
        for env in self.envs:
            env.sync()
