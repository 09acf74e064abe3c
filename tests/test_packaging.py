"""What a user installs: the sdist and the wheel (built offline, as ``python -m build --no-isolation`` does: the sdist
from the tree, the wheel from the sdist), installed without the network.

The wheel goes into a fresh virtualenv whose dependencies come from this environment's site-packages (a ``.pth``
line; never the source tree), and ``simpop eval`` runs there on a shipped panel. Whether installing it would
replace a torch already there is asked of uv's resolver offline (``--dry-run``, from uv's cache, which ``make
setup`` fills), in an environment holding only a torch's metadata.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
#: Every file the packages ship: modules, panels, data, the study's page, the verifiers plugin package.
SHIPPED = sorted(
    path.relative_to(ROOT / "src").as_posix()
    for package in ("simpop", "simpop_verifiers")
    for path in (ROOT / "src" / package).rglob("*")
    if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
)

BUILD = "import sys; from setuptools import build_meta; print(getattr(build_meta, sys.argv[1])(sys.argv[2]))"


def _build(source: Path, hook: str, out: Path) -> Path:
    done = subprocess.run([sys.executable, "-c", BUILD, hook, str(out)], cwd=source, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return out / done.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> tuple[Path, Path]:
    """The sdist and the wheel built from it."""
    out = tmp_path_factory.mktemp("dist")
    sdist = _build(ROOT, "build_sdist", out)
    unpacked = tmp_path_factory.mktemp("sdist")
    with tarfile.open(sdist) as archive:
        archive.extractall(unpacked, filter="data")
    return sdist, _build(unpacked / sdist.name.removesuffix(".tar.gz"), "build_wheel", out)


def test_the_sdist_and_the_wheel_carry_the_license_and_every_shipped_file(dist):
    sdist, wheel = dist
    with tarfile.open(sdist) as archive:
        top = sdist.name.removesuffix(".tar.gz")
        names = {name.removeprefix(top + "/") for name in archive.getnames()}
    assert {"LICENSE", "CHANGELOG.md", "README.md", "pyproject.toml"} <= names
    assert not set(SHIPPED) - {name.removeprefix("src/") for name in names}
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        info = wheel.name.split("-")[0] + "-" + wheel.name.split("-")[1] + ".dist-info"
        license_text = archive.read(f"{info}/licenses/LICENSE").decode()
        metadata = Parser().parsestr(archive.read(f"{info}/METADATA").decode())
    assert not set(SHIPPED) - names, sorted(set(SHIPPED) - names)[:10]
    assert {"simpop/evaluation/panels/p4g-act-v1.yaml", "simpop_verifiers/__init__.py"} <= names
    assert license_text == (ROOT / "LICENSE").read_text() and "Copyright 2026 simpop developers" in license_text
    assert metadata["License-Expression"] == "Apache-2.0" and metadata["License-File"] == "LICENSE"


def test_the_wheel_installs_into_a_clean_environment_and_evaluates_a_shipped_panel(dist, tmp_path):
    _, wheel = dist
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    # Dependencies from this environment (its .pth files, among them the editable source tree, are not read there).
    (Path(site) / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                           "--no-index", str(wheel)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    where = subprocess.run([python, "-c", "import importlib.util as u, simpop; "
                            "print(simpop.__file__); print(u.find_spec('simpop_verifiers').origin)"],
                           capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert where.returncode == 0, where.stderr[-2000:]
    assert all(Path(line).is_relative_to(venv) for line in where.stdout.split()), where.stdout  # the wheel's, not src
    out = tmp_path / "eval"
    done = subprocess.run([venv / "bin" / "simpop", "eval", "--env", "simpop/PersuasionAct-v0", "--policy", "reference",
                           "--panel", "p4g-act-v1", "--episodes", "2", "--out", str(out)],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert "heldout-0-T0.8" in json.dumps(summary) and (out / "episodes.jsonl").read_text().count("\n") == 6


def _declared_torch() -> str:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    torch = next(Requirement(r) for r in project["dependencies"] if Requirement(r).name == "torch")
    return next(s.version for s in torch.specifier if s.operator == ">=")


@pytest.mark.parametrize("torch", ["2.11.0", _declared_torch()])  # a GPU image's build; the lowest declared
def test_installing_it_keeps_the_torch_already_there(dist, tmp_path, torch):
    _, wheel = dist
    uv = Path(sys.executable).with_name("uv")  # `make setup` installs it
    venv = tmp_path / "venv"
    subprocess.run([uv, "venv", "-q", "--python", sys.executable, str(venv)], check=True, timeout=120)
    site = subprocess.run([venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    info = Path(site) / f"torch-{torch}.dist-info"  # the user's build, as resolvers see it: its metadata
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch\nVersion: {torch}\n")
    (info / "INSTALLER").write_text("pip\n")
    (info / "RECORD").write_text("")
    done = subprocess.run([uv, "pip", "install", "--dry-run", "--offline", "--python", str(venv / "bin" / "python"),
                           f"simpop[llm] @ {wheel.as_uri()}"], capture_output=True, text=True, timeout=300)
    output = done.stdout + done.stderr
    plan = [line.split()[1] for line in output.splitlines() if line.startswith((" + ", " - "))]
    assert done.returncode == 0 and any(p.startswith("transformers==") for p in plan), output[-3000:]
    assert not [p for p in plan if p.split("==")[0] == "torch"], plan
