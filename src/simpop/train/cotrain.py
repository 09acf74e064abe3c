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
4. Every ``snapshot_every`` updates, each trainable simulator's snapshot joins the pool (a full pool drops its
   oldest snapshot, or with ``pool_prune="redundant"`` its most redundant one).

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

**Objectives** (:attr:`CoTrainConfig.objective`, flag ``--cotrain.objective``; :data:`OBJECTIVES`):

- ``target`` — the objective above (replies steered to batch success τ, KL anchor to the base).
- ``persona`` — the same outcome term, but the simulator learns the distribution of *personas* it plays
  (:class:`PersonaTrainable`: ``log π_φ(i)`` is the log-probability of dialogue ``i``'s persona under the
  trainable persona sampler, the KL that of the sampler to its base); its reply model stays fixed.
- ``realism`` — ``target`` plus a realism anchor ``λ · NLL_ref(θ)``: the negative log-likelihood of
  reference persuadee replies given the reference persuader acts (:class:`RealismAnchored`, data from
  :attr:`CoTrainConfig.reference_data`), besides the KL (``sim_kl_coef = 0`` makes it *instead of*).
- ``adversarial`` — the simulator lowers the policy's success, ``A_i = -(s_i - p̄)`` (the score-function
  gradient of ``-p_k``), subject to the realism anchor (``realism_coef > 0`` required).
- ``diverse`` — ``target`` for a population (K >= 2) plus ``-γ · mean_{j≠k} D(π_k || π_j)``: each member is
  pushed away from the others' reply distributions on the states it visited (:class:`Divergent`).

**Generation on vLLM.** When the policy generates on a vLLM server (``ModelConfig.generator``) and
:attr:`CoTrainConfig.sim_generator` is on, every LLM simulator (one with ``use_generator``, e.g.
:class:`~simpop.simulators.trainable.TrainableLLMSimulator`) samples its replies on the same server: K
simulators are K LoRA adapters next to the policy's on one base (``VLLMGenerator.for_adapter``). After a
simulator's optimiser steps its adapter is synced (``sim0@v<N+1>`` loaded, ``sim0@v<N>`` unloaded);
frozen pool snapshots load theirs once. The simulator objective is a score-function (REINFORCE) estimate
at the current weights, so replies sampled by ``pi_gen`` (vLLM) instead of ``pi_θ`` (torch) get the policy's
correction: each reply token's log-prob is weighted by ``min(pi_θ / pi_gen, tis_cap)`` (the policy's
``GRPOConfig.tis_cap``; :func:`~simpop.train.objectives.truncated_is_weights`). Logged: ``sim_sync_s``,
``sim_generator_version``, ``sim_gen_logp_abs_diff``, ``sim_tis_truncated_frac``.

**Memory.** K LLM simulators and the policy keep K + 1 Adam states and gradients for the run, though one step
uses one. With :attr:`CoTrainConfig.offload_optimizers` (on by default) every optimiser whose parameters number
at least :data:`OFFLOAD_MIN_PARAMS` (LoRA adapters, not the act-level persuadee's 373 numbers) keeps its state
on disk between its steps and frees its gradients after them (:class:`~simpop.train.offload.OffloadedOptimizer`);
training is bit for bit the same, and each optimiser step takes ~0.4 s longer for a rank-16 SmolLM2 adapter (a
write and a read of its state; ``benchmarks/memory.py --cases offload``), small next to an LLM step. The
trained LLM backends also checkpoint every pass with gradients (:attr:`CoTrainConfig.checkpoint_tokens` 0): the
policy step's ~560 padded tokens are under the backend's 1024-token default threshold, and its kept activations
set the peak. Measured side by side (``benchmarks/memory.py --cases adapter cotrain_offload policy --checkpoints
1024 0``): K=4 + policy peaks at 1.04x one adapter's step instead of 1.50x, with the same losses bit for bit and
the policy step's time 0.99x (its micro-batches are unchanged; checkpointing adds one forward pass of a
small model).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, get_args, runtime_checkable

import numpy as np
import torch

from simpop.agents.policy import ActPolicy, LLMPolicy
from simpop.seat import Simulator, Trainable
from simpop.simulators.population import CheckpointPool, Population
from simpop.train.grpo import Batch, GRPOTrainer
from simpop.train.objectives import truncated_is_weights
from simpop.validation import check_fields
from simpop.train.offload import OffloadedOptimizer

#: Optimisers of at least this many parameters keep their state on disk between steps (``offload_optimizers``).
OFFLOAD_MIN_PARAMS = 1_000_000


#: Simulator objectives of co-training (module docstring).
Objective = Literal["target", "persona", "realism", "adversarial", "diverse"]
OBJECTIVES: tuple[str, ...] = get_args(Objective)


@runtime_checkable
class PersonaTrainable(Protocol):
    """A trainable simulator that can learn the distribution of personas it plays (objective ``persona``)."""

    def use_persona_sampler(self) -> None:
        """From now on, draw each dialogue's persona from the trainable persona sampler."""

    def persona_parameters(self) -> list[torch.nn.Parameter]:
        """The persona sampler's parameters."""

    def persona_score(self, episodes: Sequence[Any]) -> Any:
        """Per episode: log-probability of its persona (with gradient) and the sampler's KL to its base."""


@runtime_checkable
class RealismAnchored(Protocol):
    """A trainable simulator whose replies can be scored on reference (human) dialogues."""

    def load_reference(self, path: str) -> int:
        """Read the reference dialogues at ``path``; returns how many can be scored."""

    def reference_nll(self) -> torch.Tensor:
        """Mean (over reference dialogues) summed negative log-likelihood of the reference replies."""


@runtime_checkable
class Divergent(Protocol):
    """A trainable simulator that can measure how far its reply distribution is from another's."""

    def divergence(self, other: Any, episodes: Sequence[Any]) -> torch.Tensor:
        """Mean over ``episodes`` of the summed per-turn ``KL(self || other)`` (gradient through self only)."""


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
        draw_rule: How each dialogue's driver is chosen among the K simulators and the pool: ``weighted``
            (the weights above) or ``prioritised`` (those weights times each one's recent failure rate against the
            policy, :class:`~simpop.simulators.population.Population`'s rule: the ones it loses to drive more).
        pool_prune: Which snapshot leaves a full pool: ``oldest``, or ``redundant``: the one whose reply
            distribution is nearest another snapshot's (or the newcomer's), by symmetrised KL on the states of the
            latest batch's dialogues (simulators must be :class:`Divergent`), so the pool keeps distinct behaviours.
        objective: The simulators' objective, one of :data:`OBJECTIVES` (module docstring).
        realism_coef: Weight λ of the realism anchor; acts only under objectives ``realism`` and
            ``adversarial`` (> 0 there). The default 0.1 was fixed before the objectives were compared.
        reference_data: Where the realism anchor's reference dialogues are (benchmark-specific; the P4G
            persuadee reads a corpus directory, :func:`~simpop.envs.persuasion.corpus.load_corpus`).
        diversity_coef: Weight γ of the diversity term; acts only under objective ``diverse`` (> 0 there).
            The default 0.05 was fixed before the objectives were compared.
        sim_generator: When the policy generates on vLLM (``ModelConfig.generator``), the LLM simulators do too:
            each serves its LoRA adapter on the policy's server under its own versioned name (``sim0@v3``),
            synced after each of its updates (module docstring, "Generation on vLLM"). They must share the
            policy's base model. False: they generate in torch.
        offload_optimizers: Keep the optimiser state of the simulators and the policy on disk between their steps
            (those with at least :data:`OFFLOAD_MIN_PARAMS` parameters; module docstring, "Memory").
        checkpoint_tokens: The activation-checkpointing threshold set on the LLM backends co-training trains (the
            policy's and the simulators': ``TransformersBackend.checkpoint_tokens``); 0 checkpoints every pass with
            gradients (module docstring, "Memory"); None leaves each backend's own.
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
    draw_rule: Literal["weighted", "prioritised"] = "weighted"
    pool_prune: Literal["oldest", "redundant"] = "oldest"
    objective: Objective = "target"
    realism_coef: float = 0.1
    reference_data: str | None = None
    diversity_coef: float = 0.05
    sim_generator: bool = True
    offload_optimizers: bool = True
    checkpoint_tokens: int | None = 0

    def __post_init__(self) -> None:
        check_fields(self)
        def need(ok: bool, message: str) -> None:
            if not ok:
                raise ValueError(f"CoTrainConfig: {message}")

        need(0 < self.target_success < 1, f"target_success must be in (0, 1) (0.5 keeps binary outcomes most "
                                          f"informative), got {self.target_success}")
        need(math.isfinite(self.sim_lr) and self.sim_lr > 0, f"sim_lr must be > 0, got {self.sim_lr}")
        need(self.checkpoint_tokens is None or self.checkpoint_tokens >= 0,
             f"checkpoint_tokens must be >= 0 or None, got {self.checkpoint_tokens}")
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
        need(self.draw_rule == "weighted" or self.population_size > 1 or self.pool_size > 0,
             "draw_rule 'prioritised' chooses among several simulators: population_size >= 2 or a pool")
        need(self.pool_prune in ("oldest", "redundant"),
             f"pool_prune must be oldest or redundant, got {self.pool_prune!r}")
        need(self.objective in OBJECTIVES, f"objective must be one of {', '.join(OBJECTIVES)}, got {self.objective!r}")
        need(math.isfinite(self.realism_coef) and self.realism_coef >= 0,
             f"realism_coef must be >= 0, got {self.realism_coef}")
        need(math.isfinite(self.diversity_coef) and self.diversity_coef >= 0,
             f"diversity_coef must be >= 0, got {self.diversity_coef}")
        realism = self.objective in ("realism", "adversarial")
        need(not realism or (self.realism_coef > 0 and self.reference_data),
             f"objective {self.objective!r} needs a realism anchor: realism_coef > 0 and reference_data (the "
             f"reference dialogues, e.g. a P4G corpus directory)")
        need(self.objective != "diverse" or self.diversity_coef > 0, "objective 'diverse' needs diversity_coef > 0")


def simulator_objective(successes: Sequence[float], target: float = 0.5) -> float:
    """``-(p̄ - target)²`` for a batch's successes (0 is best)."""
    return -(float(np.mean(successes)) - target) ** 2


def simulator_advantages(successes: Sequence[float], target: float = 0.5, objective: str = "target") -> np.ndarray:
    """Per-dialogue advantages of the simulator: ``2 (target - p̄)(s_i - p̄)``, or ``-(s_i - p̄)`` when
    ``objective`` is ``adversarial`` (module docstring)."""
    s = np.asarray(successes, dtype=float)
    if s.ndim != 1 or s.size == 0:
        raise ValueError(f"successes must be a non-empty 1-D sequence, got shape {s.shape}")
    mean = s.mean()
    if objective == "adversarial":
        return -(s - mean)
    return 2.0 * (target - mean) * (s - mean)


def _require(simulators: Sequence[Any], protocol: type, what: str) -> None:
    missing = [s.name for s in simulators if not isinstance(s, protocol)]
    if missing:
        raise TypeError(f"{what} needs simulators that are {protocol.__name__}; {', '.join(missing)} are not")


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
    return Population(members, weights, rule=config.draw_rule, min_probability=0.0,
                      name="cotrain-population"), pool


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
        reference_sizes: Reference dialogues each simulator scores (objectives realism and adversarial), else [].
    """

    def __init__(self, policy_trainer: GRPOTrainer, simulators: Sequence[Trainable], config: CoTrainConfig):
        if len({s.name for s in simulators}) != len(simulators):
            raise ValueError("trainable simulators need distinct names (records are matched by name)")
        if any(s.frozen for s in simulators):
            raise ValueError("a frozen snapshot cannot be co-trained; pass the trainable simulators")
        self.config = config
        self.simulators = list(simulators)
        if config.sim_generator:
            self._generate_on_policy_server(policy_trainer)
        self.reference_sizes = self._prepare_objective()  # before the pool copies the simulators
        # The pool starts with each simulator as it is now (the base simulator), so it is never empty.
        self._snapshots = ([(i, 0, s.state_dict()) for i, s in enumerate(self.simulators)]
                           if config.pool_size else [])
        self.simulator, self.pool = training_population(self.simulators, config, self._snapshots)
        self.policy_trainer = policy_trainer
        policy_trainer.use_simulator(self.simulator)
        self.optimizers = [self._offloaded(torch.optim.Adam(self._trained(s), lr=config.sim_lr))
                           for s in self.simulators]
        policy_trainer.optimizer = self._offloaded(policy_trainer.optimizer)
        if config.checkpoint_tokens is not None:
            for trained in (policy_trainer.policy, *self.simulators):
                if hasattr(backend := getattr(trained, "backend", None), "checkpoint_tokens"):
                    backend.checkpoint_tokens = config.checkpoint_tokens
        self.update_count = 0

    def _prepare_objective(self) -> list[int]:
        """Check the simulators support the objective and set them up for it; reference dialogues per simulator."""
        objective = self.config.objective
        if self.config.pool_prune == "redundant" and self.config.pool_size:
            _require(self.simulators, Divergent, "pool_prune 'redundant'")
        if objective == "persona":
            _require(self.simulators, PersonaTrainable, f"objective {objective!r}")
            for sim in self.simulators:
                sim.use_persona_sampler()  # type: ignore[attr-defined]
        if objective == "diverse":
            _require(self.simulators, Divergent, f"objective {objective!r}")
            if len(self.simulators) < 2:
                raise ValueError("objective 'diverse' pushes population members apart: it needs population_size >= 2")
        if objective not in ("realism", "adversarial"):
            return []
        _require(self.simulators, RealismAnchored, f"objective {objective!r}")
        path = self.config.reference_data
        sizes = [sim.load_reference(path) for sim in self.simulators]  # type: ignore[attr-defined]
        if min(sizes) == 0:
            raise ValueError(f"{self.config.reference_data!r} holds no reference dialogue the simulators can score")
        return sizes

    def _generate_on_policy_server(self, policy_trainer: GRPOTrainer) -> None:
        """Give every LLM simulator its adapter on the policy's vLLM server (nothing if the policy has none)."""
        generator = getattr(policy_trainer.policy, "generator", None)
        if generator is None:
            return
        if generator.adapter is None:
            raise ValueError("the policy fine-tunes the vLLM server's base weights, so simulators' adapters cannot "
                             "share it: train the policy with --lora, or set CoTrainConfig.sim_generator=False "
                             "(--no-sim-generator) to generate the simulators in torch")
        base = Path(policy_trainer.policy.backend.path).resolve()  # type: ignore[union-attr]
        cap = policy_trainer.config.tis_cap
        weigh = (lambda logp, gen, mask: truncated_is_weights(logp, gen, mask, cap)) if cap > 0 else None
        for sim in self.simulators:
            if not callable(getattr(sim, "use_generator", None)):
                continue  # not an LLM simulator (e.g. an act-level one): nothing to generate there
            own = Path(sim.backend.path).resolve()  # type: ignore[attr-defined]
            if own != base:
                raise ValueError(f"simulator {sim.name!r} is on {own}, the policy's vLLM server on {base}: give "
                                 f"them one base model, or set CoTrainConfig.sim_generator=False "
                                 f"(--no-sim-generator) to generate the simulators in torch")
            sim.use_generator(generator.for_adapter(sim.adapter), weigh)  # type: ignore[attr-defined]

    def _offloaded(self, optimizer: Any) -> Any:
        """``optimizer`` with its state on disk between steps, if the config says so and it is large enough."""
        size = sum(p.numel() for group in optimizer.param_groups for p in group["params"])
        if (not self.config.offload_optimizers or size < OFFLOAD_MIN_PARAMS
                or isinstance(optimizer, OffloadedOptimizer)):
            return optimizer
        return OffloadedOptimizer(optimizer)

    def _trained(self, sim: Trainable) -> list[torch.nn.Parameter]:
        """The parameters the objective trains: the persona sampler's (``persona``) or the simulator's."""
        return sim.persona_parameters() if self.config.objective == "persona" else sim.parameters()  # type: ignore

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
                                        "sim_grad_norm": [], "sim_realism_nll": [], "sim_divergence": [],
                                        "sim_sync_s": [], "sim_generator_version": [], "sim_gen_logp_abs_diff": [],
                                        "sim_tis_truncated_frac": []}
        for index, (sim, optimizer) in enumerate(zip(self.simulators, self.optimizers)):
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
            advantages = torch.as_tensor(simulator_advantages(successes, c.target_success, c.objective))
            others = [o for j, o in enumerate(self.simulators) if j != index]
            mismatch = getattr(sim, "mismatch", None)
            if mismatch is not None:
                mismatch.update(dict.fromkeys(mismatch, 0.0))
            for _ in range(c.sim_epochs):
                scores = (sim.persona_score(episodes) if c.objective == "persona"  # type: ignore[attr-defined]
                          else sim.score(episodes))
                policy_gradient = -(advantages.to(scores.logprob.dtype) * scores.logprob).mean()
                kl = scores.kl.mean()
                loss = policy_gradient + c.sim_kl_coef * kl
                if c.objective in ("realism", "adversarial"):
                    realism = sim.reference_nll()  # type: ignore[attr-defined]
                    loss = loss + c.realism_coef * realism
                    logs["sim_realism_nll"].append(float(realism.detach()))
                if c.objective == "diverse":
                    divergence = torch.stack([sim.divergence(o, episodes) for o in others]).mean()  # type: ignore
                    loss = loss - c.diversity_coef * divergence
                    logs["sim_divergence"].append(float(divergence.detach()))
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                params = [p for p in self._trained(sim) if p.grad is not None]
                norm = torch.linalg.vector_norm(torch.stack([p.grad.detach().norm() for p in params])) if params \
                    else torch.zeros(())
                if c.sim_max_grad_norm > 0 and params:
                    torch.nn.utils.clip_grad_norm_(params, c.sim_max_grad_norm)
                optimizer.step()
                sim.after_step()
            logs["sim_loss"].append(float(loss.detach()))
            logs["sim_kl"].append(float(kl.detach()))
            logs["sim_success"].append(float(np.mean(successes)))
            logs["sim_objective"].append(-float(np.mean(successes)) if c.objective == "adversarial"
                                         else simulator_objective(successes, c.target_success))
            logs["sim_grad_norm"].append(float(norm))
            sync = sim.sync_generator() if callable(getattr(sim, "sync_generator", None)) else {}  # type: ignore
            if sync:
                logs["sim_sync_s"].append(sync["sync_s"])
                logs["sim_generator_version"].append(sync["generator_version"])
            if mismatch is not None and mismatch["tokens"] > 0:
                logs["sim_gen_logp_abs_diff"].append(mismatch["abs_diff_sum"] / mismatch["tokens"])
                logs["sim_tis_truncated_frac"].append(mismatch["truncated"] / mismatch["tokens"])
        return {key: float(np.mean(values)) for key, values in logs.items() if values}

    # ----------------------------------------------------------------- checkpoints
    def _add_snapshot(self, index: int, step: int, state: dict[str, Any]) -> None:
        assert self.pool is not None
        frozen = self.simulators[index].snapshot()  # type: ignore[attr-defined]
        frozen.load_state_dict(state)
        before = self.pool.members
        evict = 0
        if len(before) == self.config.pool_size:
            evict = self._most_redundant(before, frozen) if self.config.pool_prune == "redundant" else 0
            del self._snapshots[evict]
        self.pool.add_snapshot(frozen, step, evict=evict)
        for evicted in (m for m in before if all(m is not kept for kept in self.pool.members)):
            if getattr(evicted, "generator", None) is not None:  # its adapter leaves the vLLM server too
                evicted.generator.release()  # type: ignore[attr-defined]
        self._snapshots.append((index, step, state))

    def _most_redundant(self, snapshots: Sequence[Any], new: Any) -> int:
        """Index of the pool snapshot nearest to another one or to ``new`` (symmetrised reply-distribution KL on the
        states of the latest batch's dialogues); the oldest on ties, and 0 without dialogues."""
        episodes = [e for sim in self.simulators for e in sim.episodes]  # type: ignore[attr-defined]
        if not episodes:
            return 0
        candidates = [*snapshots, new]
        with torch.no_grad():
            distance = [[0.0 if i == j else float(a.divergence(b, episodes) + b.divergence(a, episodes))
                         for j, b in enumerate(candidates)] for i, a in enumerate(candidates)]
        nearest = [min(d for j, d in enumerate(row) if j != i) for i, row in enumerate(distance[:-1])]
        return int(np.argmin(nearest))

    def state_dict(self) -> dict[str, Any]:
        """Policy trainer, simulators, their optimisers, the pool's snapshots and the update counter."""
        return {"policy_trainer": self.policy_trainer.state_dict(),
                "simulators": [s.state_dict() for s in self.simulators],
                "optimizers": [o.state_dict() for o in self.optimizers],
                "snapshots": list(self._snapshots), "update_count": self.update_count,
                "config": dataclasses.asdict(self.config)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the policy trainer, every simulator and its optimiser, the pool's snapshots and the update count."""
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
