"""Trainable LLM simulators: a LoRA adapter per simulator on a shared in-process model.

:class:`TrainableLLMSimulator` is an :class:`~simpop.simulators.llm.LLMSimulator` with its own
:class:`~simpop.agents.lora.LoRAAdapter` on a shared :class:`~simpop.agents.base.TrainableBackend` (K
simulators = K adapters on one base model). It keeps the prompt ids, generated ids and sampling log-probs
of its own turns; :meth:`TrainableLLMSimulator.score` re-scores them with gradient, and its KL anchor is to
the base model (adapters disabled). Records are kept per dialogue in start order (:attr:`episodes`), as
:class:`~simpop.seat.Trainable` requires. ``snapshot()`` returns a frozen copy (a new adapter holding the
current weights) for a :class:`~simpop.simulators.population.CheckpointPool`.

With a generator (:meth:`TrainableLLMSimulator.use_generator`, a
:class:`~simpop.agents.vllm_backend.VLLMGenerator`; the co-trainer gives one when the policy generates on vLLM)
the simulator's replies are sampled on that server under its own versioned LoRA name (``sim0@v3``); scoring
and training stay in torch, and :meth:`TrainableLLMSimulator.sync_generator` pushes the adapter after each
update (and lazily after :meth:`~TrainableLLMSimulator.load_state_dict` or :meth:`~TrainableLLMSimulator.snapshot`).

Spec strings: ``trainable:MODEL?temperature=1.0&lora_r=8`` (this class), ``trainable:KIND`` (a kind's own
trainable form, e.g. ``trainable:persuadee``; :func:`from_spec` dispatches).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Sequence
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
        lora_r: LoRA rank.
        lora_alpha: LoRA scaling.
        name: As for :class:`LLMSimulator`.
        personas: As for :class:`LLMSimulator`.
        persona_set: As for :class:`LLMSimulator`.
        **kwargs: More :class:`LLMSimulator` arguments (``fallback_reply``, ``text_format``).
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
        self.generator: Any = None
        self.is_weights: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], Any] | None = None
        self.mismatch = {"abs_diff_sum": 0.0, "truncated": 0.0, "tokens": 0.0}
        self._stale = False

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

    def use_generator(self, generator: Any, is_weights: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], Any]
                      | None = None) -> None:
        """Sample replies on ``generator`` (a :class:`~simpop.agents.vllm_backend.VLLMGenerator` of the same base
        model; this simulator serves its adapter under its own name), synced before the next generation.

        Args:
            generator: A generator whose ``adapter`` is :attr:`adapter`; use ``generator.for_adapter(...)`` to
                share one server.
            is_weights: ``(torch_logp, gen_logp, mask) -> Mismatch`` (truncated importance sampling,
                :func:`simpop.train.objectives.truncated_is_weights` with a cap); :meth:`score` then weights each
                reply token's log-prob by it. None: no correction.
        """
        if generator.adapter != self.adapter:
            raise ValueError(f"the generator serves adapter {generator.adapter!r}, this simulator is {self.adapter!r}")
        self.generator, self.is_weights, self._stale = generator, is_weights, True

    def sync_generator(self) -> dict[str, float]:
        """Push this adapter's weights to the generator (after an update); its metrics ({} without one)."""
        if self.generator is None:
            return {}
        self._stale = False
        return self.generator.sync(self.backend.model)

    def reset_batch(self, scenarios: list[Any], rngs: list[np.random.Generator]) -> None:
        super().reset_batch(scenarios, rngs)
        self._slot_episode = [LLMEpisode() for _ in scenarios]
        if not self.frozen:  # snapshots are never trained: keeping their dialogues would only grow memory
            self.episodes.extend(self._slot_episode)

    def raw_generate(self, chats: list[Chat], params: SamplingParams) -> list[str]:
        """Generate with this simulator's adapter, keeping ids and log-probs of every reply."""
        self.stats["backend_calls"] += 1
        params = dataclasses.replace(params, logprobs=True)
        if self.generator is None:
            self.lora.activate()
            generations = self.backend.generate(chats, params)
        else:
            if self._stale:
                self.sync_generator()
            generations = self.generator.generate_ids([self.backend.encode_chat(c) for c in chats], params)
        self._last = [LLMTurn(g.prompt_ids, g.token_ids, list(g.logprobs or [])) for g in generations]
        return [g.text for g in generations]

    def act_batch(self, observations: list[Any], slots: list[int]) -> list[str]:
        replies = super().act_batch(observations, slots)
        for slot, turn in zip(slots, self._last, strict=True):
            if turn.token_ids:
                self._slot_episode[slot].turns.append(turn)
        return replies

    def score(self, episodes: Sequence[LLMEpisode]) -> Scores:
        """Summed token log-probs of each dialogue's replies (this adapter) and the k3 KL to the base model.

        Replies sampled on a generator, with ``is_weights`` set (:meth:`use_generator`): each token's log-prob is
        weighted by its truncated importance weight ``min(pi_torch / pi_gen, cap)`` (detached), so the
        score-function gradient is that of the torch model although vLLM sampled; the mismatch accumulates in
        :attr:`mismatch`.

        A dialogue's turns are scored in as few rows as :func:`dialogue_rows` finds (a turn whose prompt begins
        with the previous turn's prompt and reply is scored in that row); call ``backward`` on what is built from
        the result before another adapter is activated (above the backend's token budget, backward recomputes the
        layers).
        """
        logprob = torch.zeros(len(episodes))
        kl = torch.zeros(len(episodes))
        rows = dialogue_rows(episodes)
        if not rows.sequences:
            return Scores(logprob, kl)
        temperature = self.params.temperature
        # Both passes run in the backend's micro-batches (the same split): the reference first, under no_grad,
        # so that no graph is alive meanwhile; then the scored pass (above the backend's token budget it keeps
        # only each layer's input, and backward recomputes the rest).
        self.lora.activate()
        with torch.no_grad(), self.lora.disabled():
            reference = self.backend.token_logprobs(rows.sequences, rows.masks, temperature=temperature).logprobs
        scores = self.backend.token_logprobs(rows.sequences, rows.masks, temperature=temperature)
        delta = (reference - scores.logprobs) * scores.mask
        per_token_kl = (torch.exp(delta) - delta - 1) * scores.mask  # k3 estimator: unbiased, >= 0
        index = torch.as_tensor(rows.episode)
        weight = scores.mask
        if self.generator is not None and self.is_weights is not None:
            weight = self._importance_weights(rows.placed, scores.logprobs, scores.mask)
        logprob = logprob.index_add(0, index, (scores.logprobs * weight).sum(1))
        kl = kl.index_add(0, index, per_token_kl.sum(1))
        return Scores(logprob, kl)

    def _importance_weights(self, placed: list[tuple[int, int, LLMTurn]], logprobs: torch.Tensor,
                            mask: torch.Tensor) -> torch.Tensor:
        """Per-token TIS weights (0 off the replies) of the turns ``placed`` (row, reply start, turn) in the rows
        scored as ``logprobs``."""
        assert self.is_weights is not None
        gen = torch.zeros_like(logprobs)
        for row, start, turn in placed:
            if len(turn.logprobs) != len(turn.token_ids):
                raise ValueError(f"{self.name}: a reply of {len(turn.token_ids)} tokens came with "
                                 f"{len(turn.logprobs)} generator log-probs")
            gen[row, start:start + len(turn.token_ids)] = torch.as_tensor(turn.logprobs, dtype=gen.dtype)
        mismatch = self.is_weights(logprobs.detach(), gen, mask)
        self.mismatch["abs_diff_sum"] += mismatch.abs_diff_sum
        self.mismatch["truncated"] += mismatch.truncated
        self.mismatch["tokens"] += float(mask.sum())
        return mismatch.weight

    def state_dict(self) -> dict[str, Any]:
        return self.lora.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.lora.load_state_dict(state)
        self._stale = self.generator is not None

    def snapshot(self) -> TrainableLLMSimulator:
        """A frozen copy: a new adapter ``<adapter>_s<n>`` on the same base holding the current weights."""
        clone = copy.copy(self)
        clone.lora = self.lora.copy(f"{self.adapter}_s{len(list(self.lora.copies()))}")
        clone.stats = {key: 0 for key in self.stats}
        clone.episodes, clone._slot_episode, clone._last = [], [], []
        clone._scenarios, clone._rngs = [], []
        clone.frozen = True
        clone.mismatch = dict.fromkeys(self.mismatch, 0.0)
        if self.generator is not None:  # the copy serves its own adapter on the same server
            clone.generator, clone._stale = self.generator.for_adapter(clone.adapter), True
        return clone


@dataclass
class Rows:
    """Token rows to score: ``sequences`` with 0/1 ``masks`` (1 on reply tokens), the dialogue each row belongs to
    (``episode``), and where each turn's reply sits (``placed``: row, first reply position, turn)."""

    sequences: list[list[int]] = field(default_factory=list)
    masks: list[list[int]] = field(default_factory=list)
    episode: list[int] = field(default_factory=list)
    placed: list[tuple[int, int, LLMTurn]] = field(default_factory=list)


def dialogue_rows(episodes: Sequence[LLMEpisode]) -> Rows:
    """Each dialogue's turns as few rows as their tokens allow.

    A turn whose prompt begins with the previous turn's prompt and reply (the history re-encoded to the same
    tokens) extends that turn's row: under causal attention every reply token keeps its exact context, so the
    row scores both replies as two rows would, with the shared prefix run once. A turn whose history was
    re-encoded otherwise (a reply trimmed or re-tokenised) starts a row of its own.
    """
    rows = Rows()
    for index, episode in enumerate(episodes):
        previous: list[int] | None = None
        for turn in episode.turns:
            sequence = turn.prompt_ids + turn.token_ids
            if previous is None or turn.prompt_ids[:len(previous)] != previous:
                rows.sequences.append(sequence)
                rows.masks.append([0] * len(sequence))
                rows.episode.append(index)
            else:
                rows.sequences[-1] = sequence
                rows.masks[-1] += [0] * (len(sequence) - len(previous))
            start = len(turn.prompt_ids)
            rows.masks[-1][start:] = [1] * len(turn.token_ids)
            rows.placed.append((len(rows.sequences) - 1, start, turn))
            previous = sequence
    return rows


def from_spec(spec: SimulatorSpec, context: BuildContext) -> Simulator:
    """The ``trainable`` kind: a LoRA simulator on a model, or a kind's own trainable form (``trainable:KIND``)."""
    inner = inner_or_none(spec)
    if inner is None:
        return TrainableLLMSimulator.from_spec(spec, context)
    from simpop.envs.registration import load

    return load(kind(inner.kind).trainable)(inner, context)
