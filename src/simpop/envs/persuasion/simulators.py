"""Native P4G persuadee simulators built on :mod:`~simpop.envs.persuasion.model`.

- :class:`ActPersuadee` fills the act-level env's persuadee seat and can state its full action
  distribution.
- :class:`TextPersuadee` fills the text env's seat: it classifies the persuader's message into an act,
  lets the model answer, and realises the answer as text (decisions as natural phrasings that
  :func:`parse_donation` reads, without a ``[DONATE $N]`` tag). It answers the closing survey
  (:class:`~simpop.seat.SurveyAnswerer`) from the model's decision distribution in its current state:
  exactly what it would decide if the persuader asked now.

Decoding ``"sample"`` draws from the model at ``temperature``; ``"greedy"`` takes every argmax (and the
canonical phrasing): with ``persona_override=modal_persona()`` it is the mode-collapsed frozen simulator.

Spec strings name them as kind ``persuadee`` (registered in :mod:`simpop.envs`; :func:`from_spec` builds
the act or text form to fit the env)::

    persuadee?decoding=greedy&personas=modal            the mode-collapsed frozen simulator
    persuadee:heldout-2?temperature=1.2&personas=heldout    a held-out model (see :func:`model_params`)
    verbalized:persuadee?floor=0.01&tau=1.0             verbalized sampling over its stated distribution
    trainable:persuadee                                 its co-trainable form (:mod:`.trainable`)
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from simpop.envs.dialogue import parse_observation
from simpop.envs.persuasion.acts import (ASKING_ACTS, DONATING_ACTS, PERSUADER_ACTS, STRATEGIES, classify_persuader,
                                         render_persuadee)
from simpop.envs.persuasion.codec import encode_persuadee_action, last_persuader_acts
from simpop.envs.persuasion.corpus import cached_corpus, fit_params
from simpop.envs.persuasion.env import PersuasionActEnv
from simpop.envs.persuasion.model import (Outcome, PersuadeeModel, PersuadeeParams, PersuadeeState, PersuadeeStates,
                                          calibrate)
from simpop.envs.persuasion.outcome import read_survey_answer
from simpop.envs.persuasion.personas import Persona
from simpop.envs.persuasion.release import shipped_params
from simpop.seat import (SCENARIO_PERSONAS, BuildContext, DistributionalSimulator, Simulator, SimulatorSpec, Survey,
                         survey_of)

DECODINGS = ("sample", "greedy")
#: The calibrated default parameters' model name in specs.
BASE_MODEL = "base"
#: Default spread (log-scale sd) of a held-out model's parameter jitter, and its seed.
HELDOUT_JITTER, HELDOUT_SEED = 0.35, 4242


@dataclass
class _Slot:
    rng: np.random.Generator
    persona: Persona


class _ModelPersuadee(Simulator):
    """Per-slot model state shared by the act and text simulators (the slots' states as one
    :class:`~simpop.envs.persuasion.model.PersuadeeStates`, advanced for a whole wave at once).

    Args:
        params: Model parameters (default: the calibrated defaults).
        decoding: ``"sample"`` or ``"greedy"``.
        temperature: Sampling temperature (ignored when greedy).
        persona_override: Play this persona in every scenario (e.g. ``modal_persona()``).
        name: Identifier in populations and reports.
        personas: Play a persona drawn (with the slot's generator) from these instead of the scenario's;
            a set of one is played without a draw.
        persona_set: The name of ``personas`` (part of :attr:`spec`; held-out panels compare it).
        model_name: The parameters' name in :attr:`spec` (``base``, ``heldout-2``, ...).
        jitter, model_seed, corpus: How a held-out model's parameters were drawn or fitted (:func:`model_params`;
            for :attr:`spec`).
    """

    kind = "persuadee"

    def __init__(self, params: PersuadeeParams | None = None, decoding: str = "sample", temperature: float = 1.0,
                 persona_override: Persona | None = None, name: str | None = None, *,
                 personas: Sequence[Persona] | None = None, persona_set: str | None = None,
                 model_name: str = BASE_MODEL, jitter: float = HELDOUT_JITTER, model_seed: int = HELDOUT_SEED,
                 corpus: str = ""):
        if decoding not in DECODINGS:
            raise ValueError(f"decoding must be one of {DECODINGS}, got {decoding!r}")
        if decoding == "sample" and temperature <= 0:
            raise ValueError(f"temperature must be > 0 for sampling (use decoding='greedy'), got {temperature}")
        if personas is not None and (not personas or persona_override is not None):
            raise ValueError("pass either a non-empty persona set or persona_override, not both")
        self.model = PersuadeeModel(params)
        self.decoding = decoding
        self.temperature = 0.0 if decoding == "greedy" else float(temperature)
        self.persona_override = persona_override
        self.personas = list(personas) if personas is not None else None
        self.persona_set = persona_set or (SCENARIO_PERSONAS if personas is None and persona_override is None
                                           else "custom")
        self.model_name, self.jitter, self.model_seed, self.corpus = model_name, jitter, model_seed, corpus
        self.name = name or f"{type(self).__name__.lower()}-{decoding}{'-modal' if persona_override else ''}"
        self._slots: list[_Slot] = []
        self._states = PersuadeeStates.of([])

    @property
    def spec(self) -> SimulatorSpec:
        return SimulatorSpec(self.kind, self.model_name, self.persona_set,
                             {"decoding": self.decoding, "temperature": float(self.temperature)},
                             {"jitter": float(self.jitter), "model_seed": self.model_seed, "corpus": self.corpus})

    def reset_batch(self, scenarios: list[Any], rngs: list[np.random.Generator]) -> None:
        personas = [self._persona(s, rng) for s, rng in zip(scenarios, rngs, strict=True)]
        self._slots = [_Slot(rng, p) for p, rng in zip(personas, rngs)]
        self._states = PersuadeeStates.of([self.model.initial_state(p) for p in personas])

    def _persona(self, scenario: Any, rng: np.random.Generator) -> Persona:
        if self.personas is None:
            return self.persona_override or scenario.persona
        if len(self.personas) == 1:
            return self.personas[0]
        return self.personas[int(rng.integers(len(self.personas)))]

    def slot_rng(self, slot: int) -> np.random.Generator:
        """The generator slot ``slot`` was started with."""
        return self._slots[slot].rng

    def _reply_batch(self, slots: Sequence[int], acts: Sequence[str]) -> list[Outcome]:
        """Each slot hears its act and replies (drawn with the slot's generator); the slots' states advance."""
        rows = np.asarray(slots, dtype=np.int64)
        self.model.update_rows(self._states, rows, acts)
        return self.model.respond_batch(self._states.take(rows), acts, [self._slots[slot].rng for slot in slots],
                                        self.temperature)

    def state(self, slot: int = 0) -> PersuadeeState:
        """The persuadee's current state in ``slot`` (inclination, rapport, act counts)."""
        return self._states[slot]


class ActPersuadee(_ModelPersuadee, DistributionalSimulator):
    """Act-level persuadee for ``simpop/PersuasionAct-v0``: actions are ``Discrete(23 · 7)`` indices.

    Arguments as for :class:`_ModelPersuadee`.
    """

    def act_batch(self, observations: list[Any], slots: list[int]) -> list[int]:
        acts = _heard(observations)
        return [encode_persuadee_action(*outcome) for outcome in self._reply_batch(slots, acts)]

    def distribution(self, observation: Any, slot: int = 0) -> list[tuple[int, float]]:
        act, = _heard([observation])
        state = self.model.update(self.state(slot), act)
        return [(encode_persuadee_action(*o), p) for o, p in self.model.distribution(state, act, self.temperature)]

    def commit(self, observation: Any, slot: int = 0, action: Any = None) -> None:
        """Advance the slot's state past the persuader act in ``observation`` (the reply does not move it)."""
        self._states[slot] = self.model.update(self.state(slot), *_heard([observation]))

    def distribution_batch(self, observations: list[Any], slots: list[int]
                           ) -> list[tuple[np.ndarray, list[int], np.ndarray]]:
        """:meth:`distribution` of many slots at once, the same numbers, in groups sharing their actions:
        ``(indices into the batch, actions, probabilities [n, len(actions)])``. Indices in no group (a
        distribution with a zero, which :meth:`distribution` leaves out) need :meth:`distribution`."""
        acts = _heard(observations)
        states = self._states.take(np.asarray(slots, dtype=np.int64))
        self.model.update_rows(states, np.arange(len(slots)), acts)
        return [(rows, [encode_persuadee_action(*o) for o in outcomes], probs)
                for rows, outcomes, probs in self.model.distribution_batch(states.inclination, acts, self.temperature)]

    def commit_batch(self, observations: list[Any], slots: list[int], actions: list[Any]) -> None:
        """:meth:`commit` of many slots at once (distinct slots)."""
        self.model.update_rows(self._states, np.asarray(slots, dtype=np.int64), _heard(observations))


class TextPersuadee(_ModelPersuadee):
    """Text persuadee for ``simpop/Persuasion-v1`` (same arguments as :class:`ActPersuadee`).

    A :class:`~simpop.seat.SurveyAnswerer`: the closing survey's answer comes from the model's decision in
    the slot's current state (:meth:`survey_distribution`), drawn with the slot's generator at the
    simulator's temperature (greedy: donate iff p > 0.5, the most likely amount). Its :meth:`success_probability`
    is the donation probability of the distribution its stated decision was drawn from.
    """

    def reset_batch(self, scenarios: list[Any], rngs: list[np.random.Generator]) -> None:
        super().reset_batch(scenarios, rngs)
        self._expected: dict[int, float] = {}

    def success_probability(self, slot: int) -> float | None:
        """The probability that slot ``slot``'s stated decision was a donation (> $0), from the distribution it was
        drawn from (greedy: 1 or 0, what was chosen); None before a decision."""
        return self._expected.get(slot)

    def act_batch(self, observations: list[Any], slots: list[int]) -> list[str]:
        replies = []
        for obs, slot in zip(observations, slots, strict=True):
            survey = survey_of(obs)
            if survey is not None:
                replies.extend(self.answer_survey([obs], [slot], [survey]))
                continue
            messages = parse_observation(obs)["messages"]
            heard = next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")
            asked = classify_persuader(heard)
            (act, amount) = self._reply_batch([slot], [asked])[0]
            if asked in ASKING_ACTS:  # a decision was drawn: remember how likely a donation was
                self._expected[slot] = (float(act in DONATING_ACTS) if self.decoding == "greedy" else _donating_share(
                    self.model.distribution(self.state(slot), asked, self.temperature)))
            rng = None if self.decoding == "greedy" else self._slots[slot].rng
            replies.append(render_persuadee(act, amount if act in DONATING_ACTS else None, rng))
        return replies

    def survey_distribution(self, observations: list[Any], slots: list[int],
                            surveys: list[Survey]) -> list[list[float] | None]:
        """Per slot, each option's probability: the model's decision if asked now, at this decoding.

        $0 gets the refusal probability, each amount level the donation probability times the level's
        share (greedy: one-hot). Options are matched to amounts as the env reads answers
        (:func:`~simpop.envs.persuasion.outcome.read_survey_answer`); None if no option is an amount the model
        gives (a survey not of this env), and the answer is then the model's decision as text.
        """
        out: list[list[float] | None] = []
        for slot, survey in zip(slots, surveys, strict=True):
            mass = {amount: q for (_, amount), q in self._decision(slot)}
            readings = [read_survey_answer(o) for o in survey.options]
            probs = np.array([mass.get(r.amount, 0.0) if r.parse != "fallback" else 0.0 for r in readings])
            out.append([float(p) for p in probs / probs.sum()] if probs.sum() > 0 else None)
        return out

    def answer_survey(self, observations: list[Any], slots: list[int], surveys: list[Survey]) -> list[str]:
        """Per slot, the chosen option: the most likely one when greedy, else drawn with the slot's generator."""
        answers = []
        for slot, survey, probs in zip(slots, surveys, self.survey_distribution(observations, slots, surveys)):
            if probs is None:
                options = self._decision(slot)
                weights = np.array([q for _, q in options])
                index = (int(np.argmax(weights)) if self.decoding == "greedy"
                         else int(self._slots[slot].rng.choice(len(options), p=weights / weights.sum())))
                amount = options[index][0][1] or 0.0  # decisions carry amounts (refusals $0)
                answers.append(f"${amount:.2f}")
                self._expected[slot] = float(amount > 0) if self.decoding == "greedy" else _donating_share(options)
                continue
            index = (int(np.argmax(probs)) if self.decoding == "greedy"
                     else int(self._slots[slot].rng.choice(len(probs), p=probs)))
            answers.append(survey.options[index])
            gives = [(read_survey_answer(o).amount or 0.0) > 0 for o in survey.options]
            self._expected[slot] = (float(gives[index]) if self.decoding == "greedy"
                                    else float(sum(p for p, g in zip(probs, gives) if g)))
        return answers

    def _decision(self, slot: int) -> list[tuple[Outcome, float]]:
        """The decision distribution in the slot's current state (no asking act applied: nothing is heard)."""
        return self.model.distribution(self.state(slot), "ask-donation-amount", self.temperature)


def _donating_share(outcomes: list[tuple[Outcome, float]]) -> float:
    """The probability mass of outcomes that give more than $0, of all the mass (the draw normalises too)."""
    total = sum(q for _, q in outcomes)
    return sum(q for (_, amount), q in outcomes if amount is not None and amount > 0) / total


def _heard(observations: list[Any]) -> list[str]:
    """The persuader act each persuadee observation answers."""
    acts = last_persuader_acts(observations)
    if None in acts:
        raise ValueError("the persuadee observation reports no persuader act yet; the persuader speaks first")
    return [act for act in acts if act is not None]


def model_params(model: str, personas: Sequence[Persona] | None, jitter: float = HELDOUT_JITTER,
                 seed: int = HELDOUT_SEED, corpus: str = "") -> PersuadeeParams:
    """The parameters a persuadee model name stands for.

    ``base`` is the calibrated defaults. ``heldout-<i>`` is a model training never uses: the act effects,
    persona modulations and trait weights of the defaults each multiplied by ``exp(N(0, jitter²))``
    (generator seeded with ``[seed, i]``), then the intercept and amount shift recalibrated
    (:func:`~simpop.envs.persuasion.model.calibrate`) on ``personas`` so that a corpus-like persuader still
    gets the corpus donor rate: other people who give as often but respond to different strategies.
    ``shuffled-<i>`` is built by another procedure: the persuasive strategies' effects and modulations are
    permuted among the strategies (:func:`_shuffled_strategies`, same generator; ``jitter`` unused), then
    recalibrated the same way: which strategy works is reassigned rather than perturbed. ``fitted-<i>`` is fitted
    to data: without ``corpus``, bootstrap resample ``i`` of the fit simpop ships (:mod:`.fitted`: the public P4G
    corpus's training split; ``seed`` unused); with ``corpus`` (a folder),
    :func:`~simpop.envs.persuasion.corpus.fit_params` on bootstrap resample ``i`` (generator seeded with
    ``[seed, i]``) of that whole corpus, calibrated to that resample's own donor rate.

    The result is cached per process (it is deterministic): a panel built again rebuilds no calibration.
    """
    return _model_params(model, None if personas is None else tuple(personas), jitter, seed, corpus)


@functools.lru_cache(maxsize=64)
def _model_params(model: str, personas: tuple[Persona, ...] | None, jitter: float, seed: int,
                  corpus: str) -> PersuadeeParams:
    if model == BASE_MODEL:
        return PersuadeeParams()
    prefix, _, index = model.partition("-")
    if prefix not in ("heldout", "shuffled", "fitted") or not index.isdigit():
        raise ValueError(f"unknown persuadee model {model!r}; use {BASE_MODEL}, heldout-<i> (e.g. heldout-0), "
                         f"shuffled-<i> or fitted-<i> (with corpus=DIR)")
    if prefix == "fitted":
        return _fitted(corpus, seed, int(index))
    base = PersuadeeParams()
    rng = np.random.default_rng([seed, int(index)])
    changed: dict[str, Any]
    if prefix == "heldout":
        changed = {name: tuple(v * float(np.exp(rng.normal(0.0, jitter))) for v in getattr(base, name))
                   for name in ("act_effects", "modulation", "trait_weights")}
    else:
        changed = _shuffled_strategies(base, rng)
    return calibrate(dataclasses.replace(base, **changed), personas=personas)


@functools.lru_cache(maxsize=16)
def _fitted(corpus: str, seed: int, index: int) -> PersuadeeParams:
    """Parameters fitted to bootstrap resample ``index`` of the corpus in folder ``corpus`` (none: the shipped fit)."""
    if not corpus:
        return shipped_params(index)
    return fit_params(cached_corpus(corpus).resample(seed, index))


def _shuffled_strategies(base: PersuadeeParams, rng: np.random.Generator) -> dict[str, tuple[float, ...]]:
    """Act effects and modulations with the persuasive strategies' entries permuted among the strategies (one
    permutation for both, never the identity): people for whom other strategies work, and work on other traits."""
    strategies = [PERSUADER_ACTS.index(s) for s in STRATEGIES]
    order = np.arange(len(strategies))
    while np.array_equal(order, np.arange(len(strategies))):
        order = rng.permutation(len(strategies))
    changed = {}
    for name in ("act_effects", "modulation"):
        values = list(getattr(base, name))
        for target, source in zip(strategies, order):
            values[target] = getattr(base, name)[strategies[source]]
        changed[name] = tuple(values)
    return changed


def from_spec(spec: SimulatorSpec, context: BuildContext) -> ActPersuadee | TextPersuadee:
    """The ``persuadee`` kind: an :class:`ActPersuadee` for the act env, a :class:`TextPersuadee` otherwise."""
    return _persuadee_class(context.env)(**_spec_arguments(spec, context))


def _spec_arguments(spec: SimulatorSpec, context: BuildContext) -> dict[str, Any]:
    """Constructor arguments of a persuadee from its spec."""
    params = spec.params
    personas = context.personas(spec.personas)
    calibration = personas if personas is not None else (
        [context.env.load_scenario(i).persona for i in context.env.scenario_ids()] if context.env is not None else None)
    return {"params": model_params(spec.model or BASE_MODEL, calibration, params["jitter"], params["model_seed"],
                                   params["corpus"]),
            "decoding": params["decoding"], "temperature": params["temperature"], "personas": personas,
            "persona_set": spec.personas if personas is not None else None, "model_name": spec.model or BASE_MODEL,
            "jitter": params["jitter"], "model_seed": params["model_seed"], "corpus": params["corpus"]}


def _persuadee_class(env: Any) -> type:
    if env is None:
        raise ValueError("persuadee simulators need the env (act or text level): pass env=...")
    return ActPersuadee if isinstance(env, PersuasionActEnv) else TextPersuadee


def native_act(env: Any) -> ActPersuadee:
    """Default simulator of ``simpop/PersuasionAct-v0``: the calibrated model, sampled."""
    return ActPersuadee()


def native_text(env: Any) -> TextPersuadee:
    """Default simulator of ``simpop/Persuasion-v1``: the calibrated model, sampled, realised as text."""
    return TextPersuadee()
