"""Trainable simulators: user simulators whose own parameters the co-training loop updates.

Both kinds record what they did in every dialogue they drove, so that the co-trainer can update them
on the *same* rollouts the policy learns from (:mod:`simpop.train.cotrain`):

- :class:`TrainableActPersuadee` (act level, P4G): the native persuadee
  (:class:`~simpop.envs.persuasion.simulators.ActPersuadee`) with its whole parameter vector
  (:meth:`PersuadeeParams.to_vector`, 373 numbers) as one torch parameter. It records each dialogue's
  persona and every (persuader act, own reply) pair; :meth:`TrainableActPersuadee.score` replays the
  persuadee's state in torch along those acts and returns the log-probability of each recorded reply,
  differentiable in the parameters, and the exact KL of each reply distribution to the base
  parameters' (the anchor that keeps the simulator plausible).
- :class:`TrainableLLMSimulator` (text level): an :class:`~simpop.simulators.llm.LLMSimulator` with its
  own LoRA adapter on a shared :class:`~simpop.agents.transformers_backend.TransformersBackend`
  (K simulators = K adapters on one base model). It keeps the prompt ids, generated ids and sampling
  log-probs of its own turns; :meth:`TrainableLLMSimulator.score` re-scores them with gradient, and
  its KL anchor is to the base model (adapters disabled).

Records are kept per dialogue in start order (:attr:`episodes`): the ``j``-th dialogue a simulator
started since :meth:`clear` is the ``j``-th trajectory of a collected batch whose ``simulator`` is that
simulator's name (the rollout engine starts dialogues in batch order). ``snapshot()`` returns a
frozen copy for a :class:`~simpop.simulators.population.CheckpointPool`.
"""

from __future__ import annotations

import copy
import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from simpop.envs.persuasion.acts import ASKING_ACTS, PERSUADEE_ACTS, PERSUADER_ACTS
from simpop.envs.persuasion.model import (_DECISION_MASK, _SENTIMENT_SIGN, _U, AMOUNT_LEVELS, APPEALS, BASE_TRAITS,
                                          MODULATORS, RAPPORT_ACTS, PersuadeeModel, PersuadeeParams)
from simpop.envs.persuasion.personas import Persona
from simpop.envs.persuasion.simulators import ActPersuadee
from simpop.simulators.llm import LLMSimulator
from simpop.simulators.spec import SimulatorSpec

if TYPE_CHECKING:
    from simpop.agents.base import Chat, SamplingParams
    from simpop.agents.transformers_backend import TransformersBackend

#: Index of "refuse" among a decision turn's outcomes (donate at one of the amount levels, or refuse).
REFUSE = len(AMOUNT_LEVELS)


@dataclass
class Scores:
    """A trainable simulator's view of its recorded dialogues, with gradient.

    Attributes:
        logprob: Per dialogue, the summed log-probability of the simulator's own replies (tokens).
        kl: Per dialogue, the summed KL of its reply distributions to the base simulator's.
    """

    logprob: torch.Tensor
    kl: torch.Tensor


class Trainable(ABC):
    """What the co-trainer needs from a trainable simulator (mixin for the two kinds below)."""

    name: str
    episodes: list[Any]
    frozen: bool = False

    @abstractmethod
    def parameters(self) -> list[torch.nn.Parameter]:
        """The trained parameters."""

    @abstractmethod
    def score(self, episodes: Sequence[Any]) -> Scores:
        """Log-probabilities of the recorded replies and KL to the base, with gradient."""

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """The trained parameters, for checkpoints."""

    @abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""

    def after_step(self) -> None:
        """Called after each optimiser step (e.g. to project parameters back into their bounds)."""

    def clear(self) -> None:
        """Forget the recorded dialogues (the co-trainer calls it before each collection)."""
        self.episodes = []



# ============================================================================================ act level
@dataclass
class ActEpisode:
    """One dialogue of the act-level persuadee.

    Attributes:
        persona: The persona it played.
        turns: ``(persuader act index, reply)`` per persuadee turn, where reply is the persuadee act
            index on a non-decision turn and the amount level (or :data:`REFUSE`) on a decision turn.
    """

    persona: Persona
    turns: list[tuple[int, int]] = field(default_factory=list)


_VECTOR_SLICES: dict[str, slice] = {}
_start = 0
for _name, _size in PersuadeeParams.sizes().items():
    _VECTOR_SLICES[_name] = slice(_start, _start + _size)
    _start += _size
_IS_APPEAL = np.array([a in APPEALS for a in PERSUADER_ACTS])
_IS_RAPPORT = np.array([a in RAPPORT_ACTS for a in PERSUADER_ACTS])
_IS_ASKING = np.array([a in ASKING_ACTS for a in PERSUADER_ACTS])
_ER = {a: i for i, a in enumerate(PERSUADER_ACTS)}
_EE = {a: i for i, a in enumerate(PERSUADEE_ACTS)}


def _persona_features(persona: Persona) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Centred base traits, per-act mean centred modulating trait, and which acts have modulators."""
    base = np.array([persona.centred(t) for t in BASE_TRAITS])
    has = np.array([bool(MODULATORS[a]) for a in PERSUADER_ACTS])
    mod = np.array([np.mean([persona.centred(t) for t in MODULATORS[a]]) if MODULATORS[a] else 0.0
                    for a in PERSUADER_ACTS])
    return base, mod, has


def replay(theta: torch.Tensor, episodes: Sequence[ActEpisode], temperature: float
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per recorded turn: the persuadee's inclination, and the log-probabilities of every reply.

    This is :meth:`PersuadeeModel.update` / :meth:`PersuadeeModel.distribution` written with torch
    tensors over a padded batch, so that gradients reach ``theta`` (the numpy model cannot carry them).
    ``tests/simulators/test_trainable.py`` checks that both give the same numbers.

    Returns:
        ``(inclination [B, L], decision log-probs [B, L, 8], response log-probs [B, L, 23])``; decision
        outcomes are the amount levels then refuse; response log-probs are ``-inf`` on decision acts.
    """
    p = {name: theta[s] for name, s in _VECTOR_SLICES.items()}
    width = max(len(e.turns) for e in episodes)
    b = len(episodes)
    acts = np.zeros((b, width), dtype=np.int64)
    repeats = np.zeros((b, width))
    premature = np.zeros((b, width))
    valid = np.zeros((b, width), dtype=bool)
    base_traits, mod_means, has_mod = zip(*(_persona_features(e.persona) for e in episodes))
    for row, episode in enumerate(episodes):
        counts = np.zeros(len(PERSUADER_ACTS), dtype=np.int64)
        for col, (act, _) in enumerate(episode.turns):
            acts[row, col], repeats[row, col], valid[row, col] = act, counts[act], True
            premature[row, col] = float(_IS_ASKING[act] and not counts[_IS_APPEAL].any())
            counts[act] += 1
    acts_t = torch.as_tensor(acts)
    repeats_t = torch.as_tensor(repeats, dtype=theta.dtype)
    has_t = torch.as_tensor(np.array(has_mod))
    multipliers = torch.where(has_t, torch.clamp(1.0 + p["modulation"] * torch.as_tensor(np.array(mod_means)), min=0.0),
                              torch.ones((), dtype=theta.dtype))
    inclination = p["intercept"][0] + torch.as_tensor(np.array(base_traits)) @ p["trait_weights"]
    rapport = torch.zeros(b, dtype=theta.dtype)
    decay, penalty = p["repeat_decay"][0], p["repeat_penalty"][0]
    steps = []
    for col in range(width):
        a = acts_t[:, col]
        n = repeats_t[:, col]
        on = torch.as_tensor(valid[:, col])
        mult = multipliers.gather(1, a[:, None]).squeeze(1)
        effect = p["act_effects"][a] * mult
        appeal = torch.as_tensor(_IS_APPEAL[acts[:, col]])
        effect = torch.where(appeal, effect * (1.0 + p["rapport_boost"][0] * rapport), effect)
        delta = effect * decay ** n - penalty * n - p["premature_penalty"][0] * torch.as_tensor(premature[:, col])
        inclination = torch.where(on, inclination + delta, inclination)
        builds = on & torch.as_tensor(_IS_RAPPORT[acts[:, col]])
        rapport = torch.where(builds, torch.clamp(rapport + p["rapport_gain"][0] * mult * decay ** n, max=1.0), rapport)
        steps.append(inclination)
    incl = torch.stack(steps, dim=1)
    t = float(temperature)
    donate = torch.nn.functional.logsigmoid(incl / t)
    refuse = torch.nn.functional.logsigmoid(-incl / t)
    u = torch.as_tensor(_U, dtype=theta.dtype)
    amount = torch.log_softmax((p["amount_logits"] + (p["amount_shift"][0] + p["amount_slope"][0] * incl)[..., None]
                                * u) / t, dim=-1)
    decision = torch.cat([donate[..., None] + amount, refuse[..., None]], dim=-1)
    table = p["response_logits"].reshape(len(PERSUADER_ACTS), len(PERSUADEE_ACTS))
    logits = table[acts_t] + p["sentiment_slope"][0] * incl[..., None] * torch.as_tensor(_SENTIMENT_SIGN,
                                                                                          dtype=theta.dtype)
    logits = torch.where(torch.as_tensor(_DECISION_MASK), torch.full_like(logits, -torch.inf), logits / t)
    return incl, decision, torch.log_softmax(logits, dim=-1)


def _kl(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """``KL(p || q)`` over the last axis; outcomes impossible under both (``-inf``) contribute 0."""
    # Masked outcomes are replaced before any arithmetic: a nan there would reach the gradient.
    possible = torch.isfinite(log_p)
    zero = torch.zeros_like(log_p)
    log_p, log_q = torch.where(possible, log_p, zero), torch.where(possible, log_q, zero)
    return torch.where(possible, log_p.exp() * (log_p - log_q), zero).sum(-1)


class TrainableActPersuadee(ActPersuadee, Trainable):
    """The native act-level persuadee with trainable parameters (sampled decoding).

    Args:
        params: Starting (and KL-anchor) parameters; default: the calibrated defaults.
        temperature: Sampling temperature of every reply.
        name: Identifier in populations and reports.

    Attributes:
        theta: The parameter vector (float64 ``torch.nn.Parameter``) the co-trainer optimises; the
            model that acts is rebuilt from it by :meth:`after_step`.
        base: The anchor parameters.
        episodes: Recorded :class:`ActEpisode` per dialogue started since :meth:`clear`.
    """

    kind = "trainable"

    def __init__(self, params: PersuadeeParams | None = None, temperature: float = 1.0, name: str | None = None):
        super().__init__(params, decoding="sample", temperature=temperature, name=name or "trainable-persuadee")
        self.base = self.model.params
        self.theta = torch.nn.Parameter(torch.as_tensor(self.base.to_vector(), dtype=torch.float64))
        self._base_theta = self.theta.detach().clone()
        self._lo, self._hi = (torch.as_tensor(x) for x in PersuadeeParams.bounds())
        self.episodes: list[ActEpisode] = []
        self._slot_episode: list[ActEpisode] = []

    @property
    def spec(self) -> SimulatorSpec:
        return SimulatorSpec(self.kind, "persuadee:native", "scenario",
                             {"decoding": "sample", "temperature": float(self.temperature)})

    @property
    def params(self) -> PersuadeeParams:
        """The current parameters as :class:`PersuadeeParams`."""
        return self.model.params

    def parameters(self) -> list[torch.nn.Parameter]:
        return [self.theta]

    # ----------------------------------------------------------------- acting (and recording)
    def reset_batch(self, scenarios: list[Any], rngs: list[np.random.Generator]) -> None:
        super().reset_batch(scenarios, rngs)
        self._slot_episode = [ActEpisode(self.persona_override or s.persona) for s in scenarios]
        if not self.frozen:  # snapshots are never trained: keeping their dialogues would only grow memory
            self.episodes.extend(self._slot_episode)

    def _reply(self, slot: int, act: str, commit: bool):
        state, outcome = super()._reply(slot, act, commit)
        if commit:
            reply, amount = outcome
            if act in ASKING_ACTS:
                choice = AMOUNT_LEVELS.index(amount) if amount else REFUSE
            else:
                choice = _EE[reply]
            self._slot_episode[slot].turns.append((_ER[act], choice))
        return state, outcome

    # ----------------------------------------------------------------- training
    def score(self, episodes: Sequence[ActEpisode]) -> Scores:
        """Summed log-probability of each dialogue's recorded replies and KL to :attr:`base`."""
        scored = [e for e in episodes if e.turns]
        logprob = torch.zeros(len(episodes), dtype=torch.float64)
        kl = torch.zeros(len(episodes), dtype=torch.float64)
        if not scored:
            return Scores(logprob, kl)
        _, decision, response = replay(self.theta, scored, self.temperature)
        with torch.no_grad():
            _, decision_ref, response_ref = replay(self._base_theta, scored, self.temperature)
        width = decision.shape[1]
        asking = np.zeros((len(scored), width), dtype=bool)
        choice = np.zeros((len(scored), width), dtype=np.int64)
        valid = np.zeros((len(scored), width), dtype=bool)
        for row, e in enumerate(scored):
            for col, (act, reply) in enumerate(e.turns):
                asking[row, col], choice[row, col], valid[row, col] = _IS_ASKING[act], reply, True
        asking_t, valid_t, choice_t = torch.as_tensor(asking), torch.as_tensor(valid), torch.as_tensor(choice)
        lp_decision = decision.gather(2, torch.where(asking_t, choice_t, 0)[..., None]).squeeze(2)
        lp_response = response.gather(2, torch.where(asking_t, 0, choice_t)[..., None]).squeeze(2)
        lp = torch.where(asking_t, lp_decision, lp_response)
        turn_kl = torch.where(asking_t, _kl(decision, decision_ref), _kl(response, response_ref))
        zero = torch.zeros((), dtype=torch.float64)
        rows = torch.as_tensor([i for i, e in enumerate(episodes) if e.turns])
        logprob = logprob.index_copy(0, rows, torch.where(valid_t, lp, zero).sum(1))
        kl = kl.index_copy(0, rows, torch.where(valid_t, turn_kl, zero).sum(1))
        return Scores(logprob, kl)

    def after_step(self) -> None:
        """Project :attr:`theta` into the parameter bounds and rebuild the acting model from it."""
        with torch.no_grad():
            # Bounds are closed; a decay of exactly 0 would make decay**0's gradient undefined.
            self.theta.copy_(torch.minimum(torch.maximum(self.theta, self._lo + 1e-6), self._hi))
        self.model = PersuadeeModel(PersuadeeParams.from_vector(self.theta.detach().numpy()))

    def state_dict(self) -> dict[str, Any]:
        return {"theta": self.theta.detach().clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with torch.no_grad():
            self.theta.copy_(state["theta"])
        self.after_step()

    def snapshot(self) -> TrainableActPersuadee:
        """A frozen copy with the current parameters (its own slots, no records)."""
        clone = copy.copy(self)
        clone.theta = torch.nn.Parameter(self.theta.detach().clone(), requires_grad=False)
        clone.episodes, clone._slot_episode = [], []
        clone.frozen = True
        return clone


# =========================================================================================== text level
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

    def __init__(self, backend: TransformersBackend, adapter: str, params: SamplingParams | None = None, *,
                 lora_r: int = 8, lora_alpha: int = 16, name: str | None = None,
                 personas: Sequence[Any] | None = None, persona_set: str | None = None, **kwargs: Any):
        from simpop.agents.base import SamplingParams

        params = params or SamplingParams(max_new_tokens=48, temperature=1.0)
        if params.greedy:
            raise ValueError("a trainable simulator must sample (temperature > 0) so that its replies have "
                             "log-probabilities to learn from")
        super().__init__(backend, params, name=name or f"trainable:{backend.name}:{adapter}", personas=personas,
                         persona_set=persona_set, **kwargs)
        self.adapter = adapter
        if adapter not in backend.adapter_names:
            backend.add_adapter(adapter, r=lora_r, alpha=lora_alpha)
        self.episodes: list[LLMEpisode] = []
        self._slot_episode: list[LLMEpisode] = []
        self._last: list[LLMTurn] = []

    @property
    def spec(self) -> SimulatorSpec:
        return SimulatorSpec(self.kind, f"{self.backend.name}+lora:{self.adapter}", self.persona_set, self._decoding())

    def parameters(self) -> list[torch.nn.Parameter]:
        return self.backend.parameters(self.adapter)

    def reset_batch(self, scenarios: list[Any], rngs: list[np.random.Generator]) -> None:
        super().reset_batch(scenarios, rngs)
        self._slot_episode = [LLMEpisode() for _ in scenarios]
        if not self.frozen:  # snapshots are never trained: keeping their dialogues would only grow memory
            self.episodes.extend(self._slot_episode)

    def raw_generate(self, chats: list[Chat], params: SamplingParams) -> list[str]:
        """Generate with this simulator's adapter, keeping ids and log-probs of every reply."""
        self.stats["backend_calls"] += 1
        self.backend.set_adapter(self.adapter)
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
        self.backend.set_adapter(self.adapter)
        scores = self.backend.token_logprobs(sequences, masks, temperature=temperature)
        with torch.no_grad(), self.backend.disabled_adapters():
            reference = self.backend.token_logprobs(sequences, masks, temperature=temperature).logprobs
        delta = (reference - scores.logprobs) * scores.mask
        per_token_kl = (torch.exp(delta) - delta - 1) * scores.mask  # k3 estimator: unbiased, >= 0
        index = torch.as_tensor([i for i, _ in rows])
        logprob = logprob.index_add(0, index, (scores.logprobs * scores.mask).sum(1))
        kl = kl.index_add(0, index, per_token_kl.sum(1))
        return Scores(logprob, kl)

    def state_dict(self) -> dict[str, Any]:
        import peft

        return {k: v.detach().cpu().clone()
                for k, v in peft.get_peft_model_state_dict(self.backend.model, adapter_name=self.adapter).items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        import peft

        peft.set_peft_model_state_dict(self.backend.model, state, adapter_name=self.adapter)

    def snapshot(self) -> TrainableLLMSimulator:
        """A frozen copy: a new adapter ``<adapter>_s<n>`` on the same base holding the current weights."""
        n = sum(name.startswith(f"{self.adapter}_s") for name in self.backend.adapter_names)
        clone = copy.copy(self)
        clone.adapter = f"{self.adapter}_s{n}"
        config = self.backend.model.peft_config[self.adapter]
        active = self.backend.active_adapter
        self.backend.add_adapter(clone.adapter, r=config.r, alpha=config.lora_alpha,
                                 target_modules=sorted(config.target_modules))
        clone.load_state_dict(self.state_dict())
        for p in self.backend.parameters(clone.adapter):
            p.requires_grad_(False)
        if active is not None:
            self.backend.set_adapter(active)
        clone.stats = {key: 0 for key in self.stats}
        clone.episodes, clone._slot_episode, clone._last = [], [], []
        clone._scenarios, clone._rngs = [], []
        clone.frozen = True
        return clone

