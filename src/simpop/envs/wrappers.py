"""Single-agent views of dialogue envs: bind a simulator (or population) to the user seat.

``UserSeat(env, simulator)`` is a ``gymnasium.Env`` for the policy seat: every time the user seat is
to act, the simulator answers, so any single-agent trainer (simpop's, Stable-Baselines3, TRL) can
train against a population without knowing it is there.
"""

from __future__ import annotations

from typing import Any

import gymnasium

from simpop.envs.dialogue import DialogueEnv
from simpop.envs.registration import load, make, spec
from simpop.seat import Simulator


class UserSeat(gymnasium.Env):
    """The policy seat of ``env`` as a Gymnasium env, with ``simulator`` in the user seat.

    Rewards the policy seat receives during the simulator's turns are added to the step's reward.
    The simulator's random generator comes from the env's reset seed, so a seeded reset makes the
    whole episode reproducible.
    """

    def __init__(self, env: DialogueEnv, simulator: Simulator):
        self.env = env
        self.simulator = simulator
        self.seat = env.policy_seat
        self.observation_space = env.observation_space(self.seat)
        self.action_space = env.action_space(self.seat)
        self.metadata = dict(env.metadata)
        self.render_mode = env.render_mode
        self._return = 0.0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        observations, infos = self.env.reset(seed=seed, options=options)
        self._return = 0.0
        self.simulator.reset(self.env.scenario, self.env.user_rng())
        obs, reward, terminated, truncated, info = self._advance(observations, infos)
        if terminated or truncated:
            raise RuntimeError("the episode ended before the policy seat acted once")
        return obs, info

    def step(self, action: Any):
        if self.env.done:
            raise RuntimeError("step() called on a finished episode; call reset() first")
        observations, rewards, terminations, truncations, infos = self.env.step({self.seat: action})
        self._return += rewards[self.seat]
        obs, extra, terminated, truncated, info = self._advance(
            observations, infos, terminations[self.seat], truncations[self.seat])
        return obs, float(rewards[self.seat] + extra), terminated, truncated, info

    def _advance(self, observations, infos, terminated: bool = False, truncated: bool = False):
        """Let the simulator act until the policy seat is to act or the episode ends."""
        user = self.env.user_seat
        reward = 0.0
        while not (terminated or truncated) and self.env.to_act == user:
            action = self.simulator.act(observations[user])
            observations, rewards, terminations, truncations, infos = self.env.step({user: action})
            reward += rewards[self.seat]
            terminated, truncated = terminations[self.seat], truncations[self.seat]
        self._return += reward
        if terminated or truncated:
            self.simulator.feedback([0], [self._return])
        return observations[self.seat], reward, terminated, truncated, infos[self.seat]

    def render(self):
        return self.env.render()

    def close(self) -> None:
        self.env.close()


def make_user_seat(env_id: str, simulator: Simulator | None = None, **kwargs: Any) -> UserSeat:
    """Gymnasium entry point: the registered env's policy seat, with ``simulator`` (default: native)."""
    env = make(env_id, **kwargs)
    if simulator is None:
        factory = spec(env_id).default_simulator
        if factory is None:
            raise ValueError(f"{env_id} has no native simulator; pass simulator=... to gymnasium.make")
        simulator = load(factory)(env)
    return UserSeat(env, simulator)
