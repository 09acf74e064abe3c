from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def verifiers_python() -> str:
    """A Python with verifiers (``$SIMPOP_VERIFIERS_PYTHON`` or the project's ``.venv-verifiers``); skips only where
    none is found (``make verifiers-env`` builds it; ``make test`` does it first)."""
    configured = os.environ.get("SIMPOP_VERIFIERS_PYTHON")
    python = Path(configured) if configured else ROOT / ".venv-verifiers" / "bin" / "python"
    if not python.is_file():
        pytest.skip("no Python with verifiers found (run `make verifiers-env`, or set SIMPOP_VERIFIERS_PYTHON)")
    return str(python)


def run_in(python: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """``python ARGS`` with these sources first on the path."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run([python, *args], capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT)


def doc_example(marker: str, language: str = "python") -> str:
    """The one ``language`` block of ``docs/integrations.md`` that contains ``marker`` (tests run the copy-paste
    examples as written)."""
    import re

    page = (ROOT / "docs" / "integrations.md").read_text()
    blocks = [m["body"] for m in re.finditer(rf"^```{language}\n(?P<body>.*?)^```", page, re.S | re.M)
              if marker in m["body"]]
    assert len(blocks) == 1, f"{len(blocks)} {language} blocks of docs/integrations.md contain {marker!r}"
    return blocks[0]
