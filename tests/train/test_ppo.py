"""PPO on the act-level P4G view: GAE, learning beyond a random policy, and SB3 PPO unmodified."""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest
import torch

import simpop.envs  # noqa: F401  (registers the ids with gymnasium)
from simpop.envs.persuasion.simulators import ActPersuadee
from simpop.rollout import RolloutEngine
from simpop.simulators.population import Population
from simpop.train import loop
from simpop.train.ppo import ActorCritic, PPOConfig, PPOTrainer, gae

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
    assert isinstance(trainer, loop.Trainer) and trainer.policy is trainer.model
    assert isinstance(trainer.training_simulator, ActPersuadee)
    metrics = loop.run(trainer, 24)  # 24 updates of 8 envs x 64 steps: 12,288 timesteps
    assert len(metrics) == 24 and trainer.update_count == 24
    assert all(np.isfinite(m["loss"]) for m in metrics)
    trained = trainer.evaluate(200, seed=1)
    assert trained > random_return + 0.1, (random_return, trained)


def test_step_checkpoint_round_trip_and_batch_policy():
    config = PPOConfig(n_envs=2, n_steps=8, minibatch_size=8, epochs=1, seed=4)
    trainer = PPOTrainer(ENV, config=config)
    metrics = trainer.step()
    assert trainer.update_count == 1
    assert {"loss", "policy_loss", "value_loss", "entropy", "clip_frac", "episode_return"} <= set(metrics)
    state = trainer.state_dict()
    other = PPOTrainer(ENV, config=PPOConfig(n_envs=2, n_steps=8, minibatch_size=8, epochs=1, seed=5))
    assert any(not torch.equal(a, b) for a, b in zip(state["model"].values(), other.model.state_dict().values()))
    other.load_state_dict(state)
    assert other.update_count == 1
    assert all(torch.equal(a, b) for a, b in zip(state["model"].values(), other.model.state_dict().values()))

    # The actor-critic is a Player: the rollout engine (and so panel evaluation) can run it.
    policy: ActorCritic = trainer.policy
    obs = [trainer.obs[0] * 0 + i / 10 for i in range(32)]
    sampled = []
    for _ in range(2):
        policy.reset_batch([None] * 32, [np.random.default_rng(2)] * 32)
        sampled.append(policy.act_batch(obs, list(range(32))))
    assert sampled[0] == sampled[1] and len(set(sampled[0])) > 1
    [t] = RolloutEngine(ENV, policy, ActPersuadee()).collect(1, seed=0)
    assert t.actions[t.policy_seat] and (t.terminated or t.truncated)


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
