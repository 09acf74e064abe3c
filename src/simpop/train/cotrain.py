"""Co-training: the policy and trainable simulator(s) learn from the same rollouts.

One co-training update:

1. **Collect** one GRPO batch (``group_size`` dialogues on each of ``scenarios_per_update``
   scenarios) against the training simulator: a single trainable simulator, or for *population
   co-training* a :class:`~simpop.simulators.population.Population` of K trainable simulators plus a
   :class:`~simpop.simulators.population.CheckpointPool` of their recent frozen snapshots (each
   dialogue is driven by the pool with probability ``pool_sample_prob``, else by one of the K
   simulators uniformly).
2. **Policy**: the policy trainer's update on that batch (:meth:`~simpop.train.grpo.GRPOTrainer.update`,
   any GRPO variant).
3. **Simulators**: each trainable simulator ``k`` takes ``sim_epochs`` optimiser steps on the
   dialogues it drove itself (its own records, :mod:`simpop.simulators.trainable`).
4. Every ``snapshot_every`` updates, each trainable simulator's snapshot joins the pool.

**The simulator objective (binary success).** A GRPO group only carries signal when its outcomes
differ, and a binary outcome's variance ``p (1 - p)`` is largest at ``p = 1/2``. So simulator ``k``
maximises

    J_k(θ) = -(p_k(θ) - τ)² - β · KL(π_θ || π_base),      τ = target_success (0.5)

where ``p_k`` is the policy's success rate against it and the KL is that of a whole dialogue (summed
over its reply acts, or tokens) on the states it visited, so that both terms are per-dialogue
quantities on the same scale. By the score-function identity, with ``s_i`` the success of its
dialogue ``i`` and ``log π_θ(i)`` the summed log-probability of its own replies in that dialogue,

    ∇ -(p_k - τ)² = -2 (p_k - τ) ∇p_k = 2 (τ - p_k) E[(s_i - b) ∇ log π_θ(i)]   (any baseline b),

estimated on its N dialogues with the batch success ``p̄`` for both ``p_k`` and ``b``: each dialogue
gets the advantage

    A_i = 2 (τ - p̄) (s_i - p̄)                                   (:func:`simulator_advantages`)

and the loss is ``-mean_i(A_i log π_θ(i)) + β · mean_i KL_i`` (``KL_i`` summed over dialogue ``i``).
When the policy wins too often (``p̄ > τ``), replies that led to a success get ``A_i < 0`` and become
less likely (the simulator becomes harder exactly where the policy exploits it), and the reverse
when ``p̄ < τ``; at ``p̄ = τ`` the outcome term vanishes and only the KL anchor acts. (A per-dialogue reward such as
``-(s_i - τ)²`` would not work: it equals 1/4 for every binary outcome.) Using ``p̄`` as the
baseline and as ``p_k`` makes the estimate slightly biased for small N (``p̄`` contains ``s_i``);
the bias is ``O(1/N)``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from simpop.agents.policy import ActPolicy, LLMPolicy
from simpop.seat import Simulator, Trainable
from simpop.simulators.population import CheckpointPool, Population
from simpop.train.grpo import Batch, GRPOTrainer


@dataclass(frozen=True)
class CoTrainConfig:
    """Co-training settings (the policy's own settings are a :class:`~simpop.train.grpo.GRPOConfig`).

    Attributes:
        target_success: The batch success rate each trainable simulator steers towards, in (0, 1);
            0.5 maximises the variance of binary outcomes (informative GRPO groups).
        sim_lr: Adam learning rate of the simulators' parameters.
        sim_kl_coef: Weight β of the KL anchor to the base simulator (keeps it plausible); >= 0.
        sim_epochs: Optimiser steps per collected batch for each simulator.
        sim_max_grad_norm: Gradient-norm clip of each simulator step; 0 disables clipping.
        population_size: Number K of trainable simulators (1 = plain co-training).
        pool_size: Capacity of the checkpoint pool of frozen snapshots (0 = no pool).
        pool_sample_prob: Probability that a dialogue is driven by the pool rather than one of the K
            trainable simulators; must be 0 without a pool and < 1 with one.
        pool_recency: Sampling weight decay per step of snapshot age inside the pool, in (0, 1].
        snapshot_every: Updates between snapshots of the trainable simulators into the pool.
    """

    target_success: float = 0.5
    sim_lr: float = 0.05
    sim_kl_coef: float = 0.1
    sim_epochs: int = 1
    sim_max_grad_norm: float = 0.0
    population_size: int = 1
    pool_size: int = 0
    pool_sample_prob: float = 0.0
    pool_recency: float = 0.7
    snapshot_every: int = 5

    def __post_init__(self) -> None:
        def need(ok: bool, message: str) -> None:
            if not ok:
                raise ValueError(f"CoTrainConfig: {message}")

        need(0 < self.target_success < 1, f"target_success must be in (0, 1) (0.5 keeps binary outcomes most "
                                          f"informative), got {self.target_success}")
        need(math.isfinite(self.sim_lr) and self.sim_lr > 0, f"sim_lr must be > 0, got {self.sim_lr}")
        need(self.sim_kl_coef >= 0, f"sim_kl_coef must be >= 0 (0 drops the KL anchor), got {self.sim_kl_coef}")
        need(self.sim_epochs >= 1, f"sim_epochs must be >= 1, got {self.sim_epochs}")
        need(self.sim_max_grad_norm >= 0, f"sim_max_grad_norm must be >= 0 (0 disables clipping), "
                                          f"got {self.sim_max_grad_norm}")
        need(self.population_size >= 1, f"population_size must be >= 1, got {self.population_size}")
        need(self.pool_size >= 0, f"pool_size must be >= 0 (0 = no pool), got {self.pool_size}")
        need(0 <= self.pool_sample_prob < 1, f"pool_sample_prob must be in [0, 1), got {self.pool_sample_prob}")
        need(self.pool_size > 0 or self.pool_sample_prob == 0,
             f"pool_sample_prob={self.pool_sample_prob} needs a pool: set pool_size >= 1 or pool_sample_prob=0")
        need(self.pool_size == 0 or self.pool_sample_prob > 0,
             "a pool is only sampled with pool_sample_prob > 0: set it (e.g. 0.25) or pool_size=0")
        need(0 < self.pool_recency <= 1, f"pool_recency must be in (0, 1], got {self.pool_recency}")
        need(self.snapshot_every >= 1, f"snapshot_every must be >= 1, got {self.snapshot_every}")


def simulator_objective(successes: Sequence[float], target: float = 0.5) -> float:
    """``-(p̄ - target)²`` for a batch's successes (0 is best)."""
    return -(float(np.mean(successes)) - target) ** 2


def simulator_advantages(successes: Sequence[float], target: float = 0.5) -> np.ndarray:
    """Per-dialogue advantages ``2 (target - p̄)(s_i - p̄)`` of the simulator (module docstring)."""
    s = np.asarray(successes, dtype=float)
    if s.ndim != 1 or s.size == 0:
        raise ValueError(f"successes must be a non-empty 1-D sequence, got shape {s.shape}")
    mean = s.mean()
    return 2.0 * (target - mean) * (s - mean)


def training_population(simulators: Sequence[Trainable], config: CoTrainConfig,
                       snapshots: Sequence[tuple[int, int, dict[str, Any]]] = ()
                       ) -> tuple[Simulator, CheckpointPool | None]:
    """The simulator the policy trains against, and the pool (None without one).

    One simulator and no pool: the simulator itself. Otherwise a weighted :class:`Population` of the
    K simulators (weight ``(1 - pool_sample_prob) / K`` each) and the pool (``pool_sample_prob``),
    which holds frozen copies of ``snapshots`` = ``(simulator index, step, state_dict)``, oldest first.
    """
    if len(simulators) != config.population_size:
        raise ValueError(f"got {len(simulators)} trainable simulators for population_size={config.population_size}")
    if config.pool_size == 0 and len(simulators) == 1:
        return simulators[0], None  # type: ignore[return-value]
    members: list[Simulator] = list(simulators)  # type: ignore[arg-type]
    weights = [(1.0 - config.pool_sample_prob) / len(simulators)] * len(simulators)
    pool = None
    if config.pool_size > 0:
        if not snapshots:
            raise ValueError("a pool needs at least one snapshot to sample from")
        pool = CheckpointPool(max_size=config.pool_size, recency=config.pool_recency)
        for index, step, state in snapshots:
            frozen = simulators[index].snapshot()  # type: ignore[attr-defined]
            frozen.load_state_dict(state)
            pool.add_snapshot(frozen, step)
        members.append(pool)
        weights.append(config.pool_sample_prob)
    return Population(members, weights, rule="weighted", min_probability=0.0, name="cotrain-population"), pool


class CoTrainer:
    """Co-training of a policy (any GRPO variant) and trainable simulators on the same rollouts; a
    :class:`~simpop.train.loop.Trainer`.

    Args:
        policy_trainer: The policy's trainer (its simulator is replaced by the co-trained population).
        simulators: ``config.population_size`` trainable simulators with distinct names.
        config: Co-training settings.

    Attributes:
        simulator: What the policy trains against (see :func:`training_population`).
        pool: The checkpoint pool, or None.
        policy_trainer: The policy's trainer.
        update_count: Co-training updates completed.
    """

    def __init__(self, policy_trainer: GRPOTrainer, simulators: Sequence[Trainable], config: CoTrainConfig):
        if len({s.name for s in simulators}) != len(simulators):
            raise ValueError("trainable simulators need distinct names (records are matched by name)")
        if any(s.frozen for s in simulators):
            raise ValueError("a frozen snapshot cannot be co-trained; pass the trainable simulators")
        self.config = config
        self.simulators = list(simulators)
        # The pool starts with each simulator as it is now (the base simulator), so it is never empty.
        self._snapshots = ([(i, 0, s.state_dict()) for i, s in enumerate(self.simulators)]
                           if config.pool_size else [])
        self.simulator, self.pool = training_population(self.simulators, config, self._snapshots)
        self.policy_trainer = policy_trainer
        policy_trainer.use_simulator(self.simulator)
        self.optimizers = [torch.optim.Adam(s.parameters(), lr=config.sim_lr) for s in self.simulators]
        self.update_count = 0

    @property
    def policy(self) -> ActPolicy | LLMPolicy:
        return self.policy_trainer.policy

    @property
    def training_simulator(self) -> Simulator:
        return self.simulator

    def step(self) -> dict[str, float]:
        """One co-training update (collect, policy update, simulator updates, snapshots); its metrics."""
        for sim in self.simulators:
            sim.clear()
        batch = self.policy_trainer.collect()
        metrics = self.policy_trainer.update(batch)
        metrics.update(self.update_simulators(batch))
        self.update_count += 1
        if self.pool is not None and self.update_count % self.config.snapshot_every == 0:
            for index, sim in enumerate(self.simulators):
                self._add_snapshot(index, self.update_count, sim.state_dict())
        if self.pool is not None:
            metrics["pool_size"] = float(len(self.pool.members))
            metrics["pool_share"] = float(np.mean([t.simulator not in {s.name for s in self.simulators}
                                                   for t in batch.trajectories]))
        return metrics

    def update_simulators(self, batch: Batch) -> dict[str, float]:
        """Update every trainable simulator on the dialogues it drove in ``batch``; averaged metrics."""
        c = self.config
        logs: dict[str, list[float]] = {"sim_loss": [], "sim_kl": [], "sim_success": [], "sim_objective": [],
                                        "sim_grad_norm": []}
        for sim, optimizer in zip(self.simulators, self.optimizers):
            mine = [t for t in batch.trajectories if t.simulator == sim.name]
            drove = [t for t in (batch.collected if batch.collected is not None else batch.trajectories)
                     if t.simulator == sim.name]
            if len(drove) != len(sim.episodes):
                raise RuntimeError(f"{sim.name!r} recorded {len(sim.episodes)} dialogues but drove {len(drove)} "
                                   f"trajectories; clear() it before each collection and give it a unique name")
            episodes = sim.episodes
            if batch.kept is not None:  # dynamic sampling dropped some groups: their dialogues too
                assert batch.collected is not None
                position = {i: j for j, i in enumerate(k for k, t in enumerate(batch.collected)
                                                       if t.simulator == sim.name)}
                episodes = [sim.episodes[position[i]] for i, t in zip(batch.kept, batch.trajectories)
                            if t.simulator == sim.name]
            if not mine:
                continue
            successes = [float(t.success) for t in mine]
            advantages = torch.as_tensor(simulator_advantages(successes, c.target_success))
            for _ in range(c.sim_epochs):
                scores = sim.score(episodes)
                policy_gradient = -(advantages.to(scores.logprob.dtype) * scores.logprob).mean()
                kl = scores.kl.mean()
                loss = policy_gradient + c.sim_kl_coef * kl
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                params = [p for p in sim.parameters() if p.grad is not None]
                norm = torch.linalg.vector_norm(torch.stack([p.grad.detach().norm() for p in params])) if params \
                    else torch.zeros(())
                if c.sim_max_grad_norm > 0 and params:
                    torch.nn.utils.clip_grad_norm_(params, c.sim_max_grad_norm)
                optimizer.step()
                sim.after_step()
            logs["sim_loss"].append(float(loss.detach()))
            logs["sim_kl"].append(float(kl.detach()))
            logs["sim_success"].append(float(np.mean(successes)))
            logs["sim_objective"].append(simulator_objective(successes, c.target_success))
            logs["sim_grad_norm"].append(float(norm))
        return {key: float(np.mean(values)) for key, values in logs.items() if values}

    # ----------------------------------------------------------------- checkpoints
    def _add_snapshot(self, index: int, step: int, state: dict[str, Any]) -> None:
        assert self.pool is not None
        frozen = self.simulators[index].snapshot()  # type: ignore[attr-defined]
        frozen.load_state_dict(state)
        self.pool.add_snapshot(frozen, step)
        self._snapshots = (self._snapshots + [(index, step, state)])[-self.config.pool_size:]

    def state_dict(self) -> dict[str, Any]:
        """Policy trainer, simulators, their optimisers, the pool's snapshots and the update counter."""
        return {"policy_trainer": self.policy_trainer.state_dict(),
                "simulators": [s.state_dict() for s in self.simulators],
                "optimizers": [o.state_dict() for o in self.optimizers],
                "snapshots": list(self._snapshots), "update_count": self.update_count,
                "config": dataclasses.asdict(self.config)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.policy_trainer.load_state_dict(state["policy_trainer"])
        for sim, s in zip(self.simulators, state["simulators"], strict=True):
            sim.load_state_dict(s)
        for optimizer, s in zip(self.optimizers, state["optimizers"], strict=True):
            optimizer.load_state_dict(s)
        if self.pool is not None:
            self._snapshots = list(state["snapshots"])
            self.simulator, self.pool = training_population(self.simulators, self.config, self._snapshots)
            self.policy_trainer.use_simulator(self.simulator)
        self.update_count = int(state["update_count"])
