"""The co-trainable P4G persuadee: :class:`ActPersuadee` with its whole parameter vector trainable.

:class:`TrainableActPersuadee` (spec ``trainable:persuadee``) holds the model's parameter vector
(:meth:`PersuadeeParams.to_vector`, 373 numbers) as one torch parameter. It records each dialogue's persona
and every (persuader act, own reply) pair; :meth:`TrainableActPersuadee.score` replays the persuadee's
state in torch along those acts and returns the log-probability of each recorded reply, differentiable in
the parameters, and the exact KL of each reply distribution to the base parameters' (the anchor that keeps
the simulator plausible). The co-trainer (:mod:`simpop.train.cotrain`) updates it on the same rollouts
as the policy; ``snapshot()`` returns a frozen copy for a checkpoint pool.

It also supports the co-trainer's other objectives: a trainable *persona sampler* (softmax of logits over its
persona pool, the env's scenario personas by default; objective ``persona``), a *realism anchor* (the likelihood
of a P4G corpus's annotated persuadee acts given its persuader acts, :func:`reference_episodes`; objectives
``realism`` and ``adversarial``) and the *divergence* of its reply distribution from another member's
(objective ``diverse``).
"""

from __future__ import annotations

import copy
import functools
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from simpop.envs.persuasion.acts import ASKING_ACTS, DECISION_ACTS, DONATING_ACTS, PERSUADEE_ACTS, PERSUADER_ACTS
from simpop.envs.persuasion.corpus import ER_LABEL_ALIASES, cached_corpus
from simpop.envs.persuasion.model import (_DECISION_MASK, _SENTIMENT_SIGN, _U, AMOUNT_LEVELS, BASE_TRAITS, IS_APPEAL,
                                          IS_ASKING, IS_RAPPORT, MODULATORS, Outcome, PersuadeeModel, PersuadeeParams)
from simpop.envs.persuasion.personas import Persona
from simpop.envs.persuasion.simulators import ActPersuadee, _persuadee_class, _spec_arguments
from simpop.seat import BuildContext, Scores, SimulatorSpec, Trainable

#: Index of "refuse" among a decision turn's outcomes (donate at one of the amount levels, or refuse).
REFUSE = len(AMOUNT_LEVELS)
#: A reference turn whose reply is not scored (the persuader act still moves the state).
UNSCORED = -1


@dataclass
class ActEpisode:
    """One dialogue of the act-level persuadee.

    Attributes:
        persona: The persona it played.
        turns: ``(persuader act index, reply)`` per persuadee turn, where reply is the persuadee act
            index on a non-decision turn and the amount level (or :data:`REFUSE`) on a decision turn;
            :data:`UNSCORED` in reference dialogues where the reply is not one the model can give.
        persona_index: The persona's index in the persona pool when the trainable sampler drew it.
    """

    persona: Persona
    turns: list[tuple[int, int]] = field(default_factory=list)
    persona_index: int | None = None


_VECTOR_SLICES: dict[str, slice] = {}
_start = 0
for _name, _size in PersuadeeParams.sizes().items():
    _VECTOR_SLICES[_name] = slice(_start, _start + _size)
    _start += _size
_ER = {a: i for i, a in enumerate(PERSUADER_ACTS)}
_EE = {a: i for i, a in enumerate(PERSUADEE_ACTS)}


@functools.lru_cache(maxsize=4096)  # personas are frozen (hashable); a run replays the same few hundred
def _persona_features(persona: Persona) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Centred base traits, per-act mean centred modulating trait, and which acts have modulators."""
    base = np.array([persona.centred(t) for t in BASE_TRAITS])
    has = np.array([bool(MODULATORS[a]) for a in PERSUADER_ACTS])
    mod = np.array([np.mean([persona.centred(t) for t in MODULATORS[a]]) if MODULATORS[a] else 0.0
                    for a in PERSUADER_ACTS])
    return base, mod, has


@dataclass(frozen=True)
class Turns:
    """The recorded turns of some episodes as padded arrays (built once by :func:`turns_of`, replayed often).

    Attributes:
        size: Number of episodes (including those without turns).
        rows: Indices of the episodes that have turns (the rows of every array below).
        acts, repeats, premature, valid: Per row and turn: persuader act, its earlier uses, whether it asks
            before any appeal, whether the turn exists (padding is False).
        asking, choice, scored: Per turn: an asking act (a decision reply), the reply index (0 where
            unscored), whether the reply is scored (not :data:`UNSCORED`).
        base_traits, mod_means, has_mod: Per row, the persona's features (:func:`_persona_features`).
    """

    size: int
    rows: torch.Tensor
    acts: torch.Tensor
    repeats: torch.Tensor
    premature: torch.Tensor
    valid: torch.Tensor
    asking: torch.Tensor
    choice: torch.Tensor
    scored: torch.Tensor
    base_traits: torch.Tensor
    mod_means: torch.Tensor
    has_mod: torch.Tensor


def turns_of(episodes: Sequence[ActEpisode]) -> Turns:
    """The episodes' turns as :class:`Turns` (the episodes without turns are left out of the arrays)."""
    rows = [i for i, e in enumerate(episodes) if e.turns]
    kept = [episodes[i] for i in rows]
    lengths = np.array([len(e.turns) for e in kept], dtype=np.int64)
    b, width = len(kept), int(lengths.max(initial=0))
    valid = np.arange(width) < lengths[:, None]
    flat = np.fromiter(itertools.chain.from_iterable(itertools.chain.from_iterable(e.turns for e in kept)),
                       dtype=np.int64, count=2 * int(lengths.sum())).reshape(-1, 2)
    acts, replies = np.zeros((b, width), dtype=np.int64), np.full((b, width), UNSCORED, dtype=np.int64)
    acts[valid], replies[valid] = flat[:, 0], flat[:, 1]
    # Earlier uses of each turn's act (its one-hot summed over the row's earlier turns), and earlier appeals.
    uses = (acts[..., None] == np.arange(len(PERSUADER_ACTS))) & valid[..., None]
    earlier = np.take_along_axis(np.cumsum(uses, axis=1) - uses, acts[..., None], axis=2)[..., 0]
    appeal = IS_APPEAL[acts] & valid
    asking = IS_ASKING[acts] & valid
    premature = asking & (np.cumsum(appeal, axis=1) - appeal == 0)
    features = [_persona_features(e.persona) for e in kept]
    base_traits, mod_means, has_mod = (np.array([f[k] for f in features]).reshape(b, size) for k, size in
                                       enumerate((len(BASE_TRAITS), len(PERSUADER_ACTS), len(PERSUADER_ACTS))))
    return Turns(len(episodes), torch.as_tensor(rows, dtype=torch.long), torch.as_tensor(acts),
                 torch.as_tensor(np.where(valid, earlier, 0).astype(np.float64)),
                 torch.as_tensor(premature.astype(np.float64)), torch.as_tensor(valid), torch.as_tensor(asking),
                 torch.as_tensor(np.maximum(replies, 0)), torch.as_tensor(replies != UNSCORED),
                 torch.as_tensor(base_traits), torch.as_tensor(mod_means), torch.as_tensor(has_mod.astype(bool)))


def replay(theta: torch.Tensor, episodes: Sequence[ActEpisode] | Turns, temperature: float
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per recorded turn: the persuadee's inclination, and the log-probabilities of every reply.

    This is :meth:`PersuadeeModel.update` / :meth:`PersuadeeModel.distribution` written with torch
    tensors over a padded batch, so that gradients reach ``theta`` (the numpy model cannot carry them).
    ``tests/simulators/test_trainable.py`` checks that both give the same numbers. ``episodes`` may be
    their :class:`Turns` (built once when the same episodes are replayed under several parameters);
    episodes without turns are left out.

    Returns:
        ``(inclination [B, L], decision log-probs [B, L, 8], response log-probs [B, L, 23])``; decision
        outcomes are the amount levels then refuse; response log-probs are ``-inf`` on decision acts.
    """
    turns = episodes if isinstance(episodes, Turns) else turns_of(episodes)
    p = {name: theta[s] for name, s in _VECTOR_SLICES.items()}
    b, width = turns.acts.shape
    repeats = turns.repeats.to(theta.dtype)
    multipliers = torch.where(turns.has_mod, torch.clamp(1.0 + p["modulation"] * turns.mod_means, min=0.0),
                              torch.ones((), dtype=theta.dtype))
    inclination = p["intercept"][0] + turns.base_traits @ p["trait_weights"]
    rapport = torch.zeros(b, dtype=theta.dtype)
    decay, penalty = p["repeat_decay"][0], p["repeat_penalty"][0]
    appeals = torch.as_tensor(IS_APPEAL)[turns.acts]
    builds = torch.as_tensor(IS_RAPPORT)[turns.acts] & turns.valid
    steps = []
    # Column by column with the same tensor ops (and so the same float arithmetic, gradients included) as
    # before the parameter-free per-turn lookups (act flags, column views) moved out of the loop.
    for a, index, n, on, premature, appeal, build in zip(
            *(x.unbind(1) for x in (turns.acts, turns.acts[..., None], repeats, turns.valid, turns.premature,
                                    appeals, builds))):
        mult = multipliers.gather(1, index).squeeze(1)
        effect = p["act_effects"][a] * mult
        effect = torch.where(appeal, effect * (1.0 + p["rapport_boost"][0] * rapport), effect)
        delta = effect * decay ** n - penalty * n - p["premature_penalty"][0] * premature
        inclination = torch.where(on, inclination + delta, inclination)
        rapport = torch.where(build, torch.clamp(rapport + p["rapport_gain"][0] * mult * decay ** n, max=1.0), rapport)
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
    logits = table[turns.acts] + p["sentiment_slope"][0] * incl[..., None] * torch.as_tensor(_SENTIMENT_SIGN,
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


def _per_dialogue(theta: torch.Tensor, reference: torch.Tensor | None, turns: Turns,
                  temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per episode: the summed log-probability of its scored replies under ``theta``, and the summed per-turn
    ``KL(theta || reference)`` over its turns (zeros without ``reference``)."""
    logprob = torch.zeros(turns.size, dtype=torch.float64)
    kl = torch.zeros(turns.size, dtype=torch.float64)
    if not len(turns.rows):
        return logprob, kl
    _, decision, response = replay(theta, turns, temperature)
    asking, choice = turns.asking, turns.choice
    lp_decision = decision.gather(2, torch.where(asking, choice, 0)[..., None]).squeeze(2)
    lp_response = response.gather(2, torch.where(asking, 0, choice)[..., None]).squeeze(2)
    lp = torch.where(asking, lp_decision, lp_response)
    zero = torch.zeros((), dtype=torch.float64)
    logprob = logprob.index_copy(0, turns.rows, torch.where(turns.scored & turns.valid, lp, zero).sum(1))
    if reference is not None:
        with torch.no_grad():
            _, decision_ref, response_ref = replay(reference, turns, temperature)
        turn_kl = torch.where(asking, _kl(decision, decision_ref), _kl(response, response_ref))
        kl = kl.index_copy(0, turns.rows, torch.where(turns.valid, turn_kl, zero).sum(1))
    return logprob, kl


def reference_episodes(dialogues: Sequence[Any]) -> list[ActEpisode]:
    """Annotated corpus dialogues as episodes of (persuader act, persuadee reply) turns.

    Each labelled persuader utterance whose act is modelled (or aliased, :data:`~.corpus.ER_LABEL_ALIASES`)
    opens a turn; its reply is the first persuadee label after it that the model can give there (a
    non-decision act after a non-asking act; after an asking act a refusal, or a donation at the level
    nearest the dialogue's stated or actual donation), else :data:`UNSCORED`. Unmodelled persuader labels
    are skipped.
    """
    levels = np.array(AMOUNT_LEVELS)
    out = []
    for dialogue in dialogues:
        episode, open_turn = ActEpisode(dialogue.persuadee_persona), False
        amount = dialogue.intended if dialogue.intended else dialogue.donation
        for u in dialogue.utterances:
            if not u.labels:
                continue
            if u.role == "persuader":
                act = ER_LABEL_ALIASES.get(u.labels[0], u.labels[0])
                if act in _ER:
                    episode.turns.append((_ER[act], UNSCORED))
                    open_turn = True
                continue
            if not open_turn:
                continue
            er = episode.turns[-1][0]
            for label in u.labels:
                if IS_ASKING[er]:
                    if label == "disagree-donation":
                        reply = REFUSE
                    elif label in DONATING_ACTS and amount and amount > 0:
                        reply = int(np.argmin(np.abs(levels - amount)))
                    else:
                        continue
                elif label in _EE and label not in DECISION_ACTS:
                    reply = _EE[label]
                else:
                    continue
                episode.turns[-1] = (er, reply)
                open_turn = False
                break
        if episode.turns:
            out.append(episode)
    return out


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
        choice = (AMOUNT_LEVELS.index(amount) if amount else REFUSE) if act in ASKING_ACTS else _EE[reply]
        self._slot_episode[slot].turns.append((_ER[act], choice))

    # ----------------------------------------------------------------- training
    def score(self, episodes: Sequence[ActEpisode]) -> Scores:
        """Summed log-probability of each dialogue's recorded replies and KL to :attr:`base`."""
        logprob, kl = _per_dialogue(self.theta, self._base_theta, turns_of(episodes), self.temperature)
        return Scores(logprob, kl)

    def divergence(self, other: TrainableActPersuadee, episodes: Sequence[ActEpisode]) -> torch.Tensor:
        """Mean over ``episodes`` of the summed per-turn ``KL(self || other)`` (gradient through self only)."""
        return _per_dialogue(self.theta, other.theta.detach(), turns_of(episodes), self.temperature)[1].mean()

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
        return -_per_dialogue(self.theta, None, self._reference_turns, self.temperature)[0].mean()

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


