"""PPO for act-level envs (clipped surrogate, GAE, value head), over the single-agent ``UserSeat`` view.

The policy seat of an act-level env (``Box`` observation, ``Discrete`` actions) with a simulator in
the user seat is a plain Gymnasium env, so PPO needs nothing dialogue-specific. One update:

1. **Rollout.** ``n_envs`` copies of the env (each with its own simulator, built by
   ``simulator_factory``) are stepped ``n_steps`` times with the current policy; finished episodes are
   reset at once. Rewards, values, log-probs and done flags are stored per step.
2. **Advantages.** Generalised advantage estimation:
   ``δ_t = r_t + γ V(s_{t+1}) (1 - done_t) - V(s_t)``, ``A_t = δ_t + γ λ (1 - done_t) A_{t+1}``;
   returns ``R_t = A_t + V(s_t)``. A truncated episode bootstraps from the value of its last state.
3. **Loss** for ``epochs`` passes over shuffled minibatches (advantages normalised per minibatch):
   ``-min(ρ A, clip(ρ, 1 ± ε) A) + vf_coef (V - R)² - ent_coef H(π)``, ``ρ = π(a|s) / π_old(a|s)``.

Stable-Baselines3 works on the same view unmodified — the documented way to use it::

    import gymnasium, simpop.envs                                    # registers the ids
    from stable_baselines3 import PPO
    from simpop.envs.persuasion.simulators import ActPersuadee
    from simpop.simulators.population import Population

    population = Population([ActPersuadee(name="a"), ActPersuadee(temperature=0.7, name="b")])
    env = gymnasium.make("simpop/PersuasionAct-v0", simulator=population)
    model = PPO("MlpPolicy", env, n_steps=256, batch_size=64, seed=0).learn(10_000)

(``tests/train/test_ppo.py`` runs exactly this.) :class:`PPOTrainer` is simpop's own, with the same
algorithm in one readable file and seeded rollouts; it is a :class:`~simpop.train.loop.Trainer`, so
:func:`simpop.train.loop.run` gives it metrics, checkpoints, resume and evaluation.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from simpop.seat import Player, Simulator, sample_rows
from simpop.validation import check_fields


@dataclass(frozen=True)
class PPOConfig:
    """PPO settings.

    Attributes:
        n_envs: Envs stepped side by side.
        n_steps: Steps per env per update (the batch is ``n_envs * n_steps`` transitions).
        gamma: Discount factor in [0, 1].
        gae_lambda: GAE λ in [0, 1].
        clip_eps: Ratio clip range, in (0, 1).
        epochs: Passes over each batch.
        minibatch_size: Transitions per optimiser step.
        lr: Adam learning rate.
        vf_coef: Weight of the value loss.
        ent_coef: Weight of the entropy bonus.
        max_grad_norm: Gradient-norm clip; 0 disables clipping.
        hidden_size: Width of the two tanh hidden layers of the policy and of the value network.
        seed: Seeds the weights, env resets and action sampling.
    """

    n_envs: int = 8
    n_steps: int = 64
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip_eps: float = 0.2
    epochs: int = 4
    minibatch_size: int = 128
    lr: float = 1e-3
    vf_coef: float = 0.5
    ent_coef: float = 0.01
    max_grad_norm: float = 0.5
    hidden_size: int = 64
    seed: int = 0

    def __post_init__(self) -> None:
        """Types by simpop's one validator (:func:`~simpop.validation.check_fields`), then ranges: one line naming the
        class and the field."""
        check_fields(self)
        for key in ("n_envs", "n_steps", "epochs", "minibatch_size", "hidden_size"):
            self._need(getattr(self, key) >= 1, f"{key} must be >= 1, got {getattr(self, key)}")
        for key in ("gamma", "gae_lambda"):
            self._need(0 <= getattr(self, key) <= 1, f"{key} must be in [0, 1], got {getattr(self, key)}")
        self._need(0 < self.clip_eps < 1, f"clip_eps must be in (0, 1), typically 0.2; got {self.clip_eps}")
        self._need(math.isfinite(self.lr) and self.lr > 0, f"lr must be > 0, got {self.lr}")
        for key in ("vf_coef", "ent_coef"):
            self._need(getattr(self, key) >= 0, f"{key} must be >= 0, got {getattr(self, key)}")
        self._need(self.max_grad_norm >= 0,
                   f"max_grad_norm must be >= 0 (0 disables clipping), got {self.max_grad_norm}")

    def _need(self, ok: bool, message: str) -> None:
        if not ok:
            raise ValueError(f"{type(self).__name__}: {message}")


class ActorCritic(nn.Module, Player):
    """Separate MLPs for the action logits and the state value."""

    def __init__(self, obs_dim: int, n_actions: int, hidden_size: int = 64, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)

        def mlp(out: int, gain: float) -> nn.Sequential:
            net = nn.Sequential(nn.Linear(obs_dim, hidden_size), nn.Tanh(), nn.Linear(hidden_size, hidden_size),
                                nn.Tanh(), nn.Linear(hidden_size, out))
            for layer in net:
                if isinstance(layer, nn.Linear):
                    nn.init.orthogonal_(layer.weight, math.sqrt(2))
                    nn.init.zeros_(layer.bias)
            head = net[-1]
            assert isinstance(head, nn.Linear)
            nn.init.orthogonal_(head.weight, gain)  # small policy head: start near uniform
            return net

        self.pi = mlp(n_actions, 0.01)
        self.v = mlp(1, 1.0)

    def forward(self, obs: torch.Tensor) -> tuple[torch.distributions.Categorical, torch.Tensor]:
        """The action distribution and the value of each observation ``[B, obs_dim]``."""
        return torch.distributions.Categorical(logits=self.pi(obs)), self.v(obs).squeeze(-1)

    def act_batch(self, observations: list[Any], slots: list[int]) -> list[int]:
        """One action per observation, sampled with its slot's generator: a :class:`~simpop.seat.Player`, so the
        rollout engine (panel evaluation) can run it."""
        obs = np.asarray(observations, dtype=np.float32).reshape(len(observations), -1)
        with torch.no_grad():
            probs = self(torch.as_tensor(obs))[0].probs.double().numpy()
        return sample_rows(probs, [self.rngs[slot] for slot in slots])


def gae(rewards: np.ndarray, values: np.ndarray, dones: np.ndarray, next_values: np.ndarray, gamma: float,
        lam: float) -> tuple[np.ndarray, np.ndarray]:
    """Advantages and returns, arrays ``[T, N]``; ``next_values[t]`` = V of the state after step ``t``
    (0 after a termination; the value of the truncated state after a truncation)."""
    advantages = np.zeros_like(rewards)
    last = np.zeros(rewards.shape[1])
    for t in reversed(range(rewards.shape[0])):
        delta = rewards[t] + gamma * next_values[t] - values[t]
        last = delta + gamma * lam * (1.0 - dones[t]) * last
        advantages[t] = last
    return advantages, advantages + values


class PPOTrainer:
    """PPO on the policy seat of an act-level env.

    Args:
        env_id: A registered act-level env id.
        simulator_factory: Builds the user seat's simulator (one per env copy); None uses the env's
            native simulator.
        config: Hyper-parameters.
        env_kwargs: Env constructor arguments.

    Attributes:
        model: The :class:`ActorCritic`.
        episode_returns: Returns of every finished episode, in order.
    """

    def __init__(self, env_id: str, simulator_factory: Callable[[], Simulator] | None = None,
                 config: PPOConfig | None = None, env_kwargs: dict[str, Any] | None = None):
        from gymnasium import spaces

        from simpop.envs.wrappers import make_user_seat

        self.config = c = config or PPOConfig()
        self.envs = [make_user_seat(env_id, simulator_factory() if simulator_factory else None, **(env_kwargs or {}))
                     for _ in range(c.n_envs)]
        obs_space, act_space = self.envs[0].observation_space, self.envs[0].action_space
        if not isinstance(obs_space, spaces.Box) or not isinstance(act_space, spaces.Discrete):
            raise TypeError(f"PPOTrainer needs a Box observation and Discrete actions; {env_id} has {obs_space} / "
                            f"{act_space} (text envs: use GRPO)")
        self.model = ActorCritic(int(np.prod(obs_space.shape)), int(act_space.n), c.hidden_size, c.seed)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=c.lr)
        self.generator = torch.Generator().manual_seed(c.seed)
        self.rng = np.random.default_rng(c.seed)
        self.obs = np.stack([env.reset(seed=int(self.rng.integers(2**31)))[0] for env in self.envs]).astype(np.float32)
        self._running = np.zeros(c.n_envs)
        self.episode_returns: list[float] = []
        self.update_count = 0

    @property
    def policy(self) -> ActorCritic:
        return self.model

    @property
    def training_simulator(self) -> Simulator:
        """The first env copy's simulator (every copy has one built the same way)."""
        return self.envs[0].simulator

    def step(self) -> dict[str, float]:
        """One update (collect ``n_envs * n_steps`` steps, then optimise); its metrics."""
        return self.update(self.collect())

    def act(self, observations: np.ndarray, deterministic: bool = False) -> np.ndarray:
        """Actions for a batch of observations (sampled, or the most likely with ``deterministic``)."""
        with torch.no_grad():
            probs = self.model(torch.as_tensor(np.asarray(observations, np.float32)))[0].probs
        if deterministic:
            return probs.argmax(-1).numpy()
        return torch.multinomial(probs, 1, generator=self.generator).squeeze(-1).numpy()

    def collect(self) -> dict[str, np.ndarray]:
        """``n_steps`` steps of every env with the current policy."""
        c = self.config
        shape = (c.n_steps, c.n_envs)
        buf: dict[str, np.ndarray] = {"obs": np.zeros((*shape, self.obs.shape[1]), np.float32), "actions": np.zeros(shape, np.int64),
               "logprobs": np.zeros(shape, np.float32), "values": np.zeros(shape, np.float32),
               "rewards": np.zeros(shape, np.float32), "dones": np.zeros(shape, np.float32),
               "next_values": np.zeros(shape, np.float32)}
        for t in range(c.n_steps):
            with torch.no_grad():
                dist, value = self.model(torch.as_tensor(self.obs))
                action = torch.multinomial(dist.probs, 1, generator=self.generator).squeeze(-1)
                logprob = dist.log_prob(action)
            buf["obs"][t], buf["actions"][t] = self.obs, action.numpy()
            buf["logprobs"][t], buf["values"][t] = logprob.numpy(), value.numpy()
            next_obs = np.zeros_like(self.obs)
            for i, env in enumerate(self.envs):
                obs, reward, terminated, truncated, _ = env.step(int(action[i]))
                buf["rewards"][t, i] = reward
                self._running[i] += reward
                if terminated or truncated:
                    buf["dones"][t, i] = 1.0
                    if truncated and not terminated:  # cut by the turn cap: bootstrap from the last state
                        with torch.no_grad():
                            buf["next_values"][t, i] = float(self.model(torch.as_tensor(
                                np.asarray(obs, np.float32)[None]))[1])
                    self.episode_returns.append(float(self._running[i]))
                    self._running[i] = 0.0
                    obs, _ = env.reset(seed=int(self.rng.integers(2**31)))
                next_obs[i] = obs
            with torch.no_grad():
                next_value = self.model(torch.as_tensor(next_obs))[1].numpy()
            live = buf["dones"][t] == 0
            buf["next_values"][t] = np.where(live, next_value, buf["next_values"][t])
            self.obs = next_obs
        return buf

    def update(self, buf: dict[str, np.ndarray]) -> dict[str, float]:
        """``epochs`` passes of minibatch PPO on a collected buffer; the update's metrics."""
        c = self.config
        advantages, returns = gae(buf["rewards"], buf["values"], buf["dones"], buf["next_values"], c.gamma,
                                  c.gae_lambda)
        flat = {k: torch.as_tensor(v.reshape(-1, *v.shape[2:])) for k, v in buf.items()}
        adv_all, ret_all = torch.as_tensor(advantages.reshape(-1)), torch.as_tensor(returns.reshape(-1))
        n = adv_all.shape[0]
        sums = {"loss": 0.0, "policy_loss": 0.0, "value_loss": 0.0, "entropy": 0.0, "clip_frac": 0.0}
        steps = 0
        for _ in range(c.epochs):
            order = torch.randperm(n, generator=self.generator)
            for begin in range(0, n, c.minibatch_size):
                idx = order[begin:begin + c.minibatch_size]
                dist, value = self.model(flat["obs"][idx])
                logprob = dist.log_prob(flat["actions"][idx])
                ratio = torch.exp(logprob - flat["logprobs"][idx])
                adv = adv_all[idx]
                if adv.numel() > 1:
                    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
                policy_loss = -torch.minimum(ratio * adv, torch.clamp(ratio, 1 - c.clip_eps, 1 + c.clip_eps) * adv).mean()
                value_loss = (value - ret_all[idx]).pow(2).mean()
                entropy = dist.entropy().mean()
                loss = policy_loss + c.vf_coef * value_loss - c.ent_coef * entropy
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                if c.max_grad_norm > 0:
                    nn.utils.clip_grad_norm_(self.model.parameters(), c.max_grad_norm)
                self.optimizer.step()
                steps += 1
                for key, value_ in (("loss", loss), ("policy_loss", policy_loss), ("value_loss", value_loss),
                                    ("entropy", entropy)):
                    sums[key] += float(value_.detach())
                sums["clip_frac"] += float(((ratio - 1).abs() > c.clip_eps).float().mean())
        self.update_count += 1
        metrics = {k: v / steps for k, v in sums.items()}
        recent = self.episode_returns[-100:]
        metrics["episode_return"] = float(np.mean(recent)) if recent else math.nan
        return metrics

    def evaluate(self, episodes: int, seed: int = 0, deterministic: bool = False) -> float:
        """Mean return of ``episodes`` fresh episodes on the first env copy (its simulator)."""
        env, rng = self.envs[0], np.random.default_rng(seed)
        total = 0.0
        for _ in range(episodes):
            obs, _ = env.reset(seed=int(rng.integers(2**31)))
            done = False
            while not done:
                action = int(self.act(np.asarray(obs, np.float32)[None], deterministic)[0])
                obs, reward, terminated, truncated, _ = env.step(action)
                total += reward
                done = terminated or truncated
        self.obs[0] = env.reset(seed=int(self.rng.integers(2**31)))[0]
        self._running[0] = 0.0
        return total / episodes

    def state_dict(self) -> dict[str, Any]:
        """The model, optimiser, update count and config, for checkpoints."""
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "update_count": self.update_count, "config": dataclasses.asdict(self.config)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.update_count = int(state["update_count"])
