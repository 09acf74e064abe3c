"""The co-trainable P4G persuadee: :class:`ActPersuadee` with its whole parameter vector trainable.

:class:`TrainableActPersuadee` (spec ``trainable:persuadee``) holds the model's parameter vector
(:meth:`PersuadeeParams.to_vector`, 373 numbers) as one torch parameter. It records each dialogue's persona
and every (persuader act, own reply) pair; :meth:`TrainableActPersuadee.score` replays the persuadee's
state in torch along those acts and returns the log-probability of each recorded reply, differentiable in
the parameters, and the exact KL of each reply distribution to the base parameters' (the anchor that keeps
the simulator plausible; the replay is :mod:`.likelihood`'s). The co-trainer (:mod:`simpop.train.cotrain`) updates it on the same rollouts
as the policy; ``snapshot()`` returns a frozen copy for a checkpoint pool.

It also supports the co-trainer's other objectives: a trainable *persona sampler* (softmax of logits over its
persona pool, the env's scenario personas by default; objective ``persona``), a *realism anchor* (the
likelihood of a P4G corpus's annotated persuadee acts given its persuader acts,
:func:`~.likelihood.reference_episodes`; objectives ``realism`` and ``adversarial``) and the *divergence* of its
reply distribution from another member's (objective ``diverse``).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from simpop.envs.persuasion.acts import ASKING_ACTS
from simpop.envs.persuasion.corpus import cached_corpus
from simpop.envs.persuasion.likelihood import (PERSUADEE_INDEX, PERSUADER_INDEX, REFUSE, UNSCORED, ActEpisode,
                                               per_dialogue, reference_episodes, turns_of)
from simpop.envs.persuasion.model import AMOUNT_LEVELS, Outcome, PersuadeeModel, PersuadeeParams
from simpop.envs.persuasion.personas import Persona
from simpop.envs.persuasion.simulators import ActPersuadee, _persuadee_class, _spec_arguments
from simpop.seat import BuildContext, Scores, SimulatorSpec, Trainable


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
        persona_pool: Personas the trainable sampler chooses from (default: its persona set; from a spec:
            its persona set, else the env's scenario personas); None if neither is known.
        persona_logits: The sampler's logits over :attr:`persona_pool` (start uniform; the KL anchor's base).
        samples_personas: Whether personas are drawn from the sampler (:meth:`use_persona_sampler`).
        reference: Reference (corpus) episodes of the realism anchor (:meth:`load_reference`).
    """

    kind = "trainable"

    def __init__(self, params: PersuadeeParams | None = None, temperature: float = 1.0, name: str | None = None,
                 persona_pool: Sequence[Persona] | None = None, **kwargs: Any):
        super().__init__(params, decoding="sample", temperature=temperature, name=name or "trainable-persuadee",
                         **kwargs)
        self.base = self.model.params
        self.theta = torch.nn.Parameter(torch.as_tensor(self.base.to_vector(), dtype=torch.float64))
        self._base_theta = self.theta.detach().clone()
        self._lo, self._hi = (torch.as_tensor(x) for x in PersuadeeParams.bounds())
        self.episodes: list[ActEpisode] = []
        self._slot_episode: list[ActEpisode] = []
        self.persona_pool = list(persona_pool) if persona_pool is not None else (
            list(self.personas) if self.personas is not None else None)
        self.persona_logits = torch.nn.Parameter(torch.zeros(len(self.persona_pool or ()), dtype=torch.float64))
        self.samples_personas = False
        self._drawn: list[int] = []
        self.reference: list[ActEpisode] = []
        self._reference_turns = turns_of([])

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
        if arguments["personas"] is None and context.env is not None:
            arguments["persona_pool"] = [context.env.load_scenario(i).persona for i in context.env.scenario_ids()]
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
        self._drawn = []
        super().reset_batch(scenarios, rngs)
        indices = self._drawn if self.samples_personas else [None] * len(self._slots)
        self._slot_episode = [ActEpisode(slot.persona, persona_index=i) for slot, i in zip(self._slots, indices)]
        if not self.frozen:  # snapshots are never trained: keeping their dialogues would only grow memory
            self.episodes.extend(self._slot_episode)

    def _reply_batch(self, slots: Sequence[int], acts: Sequence[str]) -> list[Outcome]:
        outcomes = super()._reply_batch(slots, acts)
        for slot, act, (reply, amount) in zip(slots, acts, outcomes):
            self._record(slot, act, reply, amount)
        return outcomes

    def _record(self, slot: int, act: str, reply: str, amount: float | None) -> None:
        """Append the turn (persuader act, reply or decision index) to the slot's episode."""
        choice = (AMOUNT_LEVELS.index(amount) if amount else REFUSE) if act in ASKING_ACTS else PERSUADEE_INDEX[reply]
        self._slot_episode[slot].turns.append((PERSUADER_INDEX[act], choice))

    # ----------------------------------------------------------------- training
    def score(self, episodes: Sequence[ActEpisode]) -> Scores:
        """Summed log-probability of each dialogue's recorded replies and KL to :attr:`base`."""
        logprob, kl = per_dialogue(self.theta, self._base_theta, turns_of(episodes), self.temperature)
        return Scores(logprob, kl)

    def divergence(self, other: TrainableActPersuadee, episodes: Sequence[ActEpisode]) -> torch.Tensor:
        """Mean over ``episodes`` of the summed per-turn ``KL(self || other)`` (gradient through self only)."""
        return per_dialogue(self.theta, other.theta.detach(), turns_of(episodes), self.temperature)[1].mean()

    # ----------------------------------------------------------------- persona sampler (objective "persona")
    def use_persona_sampler(self) -> None:
        """Draw each dialogue's persona from softmax(:attr:`persona_logits`) over the persona pool."""
        if not self.persona_pool:
            raise ValueError(f"{self.name}: a trainable persona sampler needs a persona pool (build it from a spec "
                             f"with the env, or pass persona_pool=...)")
        self.samples_personas = True

    def persona_parameters(self) -> list[torch.nn.Parameter]:
        """The persona sampler's logits (what the ``persona`` objective trains)."""
        return [self.persona_logits]

    def persona_score(self, episodes: Sequence[ActEpisode]) -> Scores:
        """Log-probability of each episode's persona under the sampler, and the sampler's KL to uniform."""
        if any(e.persona_index is None for e in episodes):
            raise ValueError("persona_score needs episodes whose persona the trainable sampler drew "
                             "(call use_persona_sampler() before collecting)")
        log_p = torch.log_softmax(self.persona_logits, dim=0)
        logprob = log_p[torch.as_tensor([e.persona_index for e in episodes], dtype=torch.long)]
        kl = (log_p.exp() * (log_p + math.log(len(log_p)))).sum()
        return Scores(logprob, kl.expand(len(episodes)))

    def _persona(self, scenario: Any, rng: np.random.Generator) -> Persona:
        if not self.samples_personas or self.persona_pool is None:
            return super()._persona(scenario, rng)
        probs = torch.softmax(self.persona_logits.detach(), dim=0).numpy()
        index = int(rng.choice(len(probs), p=probs))
        self._drawn.append(index)
        return self.persona_pool[index]

    # ----------------------------------------------------------------- realism anchor (realism, adversarial)
    def load_reference(self, path: str) -> int:
        """Read the annotated dialogues of the P4G corpus at ``path`` as reference episodes; how many score."""
        self.reference = [e for e in reference_episodes(cached_corpus(path).annotated)
                          if any(reply != UNSCORED for _, reply in e.turns)]
        self._reference_turns = turns_of(self.reference)
        return len(self.reference)

    def reference_nll(self) -> torch.Tensor:
        """Mean over reference dialogues of the summed negative log-likelihood of their persuadee replies."""
        if not self.reference:
            raise ValueError(f"{self.name}: no reference dialogues; call load_reference(corpus_dir) first")
        return -per_dialogue(self.theta, None, self._reference_turns, self.temperature)[0].mean()

    def after_step(self) -> None:
        """Project :attr:`theta` into the parameter bounds and rebuild the acting model from it."""
        with torch.no_grad():
            # Bounds are closed; a decay of exactly 0 would make decay**0's gradient undefined.
            self.theta.copy_(torch.minimum(torch.maximum(self.theta, self._lo + 1e-6), self._hi))
        self.model = PersuadeeModel(PersuadeeParams.from_vector(self.theta.detach().numpy()))

    def state_dict(self) -> dict[str, Any]:
        return {"theta": self.theta.detach().clone(), "persona_logits": self.persona_logits.detach().clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with torch.no_grad():
            self.theta.copy_(state["theta"])
            if "persona_logits" in state:  # checkpoints from before the persona sampler have none
                self.persona_logits.copy_(state["persona_logits"])
        self.after_step()

    def snapshot(self) -> TrainableActPersuadee:
        """A frozen copy with the current parameters (its own slots, no records)."""
        clone = copy.copy(self)
        clone.theta = torch.nn.Parameter(self.theta.detach().clone(), requires_grad=False)
        clone.persona_logits = torch.nn.Parameter(self.persona_logits.detach().clone(), requires_grad=False)
        clone._drawn = []
        clone.episodes, clone._slot_episode = [], []
        clone.frozen = True
        return clone


