"""Stable-Baselines3 PPO trains on the act-level persuader view, unmodified, and beats a random persuader."""

from __future__ import annotations

import time

import gymnasium
import numpy as np
import torch

import simpop  # noqa: F401  (registers the ids with gymnasium)

from stable_baselines3 import PPO  # noqa: E402


def success_rate(choose, episodes: int = 200) -> float:
    env = gymnasium.make("simpop/PersuasionAct-v0")
    wins = 0.0
    for episode in range(episodes):
        obs, _ = env.reset(seed=100_000 + episode)
        rng = np.random.default_rng(episode)
        done = False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(choose(obs, rng))
            done = terminated or truncated
        wins += reward
    return wins / episodes


def test_ppo_beats_a_random_persuader():
    torch.set_num_threads(1)  # reproducible and polite on a shared CPU
    start = time.perf_counter()
    model = PPO("MlpPolicy", gymnasium.make("simpop/PersuasionAct-v0"), n_steps=256, batch_size=128, n_epochs=10,
                learning_rate=3e-3, gamma=1.0, seed=0, device="cpu", verbose=0)
    model.learn(total_timesteps=12_288)
    trained = success_rate(lambda obs, rng: int(model.predict(obs, deterministic=True)[0]))
    random = success_rate(lambda obs, rng: int(rng.integers(14)))
    print(f"PPO {trained:.3f} vs random {random:.3f} in {time.perf_counter() - start:.0f}s")
    assert trained >= random + 0.15
