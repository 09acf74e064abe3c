"""Policies: what fills the policy seat, and how one is built from a :class:`ModelConfig`.

Every policy satisfies :class:`Policy` (``entropy`` over its own decisions) plus one of the two acting
protocols the rollout engine understands:

- :class:`TokenPolicy`: a text LLM whose token ids the engine keeps exactly as generated
  (:class:`LLMPolicy`, on a :class:`~simpop.agents.base.TrainableBackend`, full fine-tuning or a
  :class:`~simpop.agents.lora.LoRAAdapter`);
- :class:`BatchPolicy`: observations to actions (:class:`ActPolicy`, an MLP over ``Box`` observations with
  ``Discrete`` actions; scripted baselines; any user object with ``act_batch``).

:class:`ModelConfig` (TRL-style) says which model and how it is trained (dtype, prefix cache, LoRA);
:func:`build_policy` builds the policy that fits an env's policy seat. Algorithm configs carry no model
fields, so generation can move to another engine while training stays in torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

import numpy as np
import torch
from torch import nn

from simpop.agents.base import Generation, SamplingParams, TokenBackend, TrainableBackend
from simpop.agents.lora import LoRAAdapter
from simpop.validation import check_fields

if TYPE_CHECKING:
    from simpop.agents.transformers_backend import TokenScores


@runtime_checkable
class Policy(Protocol):
    """What evaluation needs of any policy: its entropy at its own decisions (nan if it cannot say)."""

    def entropy(self, trajectories: Sequence[Any]) -> float:
        """Mean entropy in nats over the policy's decisions (act) or generated tokens (text)."""
        ...


@runtime_checkable
class TokenPolicy(Protocol):
    """A text policy whose tokens the engine tracks.

    Attributes:
        backend: The policy model's backend; the engine uses its chat template (``encode_chat``).
        sampling: Decoding settings for the policy's turns (``seed`` is set per call by the engine).
    """

    backend: TokenBackend
    sampling: SamplingParams

    def generate_ids(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        """The policy's turns for exact prompt ids (with log-probs), e.g. ``backend.generate_ids`` with
        the policy's own LoRA adapter active."""
        ...

    def system_prompt(self, observation: dict[str, Any]) -> str | None:
        """The system message of a dialogue, given its first parsed observation (None: no system message).

        Text envs put the seat's task in the observation's ``instructions`` field.
        """
        ...


@runtime_checkable
class BatchPolicy(Protocol):
    """A policy that maps a batch of observations to actions (act-level or untracked text)."""

    def act_batch(self, observations: list[Any], rng: np.random.Generator) -> list[Any]:
        """One action per observation; randomness only from ``rng``."""
        ...


@dataclass(frozen=True)
class ModelConfig:
    """The policy model and how it is trained (the ``--model`` ... flags are generated from these fields).

    Attributes:
        model: Text policies: an embedded model name (``smollm2``) or a local HF folder.
        dtype: Weights dtype of a text policy: ``float32``, ``bfloat16`` or ``auto`` (bfloat16 on CUDA GPUs and
            on CPUs with native bf16 matmul, AVX512-BF16/AMX; float32 on other CPUs, where bf16 is ~1.8x slower).
            ``simpop train`` records the resolved one as ``model_dtype`` in the run's ``run.json``.
        prefix_cache: Text models keep each dialogue's KV cache between its turns, so a turn reads only its
            new tokens (3x faster collection in ``benchmarks/rollout_batching.py``; memory: up to 64 cached
            sequences per model, ~46 KB per token for SmolLM2 in float32). Dropped at every weight update.
        lora: Train LoRA adapters instead of all weights (text policies); the reference is then the base
            model with adapters disabled, at no extra memory.
        lora_r: LoRA rank.
        lora_alpha: LoRA scaling numerator (the update is scaled by lora_alpha / lora_r).
        adapter: Name of the policy's LoRA adapter (distinct from simulators' adapters on a shared model).
        hidden_size: Width of the act-level policy's two hidden layers.
        generator: Where text policies generate: ``""`` in torch (the trained model itself), ``vllm:launch``
            (a vLLM server started for the run) or ``vllm:http://HOST:PORT`` (a running one serving the same
            base model). Training stays in torch; the trainer syncs the weights after each update
            (:class:`~simpop.agents.vllm_backend.VLLMGenerator`).
    """

    model: str = "smollm2"
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    prefix_cache: bool = True
    lora: bool = False
    lora_r: int = 16
    lora_alpha: int = 32
    adapter: str = "policy"
    hidden_size: int = 64
    generator: str = ""

    def __post_init__(self) -> None:
        check_fields(self)
        if self.dtype not in ("auto", "float32", "bfloat16"):
            raise ValueError(f"ModelConfig: dtype must be 'auto', 'float32' or 'bfloat16', got {self.dtype!r}")
        if self.lora_r < 1 or self.lora_alpha < 1:
            raise ValueError(f"ModelConfig: lora_r and lora_alpha must be >= 1, got r={self.lora_r}, "
                             f"alpha={self.lora_alpha}")
        if self.hidden_size < 1:
            raise ValueError(f"ModelConfig: hidden_size must be >= 1, got {self.hidden_size}")
        if not self.adapter or "." in self.adapter:
            raise ValueError(f"ModelConfig: adapter must be a non-empty name without '.', got {self.adapter!r}")
        if self.generator:
            from simpop.agents.vllm_backend import parse_generator

            try:
                parse_generator(self.generator)
            except ValueError as error:
                raise ValueError(f"ModelConfig: {error}") from None


def build_policy(env: Any, model: ModelConfig, sampling: SamplingParams | None = None, seed: int = 0,
                 backend: TrainableBackend | None = None) -> ActPolicy | LLMPolicy:
    """The policy for ``env``'s policy seat: an :class:`ActPolicy` for ``Discrete`` actions (weights seeded by
    ``seed``), else an :class:`LLMPolicy` on ``model.model`` (or on ``backend``, e.g. one shared with
    trainable simulators)."""
    from gymnasium import spaces

    if isinstance(env.action_space(env.policy_seat), spaces.Discrete):
        return ActPolicy.for_env(env, model.hidden_size, seed)
    if backend is None:
        from simpop.agents.transformers_backend import TransformersBackend

        backend = TransformersBackend(model.model, dtype=model.dtype, trainable=not model.lora,
                                      prefix_cache=model.prefix_cache)
    policy = LLMPolicy(backend, sampling, lora=model.lora, lora_r=model.lora_r, lora_alpha=model.lora_alpha,
                       adapter=model.adapter)
    if model.generator:
        from simpop.agents.vllm_backend import build_generator

        policy.generator = build_generator(model.generator, model.model, backend.path, policy.adapter, model.lora_r)
    return policy


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
            head = self.net[-1]
            assert isinstance(head, nn.Linear)
            head.weight.mul_(0.01)  # start near uniform: the untrained policy explores

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
        # (cdf <= u).sum() is searchsorted(cdf, u, side="right") for every row at once (cdf is non-decreasing).
        u = rng.random(len(observations))
        cdf = np.cumsum(probs, axis=1)
        return np.minimum((cdf <= u[:, None]).sum(axis=1), self.n_actions - 1).tolist()

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

    def entropy(self, trajectories: Sequence[Any]) -> float:
        """Mean entropy (nats) of the action distribution at the policy's own decisions in ``trajectories``."""
        obs = [o for t in trajectories for o in t.observations[t.policy_seat]]
        acts = [a for t in trajectories for a in t.actions[t.policy_seat]]
        if not obs:
            return math.nan
        with torch.no_grad():
            return float(self.log_probs_and_entropy(obs, acts)[1].mean())


class LLMPolicy:
    """A text policy on a :class:`~simpop.agents.transformers_backend.TransformersBackend`.

    It satisfies :class:`~simpop.rollout.TokenPolicy`, so the rollout engine tracks its tokens.

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
        generator: Generate on another engine (a :class:`~simpop.agents.vllm_backend.VLLMGenerator`) while
            training here; :meth:`sync_generator` pushes the weights after each update. None: the backend.
    """

    def __init__(self, backend: TrainableBackend, sampling: SamplingParams | None = None, lora: bool = False,
                 lora_r: int = 16, lora_alpha: int = 32, adapter: str = "policy", system_prompt: str | None = None,
                 generator: Any = None):
        self.backend = backend
        self.generator = generator
        self.sampling = sampling or SamplingParams(max_new_tokens=48, temperature=1.0, logprobs=True)
        self.lora = LoRAAdapter(backend, adapter, r=lora_r, alpha=lora_alpha) if lora else None
        self._system_prompt = system_prompt
        self._reference: TrainableBackend | None = None

    @property
    def adapter(self) -> str | None:
        """The policy's LoRA adapter name (None for full fine-tuning)."""
        return self.lora.name if self.lora is not None else None

    def system_prompt(self, observation: dict[str, Any]) -> str | None:
        """The system message for a text observation: the policy's fixed one, else the seat's task from the
        observation.
        """
        return _system_prompt(self._system_prompt, observation)

    def served(self) -> ServedPolicy | None:
        """The policy's rollout side without the trained model: its turns on the generator's server, with the
        newest synced weights (what Ray rollout workers run, :mod:`simpop.rollout_ray`); None without a
        generator."""
        if self.generator is None:
            return None
        return ServedPolicy(self.generator.served_client(), self.sampling, self._system_prompt)

    def generate_ids(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        """The policy's turns, with its own adapter active (other adapters may share the backend)."""
        if self.generator is not None:
            return self.generator.generate_ids(prompts, params)
        if self.lora is not None:
            self.lora.activate()
        return self.backend.generate_ids(prompts, params)

    def sync_generator(self) -> dict[str, float]:
        """Push the trained weights to the generator (after an update); its metrics ({} without one)."""
        return self.generator.sync(self.backend.model) if self.generator is not None else {}

    def parameters(self) -> list[nn.Parameter]:
        """The trained weights (the adapter's with LoRA, else all of the model's)."""
        return self.lora.parameters() if self.lora is not None else self.backend.parameters()

    def score(self, sequences: list[list[int]], masks: list[list[int]]) -> TokenScores:
        """Per-token log-probs/entropies of the policy's own tokens, at the sampling temperature."""
        if self.lora is not None:
            self.lora.activate()
        return self.backend.token_logprobs(sequences, masks, temperature=self.sampling.temperature)

    def reference_logprobs(self, sequences: list[list[int]], masks: list[list[int]]) -> torch.Tensor:
        """Log-probs under the reference (LoRA: adapters off; full FT: the model as first loaded), under
        ``no_grad`` in the backend's micro-batches (those of :meth:`score`)."""
        with torch.no_grad():
            if self.lora is not None:
                with self.lora.disabled():
                    return self.backend.token_logprobs(sequences, masks, self.sampling.temperature).logprobs
            if self._reference is None:
                from simpop.agents.transformers_backend import TransformersBackend

                self._reference = TransformersBackend(self.backend.path, dtype=self.backend.dtype,
                                                      device=str(self.backend.device),
                                                      token_budget=self.backend.token_budget)
            return self._reference.token_logprobs(sequences, masks, self.sampling.temperature).logprobs

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The trained weights (adapter or full model), for checkpoints."""
        if self.lora is not None:
            return self.lora.state_dict()
        return {k: v.detach().cpu().clone() for k, v in self.backend.model.state_dict().items()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Load trained weights: the LoRA adapter's, or the whole model's for full fine-tuning."""
        if self.lora is not None:
            self.lora.load_state_dict(state)
        else:
            self.backend.model.load_state_dict(state)

    def entropy(self, trajectories: Sequence[Any]) -> float:
        """Mean per-token entropy (nats) of the policy's own generated tokens in ``trajectories``."""
        scored = [t for t in trajectories if t.policy_tokens > 0]
        if not scored:
            return math.nan
        total, count = 0.0, 0.0
        with torch.no_grad():
            for t in scored:  # one dialogue at a time keeps memory flat
                scores = self.score([t.token_ids], [t.mask])
                total += float((scores.entropies * scores.mask).sum())
                count += float(scores.mask.sum())
        return total / count if count else math.nan


@dataclass
class ServedPolicy:
    """A text policy's turns generated by a served model (:meth:`LLMPolicy.served`): a :class:`TokenPolicy`
    holding no model, light enough to ship to rollout workers while training stays with the trainer.

    Attributes:
        backend: The server client (its chat template comes from a local tokenizer), set to the served weights.
        sampling: The policy's decoding settings.
        fixed_system_prompt: The policy's fixed system message (None: the observation's ``instructions``).
    """

    backend: TokenBackend
    sampling: SamplingParams
    fixed_system_prompt: str | None = None

    def system_prompt(self, observation: dict[str, Any]) -> str | None:
        """The system message for a text observation (as :meth:`LLMPolicy.system_prompt`)."""
        return _system_prompt(self.fixed_system_prompt, observation)

    def generate_ids(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        """Completions of exact prompt ids on the server, with the newest synced weights."""
        return self.backend.generate_ids(prompts, params)


def _system_prompt(fixed: str | None, observation: dict[str, Any]) -> str | None:
    """A text policy's system message: its fixed one, else the seat's task from the observation."""
    return fixed if fixed is not None else observation.get("instructions")
