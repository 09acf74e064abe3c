"""What the PPO routes on both seats (TorchRL: :mod:`~simpop.integrations.torchrl_marl`, RLlib:
:mod:`~simpop.integrations.rllib_marl`) share: their settings (:class:`MarlConfig`, simpop's PPO settings extended),
what training returns, and the frozen-opponent rule.

:func:`evaluate` plays fixed seeds with frozen seats (trained, or uniformly random; the user seat may also be a
simulator), so each seat's learning is measured against a frozen opponent: the policy seat's success, the user
seat's ``KL(user || reference)``. :func:`gain` is the rule's test: a seat learned if it beats the uniformly random
seat by more than 2 standard errors. Needs torch only, so each library's environment can import it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import nn

import simpop
from simpop.integrations.marl import MarlView
from simpop.simulators.registry import build_simulator
from simpop.train.ppo import PPOConfig


@dataclass(frozen=True)
class MarlConfig(PPOConfig):
    """Both routes' settings: PPO's (:class:`simpop.train.ppo.PPOConfig`; an iteration collects ``n_envs * n_steps``
    frames), the env and the iterations (defaults: PersuasionAct-v0, about a minute on one core), and the user seat's
    when both seats learn. Defaults that differ from the trainer's: ``lr`` 3e-3, ``gamma`` 1 (the policy seat is paid
    the episode's outcome), ``vf_coef`` and ``max_grad_norm`` 1 (TorchRL's and RLlib's PPO defaults)."""

    lr: float = 3e-3
    gamma: float = 1.0
    vf_coef: float = 1.0
    max_grad_norm: float = 1.0
    env_id: str = "simpop/PersuasionAct-v0"
    iterations: int = 30
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    #: Both seats: the reference simulator spec whose reply distribution rewards the user seat.
    realism: str = "persuadee"
    #: The user seat may give the replies the reference gives with at least this probability.
    realism_floor: float = 0.02
    #: 1.0 with unnormalised advantages makes the user seat's objective -KL(user || reference).
    user_entropy: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        self._need(self.iterations >= 1, f"iterations must be >= 1, got {self.iterations}")
        self._need(0 < self.realism_floor < 1, f"realism_floor must be in (0, 1), got {self.realism_floor}")
        self._need(self.user_entropy >= 0, f"user_entropy must be >= 0, got {self.user_entropy}")

    @property
    def frames_per_batch(self) -> int:
        """Frames collected per iteration: ``n_steps`` of each of the ``n_envs`` envs."""
        return self.n_envs * self.n_steps


@dataclass
class Trained:
    """What training returns: per-iteration records and each trained seat's logits network (observation -> logits)."""

    history: list[dict[str, float]]
    policies: dict[str, nn.Module]

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


class Gain(NamedTuple):
    """The difference of two means (trained minus random, or random minus trained for a cost) and its standard
    error; the seat learned if the difference exceeds 2 SE."""

    difference: float
    se: float

    @property
    def learned(self) -> bool:
        """The rule: the difference exceeds 2 SE."""
        return self.difference > 2 * self.se

    def __str__(self) -> str:
        return f"{self.difference:+.3f} (SE {self.se:.3f}, {'learned' if self.learned else 'NOT learned'})"


def gain(better: np.ndarray, worse: np.ndarray) -> Gain:
    """How much ``better`` beats ``worse`` (per-episode results of two independent samples)."""
    se = np.sqrt(better.var(ddof=1) / len(better) + worse.var(ddof=1) / len(worse))
    return Gain(float(better.mean() - worse.mean()), float(se))
