"""Multi-turn GRPO for the policy seat, at the text level (LLM) and the act level (MLP).

One update:

1. **Collect.** ``scenarios_per_update`` scenarios, ``group_size`` dialogues each, run together by
   the :class:`~simpop.train.rollout.RolloutEngine` against the simulator (or population).
2. **Advantages.** Each dialogue's return is compared with its group's:
   ``A = (r - mean_group) / (std_group + eps)`` (:func:`group_advantages`). Every token (text) or
   action (act level) the policy produced in that dialogue gets the dialogue's ``A``. Groups whose
   rewards are all equal carry no signal (``A = 0``); their share is logged as ``zero_var_frac``,
   the early sign of simulator collapse.
3. **Loss.** For ``epochs`` passes over the batch, the clipped surrogate on the policy's own units
   (tokens where the rollout mask is 1: simulator, env and template tokens never enter the loss):
   ``-min(rho * A, clip(rho, 1 - eps, 1 + eps) * A) + kl_coef * KL``, averaged over units, with
   ``rho = pi(u) / pi_old(u)`` (``pi_old`` = the policy that collected the batch). KL is to a fixed
   reference: the base model with LoRA adapters disabled, or a frozen copy of the initial policy for
   full fine-tuning and act-level policies (per-token ``k3`` estimator for text, exact categorical KL
   for acts).

Policies: :class:`ActPolicy` (an MLP over a ``Box`` observation with ``Discrete`` actions) and
:class:`LLMPolicy` (a :class:`~simpop.agents.transformers_backend.TransformersBackend`, full
fine-tuning or LoRA). :class:`GRPOTrainer` runs either, writes ``metrics.jsonl`` and atomic
checkpoints, and resumes a killed run exactly (act level: bit-for-bit equal metrics).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch
from torch import nn

from simpop.agents.base import Generation, SamplingParams
from simpop.simulators.base import Simulator
from simpop.train import checkpoint
from simpop.train.rollout import RolloutEngine, RolloutStats, Trajectory

if TYPE_CHECKING:
    from simpop.agents.transformers_backend import TokenScores, TransformersBackend

EPS = 1e-6


# =================================================================================== configuration
@dataclass(frozen=True)
class GRPOConfig:
    """GRPO settings (the ``simpop train grpo`` flags are generated from these fields).

    Attributes:
        group_size: Dialogues per scenario in one update (G); advantages compare them. At least 2.
        scenarios_per_update: Scenarios (groups) per update; the batch is ``group_size`` times this.
        lr: Adam learning rate; None picks 1e-2 for act-level policies, 1e-4 with LoRA, 1e-5 for full
            fine-tuning of an LLM.
        clip_eps: PPO-style ratio clipping range: the ratio is clipped to [1 - clip_eps, 1 + clip_eps].
        kl_coef: Weight of the KL penalty to the reference policy; 0 turns it off (and skips the
            reference forward pass).
        epochs: Optimiser steps per collected batch (each a full pass over the batch).
        micro_batch_size: Dialogues per forward/backward pass of a text policy (gradients are
            accumulated over micro-batches); lower it if memory runs out.
        max_grad_norm: Gradient-norm clip per optimiser step; 0 disables clipping.
        scale_rewards: Divide advantages by the group's reward std (GRPO); False keeps only the
            mean baseline (Dr. GRPO).
        max_new_tokens: Token limit of each text policy turn.
        temperature: Sampling temperature of text policy turns (also used when scoring tokens, so
            ratios and entropies refer to the sampling distribution); must be > 0.
        top_p: Nucleus sampling mass of text policy turns (1 disables it).
        model: Text policies built by the CLI: an embedded model name (``smollm2``) or a local HF folder.
        dtype: Weights dtype of a text policy built by the CLI (``float32`` or ``bfloat16``).
        prefix_cache: Text models built by the CLI keep each dialogue's KV cache between its turns, so
            a turn reads only its new tokens (3x faster collection in ``benchmarks/rollout_batching.py``;
            memory: up to 64 cached sequences per model, ~46 KB per token for SmolLM2 in float32).
            Dropped at every weight update.
        lora: Train LoRA adapters instead of all weights (text policies); the reference is then the
            base model with adapters disabled, at no extra memory.
        lora_r: LoRA rank.
        lora_alpha: LoRA scaling numerator (the update is scaled by lora_alpha / lora_r).
        hidden_size: Width of the act-level policy's two hidden layers.
        n_envs: Dialogues run side by side during collection; None runs the whole batch at once.
        seed: Seeds scenario choice, rollouts, sampling and the initial act-level policy weights.
        log_entropy: Log the policy's mean per-token (text) or per-decision (act) entropy.
        save_every: Write a checkpoint every this many updates (when the trainer has a run folder).
        keep_checkpoints: Checkpoints kept on disk (older ones are deleted).
    """

    group_size: int = 4
    scenarios_per_update: int = 4
    lr: float | None = None
    clip_eps: float = 0.2
    kl_coef: float = 0.0
    epochs: int = 1
    micro_batch_size: int = 2
    max_grad_norm: float = 1.0
    scale_rewards: bool = True
    max_new_tokens: int = 48
    temperature: float = 1.0
    top_p: float = 1.0
    model: str = "smollm2"
    dtype: Literal["float32", "bfloat16"] = "float32"
    prefix_cache: bool = True
    lora: bool = False
    lora_r: int = 16
    lora_alpha: int = 32
    hidden_size: int = 64
    n_envs: int | None = None
    seed: int = 0
    log_entropy: bool = True
    save_every: int = 1
    keep_checkpoints: int = 3

    def __post_init__(self) -> None:
        def need(ok: bool, message: str) -> None:
            if not ok:
                raise ValueError(f"GRPOConfig: {message}")

        need(self.group_size >= 2, f"group_size must be >= 2 (GRPO compares dialogues within a group), "
                                   f"got {self.group_size}; use 4-16")
        need(self.scenarios_per_update >= 1, f"scenarios_per_update must be >= 1, got {self.scenarios_per_update}")
        need(self.lr is None or (math.isfinite(self.lr) and self.lr > 0),
             f"lr must be a positive number (e.g. 1e-5 for an LLM, 1e-2 act-level) or None, got {self.lr}")
        need(0 < self.clip_eps < 1, f"clip_eps must be in (0, 1), typically 0.2; got {self.clip_eps}")
        need(self.kl_coef >= 0, f"kl_coef must be >= 0 (0 disables the KL penalty), got {self.kl_coef}")
        need(self.epochs >= 1, f"epochs must be >= 1, got {self.epochs}")
        need(self.micro_batch_size >= 1, f"micro_batch_size must be >= 1, got {self.micro_batch_size}")
        need(self.max_grad_norm >= 0, f"max_grad_norm must be >= 0 (0 disables clipping), got {self.max_grad_norm}")
        need(self.max_new_tokens >= 1, f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        need(self.temperature > 0, f"temperature must be > 0 for GRPO (sampled groups need variety), "
                                   f"got {self.temperature}; use 1.0")
        need(0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}")
        need(self.dtype in ("float32", "bfloat16"), f"dtype must be 'float32' or 'bfloat16', got {self.dtype!r}")
        need(self.lora_r >= 1 and self.lora_alpha >= 1,
             f"lora_r and lora_alpha must be >= 1, got r={self.lora_r}, alpha={self.lora_alpha}")
        need(self.hidden_size >= 1, f"hidden_size must be >= 1, got {self.hidden_size}")
        need(self.n_envs is None or self.n_envs >= 1, f"n_envs must be >= 1 or None (all at once), got {self.n_envs}")
        need(self.save_every >= 1, f"save_every must be >= 1, got {self.save_every}")
        need(self.keep_checkpoints >= 1, f"keep_checkpoints must be >= 1, got {self.keep_checkpoints}")

    @property
    def batch_size(self) -> int:
        """Dialogues per update."""
        return self.group_size * self.scenarios_per_update

    def sampling(self) -> SamplingParams:
        """Decoding settings of text policy turns."""
        return SamplingParams(max_new_tokens=self.max_new_tokens, temperature=self.temperature, top_p=self.top_p,
                              logprobs=True)


# ====================================================================================== advantages
def group_advantages(rewards: Sequence[float], groups: Sequence[int], scale: bool = True) -> np.ndarray:
    """Group-relative advantages ``(r - mean_g) / (std_g + eps)`` (population std).

    Args:
        rewards: One return per dialogue.
        groups: The group of each dialogue (any hashable labels).
        scale: Divide by the group std; False returns ``r - mean_g``.

    Returns:
        One advantage per dialogue; exactly 0 in groups whose rewards are all equal.
    """
    r = np.asarray(rewards, dtype=float)
    g = np.asarray(groups)
    if r.shape != g.shape or r.ndim != 1:
        raise ValueError(f"rewards {r.shape} and groups {g.shape} must be equal-length 1-D sequences")
    out = np.zeros_like(r)
    for label in np.unique(g):
        members = g == label
        centred = r[members] - r[members].mean()
        std = r[members].std()
        if std == 0:  # equal rewards: no signal (and no 0/0 noise from rounding)
            continue
        out[members] = centred / (std + EPS) if scale else centred
    return out


def zero_variance_fraction(rewards: Sequence[float], groups: Sequence[int]) -> float:
    """Fraction of groups whose rewards are all equal (they contribute no gradient)."""
    r, g = np.asarray(rewards, dtype=float), np.asarray(groups)
    labels = np.unique(g)
    if labels.size == 0:
        return math.nan
    return float(np.mean([np.ptp(r[g == label]) == 0 for label in labels]))


# ======================================================================================= policies
class ActPolicy(nn.Module):
    """A small MLP policy over a ``Box`` observation with ``Discrete`` actions.

    Args:
        obs_dim: Length of the (flattened) observation vector.
        n_actions: Number of discrete actions.
        hidden_size: Width of the two tanh hidden layers.
        seed: Seeds the initial weights (independently of the global torch RNG).
    """

    def __init__(self, obs_dim: int, n_actions: int, hidden_size: int = 64, seed: int = 0):
        super().__init__()
        if obs_dim < 1 or n_actions < 2:
            raise ValueError(f"need obs_dim >= 1 and n_actions >= 2, got {obs_dim}, {n_actions}")
        self.obs_dim, self.n_actions = obs_dim, n_actions
        self.net = nn.Sequential(nn.Linear(obs_dim, hidden_size), nn.Tanh(),
                                 nn.Linear(hidden_size, hidden_size), nn.Tanh(),
                                 nn.Linear(hidden_size, n_actions))
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for layer in self.net:
                if isinstance(layer, nn.Linear):
                    bound = 1 / math.sqrt(layer.in_features)
                    layer.weight.uniform_(-bound, bound, generator=generator)
                    layer.bias.zero_()
            self.net[-1].weight.mul_(0.01)  # start near uniform: the untrained policy explores

    @classmethod
    def for_env(cls, env: Any, hidden_size: int = 64, seed: int = 0) -> ActPolicy:
        """An ActPolicy sized for ``env``'s policy seat (``Box`` observations, ``Discrete`` actions)."""
        from gymnasium import spaces

        obs_space, act_space = env.observation_space(env.policy_seat), env.action_space(env.policy_seat)
        if not isinstance(obs_space, spaces.Box) or not isinstance(act_space, spaces.Discrete):
            raise TypeError(f"ActPolicy needs a Box observation and Discrete actions for the policy seat; "
                            f"{type(env).__name__} has {obs_space} / {act_space} (use LLMPolicy for text envs)")
        return cls(int(np.prod(obs_space.shape)), int(act_space.n), hidden_size, seed)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Action logits for a batch of observations ``[B, obs_dim]``."""
        return self.net(obs)

    def observations_tensor(self, observations: Sequence[Any]) -> torch.Tensor:
        """Observations as a float32 ``[B, obs_dim]`` tensor."""
        return torch.as_tensor(np.asarray(observations, dtype=np.float32).reshape(len(observations), -1))

    def act_batch(self, observations: list[Any], rng: np.random.Generator | None) -> list[int]:
        """Sample one action per observation with ``rng`` (None: the most likely action)."""
        with torch.no_grad():
            probs = torch.softmax(self(self.observations_tensor(observations)).double(), dim=-1).numpy()
        if rng is None:
            return [int(a) for a in probs.argmax(axis=1)]
        # Inverse-CDF sampling with the caller's generator keeps rollouts reproducible.
        u = rng.random(len(observations))
        cdf = np.cumsum(probs, axis=1)
        return [int(min(np.searchsorted(row, x, side="right"), self.n_actions - 1)) for row, x in zip(cdf, u)]

    def log_probs(self, observations: Sequence[Any] | torch.Tensor) -> torch.Tensor:
        """Log-probabilities of every action, ``[B, n_actions]``, with gradient."""
        obs = observations if isinstance(observations, torch.Tensor) else self.observations_tensor(observations)
        return torch.log_softmax(self(obs), dim=-1)

    def log_probs_and_entropy(self, observations: Sequence[Any] | torch.Tensor,
                              actions: Sequence[int] | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(log pi(a|o), entropy of pi(.|o))`` per pair, with gradient."""
        log_probs = self.log_probs(observations)
        acts = torch.as_tensor(actions, dtype=torch.long)
        return log_probs.gather(1, acts[:, None]).squeeze(1), -(log_probs.exp() * log_probs).sum(-1)


class LLMPolicy:
    """A text policy on a :class:`~simpop.agents.transformers_backend.TransformersBackend`.

    It satisfies :class:`~simpop.train.rollout.TokenPolicy`, so the rollout engine tracks its tokens.

    Args:
        backend: The model. For full fine-tuning build it with ``trainable=True`` (a frozen backend
            without LoRA makes a policy that can roll out but not train).
        sampling: Decoding settings of the policy's turns.
        lora: Train a LoRA adapter (added here as ``adapter``) instead of all weights.
        lora_r: LoRA rank.
        lora_alpha: LoRA alpha.
        adapter: Name of the policy's LoRA adapter.
        system_prompt: A fixed system message; None uses the observation's ``instructions`` field (the
            text envs' task description for the seat), or no system message if it has none.
    """

    def __init__(self, backend: TransformersBackend, sampling: SamplingParams | None = None, lora: bool = False,
                 lora_r: int = 16, lora_alpha: int = 32, adapter: str = "policy", system_prompt: str | None = None):
        self.backend = backend
        self.sampling = sampling or SamplingParams(max_new_tokens=48, temperature=1.0, logprobs=True)
        self.lora = lora
        self.adapter = adapter if lora else None
        self._system_prompt = system_prompt
        self._reference: TransformersBackend | None = None
        if lora:
            backend.add_adapter(adapter, r=lora_r, alpha=lora_alpha)

    def system_prompt(self, observation: dict[str, Any]) -> str | None:
        if self._system_prompt is not None:
            return self._system_prompt
        return observation.get("instructions")

    def generate_ids(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        """The policy's turns, with its own adapter active (other adapters may share the backend)."""
        if self.adapter is not None:
            self.backend.set_adapter(self.adapter)
        return self.backend.generate_ids(prompts, params)

    def parameters(self) -> list[nn.Parameter]:
        """The trained weights (the adapter's with LoRA, else all of the model's)."""
        return self.backend.parameters(self.adapter)

    def score(self, sequences: list[list[int]], masks: list[list[int]]) -> TokenScores:
        """Per-token log-probs/entropies of the policy's own tokens, at the sampling temperature."""
        if self.adapter is not None:
            self.backend.set_adapter(self.adapter)
        return self.backend.token_logprobs(sequences, masks, temperature=self.sampling.temperature)

    def reference_logprobs(self, sequences: list[list[int]], masks: list[list[int]]) -> torch.Tensor:
        """Log-probs under the reference (LoRA: adapters off; full FT: the model as first loaded)."""
        with torch.no_grad():
            if self.lora:
                with self.backend.disabled_adapters():
                    return self.backend.token_logprobs(sequences, masks, self.sampling.temperature).logprobs
            if self._reference is None:
                from simpop.agents.transformers_backend import TransformersBackend

                self._reference = TransformersBackend(self.backend.path, dtype=self.backend.dtype,
                                                      device=str(self.backend.device))
            return self._reference.token_logprobs(sequences, masks, self.sampling.temperature).logprobs

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The trained weights (adapter or full model), for checkpoints."""
        if self.lora:
            import peft

            return {k: v.detach().cpu().clone() for k, v in
                    peft.get_peft_model_state_dict(self.backend.model, adapter_name=self.adapter).items()}
        return {k: v.detach().cpu().clone() for k, v in self.backend.model.state_dict().items()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        if self.lora:
            import peft

            result = peft.set_peft_model_state_dict(self.backend.model, state, adapter_name=self.adapter)
            if result.unexpected_keys:
                raise ValueError(f"checkpoint does not fit adapter {self.adapter!r}: {result.unexpected_keys[:3]}")
        else:
            self.backend.model.load_state_dict(state)


# ========================================================================================= trainer
@dataclass
class Batch:
    """One update's rollouts and their advantages.

    Attributes:
        trajectories: The dialogues, grouped.
        advantages: One group-relative advantage per trajectory.
        stats: Rollout timing and counts.
    """

    trajectories: list[Trajectory]
    advantages: np.ndarray
    stats: RolloutStats

    @property
    def rewards(self) -> np.ndarray:
        return np.array([t.total_reward for t in self.trajectories], dtype=float)

    @property
    def groups(self) -> np.ndarray:
        return np.array([t.group for t in self.trajectories])


class GRPOTrainer:
    """GRPO on the policy seat of ``env_id`` against ``simulator`` (text or act level).

    Args:
        env_id: A registered env id.
        policy: An :class:`ActPolicy` (act-level envs) or an :class:`LLMPolicy` (text envs).
        simulator: The user seat's simulator or population.
        config: Hyper-parameters.
        env_kwargs: Env constructor arguments.
        run_dir: If given, metrics go to ``run_dir/metrics.jsonl`` (+ TensorBoard) and checkpoints to
            ``run_dir/checkpoints``.
        resume: Continue from the newest checkpoint in ``run_dir`` (if any).

    Attributes:
        update_count: Updates completed so far.
        history: Metrics of every update run by this object.
    """

    def __init__(self, env_id: str, policy: ActPolicy | LLMPolicy, simulator: Simulator, config: GRPOConfig,
                 env_kwargs: dict[str, Any] | None = None, run_dir: str | Path | None = None, resume: bool = False):
        if resume and run_dir is None:
            raise ValueError("resume=True needs the run_dir to resume from")
        self.env_id, self.policy, self.simulator, self.config = env_id, policy, simulator, config
        self.engine = RolloutEngine(env_id, policy, simulator, n_envs=config.n_envs, env_kwargs=env_kwargs)
        self.text = isinstance(policy, LLMPolicy)
        if not list(policy.parameters()):
            raise ValueError("the policy has no trainable weights: build TransformersBackend(trainable=True) for "
                             "full fine-tuning, or LLMPolicy(..., lora=True)")
        lr = config.lr or (1e-4 if self.text and policy.lora else 1e-5 if self.text else 1e-2)
        self.optimizer = torch.optim.Adam(list(policy.parameters()), lr=lr)
        self.reference = (copy.deepcopy(policy).requires_grad_(False)
                          if isinstance(policy, ActPolicy) and config.kl_coef > 0 else None)
        self.rng = np.random.default_rng(config.seed)
        self.update_count = 0
        self.history: list[dict[str, float]] = []
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.logger = None
        if self.run_dir is not None:
            from simpop.evaluation.metrics import MetricsLogger

            start = None
            if resume and (path := checkpoint.latest(self.run_dir)) is not None:
                step, state = checkpoint.load(path)
                self.load_state_dict(state)
                start = step
            self.logger = MetricsLogger(self.run_dir, resume_step=start)

    # ----------------------------------------------------------------- rollouts
    def collect(self) -> Batch:
        """Run one update's groups of dialogues and compute their advantages."""
        c = self.config
        seed = int(self.rng.integers(2**63 - 1))
        trajectories = self.engine.collect(c.scenarios_per_update, group_size=c.group_size, seed=seed)
        rewards = [t.total_reward for t in trajectories]
        advantages = group_advantages(rewards, [t.group for t in trajectories], scale=c.scale_rewards)
        return Batch(trajectories, advantages, self.engine.stats)

    # ----------------------------------------------------------------- optimisation
    def update(self, batch: Batch) -> dict[str, float]:
        """``epochs`` optimiser steps on ``batch``; returns this update's metrics."""
        c = self.config
        start = time.perf_counter()
        units = self._text_units(batch) if self.text else self._act_units(batch)
        total = sum(float(u["weight"].sum()) for u in units)
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
            sums = {"loss": 0.0, "kl": 0.0, "clip_frac": 0.0, "entropy": 0.0}
            for i, unit in enumerate(units):
                logp, entropy, kl = self._forward(unit)
                old_logp = old[i] if old is not None else logp.detach()
                loss, parts = surrogate_loss(logp, old_logp, unit["advantage"], unit["weight"], c.clip_eps,
                                             kl=kl, kl_coef=c.kl_coef, normaliser=total)
                loss.backward()
                sums["loss"] += loss.item()
                sums["kl"] += parts["kl"]
                sums["clip_frac"] += parts["clip_frac"]
                sums["entropy"] += float((entropy.detach() * unit["weight"]).sum()) / max(total, 1.0)
            grad_norm = _clip_grad(self.policy.parameters(), c.max_grad_norm)
            self.optimizer.step()
            stats = {**sums, "grad_norm": grad_norm}
        self.update_count += 1
        rewards, rollout = batch.rewards, batch.stats
        metrics = {
            "reward_mean": float(rewards.mean()),
            "reward_std": float(rewards.std()),
            "success": float(np.mean([t.success for t in batch.trajectories])),
            "zero_var_frac": zero_variance_fraction(rewards, batch.groups),
            "loss": stats["loss"],
            "kl": stats["kl"],
            "clip_frac": stats["clip_frac"],
            "grad_norm": stats["grad_norm"],
            "policy_turns": float(np.mean([t.policy_turns for t in batch.trajectories])),
            "rollout_s": rollout.total_s,
            "update_s": time.perf_counter() - start,
            "steps_per_s": rollout.env_steps / rollout.total_s if rollout.total_s > 0 else 0.0,
        }
        if c.log_entropy:
            metrics["policy_entropy"] = stats["entropy"]
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
            weight = torch.zeros(len(chosen), width)
            for row, t in enumerate(trajectories):
                weight[row, :len(t.mask)] = torch.tensor(t.mask, dtype=torch.float32)
            advantage = torch.tensor([float(batch.advantages[i]) for i in chosen])[:, None].expand(-1, width)
            units.append({"sequences": [t.token_ids for t in trajectories], "masks": [t.mask for t in trajectories],
                          "weight": weight, "advantage": advantage})
        return units

    def _forward(self, unit: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """``(log-probs, entropies, KL to the reference or None)`` per unit, with gradient."""
        if self.text:
            scores = self.policy.score(unit["sequences"], unit["masks"])  # type: ignore[union-attr]
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
            return self.policy.reference_logprobs(unit["sequences"], unit["masks"])  # type: ignore[union-attr]
        assert self.reference is not None
        return self.reference.log_probs(unit["obs"])

    # ----------------------------------------------------------------- loop + checkpoints
    def train(self, num_updates: int, callback: Callable[[int, dict[str, float]], None] | None = None,
              progress: bool = False) -> list[dict[str, float]]:
        """Run ``num_updates`` more updates (collect + update), logging and checkpointing each.

        Args:
            num_updates: Updates to run now.
            callback: Called as ``callback(update_count, metrics)`` after each update (e.g. evaluation).
            progress: Show a tqdm progress bar.
        """
        if num_updates < 0:
            raise ValueError(f"num_updates must be >= 0, got {num_updates}")
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=num_updates, desc="grpo", unit="update")
        out = []
        for _ in range(num_updates):
            metrics = self.update(self.collect())
            self.history.append(metrics)
            out.append(metrics)
            if self.logger is not None:
                self.logger.log(self.update_count, metrics)
            if self.run_dir is not None and self.update_count % self.config.save_every == 0:
                checkpoint.save(self.run_dir, self.update_count, self.state_dict(), keep=self.config.keep_checkpoints)
            if callback is not None:
                callback(self.update_count, metrics)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(reward=f"{metrics['reward_mean']:.3f}", zero_var=f"{metrics['zero_var_frac']:.2f}")
        if bar is not None:
            bar.close()
        return out

    def state_dict(self) -> dict[str, Any]:
        """Policy, optimiser, trainer RNG and update counter (the global RNGs are saved by checkpoint.save)."""
        return {"policy": self.policy.state_dict(), "optimizer": self.optimizer.state_dict(),
                "rng": self.rng.bit_generator.state, "update_count": self.update_count,
                "config": dataclasses.asdict(self.config)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.policy.load_state_dict(state["policy"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.rng.bit_generator.state = state["rng"]
        self.update_count = int(state["update_count"])


def surrogate_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantage: torch.Tensor, weight: torch.Tensor,
                   clip_eps: float, kl: torch.Tensor | None = None, kl_coef: float = 0.0,
                   normaliser: float | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """The clipped GRPO surrogate plus KL penalty, summed over units with ``weight`` (the rollout
    mask) and divided by ``normaliser`` (default: the weight total).

    Units with weight 0 (simulator, env and template tokens) contribute neither loss nor gradient,
    whatever their inputs hold (even inf or nan).

    Args:
        logp: Current log-probs of the units (with gradient).
        old_logp: Log-probs under the policy that collected them.
        advantage: Advantage per unit.
        weight: 1 for the policy's units, 0 elsewhere.
        clip_eps: Ratio clip range.
        kl: KL to the reference per unit (with gradient), or None.
        kl_coef: KL weight.
        normaliser: Divide the weighted sum by this (so that micro-batches add up to a batch mean).

    Returns:
        ``(loss, {"kl": weighted mean KL, "clip_frac": share of units whose ratio was clipped})``.
    """
    normaliser = max(float(weight.sum()) if normaliser is None else normaliser, 1.0)
    on = weight > 0
    zero = torch.zeros((), dtype=logp.dtype)
    # Masked units become constants *before* any arithmetic, so nothing they hold reaches the loss
    # or its gradient (torch.where routes no gradient to the branch it does not take).
    logp, old_logp = torch.where(on, logp, zero), torch.where(on, old_logp, zero)
    advantage = torch.where(on, advantage, zero)
    ratio = torch.exp(logp - old_logp)
    per_unit = -torch.minimum(ratio * advantage, torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * advantage)
    kl_sum = 0.0
    if kl is not None:
        kl = torch.where(on, kl, zero)
        per_unit = per_unit + kl_coef * kl
        kl_sum = float((kl.detach() * weight).sum())
    loss = (per_unit * weight).sum() / normaliser
    clipped = (((ratio.detach() - 1).abs() > clip_eps) & on).float()
    return loss, {"kl": kl_sum / normaliser, "clip_frac": float((clipped * weight).sum()) / normaliser}


def _categorical_kl(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """``KL(p || q)`` per row of log-probability matrices."""
    return (log_p.exp() * (log_p - log_q)).sum(-1)


def _clip_grad(parameters: Iterator[nn.Parameter] | list[nn.Parameter], max_norm: float) -> float:
    params = [p for p in parameters if p.grad is not None]
    if not params:
        return 0.0
    if max_norm > 0:
        return float(torch.nn.utils.clip_grad_norm_(params, max_norm))
    return float(torch.linalg.vector_norm(torch.stack([p.grad.detach().norm() for p in params])))
