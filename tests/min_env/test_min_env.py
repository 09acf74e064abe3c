"""The lowest-versions environment (``.venv-min``) holds the minima, imports every module and passes :data:`SUITE`
(:mod:`tests.test_min_versions`). Collected only by ``make test-min`` (``SIMPOP_TEST_MIN=1``, ``tests/conftest.py``).
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.test_min_versions import IMPORT_ALL, MIN_VENV, OTHER_EXTRAS, ROOT, SUITE, _pins


@pytest.fixture(scope="module")
def min_python() -> str:
    """.venv-min's Python (``make min-env`` builds it; ``make test-min`` builds it and runs these tests)."""
    assert (MIN_VENV / ".min-installed").is_file(), "no lowest-versions environment: run `make test-min`"
    return str(MIN_VENV / "bin" / "python")


def _run(python: str, *args: str, timeout: float) -> subprocess.CompletedProcess:
    """``python ARGS`` on these sources, offline, with .venv-min's own model cache (converted by its versions)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "SIMPOP_CACHE_DIR": str(MIN_VENV / "simpop-cache"),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # .venv-min is installed without bytecode: compile once, keep it
    return subprocess.run([python, *args], capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT)


def test_the_environment_holds_the_lowest_versions(min_python):
    done = _run(min_python, "-c", "import importlib.metadata as m, json; "
                "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))", timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    installed = {canonicalize_name(name): Version(version) for name, version in json.loads(done.stdout).items()}
    wrong = {name: str(installed.get(name)) for name, pin in _pins(ROOT / "constraints-min.txt").items()
             if installed.get(name) is None or installed[name].public != pin.public}
    assert not wrong, f"{wrong}: .venv-min is out of date (`make min-env` rebuilds it)"


def test_every_module_whose_dependencies_are_installed_imports(min_python):
    done = _run(min_python, "-c", IMPORT_ALL, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    result = json.loads(lines[-1][len("RESULT "):])
    assert not result["failed"], result["failed"]
    assert set(result["missing"]) <= OTHER_EXTRAS, result["missing"]
    assert "simpop.agents.transformers_backend" in result["imported"] and len(result["imported"]) > 100


def test_the_suite_passes_at_the_lowest_versions(min_python):
    done = _run(min_python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", *SUITE, timeout=840)
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    assert done.returncode == 0 and " passed" in summary and "skipped" not in summary, done.stdout[-6000:]
