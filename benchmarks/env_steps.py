"""Env steps per second of both P4G levels, with the native persuadee in the user seat (UserSeat).

The persuader is random at the act level and the corpus-like reference persuader realised as text at
the text level. "env steps" count both seats' turns; "policy steps" only the persuader's.
"""

from __future__ import annotations

import time

import numpy as np

from simpop.envs.persuasion.acts import render_persuader
from simpop.envs.persuasion.model import reference_persuader
from simpop.envs.wrappers import make_user_seat


def measure(env_id: str, seconds: float = 3.0) -> tuple[float, float, int]:
    """(env steps/s, policy steps/s, episodes) over about ``seconds`` of rollouts."""
    env = make_user_seat(env_id)
    rng = np.random.default_rng(0)
    env_steps = policy_steps = episodes = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        env.reset(seed=episodes)
        script = reference_persuader(rng, env.env.max_turns)
        done, t = False, 0
        while not done:
            action = (render_persuader(script[t], rng) if env_id == "simpop/Persuasion-v0"
                      else int(rng.integers(env.action_space.n)))
            _, _, terminated, truncated, _ = env.step(action)
            done, t = terminated or truncated, t + 1
        env_steps += env.env.steps
        policy_steps += t
        episodes += 1
    elapsed = time.perf_counter() - start
    return env_steps / elapsed, policy_steps / elapsed, episodes


if __name__ == "__main__":
    for env_id in ("simpop/PersuasionAct-v0", "simpop/Persuasion-v0"):
        env_rate, policy_rate, episodes = measure(env_id)
        print(f"{env_id}: {env_rate:,.0f} env steps/s ({policy_rate:,.0f} policy steps/s, {episodes} episodes)")
