"""PPO on the act-level P4G view: GAE, learning beyond a random policy, and SB3 PPO unmodified."""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest
import torch

import simpop.envs  # noqa: F401  (registers the ids with gymnasium)
from simpop.envs.persuasion.simulators import ActPersuadee
from simpop.simulators.population import Population
from simpop.train.ppo import PPOConfig, PPOTrainer, gae

ENV = "simpop/PersuasionAct-v0"


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_gae_by_hand():
    rewards = np.array([[0.0], [1.0]])
    values = np.array([[0.5], [0.2]])
    dones = np.array([[0.0], [1.0]])
    next_values = np.array([[0.2], [0.0]])
    adv, ret = gae(rewards, values, dones, next_values, gamma=0.9, lam=0.5)
    last = 1.0 - 0.2
    assert np.allclose(adv[:, 0], [0.9 * 0.2 - 0.5 + 0.9 * 0.5 * last, last])
    assert np.allclose(ret, adv + values)


def test_ppo_learns_beyond_random():
    trainer = PPOTrainer(ENV, config=PPOConfig(seed=0))
    random_return = trainer.evaluate(200, seed=1)  # the initial policy is near uniform
    metrics = trainer.train(12_000)
    assert all(np.isfinite(m["loss"]) for m in metrics)
    trained = trainer.evaluate(200, seed=1)
    assert trained > random_return + 0.1, (random_return, trained)


def test_config_validation():
    with pytest.raises(ValueError, match="clip_eps"):
        PPOConfig(clip_eps=0.0)
    with pytest.raises(ValueError, match="gamma"):
        PPOConfig(gamma=1.5)


def test_stable_baselines3_ppo_on_a_population_view():
    """The module docstring's recipe, unmodified (smaller budget)."""
    from stable_baselines3 import PPO

    population = Population([ActPersuadee(name="a"), ActPersuadee(temperature=0.7, name="b")])
    env = gymnasium.make(ENV, simulator=population)
    model = PPO("MlpPolicy", env, n_steps=256, batch_size=64, seed=0, device="cpu").learn(1024)
    obs, _ = env.reset(seed=3)
    action, _ = model.predict(obs, deterministic=True)
    assert env.action_space.contains(int(action))
    assert model.num_timesteps >= 1024
