"""P4G scenarios: who the persuadee is and the $2 donation context, and where scenarios come from.

- :class:`PersuasionScenario`: one episode's setting (persona + context) and both seats' prompts.
- :func:`default_scenarios`: ``p4g-0000`` ... personas drawn from :class:`PersonaSampler` with a fixed seed.
- :func:`corpus_scenarios`: one scenario per P4G corpus dialogue (``p4g-corpus-<id>``, the real persuadee).
- :func:`persona_set`: named persona sets for simulator specs (``modal``, ``heldout-<n>-<seed>``, and the
  generated ``region-...`` / ``written-...`` sets of :mod:`.failures`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from simpop.envs.persuasion.corpus import cached_corpus
from simpop.envs.persuasion.failures import persona_set as generated
from simpop.envs.persuasion.personas import Persona, PersonaSampler, modal_persona
from simpop.envs.persuasion.release import human_sampler

DONATION_CONTEXT = (
    "This chat is part of a paid online study. The persuadee earns $2 for the task and may donate any part "
    "of it, from $0 to $2, to Save the Children, an international charity that supports children's health, "
    "education and safety in developing countries and war zones. A donation is deducted from the task "
    "payment by the research team after the chat.")


@dataclass(frozen=True)
class PersuasionScenario:
    """One P4G episode's setting: who the persuadee is, and the donation context.

    Attributes:
        id: Stable identifier (``p4g-0042`` or ``p4g-corpus-<dialogue id>``).
        persona: The persuadee (hidden from the persuader).
        context: The donation task both seats are told about.
    """

    id: str
    persona: Persona
    context: str = DONATION_CONTEXT

    def user_instructions(self) -> str:
        """System prompt for an LLM playing the persuadee."""
        return (
            "You are a participant in an online study, chatting with another participant who will try to "
            f"persuade you to donate to charity.\n\n{self.context}\n\nWho you are:\n{self.persona.describe()}\n\n"
            "Stay in character and reply in one to three short sentences, like a person chatting. Decide for "
            "yourself whether to donate and how much, as this person would. When you have decided, end your "
            "message with [DONATE $N], where N is the amount between 0 and 2 (for example [DONATE $0.50]); "
            "write [DONATE $0] if you decline.")

    def policy_instructions(self, max_turns: int = 10) -> str:
        """System prompt for the persuader."""
        return (
            f"You are the persuader in an online study. {self.context}\n\nYour goal: convince your chat partner "
            f"to donate some of their $2 task payment to Save the Children. You have at most {max_turns} "
            "messages. Be friendly and honest, adapt to your partner, use arguments, emotions, credibility or "
            "your own example, and ask for the donation before the chat ends. Keep each message short.")


@functools.lru_cache(maxsize=16)
def persona_set(name: str, training: tuple[Persona, ...]) -> tuple[Persona, ...]:
    """The personas of set ``name``, given the training personas (the env's ``persona_set`` documents the names)."""
    if name == "modal":
        return (modal_persona(),)
    if name.startswith("corpus:"):  # the real persuadees of a P4G corpus folder
        return tuple(cached_corpus(name.partition(":")[2]).personas())
    if name.startswith(("region-", "written-")):  # generated from lost dialogues (failures.py)
        return generated(name)
    prefix, *rest = name.split("-")
    if name == "heldout":
        rest = ["300", "4242"]
    if prefix not in ("heldout", "uniform", "human") or len(rest) != 2 or not all(x.isdigit() for x in rest) \
            or int(rest[0]) < 1:
        raise ValueError(f"unknown P4G persona set {name!r}; use modal, heldout, heldout-<n>-<seed> (e.g. "
                         f"heldout-300-4242), uniform-<n>-<seed>, human-<n>-<seed>, corpus:<dir>, "
                         f"region-<n>-<seed>:<clauses>, written-<sha>, or scenario")
    seen = set(training) | {modal_persona()}
    if prefix == "human":  # the shipped fit's marginals of the real persuadees
        sampler = human_sampler()
    else:
        sampler = PersonaSampler() if prefix == "heldout" else PersonaSampler.uniform()
    drawn = sampler.sample_many(int(rest[0]), np.random.default_rng(int(rest[1])))
    kept = tuple(p for p in drawn if p not in seen)
    if not kept:
        raise ValueError(f"persona set {name!r} has no persona outside the training scenarios")
    return kept


@functools.lru_cache(maxsize=8)
def default_scenarios(n: int = 200, seed: int = 2019) -> tuple[PersuasionScenario, ...]:
    """``n`` personas from :class:`PersonaSampler` with a fixed seed: ``p4g-0000`` ... (the default set)."""
    rng = np.random.default_rng(seed)
    sampler = PersonaSampler()
    return tuple(PersuasionScenario(f"p4g-{i:04d}", sampler.sample(rng)) for i in range(n))


@functools.lru_cache(maxsize=4)
def corpus_scenarios(corpus_dir: str) -> tuple[PersuasionScenario, ...]:
    """One scenario per corpus dialogue with a persuadee persona: ``p4g-corpus-<dialogue id>``."""
    corpus = cached_corpus(corpus_dir)
    return tuple(PersuasionScenario(f"p4g-corpus-{d.id}", d.persuadee_persona) for d in corpus.dialogues)
