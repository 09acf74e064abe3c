"""Multi-turn GRPO for the policy seat, at the text level (LLM) and the act level (MLP).

One update (:meth:`GRPOTrainer.step`):

1. **Collect.** ``scenarios_per_update`` scenarios, ``group_size`` dialogues each, run together by
   the :class:`~simpop.rollout.RolloutEngine` against the simulator (or population). With dynamic
   sampling (DAPO) groups whose rewards are all equal are replaced by freshly collected ones.
2. **Advantages.** Each dialogue's return is compared with its group's by the algorithm's hook
   (:mod:`simpop.train.objectives`; GRPO: ``A = (r - mean_group) / (std_group + eps)``). Every token
   (text) or action (act level) the policy produced in that dialogue gets the dialogue's ``A``. Groups
   whose rewards are all equal carry no signal (``A = 0``); their share is logged as ``zero_var_frac``,
   the early sign of simulator collapse.
3. **Loss.** For ``epochs`` passes over the batch, the clipped surrogate on the policy's own units
   (tokens where the rollout mask is 1: simulator, env and template tokens never enter the loss):
   ``-min(rho * A, clip(rho, 1 - eps_low, 1 + eps_high) * A) + kl_coef * KL``, aggregated by the
   algorithm's rule (GRPO: mean over units), with ``rho = pi(u) / pi_old(u)`` (``pi_old`` = the policy
   that collected the batch). KL is to a fixed reference: the base model with LoRA adapters disabled,
   or a frozen copy of the initial policy for full fine-tuning and act-level policies (per-token ``k3``
   estimator for text, exact categorical KL for acts).

4. **Sync.** A text policy that generates on vLLM (``ModelConfig.generator``) pushes its new weights to the
   server (a versioned LoRA adapter, or an in-place reload); its tokens were sampled by the server, so the
   surrogate is weighted by truncated importance sampling (``tis_cap``) and the mismatch is logged.

The variants (GRPO, Dr. GRPO, DAPO, REINFORCE++) differ only in those hooks (``GRPOConfig.algorithm``).
Policies live in :mod:`simpop.agents.policy`; the run loop (metrics, checkpoints, resume, evaluation)
is :func:`simpop.train.loop.run`.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from simpop.agents.base import SamplingParams
from simpop.agents.policy import ActPolicy, LLMPolicy
from simpop.rollout import RolloutEngine, RolloutStats, Trajectory
from simpop.seat import Simulator
from simpop.simulators.population import Population
from simpop.train import objectives
from simpop.validation import check_fields


# =================================================================================== configuration
#: Most dialogues one update may collect (each holds an env and its trajectory in memory until the update).
MAX_BATCH_SIZE = 16_384
#: The learning rate ``GRPOConfig.lr=None`` picks: act-level policies (chosen by the rule of docs/defaults-study.md),
#: LoRA adapters and full fine-tuning of an LLM.
DEFAULT_LR = {"act": 3e-3, "lora": 1e-4, "full": 1e-5}


@dataclass(frozen=True)
class GRPOConfig:
    """GRPO settings (the ``simpop train grpo`` flags are generated from these fields).

    Attributes:
        algorithm: The variant's hooks (:data:`simpop.train.objectives.ALGORITHMS`): ``grpo``, ``dr_grpo``,
            ``dapo`` or ``reinforce_pp``.
        group_size: Dialogues per scenario in one update (G); advantages compare them. At least 2.
        scenarios_per_update: Scenarios (groups) per update; the batch is ``group_size`` times this. The
            default 8 x 8 and the act-level ``lr`` are the picks of docs/defaults-study.md.
        lr: Adam learning rate; None picks :data:`DEFAULT_LR`: 3e-3 for act-level policies, 1e-4 with LoRA,
            1e-5 for full fine-tuning of an LLM.
        clip_eps: Lower ratio clip: the ratio is clipped to [1 - clip_eps, 1 + clip_eps_high]; None uses the
            algorithm's (0.2).
        clip_eps_high: Upper ratio clip; None uses the algorithm's (0.2; DAPO's clip-higher: 0.28).
        loss_aggregation: ``token-mean``, ``sequence-mean`` or ``token-sum``; None uses the algorithm's.
        max_refill_rounds: Dynamic sampling (DAPO): extra collection rounds at most per update to replace
            groups whose rewards are all equal; an update that still lacks informative groups trains on
            the ones it has (and logs ``refill_shortfall``).
        kl_coef: Weight of the KL penalty to the reference policy; 0 turns it off (and skips the
            reference forward pass).
        epochs: Optimiser steps per collected batch (each a full pass over the batch).
        micro_batch_size: Dialogues per forward/backward pass of a text policy (gradients are
            accumulated over micro-batches); lower it if memory runs out.
        max_grad_norm: Gradient-norm clip per optimiser step; 0 disables clipping.
        max_new_tokens: Token limit of each text policy turn.
        temperature: Sampling temperature of text policy turns (also used when scoring tokens, so
            ratios and entropies refer to the sampling distribution); must be > 0.
        top_p: Nucleus sampling mass of text policy turns (1 disables it).
        n_envs: Dialogues run side by side during collection; None runs the whole batch at once.
        seed: Seeds scenario choice, rollouts, sampling and the initial act-level policy weights.
        log_entropy: Log the policy's mean per-token (text) or per-decision (act) entropy.
        tis_cap: When a text policy generates on another engine (``ModelConfig.generator``, vLLM), weight each
            token's surrogate by ``min(pi_old / pi_gen, tis_cap)`` (truncated importance sampling, as verl and
            TRL do; :func:`~simpop.train.objectives.truncated_is_weights`); the mismatch is logged as
            ``gen_logp_abs_diff`` and ``tis_truncated_frac``. 0 turns the correction off (still logged).
    """

    algorithm: str = "grpo"
    group_size: int = 8
    scenarios_per_update: int = 8
    lr: float | None = None
    clip_eps: float | None = None
    clip_eps_high: float | None = None
    loss_aggregation: Literal["token-mean", "sequence-mean", "token-sum"] | None = None
    max_refill_rounds: int = 4
    kl_coef: float = 0.0
    epochs: int = 1
    micro_batch_size: int = 2
    max_grad_norm: float = 1.0
    max_new_tokens: int = 48
    temperature: float = 1.0
    top_p: float = 1.0
    n_envs: int | None = None
    seed: int = 0
    log_entropy: bool = True
    tis_cap: float = 2.0

    def __post_init__(self) -> None:
        check_fields(self)
        def need(ok: bool, message: str) -> None:
            if not ok:
                raise ValueError(f"GRPOConfig: {message}")

        need(self.algorithm in objectives.ALGORITHMS,
             f"algorithm must be one of {', '.join(objectives.ALGORITHMS)}, got {self.algorithm!r}")
        need(self.group_size >= 2, f"group_size must be >= 2 (GRPO compares dialogues within a group), "
                                   f"got {self.group_size}; use 4-16")
        need(self.scenarios_per_update >= 1, f"scenarios_per_update must be >= 1, got {self.scenarios_per_update}")
        need(self.batch_size <= MAX_BATCH_SIZE,
             f"group_size x scenarios_per_update = {self.batch_size} dialogues per update; at most "
             f"{MAX_BATCH_SIZE} are held in memory at once (typical batches are 16-512)")
        need(self.lr is None or (math.isfinite(self.lr) and self.lr > 0),
             f"lr must be a positive number (e.g. 1e-5 for an LLM, 1e-2 act-level) or None, got {self.lr}")
        for key in ("clip_eps", "clip_eps_high"):
            value = getattr(self, key)
            need(value is None or 0 < value < 1, f"{key} must be in (0, 1), typically 0.2; got {value}")
        need(self.loss_aggregation is None or self.loss_aggregation in objectives.AGGREGATIONS,
             f"loss_aggregation must be one of {', '.join(objectives.AGGREGATIONS)} or None, "
             f"got {self.loss_aggregation!r}")
        need(self.max_refill_rounds >= 0, f"max_refill_rounds must be >= 0, got {self.max_refill_rounds}")
        need(self.kl_coef >= 0, f"kl_coef must be >= 0 (0 disables the KL penalty), got {self.kl_coef}")
        need(self.epochs >= 1, f"epochs must be >= 1, got {self.epochs}")
        need(self.micro_batch_size >= 1, f"micro_batch_size must be >= 1, got {self.micro_batch_size}")
        need(self.max_grad_norm >= 0, f"max_grad_norm must be >= 0 (0 disables clipping), got {self.max_grad_norm}")
        need(self.max_new_tokens >= 1, f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        need(self.temperature > 0, f"temperature must be > 0 for GRPO (sampled groups need variety), "
                                   f"got {self.temperature}; use 1.0")
        need(0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}")
        need(self.n_envs is None or self.n_envs >= 1, f"n_envs must be >= 1 or None (all at once), got {self.n_envs}")
        need(math.isfinite(self.tis_cap) and self.tis_cap >= 0,
             f"tis_cap must be >= 0 (0 disables the correction; 2 is usual), got {self.tis_cap}")

    @property
    def batch_size(self) -> int:
        """Dialogues per update."""
        return self.group_size * self.scenarios_per_update

    def sampling(self) -> SamplingParams:
        """Decoding settings of text policy turns."""
        return SamplingParams(max_new_tokens=self.max_new_tokens, temperature=self.temperature, top_p=self.top_p,
                              logprobs=True)

    def objective(self) -> objectives.Algorithm:
        """The algorithm's hooks with this config's overrides (clip range, aggregation) applied."""
        base = objectives.algorithm(self.algorithm)
        overrides: dict[str, Any] = {"eps_low": self.clip_eps, "eps_high": self.clip_eps_high, "aggregation": self.loss_aggregation}
        return dataclasses.replace(base, **{k: v for k, v in overrides.items() if v is not None})


# ========================================================================================= trainer
@dataclass
class Batch:
    """One update's rollouts and their advantages.

    Attributes:
        trajectories: The dialogues, grouped.
        advantages: One group-relative advantage per trajectory.
        stats: Rollout timing and counts (of every collection round).
        extra: Collection metrics (dynamic sampling's refill counts).
        collected: With dynamic sampling, every dialogue collected for the update in collection order
            (dropped groups included; trainable simulators recorded all of them); None: the trajectories.
        kept: With dynamic sampling, the index in ``collected`` of each trajectory.
    """

    trajectories: list[Trajectory]
    advantages: np.ndarray
    stats: RolloutStats
    extra: dict[str, float] = field(default_factory=dict)
    collected: list[Trajectory] | None = None
    kept: list[int] | None = None

    @property
    def rewards(self) -> np.ndarray:
        return np.array([t.total_reward for t in self.trajectories], dtype=float)

    @property
    def groups(self) -> np.ndarray:
        return np.array([t.group for t in self.trajectories])


class GRPOTrainer:
    """GRPO on the policy seat of ``env_id`` against ``simulator`` (text or act level); a
    :class:`~simpop.train.loop.Trainer` (run it with :func:`simpop.train.loop.run`).

    Args:
        env_id: A registered env id.
        policy: An :class:`~simpop.agents.policy.ActPolicy` (act-level envs) or an
            :class:`~simpop.agents.policy.LLMPolicy` (text envs).
        simulator: The user seat's simulator or population (None: a co-trainer sets its own with
            :meth:`use_simulator`).
        config: Hyper-parameters.
        env_kwargs: Env constructor arguments.

    Attributes:
        update_count: Updates completed so far.
        objective: The algorithm's hooks (advantages, group filter, loss, aggregation).
    """

    def __init__(self, env_id: str, policy: ActPolicy | LLMPolicy, simulator: Simulator | None, config: GRPOConfig,
                 env_kwargs: dict[str, Any] | None = None):
        self.env_id, self.policy, self.config = env_id, policy, config
        self.simulator = simulator
        self.engine = RolloutEngine(env_id, policy, simulator, n_envs=config.n_envs, env_kwargs=env_kwargs)
        self.text = isinstance(policy, LLMPolicy)
        self.external_generator = self.text and getattr(policy, "generator", None) is not None
        if not list(policy.parameters()):
            raise ValueError("the policy has no trainable weights: build TransformersBackend(trainable=True) for "
                             "full fine-tuning, or LLMPolicy(..., lora=True)")
        self.objective = config.objective()
        lr = config.lr or DEFAULT_LR["lora" if self.text and policy.lora else "full" if self.text else "act"]
        self.optimizer = torch.optim.Adam(list(policy.parameters()), lr=lr)
        self.reference = (copy.deepcopy(policy).requires_grad_(False)
                          if isinstance(policy, ActPolicy) and config.kl_coef > 0 else None)
        self.rng = np.random.default_rng(config.seed)
        self.update_count = 0

    @property
    def training_simulator(self) -> Simulator | None:
        return self.simulator

    def use_simulator(self, simulator: Simulator) -> None:
        """Roll out against ``simulator`` from now on."""
        self.simulator = self.engine.simulator = simulator

    def step(self) -> dict[str, float]:
        """One update (collect, then optimise); its metrics."""
        return self.update(self.collect())

    # ----------------------------------------------------------------- rollouts
    def collect(self) -> Batch:
        """Run one update's groups of dialogues and their advantages (refilled, with dynamic sampling)."""
        if self.simulator is None:
            raise ValueError("GRPOTrainer has no simulator: pass one, or let a co-trainer set it")
        trajectories = self._groups()
        if self.objective.dynamic_sampling:
            return self._refill(trajectories)
        rewards = [t.total_reward for t in trajectories]
        advantages = self.objective.advantages(rewards, [t.group for t in trajectories])
        return Batch(trajectories, advantages, self.engine.stats)

    def _groups(self) -> list[Trajectory]:
        seed = int(self.rng.integers(2**63 - 1))
        return self.engine.collect(self.config.scenarios_per_update, group_size=self.config.group_size, seed=seed)

    def _refill(self, trajectories: list[Trajectory]) -> Batch:
        """Dynamic sampling: replace groups whose rewards are all equal by freshly collected ones."""
        wanted = self.config.scenarios_per_update
        collected = list(trajectories)
        stats = dataclasses.replace(self.engine.stats)
        pool = _group_indices(collected, start=0)  # per group: indices into ``collected``
        rounds = 0
        pick = objectives.pick_informative([[collected[i].total_reward for i in g] for g in pool], wanted)
        while not pick.complete and rounds < self.config.max_refill_rounds:
            rounds += 1
            more = self._groups()
            for f in dataclasses.fields(stats):  # the batch's stats cover every round
                setattr(stats, f.name, getattr(stats, f.name) + getattr(self.engine.stats, f.name))
            pool += _group_indices(more, start=len(collected))
            collected += more
            pick = objectives.pick_informative([[collected[i].total_reward for i in g] for g in pool], wanted)
        if pick.chosen:  # relabel the groups 0, 1, ... (labels of different rounds would collide)
            kept = [i for g in pick.chosen for i in pool[g]]
            label = {i: new for new, g in enumerate(pick.chosen) for i in pool[g]}
            chosen = [dataclasses.replace(collected[i], group=label[i]) for i in kept]
        else:  # nothing informative: keep the first round
            kept, chosen = list(range(len(trajectories))), list(trajectories)
        extra = {"refill_rounds": float(rounds), "refill_shortfall": float(wanted - len(pick.chosen)),
                 "collected_zero_var_frac": pick.uninformative / len(pool)}
        advantages = self.objective.advantages([t.total_reward for t in chosen], [t.group for t in chosen])
        return Batch(chosen, advantages, stats, extra, collected=collected, kept=kept)

    # ----------------------------------------------------------------- optimisation
    def update(self, batch: Batch) -> dict[str, float]:
        """``epochs`` optimiser steps on ``batch``; returns this update's metrics."""
        c = self.config
        start = time.perf_counter()
        units = self._text_units(batch) if self.text else self._act_units(batch)
        totals = objectives.LossTotals.of([u["weight"] for u in units])
        with torch.no_grad():
            # pi_old (the policy that collected the batch) equals the current policy before the first
            # step, so with one epoch the detached current log-probs serve and save a forward pass.
            old = [self._forward(u)[0] for u in units] if c.epochs > 1 else None
            if c.kl_coef > 0:
                for u in units:
                    u["reference"] = self._reference(u)
        stats: dict[str, float] = {}
        for _ in range(c.epochs):
            self.optimizer.zero_grad(set_to_none=True)
            sums = {"loss": 0.0, "kl": 0.0, "clip_frac": 0.0, "entropy": 0.0, "mismatch": 0.0, "truncated": 0.0}
            for i, unit in enumerate(units):
                logp, entropy, kl = self._forward(unit)
                old_logp = old[i] if old is not None else logp.detach()
                is_weight = None
                if self.external_generator:
                    mismatch = objectives.truncated_is_weights(old_logp, unit["gen_logp"], unit["weight"],
                                                               c.tis_cap or math.inf)
                    sums["mismatch"] += mismatch.abs_diff_sum / max(totals.units, 1.0)
                    sums["truncated"] += mismatch.truncated / max(totals.units, 1.0)
                    is_weight = mismatch.weight if c.tis_cap > 0 else None
                loss, parts = self.objective.loss(logp, old_logp, unit["advantage"], unit["weight"], kl=kl,
                                                  kl_coef=c.kl_coef, totals=totals, is_weight=is_weight)
                loss.backward()
                sums["loss"] += loss.item()
                sums["kl"] += parts["kl"]
                sums["clip_frac"] += parts["clip_frac"]
                sums["entropy"] += float((entropy.detach() * unit["weight"]).sum()) / max(totals.units, 1.0)
            grad_norm = _clip_grad(self.policy.parameters(), c.max_grad_norm)
            self.optimizer.step()
            stats = {**sums, "grad_norm": grad_norm}
        self.update_count += 1
        sync = self.policy.sync_generator() if self.text else {}  # type: ignore[union-attr,operator]
        rewards, rollout = batch.rewards, batch.stats
        metrics = {
            "reward_mean": float(rewards.mean()),
            "reward_std": float(rewards.std()),
            "success": float(np.mean([t.success for t in batch.trajectories])),
            "zero_var_frac": objectives.zero_variance_fraction(rewards, batch.groups),
            "loss": stats["loss"],
            "kl": stats["kl"],
            "clip_frac": stats["clip_frac"],
            "grad_norm": stats["grad_norm"],
            "policy_turns": float(np.mean([t.policy_turns for t in batch.trajectories])),
            "user_rejected": float(sum(t.user_rejected for t in batch.trajectories)),
            "rollout_s": rollout.total_s,
            "update_s": time.perf_counter() - start,
            "steps_per_s": rollout.env_steps / rollout.total_s if rollout.total_s > 0 else 0.0,
            **batch.extra,
            # Ray: waves the driver ran itself because a worker failed (cumulative; see simpop.rollout_ray)
            **{k: float(v) for k, v in getattr(self.engine, "fallbacks", {}).items()},
        }
        if isinstance(self.simulator, Population):  # a rotation logs who played and advances its schedule
            played = batch.collected if batch.collected is not None else batch.trajectories
            metrics.update(self.simulator.end_update([t.simulator for t in played], [t.success for t in played]))
        if c.log_entropy:
            metrics["policy_entropy"] = stats["entropy"]
        if self.external_generator:
            metrics.update(sync, gen_logp_abs_diff=stats["mismatch"], tis_truncated_frac=stats["truncated"])
        if self.text:
            metrics["policy_tokens"] = float(rollout.policy_tokens)
            metrics["tokens_per_s"] = rollout.policy_tokens / rollout.total_s if rollout.total_s > 0 else 0.0
        return metrics

    def _act_units(self, batch: Batch) -> list[dict[str, torch.Tensor]]:
        """The whole act-level batch as one unit: every policy decision with its dialogue's advantage."""
        obs, acts, adv = [], [], []
        for t, a in zip(batch.trajectories, batch.advantages):
            obs += t.observations[t.policy_seat]
            acts += t.actions[t.policy_seat]
            adv += [a] * len(t.actions[t.policy_seat])
        return [{"obs": self.policy.observations_tensor(obs),  # type: ignore[union-attr]
                 "actions": torch.as_tensor(acts, dtype=torch.long),
                 "advantage": torch.as_tensor(adv, dtype=torch.float32), "weight": torch.ones(len(acts))}]

    def _text_units(self, batch: Batch) -> list[dict[str, Any]]:
        """Micro-batches of dialogues; the weights are the rollout masks (the policy's tokens only)."""
        order = [i for i, t in enumerate(batch.trajectories) if t.policy_tokens > 0]
        units = []
        for begin in range(0, len(order), self.config.micro_batch_size):
            chosen = order[begin:begin + self.config.micro_batch_size]
            trajectories = [batch.trajectories[i] for i in chosen]
            width = max(len(t.token_ids) for t in trajectories)
            weight, gen_logp = torch.zeros(len(chosen), width), torch.zeros(len(chosen), width)
            for row, t in enumerate(trajectories):
                weight[row, :len(t.mask)] = torch.tensor(t.mask, dtype=torch.float32)
                gen_logp[row, :len(t.logprobs)] = torch.tensor(t.logprobs, dtype=torch.float32)
            advantage = torch.tensor([float(batch.advantages[i]) for i in chosen])[:, None].expand(-1, width)
            units.append({"sequences": [t.token_ids for t in trajectories], "masks": [t.mask for t in trajectories],
                          "weight": weight, "advantage": advantage, "gen_logp": gen_logp})
        return units

    def _forward(self, unit: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """``(log-probs, entropies, KL to the reference or None)`` per unit, with gradient."""
        if self.text:
            scores = self.policy.score(unit["sequences"], unit["masks"])  # type: ignore[union-attr,operator]
            kl = None
            if "reference" in unit:
                delta = unit["reference"] - scores.logprobs
                kl = torch.exp(delta) - delta - 1  # k3 estimator: unbiased and >= 0
            return scores.logprobs, scores.entropies, kl
        log_probs = self.policy.log_probs(unit["obs"])  # type: ignore[union-attr]
        logp = log_probs.gather(1, unit["actions"][:, None]).squeeze(1)
        entropy = -(log_probs.exp() * log_probs).sum(-1)
        kl = _categorical_kl(log_probs, unit["reference"]) if "reference" in unit else None
        return logp, entropy, kl

    def _reference(self, unit: dict[str, Any]) -> torch.Tensor:
        """Reference log-probs: per token (text) or the whole action distribution (act level)."""
        if self.text:
            return self.policy.reference_logprobs(unit["sequences"], unit["masks"])  # type: ignore[union-attr,operator]
        assert self.reference is not None
        return self.reference.log_probs(unit["obs"])

    def state_dict(self) -> dict[str, Any]:
        """Policy, optimiser, trainer RNG, update counter and, for a population, its state (rotation position,
        recorded outcomes); the global RNGs are saved by checkpoint.save."""
        state = {"policy": self.policy.state_dict(), "optimizer": self.optimizer.state_dict(),
                 "rng": self.rng.bit_generator.state, "update_count": self.update_count,
                 "config": dataclasses.asdict(self.config)}
        if isinstance(self.simulator, Population):
            state["population"] = self.simulator.pool_state()
        if isinstance(self.policy, LLMPolicy) and self.policy.generator is not None:
            state["generator_version"] = self.policy.generator.version
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the policy, optimiser, generator state and update count; a text policy then pushes the loaded
        weights to its generator.
        """
        self.policy.load_state_dict(state["policy"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.rng.bit_generator.state = state["rng"]
        self.update_count = int(state["update_count"])
        if isinstance(self.simulator, Population) and "population" in state:
            self.simulator.load_pool_state(state["population"], _not_a_member)
        if isinstance(self.policy, LLMPolicy) and self.policy.generator is not None and "generator_version" in state:
            # The generator serves the loaded weights under the saved version (none synced yet: the base model
            # still is the loaded weights), so a resumed run's versions follow an uninterrupted run's.
            version = int(state["generator_version"])
            if version > 0:
                self.policy.generator.version = version - 1
                self.policy.sync_generator()
        elif self.text:
            self.policy.sync_generator()  # type: ignore[union-attr,operator]  # the generator serves the loaded weights


def _not_a_member(name: str) -> Simulator:
    raise ValueError(f"the checkpoint's population has a member {name!r} that this run's population lacks; resume "
                     f"with the simulators the run was started with")


def _group_indices(trajectories: list[Trajectory], start: int) -> list[list[int]]:
    """Per group (in order of first appearance), the indices ``start + i`` of its trajectories."""
    groups: dict[Any, list[int]] = {}
    for i, t in enumerate(trajectories):
        groups.setdefault(t.group, []).append(start + i)
    return list(groups.values())


def _categorical_kl(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """``KL(p || q)`` per row of log-probability matrices."""
    return (log_p.exp() * (log_p - log_q)).sum(-1)


def _clip_grad(parameters: Iterator[nn.Parameter] | list[nn.Parameter], max_norm: float) -> float:
    params = [p for p in parameters if p.grad is not None]
    if not params:
        return 0.0
    if max_norm > 0:
        return float(torch.nn.utils.clip_grad_norm_(params, max_norm))
    norms = [p.grad.detach().norm() for p in params if p.grad is not None]
    return float(torch.linalg.vector_norm(torch.stack(norms)))
