"""Trainable LLM simulators: a LoRA adapter per simulator on a shared in-process model.

:class:`TrainableLLMSimulator` is an :class:`~simpop.simulators.llm.LLMSimulator` with its own
:class:`~simpop.agents.lora.LoRAAdapter` on a shared :class:`~simpop.agents.base.TrainableBackend` (K
simulators = K adapters on one base model). It keeps the prompt ids, generated ids and sampling log-probs
of its own turns; :meth:`TrainableLLMSimulator.score` re-scores them with gradient, and its KL anchor is to
the base model (adapters disabled). Records are kept per dialogue in start order (:attr:`episodes`), as
:class:`~simpop.seat.Trainable` requires. ``snapshot()`` returns a frozen copy (a new adapter holding the
current weights) for a :class:`~simpop.simulators.population.CheckpointPool`.

Spec strings: ``trainable:MODEL?temperature=1.0&lora_r=8`` (this class), ``trainable:KIND`` (a kind's own
trainable form, e.g. ``trainable:persuadee``; :func:`from_spec` dispatches).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from simpop.agents.base import Chat, SamplingParams, TrainableBackend
from simpop.agents.lora import LoRAAdapter
from simpop.seat import BuildContext, Scores, Simulator, SimulatorSpec, Trainable, kind
from simpop.simulators.llm import LLMSimulator, env_format, sampling
from simpop.simulators.registry import inner_or_none


@dataclass
class LLMTurn:
    """One generated simulator turn: prompt ids, generated ids, and their sampling log-probs."""

    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]


@dataclass
class LLMEpisode:
    """The simulator turns of one dialogue."""

    turns: list[LLMTurn] = field(default_factory=list)


class TrainableLLMSimulator(LLMSimulator, Trainable):
    """An LLM simulator with its own LoRA adapter on a shared backend.

    Args:
        backend: The shared base model; this simulator adds adapter ``adapter`` to it (or reuses it).
        adapter: The adapter's name (unique per simulator on one backend).
        params: Decoding settings; must sample (temperature > 0): a trainable simulator needs the
            log-probabilities of sampled replies.
        lora_r, lora_alpha: LoRA rank and scaling.
        name, personas, persona_set, fallback_reply: As for :class:`LLMSimulator`.
    """

    kind = "trainable"

    def __init__(self, backend: TrainableBackend, adapter: str, params: SamplingParams | None = None, *,
                 lora_r: int = 8, lora_alpha: int = 16, name: str | None = None,
                 personas: Sequence[Any] | None = None, persona_set: str | None = None, **kwargs: Any):
        params = params or SamplingParams(max_new_tokens=48, temperature=1.0)
        if params.greedy:
            raise ValueError("a trainable simulator must sample (temperature > 0) so that its replies have "
                             "log-probabilities to learn from")
        super().__init__(backend, params, name=name or f"trainable:{backend.name}:{adapter}", personas=personas,
                         persona_set=persona_set, **kwargs)
        self.lora = LoRAAdapter(backend, adapter, r=lora_r, alpha=lora_alpha)
        self.lora_r, self.lora_alpha = lora_r, lora_alpha
        self.episodes: list[LLMEpisode] = []
        self._slot_episode: list[LLMEpisode] = []
        self._last: list[LLMTurn] = []

    @classmethod
    def from_spec(cls, spec: SimulatorSpec, context: BuildContext) -> TrainableLLMSimulator:
        """Build from a ``trainable:MODEL`` spec: a new adapter on the context's shared model."""
        if spec.params["temperature"] <= 0:
            raise ValueError(f"trainable simulators must sample (their replies' log-probabilities are what they "
                             f"learn from): use trainable:{spec.model}?temperature=1.0")
        backend = context.trainable_backend(spec.model)
        adapter = f"sim{sum(n.startswith('sim') and '_s' not in n for n in backend.adapter_names)}"
        personas = context.personas(spec.personas)
        return cls(backend, adapter, sampling(spec), lora_r=spec.params["lora_r"], lora_alpha=spec.params["lora_alpha"],
                   personas=personas, persona_set=spec.personas if personas is not None else None,
                   text_format=env_format(context))

    @property
    def adapter(self) -> str:
        return self.lora.name

    @property
    def spec(self) -> SimulatorSpec:
        return SimulatorSpec(self.kind, f"{self.backend.name}+lora:{self.adapter}", self.persona_set, self._decoding(),
                             {"lora_r": self.lora_r, "lora_alpha": self.lora_alpha})

    def parameters(self) -> list[torch.nn.Parameter]:
        return self.lora.parameters()

    def reset_batch(self, scenarios: list[Any], rngs: list[np.random.Generator]) -> None:
        super().reset_batch(scenarios, rngs)
        self._slot_episode = [LLMEpisode() for _ in scenarios]
        if not self.frozen:  # snapshots are never trained: keeping their dialogues would only grow memory
            self.episodes.extend(self._slot_episode)

    def raw_generate(self, chats: list[Chat], params: SamplingParams) -> list[str]:
        """Generate with this simulator's adapter, keeping ids and log-probs of every reply."""
        self.stats["backend_calls"] += 1
        self.lora.activate()
        generations = self.backend.generate(chats, dataclasses.replace(params, logprobs=True))
        self._last = [LLMTurn(g.prompt_ids, g.token_ids, list(g.logprobs or [])) for g in generations]
        return [g.text for g in generations]

    def act_batch(self, observations: list[Any], slots: list[int]) -> list[str]:
        replies = super().act_batch(observations, slots)
        for slot, turn in zip(slots, self._last, strict=True):
            if turn.token_ids:
                self._slot_episode[slot].turns.append(turn)
        return replies

    def score(self, episodes: Sequence[LLMEpisode]) -> Scores:
        """Summed token log-probs of each dialogue's replies (this adapter) and the k3 KL to the base model."""
        logprob = torch.zeros(len(episodes))
        kl = torch.zeros(len(episodes))
        rows = [(i, turn) for i, e in enumerate(episodes) for turn in e.turns]
        if not rows:
            return Scores(logprob, kl)
        sequences = [t.prompt_ids + t.token_ids for _, t in rows]
        masks = [[0] * len(t.prompt_ids) + [1] * len(t.token_ids) for _, t in rows]
        temperature = self.params.temperature
        self.lora.activate()
        scores = self.backend.token_logprobs(sequences, masks, temperature=temperature)
        with torch.no_grad(), self.lora.disabled():
            reference = self.backend.token_logprobs(sequences, masks, temperature=temperature).logprobs
        delta = (reference - scores.logprobs) * scores.mask
        per_token_kl = (torch.exp(delta) - delta - 1) * scores.mask  # k3 estimator: unbiased, >= 0
        index = torch.as_tensor([i for i, _ in rows])
        logprob = logprob.index_add(0, index, (scores.logprobs * scores.mask).sum(1))
        kl = kl.index_add(0, index, per_token_kl.sum(1))
        return Scores(logprob, kl)

    def state_dict(self) -> dict[str, Any]:
        return self.lora.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.lora.load_state_dict(state)

    def snapshot(self) -> TrainableLLMSimulator:
        """A frozen copy: a new adapter ``<adapter>_s<n>`` on the same base holding the current weights."""
        clone = copy.copy(self)
        clone.lora = self.lora.copy(f"{self.adapter}_s{len(list(self.lora.copies()))}")
        clone.stats = {key: 0 for key in self.stats}
        clone.episodes, clone._slot_episode, clone._last = [], [], []
        clone._scenarios, clone._rngs = [], []
        clone.frozen = True
        return clone


def from_spec(spec: SimulatorSpec, context: BuildContext) -> Simulator:
    """The ``trainable`` kind: a LoRA simulator on a model, or a kind's own trainable form (``trainable:KIND``)."""
    inner = inner_or_none(spec)
    if inner is None:
        return TrainableLLMSimulator.from_spec(spec, context)
    from simpop.envs.registration import load

    return load(kind(inner.kind).trainable)(inner, context)
