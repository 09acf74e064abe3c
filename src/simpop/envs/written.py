"""Persona sets an LLM wrote (failure-driven simulator generation), named by their content hash.

A benchmark's failure model registers each group of written personas as the persona set ``written-<sha>``,
which its env's ``persona_set`` then resolves, so generated simulators are ordinary spec strings
(``...&personas=written-<sha>``). The sets live in the process: :meth:`WrittenSets.save` /
:meth:`WrittenSets.load` carry them to another one (a resumed run).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

PREFIX = "written-"


class WrittenSets:
    """One benchmark's written persona sets.

    Args:
        owner: The module whose ``load_written`` restores them (named in errors).
        encode: A persona as JSON data (hashed and saved).
        decode: JSON data back as a persona.
    """

    def __init__(self, owner: str, encode: Callable[[Any], Any] = lambda p: p,
                 decode: Callable[[Any], Any] = lambda d: d):
        self.owner, self.encode, self.decode = owner, encode, decode
        self._sets: dict[str, tuple[Any, ...]] = {}

    def register(self, personas: Sequence[Any]) -> str:
        """Register ``personas`` under their content hash; the set's name (``written-<sha>``)."""
        if not personas:
            raise ValueError("a written persona set needs at least one persona")
        payload = json.dumps([self.encode(p) for p in personas], sort_keys=True)
        name = PREFIX + hashlib.sha256(payload.encode()).hexdigest()[:12]
        self._sets[name] = tuple(personas)
        return name

    def get(self, name: str) -> tuple[Any, ...]:
        """The personas of a registered set.

        Raises:
            ValueError: The set is not registered in this process.
        """
        if name not in self._sets:
            raise ValueError(f"written persona set {name!r} is not registered in this process; load the run's "
                             f"written personas with {self.owner}.load_written(path)")
        return self._sets[name]

    def save(self, path: str | Path) -> None:
        """Write every set of this process to ``path`` (JSON)."""
        data = {name: [self.encode(p) for p in personas] for name, personas in self._sets.items()}
        Path(path).write_text(json.dumps(data, indent=1))

    def load(self, path: str | Path) -> list[str]:
        """Register the sets saved in ``path``; their names.

        Raises:
            ValueError: A saved set whose content does not match its name.
        """
        names = []
        for name, personas in json.loads(Path(path).read_text()).items():
            if self.register([self.decode(p) for p in personas]) != name:
                raise ValueError(f"{path}: written persona set {name!r} does not match its content")
            names.append(name)
        return names
