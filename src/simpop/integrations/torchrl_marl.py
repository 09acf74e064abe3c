"""PPO with TorchRL, unmodified, on act-level simpop envs: both seats at once, or the policy seat against a population.

Both seats (:func:`train_both_seats`): the recipe of TorchRL's multi-agent PPO tutorial with one group per seat (the
seats have different observation and action spaces): TorchRL's own ``PettingZooWrapper`` around
:class:`~simpop.integrations.marl.MarlView`, a categorical actor (masked for the user seat) and a critic per seat,
``Collector``, ``GAE`` and ``ClipPPOLoss`` per seat. The policy seat is rewarded by the benchmark (``gamma`` 1 by
default: the episode's outcome). The user seat is rewarded by ``MarlView``'s realism reward, ``log p_reference(reply)``, per reply (``gamma`` 0: a
contextual bandit, so ending dialogues early neither pays nor costs) with entropy coefficient 1 and unnormalised
advantages: its objective is ``-KL(user || reference)`` at every turn.

The policy seat alone (:func:`train_policy_seat`): TorchRL's ``GymWrapper`` around simpop's single-agent view
``gymnasium.make(env_id, simulator=population)``, the same PPO.

:func:`evaluate` (from :mod:`~simpop.integrations.marl_ppo`, shared with RLlib's route, as are the settings) plays
fixed seeds with frozen seats, so each seat's learning is measured against a frozen opponent.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium

import simpop
from simpop.integrations.marl import MarlView
from simpop.integrations.marl_ppo import MarlConfig, Trained
from simpop.integrations.marl_ppo import Evaluation as Evaluation, evaluate as evaluate  # re-exported
from simpop.simulators.registry import build_simulator

try:
    import torch
    from tensordict import TensorDictBase
    from tensordict.nn import TensorDictModule, TensorDictSequential
    from torch import nn
    from torchrl.collectors import Collector
    from torchrl.envs import EnvBase, GymWrapper, PettingZooWrapper, SerialEnv
    from torchrl.envs.libs.pettingzoo import MarlGroupMapType
    from torchrl.modules import MaskedCategorical, ProbabilisticActor
    from torchrl.objectives import ClipPPOLoss, ValueEstimators
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise ImportError("simpop.integrations.torchrl_marl needs TorchRL: pip install 'simpop[torchrl]'") from error


@dataclass
class _Seat:
    """One trained seat: its keys' prefix (a group name, or () for a single-agent env) and its PPO parts."""

    prefix: tuple[str, ...]
    net: nn.Module
    actor: ProbabilisticActor
    loss: ClipPPOLoss
    optimizer: torch.optim.Optimizer

    def key(self, *names: str) -> tuple[str, ...]:
        return (*self.prefix, *names)


def _mlp(n_in: int, n_out: int, hidden: int) -> nn.Module:
    return nn.Sequential(nn.Linear(n_in, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(),
                         nn.Linear(hidden, n_out))


def _seat(env: EnvBase, prefix: tuple[str, ...], config: MarlConfig, *, gamma: float, entropy: float,
          normalize: bool, masked: bool) -> _Seat:
    n_obs = env.observation_spec[(*prefix, "observation")].shape[-1]
    action_spec = env.full_action_spec[(*prefix, "action")]
    net = _mlp(n_obs, action_spec.space.n, config.hidden_size)
    logits = TensorDictModule(net, in_keys=[(*prefix, "observation")], out_keys=[(*prefix, "logits")])
    in_keys = {"logits": (*prefix, "logits")} | ({"mask": (*prefix, "action_mask")} if masked else {})
    actor = ProbabilisticActor(logits, in_keys=in_keys, out_keys=[(*prefix, "action")],
                               distribution_class=MaskedCategorical if masked else torch.distributions.Categorical,
                               return_log_prob=True, log_prob_key=(*prefix, "sample_log_prob"), spec=action_spec)
    critic = TensorDictModule(_mlp(n_obs, 1, config.hidden_size), in_keys=[(*prefix, "observation")],
                              out_keys=[(*prefix, "state_value")])
    loss = ClipPPOLoss(actor, critic, clip_epsilon=config.clip_eps, entropy_coeff=entropy, critic_coeff=config.vf_coef,
                       normalize_advantage=normalize)
    # Every key per seat, the advantage and value target included: seats sharing them would train on each other's.
    # ``done`` serves as ``terminated``: the turn cap ends a dialogue with reward 0 (the env calls it truncation,
    # gymnasium's time limit) and observations carry the turn count, so nothing lies past it to bootstrap. GAE
    # bootstrapping there paid the policy seat the critic's guess for stalling to the cap: in joint training it
    # stopped asking for a donation and ended below a random persuader (docs/results/integrations.md).
    loss.set_keys(reward=(*prefix, "reward"), action=(*prefix, "action"), done=(*prefix, "done"),
                  terminated=(*prefix, "done"), value=(*prefix, "state_value"),
                  sample_log_prob=(*prefix, "sample_log_prob"), advantage=(*prefix, "advantage"),
                  value_target=(*prefix, "value_target"))
    loss.make_value_estimator(ValueEstimators.GAE, gamma=gamma, lmbda=config.gae_lambda)
    return _Seat(prefix, net, actor, loss, torch.optim.Adam(loss.parameters(), lr=config.lr))


def _train(env: EnvBase, seats: list[_Seat], config: MarlConfig,
           measure: Callable[[TensorDictBase], dict[str, float]], log: Callable[[str], Any]) -> list[dict[str, float]]:
    """PPO iterations over ``seats`` (each with its own loss and optimiser); one ``measure`` record per batch."""
    collector = Collector(env, TensorDictSequential(*(s.actor for s in seats)), frames_per_batch=config.frames_per_batch,
                          total_frames=config.frames_per_batch * config.iterations)
    history, start = [], time.perf_counter()
    try:
        for iteration, batch in enumerate(collector):
            record = {"iteration": float(iteration), **measure(batch)}
            for seat in seats:
                with torch.no_grad():
                    seat.loss.value_estimator(batch, params=seat.loss.critic_network_params,
                                              target_params=seat.loss.target_critic_network_params)
            flat = batch.reshape(-1)
            for _ in range(config.epochs):
                for indices in torch.randperm(flat.shape[0]).split(config.minibatch_size):
                    minibatch = flat[indices]
                    for seat in seats:
                        out = seat.loss(minibatch)
                        seat.optimizer.zero_grad()
                        (out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]).backward()
                        if config.max_grad_norm:
                            nn.utils.clip_grad_norm_(seat.loss.parameters(), config.max_grad_norm)
                        seat.optimizer.step()
            collector.update_policy_weights_()
            record["seconds"] = time.perf_counter() - start
            history.append(record)
            log(" ".join(f"{k}={v:.3f}" for k, v in record.items()))
    finally:
        collector.shutdown()
    return history


def make_marl_env(config: MarlConfig, seed: int | None = None) -> PettingZooWrapper:
    """The two-seat TorchRL env: TorchRL's PettingZoo wrapper around :class:`MarlView`, one group per seat."""
    view = MarlView(simpop.make(config.env_id, **config.env_kwargs), realism=config.realism,
                    floor=config.realism_floor)
    return PettingZooWrapper(view, group_map=MarlGroupMapType.ONE_GROUP_PER_AGENT, categorical_actions=True,
                             seed=config.seed if seed is None else seed)


def _batched(make: Callable[[int], EnvBase], config: MarlConfig) -> EnvBase:
    """``config.n_envs`` copies stepped in this process (``SerialEnv``), so each policy call acts for all of them."""
    return SerialEnv(config.n_envs, [lambda i=i: make(config.seed + i) for i in range(config.n_envs)])



def train_both_seats(config: MarlConfig | None = None, log: Callable[[str], Any] = print) -> Trained:
    """PPO on both seats at once. Records: ``user_realism`` (mean realism reward per user reply), ``policy_success``
    (mean outcome of the batch's finished episodes, against the co-trained user) and ``episode_steps``."""
    config = config or MarlConfig()
    torch.manual_seed(config.seed)
    dialogue = simpop.make(config.env_id, **config.env_kwargs)
    policy, user = dialogue.policy_seat, dialogue.user_seat
    env = _batched(lambda seed: make_marl_env(config, seed), config)
    # The policy seat samples from all its acts (off turn the env ignores them). Masking its off-turn steps to one
    # action made its success fall even against a frozen user (docs/results/integrations.md); unmasked, it learns.
    seats = {policy: _seat(env, (policy,), config, gamma=config.gamma, entropy=config.ent_coef, normalize=True,
                           masked=False),
             user: _seat(env, (user,), config, gamma=0.0, entropy=config.user_entropy, normalize=False, masked=True)}

    def measure(batch: TensorDictBase) -> dict[str, float]:
        replied = batch[user, "info", "acting"].reshape(-1).bool()
        realism = batch["next", user, "reward"].reshape(-1)[replied]
        done = batch["next", "done"].reshape(-1)
        outcomes = batch["next", policy, "reward"].reshape(-1)[done]
        return {"user_realism": float(realism.mean()), "policy_success": float(outcomes.mean()),
                "episode_steps": float(done.numel() / max(int(done.sum()), 1))}

    history = _train(env, list(seats.values()), config, measure, log)
    return Trained(history, {name: seat.net for name, seat in seats.items()})


def train_policy_seat(population: Any, config: MarlConfig | None = None,
                      log: Callable[[str], Any] = print) -> Trained:
    """PPO on the policy seat alone against ``population`` (simulator spec(s), or a factory returning a simulator: one
    per env copy), through TorchRL's ``GymWrapper`` on simpop's single-agent view. Records ``policy_success``."""
    config = config or MarlConfig()
    torch.manual_seed(config.seed)
    if isinstance(population, (str, list, tuple, dict)):
        specs = population
        population = lambda: build_simulator(specs, env=simpop.make(config.env_id, **config.env_kwargs))  # noqa: E731
    elif not callable(population):
        raise TypeError("population must be simulator spec(s) or a factory returning a simulator (each env copy "
                        f"needs its own), got {type(population).__name__}")

    def make(seed: int) -> GymWrapper:
        view = gymnasium.make(config.env_id, simulator=population, **config.env_kwargs)
        env = GymWrapper(view, categorical_action_encoding=True)
        env.set_seed(seed)
        return env

    env = _batched(make, config)
    seat = _seat(env, (), config, gamma=config.gamma, entropy=config.ent_coef, normalize=True, masked=False)

    def measure(batch: TensorDictBase) -> dict[str, float]:
        done = batch["next", "done"].reshape(-1)
        return {"policy_success": float(batch["next", "reward"].reshape(-1)[done].mean())}

    history = _train(env, [seat], config, measure, log)
    return Trained(history, {simpop.make(config.env_id).policy_seat: seat.net})
