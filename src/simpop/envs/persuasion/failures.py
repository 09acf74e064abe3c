"""P4G's failure model for failure-driven simulator generation (:mod:`simpop.simulators.generation`).

**Act level (and text, without a writer): persona regions.** The personas of the lost probe dialogues (their
scenarios' personas: probe members play ``personas=scenario``) are compared with those of the won ones.
Numeric attributes are ranked by the standardised difference of their centred values (lost minus won, over the
pooled sd); a categorical attribute by the lift of its most failure-prone category (failure rate with it over
the overall rate). The strongest ``attributes`` (default 2) with ``|d| >= min_effect`` (0.2; a categorical lift
>= 1.2) form a *region*: numeric ``attr<v`` or ``attr>v`` at the midpoint between the lost and won means,
categorical ``attr=category``. Its persona set is named ``region-<n>-<seed>:<clauses>`` (e.g.
``region-64-7:care<4.2,religion=Atheist``) and resolved by :func:`persona_set`: ``n`` personas drawn with
``seed`` from :class:`~.personas.PersonaSampler`'s marginals restricted to the region (exact: attributes are
independent). With no attribute over the threshold the region is the lost personas' single strongest
attribute (counted as ``weak_region``). Each proposal also reports the *reply patterns* of the lost dialogues:
the persuadee replies most over-represented in them relative to won ones. Proposals are
``persuadee?temperature=1.0&personas=region-...`` (the calibrated base model, sampled): the region is the new
information, the model is the training model.

**Text level with a writer: written personas.** A :class:`~simpop.simulators.generation.DescriptionWriter`
(the embedded SmolLM2) writes persona descriptions from the lost transcripts. Each description is attached to
a lost dialogue's persona attributes (:class:`WrittenPersona`: its ``describe()`` is the written text) and the
set is registered under a content hash, ``written-<sha>`` (:func:`register_written`; :func:`save_written` /
:func:`load_written` carry the sets to another process). Proposals are ``frozen:MODEL?temperature=1.0&
personas=written-<sha>`` (an LLM persuadee playing them). When the writer's answer cannot be parsed the model
falls back to a persona region (counted as ``writer_fallback``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from simpop.envs.persuasion.personas import CATEGORICAL, DEFAULT_MARGINALS, NUMERIC, PERSONA_FIELDS, SCALES, Persona
from simpop.envs.written import PREFIX, WrittenSets

#: Written persona sets registered in this process: name -> personas.
_WRITTEN = WrittenSets("simpop.envs.persuasion.failures", encode=lambda p: p.to_dict(),
                       decode=lambda d: WrittenPersona(**d))
save_written, load_written = _WRITTEN.save, _WRITTEN.load


@dataclass(frozen=True)
class WrittenPersona(Persona):
    """A persona whose description an LLM wrote (the attributes stay those of the lost dialogue it came from)."""

    description: str = ""

    def describe(self) -> str:
        return self.description


# ---------------------------------------------------------------------------------------------- persona sets
def persona_set(name: str) -> tuple[Persona, ...]:
    """The personas of a ``region-<n>-<seed>:<clauses>`` or ``written-<sha>`` set (module docstring).

    Raises:
        ValueError: a malformed name, an unknown attribute or category, an empty region, or a written set not
            registered in this process (load it with :func:`load_written`).
    """
    if name.startswith(PREFIX):
        return _WRITTEN.get(name)
    head, _, clauses = name.partition(":")
    parts = head.split("-")
    if len(parts) != 3 or parts[0] != "region" or not all(p.isdigit() for p in parts[1:]) or int(parts[1]) < 1:
        raise ValueError(f"bad region persona set {name!r}; expected region-<n>-<seed>:<attr><v>,<attr>=<category>")
    tables = {n: (np.array(DEFAULT_MARGINALS[n].support(n), dtype=object), DEFAULT_MARGINALS[n].probabilities(n))
              for n in PERSONA_FIELDS}
    for clause in filter(None, clauses.split(",")):
        attr, op, value = _split_clause(clause, name)
        support, probs = tables[attr]
        if op == "=":
            keep = np.array([s == value for s in support])
        else:
            keep = np.array([float(s) < float(value) if op == "<" else float(s) > float(value) for s in support])
        probs = np.where(keep, probs, 0.0)
        if probs.sum() <= 0:
            raise ValueError(f"region persona set {name!r}: clause {clause!r} leaves no value of {attr}")
        tables[attr] = (support, probs / probs.sum())
    rng = np.random.default_rng(int(parts[2]))
    return tuple(Persona(**{n: support[int(rng.choice(len(support), p=p))] for n, (support, p) in tables.items()})
                 for _ in range(int(parts[1])))


def _split_clause(clause: str, name: str) -> tuple[str, str, str]:
    for op in ("<", ">", "="):
        attr, found, value = clause.partition(op)
        if found:
            if attr not in PERSONA_FIELDS:
                raise ValueError(f"region persona set {name!r}: unknown attribute {attr!r}")
            if (op == "=") != (attr in CATEGORICAL):
                raise ValueError(f"region persona set {name!r}: {attr} takes "
                                 f"{'=category' if attr in CATEGORICAL else '< or > a number'}")
            if op != "=":
                float(value)
            return attr, op, value
    raise ValueError(f"region persona set {name!r}: clause {clause!r} has no <, > or =")


def register_written(personas: Sequence[WrittenPersona]) -> str:
    """Register written personas under their content hash; returns the set's name (``written-<sha>``)."""
    return _WRITTEN.register(personas)


# ---------------------------------------------------------------------------------------------- the model
class PersuasionFailures:
    """Proposals from lost P4G probe dialogues (module docstring).

    Args:
        env: A P4G env (act or text); lost dialogues' scenarios are read from it.
        writer: Text level: writes persona descriptions (None: persona regions only).
        personas_per_set: Personas in a generated set.
        attributes: Attributes in a region.
        min_effect: Smallest standardised difference (numeric) kept in a region.
        min_lift: Smallest failure-rate lift (categorical) kept in a region.
        llm: The LLM that plays written personas (text level).
    """

    def __init__(self, env: Any, writer: Any = None, personas_per_set: int = 64, attributes: int = 2,
                 min_effect: float = 0.2, min_lift: float = 1.2, llm: str = "smollm2"):
        if personas_per_set < 1 or attributes < 1:
            raise ValueError("personas_per_set and attributes must be >= 1")
        self.env, self.writer = env, writer
        self.personas_per_set, self.attributes = personas_per_set, attributes
        self.min_effect, self.min_lift, self.llm = min_effect, min_lift, llm

    def propose(self, lost: Sequence[Any], won: Sequence[Any], count: int, rng: np.random.Generator,
                stats: MutableMapping[str, int]) -> list[dict[str, Any]]:
        """Up to ``count`` simulator proposals from the lost dialogues' personas (module docstring); ``stats`` counts
        why none came.
        """
        lost_p, won_p = self._personas(lost, stats), self._personas(won, stats)
        if not lost_p:
            stats["no_lost_personas"] = stats.get("no_lost_personas", 0) + 1
            return []
        patterns = reply_patterns(lost, won)
        if self.writer is not None:
            written = self._written(lost, lost_p, count, rng, stats)
            if written:
                return [{"name": f"written-{i}-{name[8:16]}",
                         "spec": f"frozen:{self.llm}?temperature=1.0&personas={name}",
                         "reason": {"written": [p.description for p in _WRITTEN.get(name)], "reply_patterns": patterns}}
                        for i, name in enumerate(written)]
            stats["writer_fallback"] = stats.get("writer_fallback", 0) + 1
        ranked = rank_attributes(lost_p, won_p)
        strong = [r for r in ranked if (r["effect"] >= self.min_effect if r["op"] != "=" else r["effect"]
                                        >= self.min_lift)]
        if not strong:
            stats["weak_region"] = stats.get("weak_region", 0) + 1
            strong = ranked[:1]
        proposals = []
        for i in range(count):
            # the strongest region first; further proposals drop one clause in turn (neighbouring regions)
            clauses = strong[:self.attributes] if i == 0 else [c for j, c in enumerate(
                strong[:self.attributes + 1]) if j != (i - 1) % (min(len(strong), self.attributes + 1))]
            clauses = clauses or strong[:1]
            text = ",".join(f"{c['attribute']}{c['op']}{c['value']}" for c in clauses)
            name = f"region-{self.personas_per_set}-{int(rng.integers(1 << 30))}:{text}"
            proposals.append({"name": f"region-{i}-{text}", "spec": f"persuadee?temperature=1.0&personas={name}",
                              "reason": {"region": clauses, "reply_patterns": patterns, "lost": len(lost),
                                         "won": len(won)}})
        return proposals

    def _personas(self, records: Sequence[Any], stats: MutableMapping[str, int]) -> list[Persona]:
        out = []
        for r in records:
            try:
                out.append(self.env.load_scenario(r.scenario).persona)
            except KeyError:
                stats["unknown_scenario"] = stats.get("unknown_scenario", 0) + 1
        return out

    def _written(self, lost: Sequence[Any], personas: Sequence[Persona], count: int, rng: np.random.Generator,
                 stats: MutableMapping[str, int]) -> list[str]:
        shown = [r.transcript for r in lost[:4]]
        texts = self.writer.write(shown, count * 4, what="persuadee persona descriptions",
                                  seats=("persuader", "persuadee"), seed=int(rng.integers(1 << 30)))
        if not texts:
            return []
        stats["written"] = stats.get("written", 0) + len(texts)
        sets = [texts[i::count] for i in range(count) if texts[i::count]]
        names = []
        for group in sets:
            base = [personas[int(rng.integers(len(personas)))] for _ in group]
            names.append(register_written([WrittenPersona(**p.to_dict(), description=t) for p, t in zip(base, group)]))
        return names


def rank_attributes(lost: Sequence[Persona], won: Sequence[Persona]) -> list[dict[str, Any]]:
    """Every attribute's region clause and effect, strongest first (module docstring).

    Numeric: ``{"attribute", "op": "<" | ">", "value", "effect": |d|}``; categorical: ``{"attribute", "op": "=",
    "value": category, "effect": lift}``. With no won dialogue the lost personas are compared with the sampler's
    marginal means.
    """
    out = []
    for name in NUMERIC:
        a = np.array([p.centred(name) for p in lost])
        lo, hi = SCALES[name]
        if won:
            b = np.array([p.centred(name) for p in won])
            sd = float(np.sqrt((a.var() + b.var()) / 2)) or 1.0
            mean_b = float(b.mean())
        else:
            m = DEFAULT_MARGINALS[name]
            mean_b = (2 * m.mean - lo - hi) / (hi - lo)
            sd = 2 * m.sd / (hi - lo) if m.sd > 0 else 1.0
        d = (float(a.mean()) - mean_b) / sd
        mid = (float(a.mean()) + mean_b) / 2
        value = round(lo + (mid + 1) * (hi - lo) / 2, 2)
        out.append({"attribute": name, "op": "<" if d < 0 else ">", "value": value, "effect": abs(d)})
    everyone = list(lost) + list(won)
    base = len(lost) / len(everyone)
    for name in CATEGORICAL:
        counts, fails = Counter(getattr(p, name) for p in everyone), Counter(getattr(p, name) for p in lost)
        lifts = {c: (fails[c] / n) / base for c, n in counts.items() if n >= 2}
        if lifts:
            best = max(sorted(lifts), key=lambda c: lifts[c])
            out.append({"attribute": name, "op": "=", "value": best, "effect": lifts[best]})
    # numeric effects (sd units) and categorical lifts are on different scales: rank each by its threshold
    return sorted(out, key=lambda r: -(r["effect"] / 0.2 if r["op"] != "=" else (r["effect"] - 1) / 0.2))


def reply_patterns(lost: Sequence[Any], won: Sequence[Any], top: int = 3) -> list[dict[str, Any]]:
    """The persuadee replies most over-represented in lost dialogues (share in lost minus share in won)."""
    def shares(records: Sequence[Any]) -> Counter:
        counts = Counter(t["text"] for r in records for t in r.transcript if t.get("seat") == "persuadee")
        total = sum(counts.values()) or 1
        return Counter({k: v / total for k, v in counts.items()})

    a, b = shares(lost), shares(won)
    lift = sorted(((a[k] - b.get(k, 0.0), k) for k in a), reverse=True)[:top]
    return [{"reply": k, "lost_share": round(a[k], 3), "won_share": round(b.get(k, 0.0), 3)} for d, k in lift if d > 0]


def failure_model(env: Any, writer: Any = None) -> PersuasionFailures:
    """The P4G failure model (the entry point :data:`simpop.simulators.generation.FAILURE_MODELS` names)."""
    return PersuasionFailures(env, writer)
