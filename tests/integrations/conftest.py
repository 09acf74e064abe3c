from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _python(package: str) -> str:
    """A Python with ``package`` (``$SIMPOP_<PACKAGE>_PYTHON`` or the project's ``.venv-<package>``); skips only
    where none is found (``make <package>-env`` builds it; ``make test`` does it first)."""
    variable = f"SIMPOP_{package.upper()}_PYTHON"
    configured = os.environ.get(variable)
    python = Path(configured) if configured else ROOT / f".venv-{package}" / "bin" / "python"
    if not python.is_file():
        pytest.skip(f"no Python with {package} found (run `make {package}-env`, or set {variable})")
    return str(python)


@pytest.fixture(scope="session")
def verifiers_python() -> str:
    """A Python with verifiers (:func:`_python`)."""
    return _python("verifiers")


@pytest.fixture(scope="session")
def rllib_python() -> str:
    """A Python with ray[rllib] (:func:`_python`)."""
    return _python("rllib")


def run_in(python: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """``python ARGS`` with these sources first on the path."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run([python, *args], capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT)


def doc_example(marker: str, language: str = "python") -> str:
    """The one ``language`` block of the integration pages (``docs/integrations/*.md``) that contains ``marker``
    (tests run the copy-paste examples as written)."""
    import re

    blocks = [m["body"] for page in sorted((ROOT / "docs" / "integrations").glob("*.md"))
              for m in re.finditer(rf"^```{language}\n(?P<body>.*?)^```", page.read_text(), re.S | re.M)
              if marker in m["body"]]
    assert len(blocks) == 1, f"{len(blocks)} {language} blocks of docs/integrations/*.md contain {marker!r}"
    return blocks[0]
