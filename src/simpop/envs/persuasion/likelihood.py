"""The act-level persuadee's likelihood in torch: its state replayed along recorded dialogues, differentiable in
its parameter vector.

An :class:`ActEpisode` records a persona and each persuadee turn's ``(persuader act, reply)``; :func:`turns_of`
packs episodes into arrays; :func:`replay` runs the persuadee's state along them and gives each recorded reply's
log-probability and reply distribution under a parameter vector (:meth:`PersuadeeParams.to_vector`);
:func:`per_dialogue` sums them per dialogue, with the KL to a reference's distributions. :func:`reference_episodes`
turns annotated P4G dialogues into episodes (the realism anchor of co-training, and the fit's quality measure).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from simpop.envs.persuasion.acts import DECISION_ACTS, DONATING_ACTS, PERSUADEE_ACTS, PERSUADER_ACTS
from simpop.envs.persuasion.corpus import ER_LABEL_ALIASES
from simpop.envs.persuasion.model import (_DECISION_MASK, _SENTIMENT_SIGN, _U, AMOUNT_LEVELS, BASE_TRAITS, IS_APPEAL,
                                          IS_ASKING, IS_RAPPORT, MODULATORS, PersuadeeParams)
from simpop.envs.persuasion.personas import Persona


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
#: Each act's index (the model's parameter tables are laid out in this order).
PERSUADER_INDEX = {a: i for i, a in enumerate(PERSUADER_ACTS)}
PERSUADEE_INDEX = {a: i for i, a in enumerate(PERSUADEE_ACTS)}


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


def per_dialogue(theta: torch.Tensor, reference: torch.Tensor | None, turns: Turns,
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
                if act in PERSUADER_INDEX:
                    episode.turns.append((PERSUADER_INDEX[act], UNSCORED))
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
                elif label in PERSUADEE_INDEX and label not in DECISION_ACTS:
                    reply = PERSUADEE_INDEX[label]
                else:
                    continue
                episode.turns[-1] = (er, reply)
                open_turn = False
                break
        if episode.turns:
            out.append(episode)
    return out
