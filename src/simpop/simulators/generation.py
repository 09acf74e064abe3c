"""Failure-driven simulator generation: new training simulators built from the dialogues the policy loses.

One round (:func:`generate`):

1. **collect**: the probe panel's dialogues (records with ``member``, ``scenario``, ``success``, ``transcript``,
   e.g. :class:`~simpop.evaluation.panel.EpisodeRecord`), split into lost and won;
2. **characterise and propose**: the benchmark's :class:`FailureModel` turns them into proposals, each a
   simulator spec with the reason for it (P4G: persona regions where the policy loses and the reply patterns
   there, or, with a writer, persona descriptions an LLM writes from the lost transcripts; τ²: user personas
   written from the lost transcripts). Benchmarks name their model in :data:`FAILURE_MODELS` (entry-point
   strings, so this generic module imports no benchmark);
3. **check**: every proposal is built through the one registry and must round-trip
   (``build_simulator(str(sim.spec)).spec == sim.spec``), be held out from the panel the policy is judged on
   (:meth:`~simpop.simulators.population.Panel.check_disjoint`, strict: every axis differs; and no persona shared
   with a panel member: not a copy of a held-out member), and be new to the pool; rejects are counted by reason,
   never raised;
4. **add** the survivors to the training :class:`~simpop.simulators.population.Population`.

Text-level models write with :class:`DescriptionWriter` (any backend: the embedded SmolLM2 by default): it asks
for a JSON list of descriptions and parses the answer robustly (JSON, a JSON list inside other text, then
numbered or bulleted lines), counting each path and every fallback in ``stats``.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Collection, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from simpop.seat import Simulator, SimulatorSpec
from simpop.simulators.population import Panel, PanelOverlapError, Population, leaf_simulators

#: Env package -> ``"module:callable"`` returning that benchmark's :class:`FailureModel` for an env.
FAILURE_MODELS: dict[str, str] = {
    "simpop.envs.persuasion": "simpop.envs.persuasion.failures:failure_model",
    "simpop.envs.tau2": "simpop.envs.tau2.failures:failure_model",
}


@dataclass(frozen=True)
class Proposal:
    """A simulator a failure model proposes: its name in the pool, its spec, and why (for the report).

    Benchmarks (below this layer) return the same as a mapping ``{"name", "spec", "reason"}``."""

    name: str
    spec: str
    reason: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class FailureModel(Protocol):
    """A benchmark's characterisation of lost dialogues into simulator proposals."""

    def propose(self, lost: Sequence[Any], won: Sequence[Any], count: int, rng: np.random.Generator,
                stats: MutableMapping[str, int]) -> list[Proposal | Mapping[str, Any]]:
        """Up to ``count`` proposals from the lost (and, for contrast, won) dialogues; counts fallbacks in
        ``stats``."""
        ...


def failure_model(env: Any, writer: DescriptionWriter | None = None) -> FailureModel:
    """The registered :class:`FailureModel` of ``env``'s benchmark.

    Raises:
        ValueError: the env's benchmark has none.
    """
    from simpop.envs.registration import load

    module = type(env).__module__
    entry = next((e for package, e in FAILURE_MODELS.items() if module.startswith(package)), None)
    if entry is None:
        raise ValueError(f"{type(env).__name__} has no failure model for simulator generation; benchmarks with one: "
                         + ", ".join(sorted(FAILURE_MODELS)))
    return load(entry)(env, writer)


# ---------------------------------------------------------------------------------------------- one round
@dataclass
class GenerationResult:
    """What one round did: simulators added, and proposals rejected by reason."""

    added: list[Simulator] = field(default_factory=list)
    proposals: list[Proposal] = field(default_factory=list)
    rejected: Counter = field(default_factory=Counter)
    stats: dict[str, int] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        """A flat, JSON-safe summary for ``metrics.jsonl``."""
        return {"added": len(self.added), "proposed": len(self.proposals),
                "added_specs": [str(s.spec) for s in self.added],
                **{f"rejected/{k}": v for k, v in sorted(self.rejected.items())},
                **{f"stats/{k}": v for k, v in sorted(self.stats.items())}}


def split_outcomes(records: Sequence[Any]) -> tuple[list[Any], list[Any]]:
    """(lost, won) dialogues of ``records`` (anything with a boolean ``success``)."""
    lost = [r for r in records if not r.success]
    return lost, [r for r in records if r.success]


def generate(model: FailureModel, records: Sequence[Any], pool: Population, env: Any, *, count: int = 2,
             panel: Panel | None = None, shared_model: Collection[str] = (), rng: np.random.Generator | None = None,
             backends: MutableMapping[str, Any] | None = None) -> GenerationResult:
    """One round: propose from the lost ``records``, check, and add up to ``count`` simulators to ``pool``.

    Args:
        model: The benchmark's failure model (:func:`failure_model`).
        records: The probe dialogues (lost and won).
        pool: The training population the new simulators join.
        env: The env the simulators serve.
        count: Most simulators added.
        panel: The held-out panel new simulators must stay disjoint from (None: no check; say so in reports).
        shared_model: Panel labels allowed to share the model (see :meth:`Panel.check_disjoint`).
        rng: Generator for the proposals' seeds.
        backends: Loaded-model cache shared with the rest of the run.
    """
    from simpop.simulators.registry import build_simulator

    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    rng = rng or np.random.default_rng(0)
    result = GenerationResult()
    lost, won = split_outcomes(records)
    if not lost:
        result.rejected["no_lost_dialogues"] += 1
        return result
    stats: dict[str, int] = {}
    result.proposals = [p if isinstance(p, Proposal) else Proposal(**p)
                        for p in model.propose(lost, won, count, rng, stats)]
    result.stats = stats
    names = {s.name for s in pool.members}
    specs = {str(s.spec) for s in leaf_simulators([pool])}
    for proposal in result.proposals:
        if len(result.added) >= count:
            break
        try:
            simulator = build_simulator(proposal.spec, env, backends, name=proposal.name)
        except (ValueError, KeyError, TypeError) as error:
            result.rejected["build_error"] += 1
            result.stats[f"build_error:{type(error).__name__}"] = result.stats.get(
                f"build_error:{type(error).__name__}", 0) + 1
            continue
        reason = check(simulator, env, panel, shared_model, names, specs, backends)
        if reason is not None:
            result.rejected[reason] += 1
            continue
        pool.add(simulator)
        names.add(simulator.name)
        specs.add(str(simulator.spec))
        result.added.append(simulator)
    return result


def check(simulator: Simulator, env: Any, panel: Panel | None, shared_model: Collection[str] = (),
          names: Collection[str] = (), specs: Collection[str] = (),
          backends: MutableMapping[str, Any] | None = None) -> str | None:
    """Why ``simulator`` may not join the pool (None: it may): ``not_round_trip``, ``not_held_out``,
    ``copies_panel_persona``, ``duplicate_name`` or ``duplicate_spec``."""
    from simpop.simulators.registry import build_simulator

    spec = simulator.spec
    if SimulatorSpec.parse(str(spec)) != spec or build_simulator(str(spec), env, backends).spec != spec:
        return "not_round_trip"
    if simulator.name in names:
        return "duplicate_name"
    if str(spec) in specs:
        return "duplicate_spec"
    if panel is not None:
        try:
            panel.check_disjoint([simulator], shared_model=shared_model, strict=True)
        except PanelOverlapError:
            return "not_held_out"
        if shares_persona(simulator, panel):
            return "copies_panel_persona"
    return None


def shares_persona(simulator: Simulator, panel: Panel) -> bool:
    """Whether ``simulator`` plays a persona some panel member plays (simulators with a ``personas`` list)."""
    own = {_persona_key(p) for p in _personas(simulator)}
    return bool(own) and any(_persona_key(p) in own for _, member in panel for leaf in leaf_simulators([member])
                             for p in _personas(leaf))


def _personas(simulator: Simulator) -> list[Any]:
    found = getattr(simulator, "personas", None)
    return list(found) if isinstance(found, (list, tuple)) else []


def _persona_key(persona: Any) -> Any:
    """What makes two personas the same person (a written description differs from its base attributes)."""
    try:
        hash(persona)
        return persona
    except TypeError:
        return repr(persona)


# ---------------------------------------------------------------------------------------------- LLM writer
_WRITE_PROMPT = (
    "Below are {n} conversations in which the assistant ({policy}) failed at its task with the user ({user}).\n\n"
    "{transcripts}\n\nWrite {count} new, different {what} for users like these: the kind of people the assistant "
    "fails with. Each one or two sentences, in the second person (\"You are ...\"). Answer with a JSON list of "
    "{count} strings and nothing else.")


@dataclass
class DescriptionWriter:
    """An LLM that writes new user descriptions from failed transcripts (any simpop backend).

    Args:
        backend: A backend (``generate(chats, params)``), e.g. ``load_backend("smollm2")``.
        temperature: Sampling temperature of the writing call.
        max_new_tokens: Token budget of one answer.
        min_chars: Shortest accepted description (shorter ones are dropped).
        max_chars: Longest accepted description (longer ones are cut).
        max_transcript_chars: Characters of each transcript shown to the model.
        stats: Counters: ``calls``, ``parsed_json``, ``parsed_embedded_json``, ``parsed_lines``, ``unparsed``,
            ``dropped_short``, ``truncated_long``.
    """

    backend: Any
    temperature: float = 0.9
    max_new_tokens: int = 256
    min_chars: int = 20
    max_chars: int = 400
    max_transcript_chars: int = 600
    stats: Counter = field(default_factory=Counter)

    def write(self, transcripts: Sequence[Sequence[Mapping[str, str]]], count: int, what: str = "persona descriptions",
              seats: tuple[str, str] = ("policy", "user"), seed: int = 0) -> list[str]:
        """Up to ``count`` descriptions (possibly none: then ``unparsed`` was counted and the caller falls back)."""
        from simpop.agents.base import SamplingParams

        shown = "\n\n".join(f"Conversation {i + 1}:\n{_render(t)[:self.max_transcript_chars]}"
                            for i, t in enumerate(transcripts))
        prompt = _WRITE_PROMPT.format(n=len(transcripts), policy=seats[0], user=seats[1], transcripts=shown,
                                      count=count, what=what)
        params = SamplingParams(temperature=self.temperature, max_new_tokens=self.max_new_tokens, seed=seed)
        self.stats["calls"] += 1
        text = self.backend.generate([[{"role": "user", "content": prompt}]], params)[0].text
        return self.parse(text)[:count]

    def parse(self, text: str) -> list[str]:
        """Descriptions in ``text``: a JSON list, a JSON list inside other text, else numbered/bulleted lines."""
        items, path = _json_list(text.strip()), "parsed_json"
        if items is None:
            match = re.search(r"\[.*\]", text, flags=re.DOTALL)
            items, path = (_json_list(match.group(0)) if match else None), "parsed_embedded_json"
        if items is None:
            items = [m.group(1) for m in re.finditer(r"^\s*(?:\d+[.)]|[-*•])\s*\"?(.+?)\"?\s*$", text, re.MULTILINE)]
            path = "parsed_lines" if items else "unparsed"
        self.stats[path] += 1
        out = []
        for item in items:
            item = " ".join(str(item).split())
            if len(item) < self.min_chars:
                self.stats["dropped_short"] += 1
                continue
            if len(item) > self.max_chars:
                self.stats["truncated_long"] += 1
                item = item[:self.max_chars].rsplit(" ", 1)[0]
            out.append(item)
        return out


def _json_list(text: str) -> list[Any] | None:
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if isinstance(value, dict):  # {"descriptions": [...]} and the like
        value = next((v for v in value.values() if isinstance(v, list)), None)
    if not isinstance(value, list):
        return None
    return [v if isinstance(v, str) else json.dumps(v) for v in value]


def _render(transcript: Sequence[Mapping[str, str]]) -> str:
    return "\n".join(f"{turn.get('seat', '?')}: {turn.get('text', '')}" for turn in transcript)
