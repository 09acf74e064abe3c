"""The co-trainable P4G persuadee: :class:`ActPersuadee` with its whole parameter vector trainable.

:class:`TrainableActPersuadee` (spec ``trainable:persuadee``) holds the model's parameter vector
(:meth:`PersuadeeParams.to_vector`, 373 numbers) as one torch parameter. It records each dialogue's persona
and every (persuader act, own reply) pair; :meth:`TrainableActPersuadee.score` replays the persuadee's
state in torch along those acts and returns the log-probability of each recorded reply, differentiable in
the parameters, and the exact KL of each reply distribution to the base parameters' (the anchor that keeps
the simulator plausible). The co-trainer (:mod:`simpop.train.cotrain`) updates it on the same rollouts
as the policy; ``snapshot()`` returns a frozen copy for a checkpoint pool.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from simpop.envs.persuasion.acts import ASKING_ACTS, PERSUADEE_ACTS, PERSUADER_ACTS
from simpop.envs.persuasion.model import (_DECISION_MASK, _SENTIMENT_SIGN, _U, AMOUNT_LEVELS, APPEALS, BASE_TRAITS,
                                          MODULATORS, RAPPORT_ACTS, PersuadeeModel, PersuadeeParams)
from simpop.envs.persuasion.personas import Persona
from simpop.envs.persuasion.simulators import ActPersuadee, _persuadee_class, _spec_arguments
from simpop.seat import BuildContext, Scores, SimulatorSpec, Trainable

#: Index of "refuse" among a decision turn's outcomes (donate at one of the amount levels, or refuse).
REFUSE = len(AMOUNT_LEVELS)


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

    def __init__(self, params: PersuadeeParams | None = None, temperature: float = 1.0, name: str | None = None,
                 **kwargs: Any):
        super().__init__(params, decoding="sample", temperature=temperature, name=name or "trainable-persuadee",
                         **kwargs)
        self.base = self.model.params
        self.theta = torch.nn.Parameter(torch.as_tensor(self.base.to_vector(), dtype=torch.float64))
        self._base_theta = self.theta.detach().clone()
        self._lo, self._hi = (torch.as_tensor(x) for x in PersuadeeParams.bounds())
        self.episodes: list[ActEpisode] = []
        self._slot_episode: list[ActEpisode] = []

    @classmethod
    def from_spec(cls, spec: SimulatorSpec, context: BuildContext) -> TrainableActPersuadee:
        """Build from a ``trainable:persuadee[:MODEL]`` spec's inner ``persuadee`` spec (sampled decoding)."""
        if context.env is not None and _persuadee_class(context.env) is not ActPersuadee:
            raise ValueError("trainable:persuadee is the act-level persuadee (simpop/PersuasionAct-v0); on the text "
                             "env co-train an LLM simulator: trainable:MODEL?temperature=1.0 (e.g. "
                             "trainable:smollm2?temperature=1.0)")
        arguments = _spec_arguments(spec, context)
        if arguments.pop("decoding") != "sample":
            raise ValueError("a trainable persuadee samples (its replies' log-probabilities are what it learns "
                             "from): drop decoding=greedy")
        return cls(**arguments)

    @property
    def spec(self) -> SimulatorSpec:
        own = super().spec
        return SimulatorSpec(self.kind, f"persuadee:{own.model}", own.personas, own.decoding, own.extra)

    @property
    def params(self) -> PersuadeeParams:
        """The current parameters as :class:`PersuadeeParams`."""
        return self.model.params

    def parameters(self) -> list[torch.nn.Parameter]:
        return [self.theta]

    # ----------------------------------------------------------------- acting (and recording)
    def reset_batch(self, scenarios: list[Any], rngs: list[np.random.Generator]) -> None:
        super().reset_batch(scenarios, rngs)
        self._slot_episode = [ActEpisode(slot.persona) for slot in self._slots]  # the persona each slot plays
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


