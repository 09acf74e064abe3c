"""Loading CooperBench's dataset layout (the real one, or the packaged mini set) into scenarios
(:mod:`~simpop.envs.cooperbench.scenario`).

Layout (upstream's ``dataset/`` folder)::

    <repo>_task/task<id>/
        setup.sh                  clones the repository and checks out BASE_COMMIT
        run_tests.sh              run_tests.sh <repo_path> <tests.patch> [feature.patch]
        combined.patch            every feature of the task at once (optional)
        feature<k>/feature.md     the feature request an agent receives
        feature<k>/feature.patch  the gold implementation
        feature<k>/tests.patch    the hidden tests for feature k
        repo/                     (mini set only) the repository at its base, as plain files
    subsets/<name>.json           {"tasks": [{"repo": "<repo>_task", "task_id": N, "pairs": [[a, b], ...]}]}

Repository checkouts at their base commits are looked up, in order, at ``<task>/repo/``,
``<repos>/<repo>_task/task<id>/`` and ``<repos>/<REPO_NAME>/`` (where ``setup.sh`` clones it).

Tests: the evaluator runs the task's own ``run_tests.sh`` (``runner.sh`` if there is none) with
bash inside the sandbox, as upstream does in its containers: ``if``/``else`` branches, line
continuations, ``timeout``, test files computed at run time all work. A script that uses
upstream's Docker paths (``/workspace/repo``, ``/patches/``) gets this run's folders in their
place (see :class:`~simpop.envs.cooperbench.scenario.TestCommand`). The sandbox has no network,
so ``pip``/``uv`` installs are skipped (shims that say so) and the checkout's dependencies must
already be importable by the evaluator's interpreter, which is ``python`` on the script's
``PATH``. Tasks whose script never mentions pytest are not runnable.
"""

from __future__ import annotations

import itertools
import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from simpop.envs.cooperbench.scenario import Feature, FeaturePair, Task, TestCommand

#: The mini task set shipped with simpop (upstream layout, plus a ``repo/`` folder per task).
MINI_DIR = Path(__file__).resolve().parent / "mini"

_TASK_DIR_RE = re.compile(r"^task(\d+)$")
_FEATURE_DIR_RE = re.compile(r"^feature(\d+)$")
_ASSIGN_RE = re.compile(r"^\s*(export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
_PYTEST_RE = re.compile(r"\bpytest\b")
_VAR_RE = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")


@dataclass
class Dataset:
    """Every task of a dataset folder, plus its named subsets of feature pairs."""

    root: Path
    tasks: dict[str, Task]
    subsets: dict[str, list[tuple[str, int, int]]]

    def pairs(self, subset: str | None = None) -> list[FeaturePair]:
        """All feature pairs of every task (sorted), or the pairs of a named subset."""
        if subset is None:
            keys = [(key, a, b) for key, task in sorted(self.tasks.items())
                    for a, b in itertools.combinations(sorted(task.features), 2)]
        elif subset in self.subsets:
            keys = self.subsets[subset]
        else:
            raise KeyError(f"unknown subset {subset!r}; {self.root / 'subsets'} has: {sorted(self.subsets) or 'none'}")
        pairs = []
        for key, a, b in keys:
            if key not in self.tasks:
                raise KeyError(f"subset {subset!r} names task {key}, which is not in {self.root}")
            task = self.tasks[key]
            lo, hi = sorted((a, b))
            missing = [f for f in (lo, hi) if f not in task.features]
            if missing or lo == hi:
                raise KeyError(f"subset {subset!r}: pair {[a, b]} of {key} is not two distinct features of the task")
            pairs.append(FeaturePair(f"{key}/f{lo}-f{hi}", task, task.features[lo], task.features[hi]))
        return pairs


def load_dataset(root: str | Path, repos: str | Path | None = None) -> Dataset:
    """Read a CooperBench dataset folder.

    Args:
        root: The ``dataset/`` folder (``"mini"`` for the packaged mini set).
        repos: Where repository checkouts live (see the module docstring); not needed when
            every task has a ``repo/`` folder.
    """
    root = MINI_DIR if str(root) == "mini" else Path(root).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"CooperBench dataset folder {root} does not exist; pass the path of the "
                                "benchmark's dataset/ folder (or 'mini' for the packaged mini set)")
    repos_dir = Path(repos).expanduser() if repos is not None else None
    tasks: dict[str, Task] = {}
    for repo_dir in sorted(p for p in root.iterdir() if p.is_dir() and p.name.endswith("_task")):
        for task_dir in sorted(p for p in repo_dir.iterdir() if p.is_dir() and _TASK_DIR_RE.match(p.name)):
            task = _load_task(repo_dir.name[: -len("_task")], task_dir, repos_dir)
            if task.features:
                tasks[task.key] = task
    if not tasks:
        raise FileNotFoundError(f"no tasks found in {root}: expected folders like <repo>_task/task<id>/feature<k>/")
    return Dataset(root, tasks, _load_subsets(root))


def _load_task(repo: str, task_dir: Path, repos_dir: Path | None) -> Task:
    task_id = int(_TASK_DIR_RE.match(task_dir.name).group(1))  # type: ignore[union-attr]  # matched when listed
    features = {}
    for feature_dir in task_dir.iterdir():
        match = _FEATURE_DIR_RE.match(feature_dir.name)
        if not (match and feature_dir.is_dir() and (feature_dir / "tests.patch").is_file()):
            continue
        fid = int(match.group(1))
        features[fid] = Feature(fid, _read(feature_dir / "feature.md") or "",
                                _read(feature_dir / "feature.patch") or "",
                                _read(feature_dir / "tests.patch") or "")
    setup = _shell_assignments(_read(task_dir / "setup.sh") or "")
    script_name = "run_tests.sh" if (task_dir / "run_tests.sh").is_file() else "runner.sh"
    script = _read(task_dir / script_name)
    return Task(repo=repo, task_id=task_id, path=task_dir, features=dict(sorted(features.items())),
                combined_patch=_read(task_dir / "combined.patch"),
                tests=parse_test_script(script, script_name) if script else None,
                checkout=_find_checkout(repo, task_id, task_dir, repos_dir, setup.get("REPO_NAME")),
                base_commit=setup.get("BASE_COMMIT"))


def _find_checkout(repo: str, task_id: int, task_dir: Path, repos_dir: Path | None,
                   repo_name: str | None) -> Path | None:
    candidates = [task_dir / "repo"]
    if repos_dir is not None:
        candidates.append(repos_dir / f"{repo}_task" / f"task{task_id}")
        if repo_name:
            candidates.append(repos_dir / repo_name)
    return next((c for c in candidates if c.is_dir()), None)


def parse_test_script(script: str, name: str = "run_tests.sh") -> TestCommand | None:
    """A task's test script as a :class:`TestCommand` (None if it never runs pytest).

    Scripts that use upstream's Docker paths (``/workspace/repo`` or ``/patches/``) take the
    ``docker`` calling convention, others the ``args`` one (see :class:`TestCommand`).
    """
    if not _PYTEST_RE.search(script):
        return None
    style = "docker" if re.search(r"/workspace/repo|/patches/", script) else "args"
    return TestCommand(script, name, style)


def _shell_assignments(script: str) -> dict[str, str]:
    """``NAME=value`` assignments whose value is a constant (expanded in order)."""
    variables: dict[str, str] = {}
    for raw in script.splitlines():
        match = _ASSIGN_RE.match(raw.split(" #")[0])
        if match:
            value = _expand(_unquote(match.group(3).strip()), variables)
            if value is not None:
                variables[match.group(2)] = value
    return variables


def _expand(text: str, variables: dict[str, str]) -> str | None:
    """Substitute known variables; None if an unknown one (or a command substitution) remains."""
    if "$(" in text or "`" in text:
        return None
    missing = False

    def sub(match: re.Match) -> str:
        nonlocal missing
        name = match.group(1) or match.group(2)
        if name not in variables:
            missing = True
            return ""
        return variables[name]

    expanded = _VAR_RE.sub(sub, text)
    return None if missing or "$" in expanded else expanded


def _unquote(value: str) -> str:
    try:
        parts = shlex.split(value)
    except ValueError:
        return value
    return parts[0] if len(parts) == 1 else value


def _load_subsets(root: Path) -> dict[str, list[tuple[str, int, int]]]:
    subsets = {}
    for path in sorted((root / "subsets").glob("*.json")):
        try:
            data = json.loads(path.read_text())
            entries = []
            for entry in data["tasks"]:
                repo = str(entry["repo"]).removesuffix("_task")
                entries += [(f"{repo}/task{int(entry['task_id'])}", int(a), int(b)) for a, b in entry["pairs"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{path}: expected {{'tasks': [{{'repo', 'task_id', 'pairs'}}]}} ({exc})") from exc
        subsets[path.stem] = entries
    return subsets


def _read(path: Path) -> str | None:
    return path.read_text(encoding="utf-8", errors="replace") if path.is_file() else None
