"""PPO with TorchRL, unmodified, on act-level simpop envs: both seats at once, or the policy seat against a population.

Both seats (:func:`train_both_seats`): the recipe of TorchRL's multi-agent PPO tutorial with one group per seat (the
seats have different observation and action spaces): TorchRL's own ``PettingZooWrapper`` around
:class:`~simpop.integrations.marl.MarlView`, a categorical actor (masked for the user seat) and a critic per seat,
``Collector``, ``GAE`` and ``ClipPPOLoss`` per seat. The policy seat is rewarded by the benchmark (``gamma`` 1: the episode's outcome). The
user seat is rewarded by ``MarlView``'s realism reward, ``log p_reference(reply)``, per reply (``gamma`` 0: a
contextual bandit, so ending dialogues early neither pays nor costs) with entropy coefficient 1 and unnormalised
advantages: its objective is ``-KL(user || reference)`` at every turn.

The policy seat alone (:func:`train_policy_seat`): TorchRL's ``GymWrapper`` around simpop's single-agent view
``gymnasium.make(env_id, simulator=population)``, the same PPO.

:func:`evaluate` plays fixed seeds with frozen seats (trained, or uniformly random; the user seat may also be a
simulator), so each seat's learning is measured against a frozen opponent: the policy seat's success, the user
seat's ``KL(user || reference)``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gymnasium
import numpy as np

import simpop
from simpop.integrations.marl import MarlView
from simpop.simulators.registry import build_simulator
from simpop.validation import check_fields

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
class PPOConfig:
    """PPO settings shared by both entry points (defaults: PersuasionAct-v0, about a minute on one core)."""

    env_id: str = "simpop/PersuasionAct-v0"
    iterations: int = 30
    frames_per_batch: int = 512
    epochs: int = 4
    minibatch_size: int = 128
    lr: float = 3e-3
    lmbda: float = 0.95
    clip_epsilon: float = 0.2
    policy_entropy: float = 0.01
    hidden: int = 64
    seed: int = 0
    #: Env copies stepped together (one batched policy call per step of all of them).
    envs: int = 8
    env_kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        """Types by simpop's one validator (:func:`~simpop.validation.check_fields`), then ranges."""
        check_fields(self)
        for key in ("iterations", "frames_per_batch", "epochs", "minibatch_size", "hidden", "envs"):
            self._need(getattr(self, key) >= 1, f"{key} must be >= 1, got {getattr(self, key)}")
        self._need(self.lr > 0, f"lr must be > 0, got {self.lr}")
        self._need(0 <= self.lmbda <= 1, f"lmbda must be in [0, 1], got {self.lmbda}")
        self._need(0 < self.clip_epsilon < 1, f"clip_epsilon must be in (0, 1), typically 0.2; got {self.clip_epsilon}")
        self._need(self.policy_entropy >= 0, f"policy_entropy must be >= 0, got {self.policy_entropy}")

    def _need(self, ok: bool, message: str) -> None:
        if not ok:
            raise ValueError(f"{type(self).__name__}: {message}")


@dataclass
class MarlConfig(PPOConfig):
    """Both seats: ``realism`` is the reference simulator spec whose reply distribution rewards the user seat."""

    realism: str = "persuadee"
    #: The user seat may give the replies the reference gives with at least this probability.
    realism_floor: float = 0.02
    #: 1.0 with unnormalised advantages makes the user seat's objective -KL(user || reference).
    user_entropy: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        self._need(0 < self.realism_floor < 1, f"realism_floor must be in (0, 1), got {self.realism_floor}")
        self._need(self.user_entropy >= 0, f"user_entropy must be >= 0, got {self.user_entropy}")


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


def _seat(env: EnvBase, prefix: tuple[str, ...], config: PPOConfig, *, gamma: float, entropy: float,
          normalize: bool, masked: bool, clip_epsilon: float) -> _Seat:
    n_obs = env.observation_spec[(*prefix, "observation")].shape[-1]
    action_spec = env.full_action_spec[(*prefix, "action")]
    net = _mlp(n_obs, action_spec.space.n, config.hidden)
    logits = TensorDictModule(net, in_keys=[(*prefix, "observation")], out_keys=[(*prefix, "logits")])
    in_keys = {"logits": (*prefix, "logits")} | ({"mask": (*prefix, "action_mask")} if masked else {})
    actor = ProbabilisticActor(logits, in_keys=in_keys, out_keys=[(*prefix, "action")],
                               distribution_class=MaskedCategorical if masked else torch.distributions.Categorical,
                               return_log_prob=True, log_prob_key=(*prefix, "sample_log_prob"), spec=action_spec)
    critic = TensorDictModule(_mlp(n_obs, 1, config.hidden), in_keys=[(*prefix, "observation")],
                              out_keys=[(*prefix, "state_value")])
    loss = ClipPPOLoss(actor, critic, clip_epsilon=clip_epsilon, entropy_coeff=entropy,
                       normalize_advantage=normalize)
    # Every key per seat, the advantage and value target included: seats sharing them would train on each other's.
    # ``done`` serves as ``terminated``: the turn cap ends a dialogue with reward 0 (the env calls it truncation,
    # gymnasium's time limit) and observations carry the turn count, so nothing lies past it to bootstrap. GAE
    # bootstrapping there paid the policy seat the critic's guess for stalling to the cap: in joint training it
    # stopped asking for a donation and ended below a random persuader (docs/integrations.md).
    loss.set_keys(reward=(*prefix, "reward"), action=(*prefix, "action"), done=(*prefix, "done"),
                  terminated=(*prefix, "done"), value=(*prefix, "state_value"),
                  sample_log_prob=(*prefix, "sample_log_prob"), advantage=(*prefix, "advantage"),
                  value_target=(*prefix, "value_target"))
    loss.make_value_estimator(ValueEstimators.GAE, gamma=gamma, lmbda=config.lmbda)
    return _Seat(prefix, net, actor, loss, torch.optim.Adam(loss.parameters(), lr=config.lr))


def _train(env: EnvBase, seats: list[_Seat], config: PPOConfig,
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
                        nn.utils.clip_grad_norm_(seat.loss.parameters(), 1.0)
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


def _batched(make: Callable[[int], EnvBase], config: PPOConfig) -> EnvBase:
    """``config.envs`` copies stepped in this process (``SerialEnv``), so each policy call acts for all of them."""
    return SerialEnv(config.envs, [lambda i=i: make(config.seed + i) for i in range(config.envs)])


@dataclass
class Trained:
    """What training returns: per-iteration records and each trained seat's logits network (observation -> logits)."""

    history: list[dict[str, float]]
    policies: dict[str, nn.Module]


def train_both_seats(config: MarlConfig | None = None, log: Callable[[str], Any] = print) -> Trained:
    """PPO on both seats at once. Records: ``user_realism`` (mean realism reward per user reply), ``policy_success``
    (mean outcome of the batch's finished episodes, against the co-trained user) and ``episode_steps``."""
    config = config or MarlConfig()
    torch.manual_seed(config.seed)
    dialogue = simpop.make(config.env_id, **config.env_kwargs)
    policy, user = dialogue.policy_seat, dialogue.user_seat
    env = _batched(lambda seed: make_marl_env(config, seed), config)
    # The policy seat samples from all its acts (off turn the env ignores them). Masking its off-turn steps to one
    # action made its success fall even against a frozen user (docs/integrations.md); unmasked, it learns.
    seats = {policy: _seat(env, (policy,), config, gamma=1.0, entropy=config.policy_entropy, normalize=True,
                           masked=False, clip_epsilon=config.clip_epsilon),
             user: _seat(env, (user,), config, gamma=0.0, entropy=config.user_entropy, normalize=False,
                         masked=True, clip_epsilon=config.clip_epsilon)}

    def measure(batch: TensorDictBase) -> dict[str, float]:
        replied = batch[user, "info", "acting"].reshape(-1).bool()
        realism = batch["next", user, "reward"].reshape(-1)[replied]
        done = batch["next", "done"].reshape(-1)
        outcomes = batch["next", policy, "reward"].reshape(-1)[done]
        return {"user_realism": float(realism.mean()), "policy_success": float(outcomes.mean()),
                "episode_steps": float(done.numel() / max(int(done.sum()), 1))}

    history = _train(env, list(seats.values()), config, measure, log)
    return Trained(history, {name: seat.net for name, seat in seats.items()})


def train_policy_seat(population: Any, config: PPOConfig | None = None,
                      log: Callable[[str], Any] = print) -> Trained:
    """PPO on the policy seat alone against ``population`` (simulator spec(s), or a factory returning a simulator: one
    per env copy), through TorchRL's ``GymWrapper`` on simpop's single-agent view. Records ``policy_success``."""
    config = config or PPOConfig()
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
    seat = _seat(env, (), config, gamma=1.0, entropy=config.policy_entropy, normalize=True, masked=False,
                 clip_epsilon=config.clip_epsilon)

    def measure(batch: TensorDictBase) -> dict[str, float]:
        done = batch["next", "done"].reshape(-1)
        return {"policy_success": float(batch["next", "reward"].reshape(-1)[done].mean())}

    history = _train(env, [seat], config, measure, log)
    return Trained(history, {simpop.make(config.env_id).policy_seat: seat.net})


@dataclass
class Evaluation:
    """Per-episode results of :func:`evaluate` (one entry per seed)."""

    #: The policy seat's outcome (P4G: 1.0 if the persuadee donated).
    success: np.ndarray
    #: The mean over the user seat's turns of ``KL(user || reference)``, the user seat's training objective
    #: negated (NaN when a simulator plays the user).
    user_kl: np.ndarray


def evaluate(policy: nn.Module | None, user: str | nn.Module | None, config: MarlConfig | None = None,
             episodes: int = 300, seed: int = 10_000) -> Evaluation:
    """Play ``episodes`` dialogues on seeds ``seed ..`` with frozen seats: the policy seat's acts sampled from
    ``policy``'s logits (uniformly at random when None), the user seat played by ``user``: a simulator spec, a
    trained user seat's logits network or None (uniformly random), the latter two within :class:`MarlView`'s realism
    mask, as in training."""
    config = config or MarlConfig()
    view = MarlView(simpop.make(config.env_id, **config.env_kwargs), realism=config.realism,
                    floor=config.realism_floor)
    dialogue = view.dialogue
    simulator = build_simulator(user, env=dialogue) if isinstance(user, str) else None
    user_net = None if isinstance(user, str) else user
    generator = torch.Generator().manual_seed(seed)
    success, user_kl = np.zeros(episodes), np.full(episodes, np.nan)

    def distribution(net: nn.Module | None, observation: np.ndarray, mask: np.ndarray) -> torch.Tensor:
        with torch.no_grad():
            logits = (torch.zeros(len(mask)) if net is None else net(torch.as_tensor(observation))).clone()
        logits[~torch.as_tensor(mask, dtype=torch.bool)] = -torch.inf
        return torch.softmax(logits, -1)

    for episode in range(episodes):
        observations, infos = view.reset(seed=seed + episode)
        if simulator is not None:
            simulator.reset(dialogue.scenario, dialogue.user_rng())
        divergences = []
        while not dialogue.done:
            seat = dialogue.to_act
            assert seat is not None  # a live dialogue always has a seat to act
            if seat == dialogue.user_seat and simulator is not None:
                action = simulator.act(observations[seat])
            else:
                probs = distribution(policy if seat == dialogue.policy_seat else user_net, observations[seat],
                                     infos[seat]["action_mask"])
                if seat == dialogue.user_seat:
                    support = probs > 0
                    reference = torch.tensor([view.reference.get(a, 0.0) for a in range(len(probs))])
                    divergences.append(float((probs[support] * (probs[support].log()
                                                                - reference[support].log())).sum()))
                action = int(torch.multinomial(probs, 1, generator=generator))
            observations, rewards, _, _, infos = view.step({seat: action})
        success[episode] = rewards[dialogue.policy_seat]
        if divergences:
            user_kl[episode] = np.mean(divergences)
    return Evaluation(success, user_kl)
