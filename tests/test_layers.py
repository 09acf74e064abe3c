"""The import layers of docs/architecture.md, enforced with import-linter contracts (pyproject.toml)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from importlinter.cli import lint_imports

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


@pytest.fixture(autouse=True)
def _keep_loggers_enabled():
    """import-linter configures logging with ``disable_existing_loggers``: undo that for the tests that follow."""
    yield
    for logger in [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]:
        if isinstance(logger, logging.Logger):
            logger.disabled = False


def test_import_contracts_are_kept():
    assert lint_imports(config_filename=str(PYPROJECT)) == 0


def test_a_forbidden_import_breaks_a_contract(tmp_path):
    # The checker must be able to fail: forbid an import the code really makes (training uses the rollout engine).
    config = tmp_path / "broken.toml"
    config.write_text('[tool.importlinter]\nroot_package = "simpop"\n\n[[tool.importlinter.contracts]]\n'
                      'name = "train must not use the rollout engine"\ntype = "forbidden"\n'
                      'source_modules = ["simpop.train"]\nforbidden_modules = ["simpop.rollout"]\n')
    assert lint_imports(config_filename=str(config)) == 1


def test_importing_simpop_loads_no_heavy_backend():
    import subprocess
    import sys

    code = ("import sys, simpop, simpop.seat, simpop.simulators.registry; "
            "print(','.join(m for m in ('torch', 'transformers', 'tau2', 'litellm') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == ""


def test_a_circle_through_a_deferred_import_breaks_the_acyclic_contract(tmp_path, monkeypatch):
    # The same contract as pyproject.toml's, on a package whose two modules import each other, one of them only
    # inside a function (the way the Persuasion knot was held open).
    package = tmp_path / "knot"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "env.py").write_text("from knot.sims import native\n")
    (package / "sims.py").write_text("def native():\n    from knot.env import native\n    return native\n")
    config = tmp_path / "acyclic.toml"
    config.write_text('[tool.importlinter]\nroot_package = "knot"\n\n[[tool.importlinter.contracts]]\n'
                      'name = "no circles"\ntype = "acyclic_siblings"\nancestors = ["knot"]\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    assert lint_imports(config_filename=str(config), no_cache=True) == 1
    (package / "sims.py").write_text("def native():\n    return None\n")
    assert lint_imports(config_filename=str(config), no_cache=True) == 0
