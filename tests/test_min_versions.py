"""The lowest versions pyproject.toml declares, installed and tested.

``constraints-min.txt`` pins every lower bound of simpop's dependencies and of the extras ``make min-env`` installs
(``MIN_EXTRAS`` in the Makefile); ``make min-env`` builds ``.venv-min`` from exactly those, with torch 2.13.0 (the
one torch on this machine's disk). There every module whose dependencies are installed must import and
:data:`SUITE`, a representative part of the suite, must pass, on these sources. ``make test-min`` builds the
environment and runs this file and ``tests/min_env/`` (measured on 2 busy cores: 17 s to build, 2 min to run).
``make test`` runs only this file's check that the pins follow pyproject.toml: the environment's own tests
(``tests/min_env/``) add about 2 minutes, so CI leaves them to ``make test-min`` (``tests/conftest.py``).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
MIN_VENV = ROOT / ".venv-min"

#: The part of the suite run at the lowest versions: the transformers backend, its KV cache, log-probs, LoRA, export
#: and the JSON-schema mask (on ``tiny_model``; the embedded model converted by these versions), TRL's GRPO through
#: the adapter, act-level GRPO and Stable-Baselines3, the PettingZoo views, diversity with the bundled embedder,
#: reports and plots, ``simpop eval``, ``simpop serve`` and the study.
SUITE = [
    "tests/agents/test_transformers_backend.py",
    "tests/agents/test_kv_buffer.py",
    "tests/agents/test_cpu_attention.py",
    "tests/agents/test_token_logprobs.py",
    "tests/agents/test_lora.py",
    "tests/agents/test_export.py",
    "tests/agents/test_structured_output.py::test_the_mask_allows_the_schema_then_only_end_of_turn",
    "tests/train/test_trl_adapter.py",
    "tests/train/test_grpo_act.py",
    "tests/train/test_ppo.py::test_stable_baselines3_ppo_on_a_population_view",
    "tests/envs/test_aec.py::test_aec_view_passes_pettingzoo_api_test[simpop/PersuasionAct-v0]",
    "tests/envs/test_aec.py::test_aec_view_passes_pettingzoo_api_test[simpop/Persuasion-v1]",
    "tests/envs/test_aec.py::test_one_aec_cycle_is_one_dialogue_turn",
    "tests/evaluation/test_diversity.py",
    "tests/experiments/test_collapse_report.py",
    "tests/evaluation/test_eval_cli.py",
    "tests/agents/test_serve.py",
    "tests/test_validation.py",
    "tests/study/test_study.py",
    "--deselect", "tests/study/test_study.py::test_a_tau2_customer_is_scored_by_tau2s_evaluator",  # needs tau2
]

#: Import names of packages only the extras left out of .venv-min provide (tau2, openenv, torchrl, verifiers, verl,
#: ray/rllib).
OTHER_EXTRAS = {"tau2", "loguru", "litellm", "openenv", "torchrl", "tensordict", "verifiers", "verl", "ray"}

IMPORT_ALL = """
import importlib, importlib.util, json, pkgutil
import simpop

def absent(error):  # the top-level package whose absence caused ``error``, if any
    while error is not None:
        if isinstance(error, ModuleNotFoundError) and error.name:
            top = error.name.split(".")[0]
            if importlib.util.find_spec(top) is None:
                return top
        error = error.__cause__ or error.__context__
    return None

imported, missing, failed = [], {}, {}
for info in pkgutil.walk_packages(simpop.__path__, "simpop.", onerror=lambda name: None):
    try:
        importlib.import_module(info.name)
        imported.append(info.name)
    except Exception as error:
        top = absent(error)
        if top:
            missing.setdefault(top, []).append(info.name)
        else:
            failed[info.name] = repr(error)[:500]
print("RESULT " + json.dumps({"imported": imported, "missing": missing, "failed": failed}))
"""


def _pins(path: Path) -> dict[str, Version]:
    pins = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            pins[canonicalize_name(name)] = Version(version)
    return pins


def _min_extras() -> list[str]:
    line = re.search(r"^MIN_EXTRAS\s*:=(.*)$", (ROOT / "Makefile").read_text(), re.M)
    assert line is not None, "the Makefile names the extras .venv-min installs in MIN_EXTRAS"
    return re.findall(r"--extra (\S+)", line.group(1))


def _declared(extras: list[str]) -> dict[str, Version]:
    """Each requirement's lower bound (``>=`` or ``==``) in simpop's dependencies and ``extras``."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = [Requirement(r) for r in project["dependencies"]]
    pending, seen = list(extras), set()
    while pending:
        extra = pending.pop()
        if extra not in seen:
            seen.add(extra)
            for requirement in map(Requirement, project["optional-dependencies"][extra]):
                if canonicalize_name(requirement.name) == "simpop":
                    pending += sorted(requirement.extras)
                else:
                    requirements.append(requirement)
    bounds: dict[str, Version] = {}
    for requirement in requirements:
        lower = [Version(s.version) for s in requirement.specifier if s.operator in (">=", "==")]
        assert lower, f"{requirement} declares no lower bound: nothing says which oldest version works"
        name = canonicalize_name(requirement.name)
        bounds[name] = max([*lower, bounds.get(name, lower[0])])
    return bounds


def test_constraints_min_pins_each_declared_lower_bound():
    declared = _declared(_min_extras())
    pins = _pins(ROOT / "constraints-min.txt")
    torch = pins.pop("torch")
    assert torch >= declared.pop("torch")  # the torch on this disk, not the declared floor (see constraints-min.txt)
    assert torch == _pins(ROOT / "constraints.txt")["torch"]
    assert pins == declared
