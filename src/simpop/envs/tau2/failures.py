"""τ²'s failure model for failure-driven simulator generation (:mod:`simpop.simulators.generation`).

A τ² user persona is text (``Tau2Scenario.persona``), so new users come from the lost dialogues through an LLM:
a :class:`~simpop.simulators.generation.DescriptionWriter` (the embedded SmolLM2 by default) reads the lost
transcripts and writes user persona descriptions; each group of them is registered under its content hash as
the persona set ``written-<sha>`` (:func:`register_written`; :func:`save_written` / :func:`load_written` carry the
sets to another process), which ``Tau2Env.persona_set`` resolves. Proposals are
``frozen:MODEL?temperature=1.0&personas=written-<sha>``: an LLM user playing the same tasks as those people.
Without a writer, or when its answer cannot be parsed, there is nothing to propose (counted as ``no_writer`` /
``writer_unparsed``): unlike P4G there are no persona attributes to fall back on.
"""

from __future__ import annotations

from collections.abc import MutableMapping, Sequence
from typing import Any

import numpy as np

from simpop.envs.written import PREFIX, WrittenSets

#: Written persona sets registered in this process (persona texts).
_WRITTEN = WrittenSets("simpop.envs.tau2.failures")
save_written, load_written = _WRITTEN.save, _WRITTEN.load


def persona_set(name: str) -> tuple[str, ...]:
    """The personas of a ``written-<sha>`` set.

    Raises:
        ValueError: an unknown name, or a set not registered in this process (load it with :func:`load_written`).
    """
    if not name.startswith(PREFIX):
        raise ValueError(f"unknown τ² persona set {name!r}; τ² has written-<sha> sets (or scenario)")
    return _WRITTEN.get(name)


def register_written(personas: Sequence[str]) -> str:
    """Register persona texts under their content hash; the set's name (``written-<sha>``)."""
    if not personas or not all(isinstance(p, str) and p.strip() for p in personas):
        raise ValueError("a written persona set needs at least one non-empty persona text")
    return _WRITTEN.register(personas)


class Tau2Failures:
    """Proposals from lost τ² probe dialogues (module docstring).

    Args:
        env: A τ² env.
        writer: Writes user personas from the lost transcripts.
        llm: The LLM that plays the written users.
        per_set: Personas in a written set.
    """

    def __init__(self, env: Any, writer: Any = None, llm: str = "smollm2", per_set: int = 2):
        if per_set < 1:
            raise ValueError(f"per_set must be >= 1, got {per_set}")
        self.env, self.writer, self.llm, self.per_set = env, writer, llm, per_set

    def propose(self, lost: Sequence[Any], won: Sequence[Any], count: int, rng: np.random.Generator,
                stats: MutableMapping[str, int]) -> list[dict[str, Any]]:
        """Up to ``count`` written user personas from the lost dialogues (module docstring); ``stats`` counts why none
        came.
        """
        if self.writer is None:
            stats["no_writer"] = stats.get("no_writer", 0) + 1
            return []
        texts = self.writer.write([r.transcript for r in lost[:4]], count * self.per_set, what="customer personas",
                                  seats=("agent", "customer"), seed=int(rng.integers(1 << 30)))
        if not texts:
            stats["writer_unparsed"] = stats.get("writer_unparsed", 0) + 1
            return []
        stats["written"] = stats.get("written", 0) + len(texts)
        tasks = sorted({r.scenario for r in lost})
        proposals = []
        for i in range(count):
            group = texts[i * self.per_set:(i + 1) * self.per_set]
            if group:
                name = register_written(group)
                proposals.append({"name": f"written-{i}-{name[8:16]}",
                                  "spec": f"frozen:{self.llm}?temperature=1.0&personas={name}",
                                  "reason": {"written": list(group), "lost_tasks": tasks}})
        return proposals


def failure_model(env: Any, writer: Any = None) -> Tau2Failures:
    """The τ² failure model (the entry point :data:`simpop.simulators.generation.FAILURE_MODELS` names)."""
    return Tau2Failures(env, writer)
