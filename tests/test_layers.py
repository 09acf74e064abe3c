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
