"""CooperBench's merge-and-test evaluation, on plain git in a temporary directory.

Semantics follow upstream CooperBench (``cooperbench.eval.sandbox.test_merged``):

1. Test files are stripped from each agent's patch (upstream's path rule), and so is test
   infrastructure (``conftest.py``, pytest/tox config, ``sitecustomize``, ``.pth``, plugin metadata,
   modules shadowing pytest; ``pyproject.toml``/``setup.cfg`` only when their pytest section
   changes), see :func:`simpop.envs.cooperbench.patches.strip_test_files`; a patch that could write
   outside the repository or names paths the filesystem cannot hold is *rejected* (see
   :func:`~simpop.envs.cooperbench.patches.unsafe_paths`).
2. Each patch is applied on its own branch from the base commit (``git apply``, falling back to
   ``git apply --3way``); apply status per agent: ``applied``, ``skipped`` (empty), ``failed`` or
   ``rejected``. A patch that fails leaves its branch at the base.
3. The branches are merged (``agent1`` into ``agent2``, ``git merge --no-ff``). Merge status:
   ``clean``, ``conflicts``, ``missing_input`` (a patch failed or was rejected) or ``identical``
   (both patches are the same: nothing to merge).
4. For each feature, the task's own test script (``run_tests.sh``/``runner.sh``, see
   :mod:`~simpop.envs.cooperbench.dataset`) runs in the sandbox (see
   :mod:`~simpop.envs.cooperbench.sandbox`) on a fresh clone at the base, given the merged patch and
   that feature's ``tests.patch``; it applies them itself, as upstream. Every pytest process it
   starts loads :mod:`~simpop.envs.cooperbench.pytest_guard`. A feature passes if the script exits
   0 and the guard recorded at least one passing test, no failed or erroring test, every session
   finished with status 0, and no tampering; the counts come from the guard, not from the output
   (which the tested code can forge). Success = both pass. The evaluator's own failures are no verdict:
   an interpreter that is missing or cannot run pytest in the sandbox (checked once per interpreter), or a
   test script that could not run a command (exit 126/127 before any pytest session), raise
   :class:`EvaluatorError` instead of scoring the agents 0.

**Conflict rule** (``conflict_rule``), for merges that are not clean:

- ``"lead"`` (default; upstream today): there is no merged tree. If agent1's patch applied, it is
  tested alone against feature 1's tests and, if those pass, feature 2's: agent1 is the team's
  integrator, so a pair still succeeds when agent1 implemented both features. Otherwise both
  features fail.
- ``"union"`` (upstream when the paper was written): conflicting text is resolved by a union
  merge (``* merge=union``, both sides' lines kept) and the result is tested like a clean merge;
  a patch that failed to apply simply contributes nothing. Union merges often produce broken
  code, so conflicting pairs can pass or fail by luck.
"""

from __future__ import annotations

import atexit
import dataclasses
import itertools
import json
import os
import posixpath
import shutil
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import cachetools

from simpop.envs.cooperbench import sandbox
from simpop.envs.cooperbench.patches import (PYTEST_CONFIG_FILES, path_problem, pytest_config, strip_test_files,
                                             touched_paths, unsafe_paths)
from simpop.envs.cooperbench.scenario import Task
from simpop.files import atomic_folder

CONFLICT_RULES = ("lead", "union")
#: The module name of :mod:`simpop.envs.cooperbench.pytest_guard` inside a test run.
GUARD_MODULE = "simpop_pytest_guard"
_SHIMS = {
    "pip": 'case "$1" in install|uninstall|download|wheel) echo "simpop sandbox: offline, skipped: pip $*" >&2; exit 0;; '
           'esac\nexec python -m pip "$@"\n',
    "uv": 'case "$1" in\n  pip|sync|venv|lock|add|remove|tool|python|cache) echo "simpop sandbox: offline, skipped: uv $*" >&2; '
          'exit 0;;\n  run) shift; while [ "${1#-}" != "$1" ]; do [ "$1" = "--" ] && { shift; break; }; shift; done; '
          'exec "$@";;\n  *) echo "simpop sandbox: uv $1 is not available" >&2; exit 1;;\nesac\n',
}
#: Limits for git itself (it only ever sees validated patches).
GIT_LIMITS = sandbox.Limits(timeout_s=120.0, max_output_bytes=4 * 2**20)
_EPOCH = "2000-01-01T00:00:00+0000"


class EvaluatorError(RuntimeError):
    """The evaluator's own environment failed (no interpreter, no pytest, a command the test script needs
    is missing): not the agents' work, so there is no verdict and no reward, rather than a 0."""


#: Exit codes of a shell that could not run a command (126: not executable, 127: not found).
_SHELL_CANNOT_RUN = (126, 127)


@dataclass
class FeatureResult:
    """One feature's test run.

    Attributes:
        feature_id: The feature whose tests ran.
        passed: Exit code 0 and at least one test passed.
        exit_code: The test command's exit code (None if it did not run or was killed).
        tests_passed: Passed tests, as the pytest guard recorded them (not pytest's own report).
        tests_failed: Failed tests plus errors, as the guard recorded them.
        timed_out: Killed at the time limit.
        output_limited: Killed for writing too much output.
        disk_full: The run exhausted its disk quota (``Limits.max_disk_bytes``); such a run fails.
        error: Why the tests did not run or what went wrong around them (None if nothing did).
        output_tail: The end of the test output.
    """

    feature_id: int
    passed: bool = False
    exit_code: int | None = None
    tests_passed: int = 0
    tests_failed: int = 0
    timed_out: bool = False
    output_limited: bool = False
    disk_full: bool = False
    error: str | None = None
    output_tail: str = ""

    def summary(self) -> str:
        """One line: verdict, counts, and what went wrong."""
        verdict = "PASSED" if self.passed else "FAILED"
        text = f"feature {self.feature_id}: {verdict} ({self.tests_passed} passed, {self.tests_failed} failed"
        if self.timed_out:
            text += ", killed at the time limit"
        if self.output_limited:
            text += ", killed: output limit"
        if self.disk_full:
            text += ", disk quota exhausted"
        text += ")"
        return text + (f" - {self.error}" if self.error else "")


@dataclass
class MergeResult:
    """The branch/merge stage.

    Attributes:
        apply_status: Per agent: ``applied``, ``skipped``, ``failed`` or ``rejected``.
        rejected: Per agent, why its patch was rejected (unsafe paths).
        status: ``clean``, ``conflicts``, ``missing_input`` or ``identical``.
        strategy: ``naive``, ``union``, ``skip-merge-identical`` (``solo-agent1`` is set later).
        merged_patch: The merged diff against the base ("" if there is no merged tree).
    """

    apply_status: dict[str, str]
    rejected: dict[str, list[str]]
    status: str
    strategy: str
    merged_patch: str


@dataclass
class PairResult:
    """The evaluation of one feature pair (what the env puts in ``info["cooperbench"]``)."""

    features: tuple[int, int]
    merge: MergeResult
    feature1: FeatureResult
    feature2: FeatureResult
    duration_s: float = 0.0
    conflict_rule: str = "lead"

    @property
    def both_passed(self) -> bool:
        return self.feature1.passed and self.feature2.passed

    def to_dict(self, diff_chars: int = 5000) -> dict[str, Any]:
        """The result as JSON-ready data for ``info["cooperbench"]`` (the merged patch cut to ``diff_chars``)."""
        merge = asdict(self.merge)
        merge["merged_patch"] = merge["merged_patch"][:diff_chars]
        return {"features": list(self.features), "both_passed": self.both_passed, "conflict_rule": self.conflict_rule,
                "apply_status": merge.pop("apply_status"), "rejected": merge.pop("rejected"), "merge": merge,
                "feature1": asdict(self.feature1), "feature2": asdict(self.feature2),
                "duration_s": round(self.duration_s, 3)}


class Evaluator:
    """Runs CooperBench's evaluation for tasks whose checkouts are on this machine.

    Args:
        limits: Limits for every test run (time, memory, output, processes, network).
        conflict_rule: ``"lead"`` or ``"union"`` (see the module docstring).
        python: The interpreter that runs the tests (default: this one); the task's
            dependencies must be importable by it.
        tail_chars: How much of each test output to keep.
        reuse_verdicts: Answer a feature's test run that this process has already made (the same base, feature,
            patch, interpreter, limits and containment) from :data:`VERDICTS` instead of running it again. A test
            run is what an evaluation costs, and a GRPO group repeats patches (the empty one above all); turn it
            off for tasks whose tests are not deterministic.
    """

    def __init__(self, limits: sandbox.Limits | None = None, conflict_rule: str = "lead",
                 python: str | None = None, tail_chars: int = 2000, reuse_verdicts: bool = True):
        if conflict_rule not in CONFLICT_RULES:
            raise ValueError(f"conflict_rule must be one of {CONFLICT_RULES}, got {conflict_rule!r}")
        self.limits = limits or sandbox.Limits()
        self.conflict_rule = conflict_rule
        self.python = python or sys.executable
        self.tail_chars = tail_chars
        self.reuse_verdicts = reuse_verdicts
        self._checked: set[str] = set()  # interpreters shown to run pytest inside the sandbox

    # ----------------------------------------------------------------- public API
    def evaluate(self, task: Task, feature1: int, feature2: int, patch1: str, patch2: str) -> PairResult:
        """Merge two agents' patches and run both features' tests (the full CooperBench verdict)."""
        start = time.monotonic()
        with _Workspace(task) as ws:
            merge = self._merge(ws, patch1, patch2)
            if merge.status in ("clean", "identical") or (self.conflict_rule == "union" and merge.merged_patch):
                # The two features' runs are independent: run them side by side.
                with ThreadPoolExecutor(max_workers=2) as pool:
                    runs = [pool.submit(self._run_feature, ws, task, f, merge.merged_patch)
                            for f in (feature1, feature2)]
                    r1, r2 = (run.result() for run in runs)
            else:
                r1, r2 = self._lead_fallback(ws, task, feature1, feature2, merge, patch1)
        return PairResult((feature1, feature2), merge, r1, r2, time.monotonic() - start, self.conflict_rule)

    def test_feature(self, task: Task, feature_id: int, patch: str) -> FeatureResult:
        """Apply one patch (test files stripped) and run one feature's tests on it."""
        with _Workspace(task) as ws:
            clean = self._strip(ws, patch)
            problems = unsafe_paths(clean, ws.source)
            if problems:
                return FeatureResult(feature_id, error="patch rejected: " + "; ".join(problems))
            return self._run_feature(ws, task, feature_id, clean)

    def merge(self, task: Task, patch1: str, patch2: str) -> MergeResult:
        """Only the branch/merge stage (used to tell which gold pairs conflict)."""
        with _Workspace(task) as ws:
            return self._merge(ws, patch1, patch2)

    def diff(self, task: Task, changes: dict[str, str | None]) -> str:
        """The patch that turns the base into the base with ``changes`` (path -> new text, None = deleted)."""
        with _Workspace(task) as ws:
            repo = ws.clone("diff")
            for path, content in sorted(changes.items()):
                problem = path_problem(path)
                target = repo / path
                if problem or not target.resolve().is_relative_to(repo.resolve()):
                    raise ValueError(f"cannot write {path!r}: {problem or 'leads outside the repository'}")
                if content is None:
                    if target.is_file() or target.is_symlink():
                        target.unlink()
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(content, encoding="utf-8")
            ws.git(repo, "add", "-A")
            return ws.diff(repo, "--cached")

    def base_files(self, task: Task) -> list[str]:
        """Every file of the task's base commit, sorted (untracked files of a checkout are not included)."""
        source, sha = _base_repo(task)
        listing = sandbox.run(["git", "ls-tree", "-r", "-z", "--name-only", sha], source, GIT_LIMITS, _git_env(source))
        if not listing.ok:
            raise RuntimeError(f"cannot list the base of {task.key}: {listing.tail(300)}")
        return sorted(name for name in listing.output.split("\0") if name)

    def read_base(self, task: Task, path: str) -> str | None:
        """A file's text at the base commit (None if it is not a file there)."""
        source, sha = _base_repo(task)
        shown = sandbox.run(["git", "cat-file", "blob", f"{sha}:{path}"], source, GIT_LIMITS, _git_env(source))
        return shown.output if shown.ok else None

    # ----------------------------------------------------------------- stages
    def _strip(self, ws: _Workspace, patch: str) -> str:
        """Test files and test infrastructure out of ``patch``, including ``pyproject.toml``/``setup.cfg``
        changes whose pytest section differs from the base's (found by applying the patch to a clone)."""
        clean = strip_test_files(_with_newline(patch))
        configs = [p for p in touched_paths(clean) if posixpath.basename(p) in PYTEST_CONFIG_FILES]
        if not configs or unsafe_paths(clean, ws.source):
            return clean
        repo = ws.clone("config")
        if not ws.apply(repo, clean, first_try=()):
            return clean  # it will fail to apply when graded, too
        changed = set()
        for path in configs:
            shown = ws.git(repo, "cat-file", "blob", f"{ws.base_sha}:{path}")
            target = repo / path
            new = target.read_text(encoding="utf-8", errors="replace") if target.is_file() else None
            if pytest_config(path, shown.output if shown.ok else None) != pytest_config(path, new):
                changed.add(path)
        return strip_test_files(clean, also=changed) if changed else clean

    def _merge(self, ws: _Workspace, patch1: str, patch2: str) -> MergeResult:
        patches = {"agent1": self._strip(ws, patch1), "agent2": self._strip(ws, patch2)}
        rejected = {seat: problems for seat, p in patches.items() if (problems := unsafe_paths(p, ws.source))}
        if patches["agent1"] and patches["agent1"] == patches["agent2"] and not rejected:
            return MergeResult({"agent1": "applied", "agent2": "applied"}, {}, "identical", "skip-merge-identical",
                               patches["agent1"])
        repo = ws.clone("merge")
        status: dict[str, str] = {}
        for seat in ("agent1", "agent2"):
            ws.git(repo, "checkout", "-q", "-b", seat, ws.base_sha, check=True)
            if seat in rejected:
                status[seat] = "rejected"
            elif not patches[seat].strip():
                status[seat] = "skipped"
            else:
                status[seat] = "applied" if ws.apply(repo, patches[seat], first_try=()) else "failed"
                if status[seat] == "failed":
                    ws.git(repo, "reset", "-q", "--hard", ws.base_sha)
                    ws.git(repo, "clean", "-qfd")
            ws.git(repo, "add", "-A")
            ws.git(repo, "commit", "-q", "--allow-empty", "-m", f"{seat} changes", check=True)
        ws.git(repo, "checkout", "-q", "agent2", check=True)
        strategy = "naive"
        conflict = not ws.git(repo, "merge", "-q", "--no-ff", "--no-commit", "agent1").ok
        if conflict:
            ws.git(repo, "merge", "--abort")
        merged = "" if conflict else ws.diff(repo, "--cached")
        if conflict and self.conflict_rule == "union":
            strategy = "union"
            info = repo / ".git" / "info"
            info.mkdir(exist_ok=True)
            (info / "attributes").write_text("* merge=union\n")
            if ws.git(repo, "merge", "-q", "--no-ff", "--no-commit", "agent1").ok:
                merged = ws.diff(repo, "--cached")
            else:
                ws.git(repo, "merge", "--abort")
        failed_input = any(s in ("failed", "rejected") for s in status.values())
        merge_status = "missing_input" if failed_input else "conflicts" if conflict else "clean"
        return MergeResult(status, rejected, merge_status, strategy, merged)

    def _lead_fallback(self, ws: _Workspace, task: Task, feature1: int, feature2: int, merge: MergeResult,
                       patch1: str) -> tuple[FeatureResult, FeatureResult]:
        """Upstream's rule without a merged tree: agent1's patch alone must pass both features."""
        why = {"conflicts": "the patches conflict", "missing_input": "a patch did not apply or was rejected"}.get(
            merge.status, f"no merged tree ({merge.status})")
        if self.conflict_rule == "lead" and merge.apply_status.get("agent1") == "applied":
            solo = self._strip(ws, patch1)
            r1 = self._run_feature(ws, task, feature1, solo)
            r2 = self._run_feature(ws, task, feature2, solo) if r1.passed else FeatureResult(feature2)
            if r1.passed and r2.passed:
                merge.strategy = "solo-agent1"
                return r1, r2
            why += "; agent1's patch alone does not pass both features"
        return FeatureResult(feature1, error=why), FeatureResult(feature2, error=why)

    def _run_feature(self, ws: _Workspace, task: Task, feature_id: int, patch: str) -> FeatureResult:
        """:meth:`_test_run`, or the verdict this process already reached on the same run (``reuse_verdicts``)."""
        if feature_id not in task.features:
            raise KeyError(f"{task.key} has no feature {feature_id}; features: {sorted(task.features)}")
        if not self.reuse_verdicts:
            return self._test_run(ws, task, feature_id, patch)
        key = (str(ws.source), ws.base_sha, task.key, task.tests, task.features[feature_id].tests_patch, feature_id,
               patch, self.python, self.limits, self.tail_chars, sandbox.capabilities())
        known = VERDICTS.get(key)
        if known is not None:
            return dataclasses.replace(known)
        result = self._test_run(ws, task, feature_id, patch)
        if not (result.timed_out or result.output_limited or result.disk_full):  # verdicts of the code, not the load
            VERDICTS.put(key, dataclasses.replace(result))
        return result

    def _test_run(self, ws: _Workspace, task: Task, feature_id: int, patch: str) -> FeatureResult:
        """Fresh clone at the base + ``patch`` + the feature's tests.patch; run the tests contained."""
        assert task.tests is not None
        repo = ws.clone(f"f{feature_id}")
        tag = repo.name
        patches = ws.root / f"patches-{tag}"
        patches.mkdir()
        tests_patch = patches / "tests.patch"
        tests_patch.write_text(_with_newline(task.features[feature_id].tests_patch), encoding="utf-8",
                               errors="surrogateescape")
        feature_patch = None
        if patch.strip():
            feature_patch = patches / "feature.patch"
            feature_patch.write_text(patch, encoding="utf-8", errors="surrogateescape")
        home = ws.root / f"home-{tag}"
        (home / "tmp").mkdir(parents=True)
        record = home / ".simpop-pytest-guard.jsonl"
        script = ws.root / f"{tag}-{task.tests.name}"
        script.write_text(task.tests.prepared(repo, patches, home / "tmp"), encoding="utf-8")
        paths = [str(ws.tools(self.python))]
        if not (self.limits.network or sandbox.capabilities().namespaces):
            paths.append(str(ws.socket_guard()))
        env = {**_git_env(home), "PATH": f"{ws.tools(self.python)}:{Path(self.python).parent}:/usr/local/bin:/usr/bin:/bin",
               "TMPDIR": str(home / "tmp"), "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1",
               "PYTHONHASHSEED": "0", "PYTEST_ADDOPTS": "-p no:cacheprovider", "PYTEST_PLUGINS": GUARD_MODULE,
               "SIMPOP_PYTEST_GUARD": str(record), "PYTHONPATH": ":".join(paths)}
        self._check_interpreter(repo, env, [repo, home])
        argv = ["bash", str(script), *task.tests.args(repo, tests_patch, feature_patch)]
        result = sandbox.run(argv, repo, self.limits, env, writable=[repo, home],
                             readable=[script, patches, ws.source], outputs=[record])
        passed, failed, problems = guard_verdict(record.read_text(errors="replace") if record.is_file() else "")
        if not (result.timed_out or result.output_limited) and "no pytest session ran" in problems and (
                result.exit_code is None or result.exit_code in _SHELL_CANNOT_RUN):
            raise EvaluatorError(f"{task.key} feature {feature_id}: {task.tests.name} could not run a command in "
                                 f"the sandbox ({result.describe()}): "
                                 + (" ".join(result.tail(300).split()) or "no output"))
        error = None
        if result.exit_code not in (0, None) and not problems:
            error = f"{task.tests.name} exited with code {result.exit_code}"
        if problems and error is None and not (result.timed_out or result.output_limited):
            error = "; ".join(dict.fromkeys(problems))[:1000]
        if result.disk_full:
            error = f"disk quota of {self.limits.max_disk_bytes} bytes exhausted" + (f"; {error}" if error else "")
        return FeatureResult(feature_id, passed=result.ok and passed > 0 and failed == 0 and not problems,
                             exit_code=result.exit_code, tests_passed=passed, tests_failed=failed,
                             timed_out=result.timed_out, output_limited=result.output_limited,
                             disk_full=result.disk_full, error=error,
                             output_tail=result.tail(self.tail_chars))


    def _check_interpreter(self, cwd: Path, env: dict[str, str], writable: list[Path]) -> None:
        """Raise :class:`EvaluatorError` unless ``python -m pytest`` runs in a test run's sandbox (once per
        interpreter; ``python`` is the evaluator's, through the tools folder first on ``PATH``)."""
        with _CHECK_LOCK:
            if self.python in self._checked:
                return
            if not os.access(self.python, os.X_OK):
                raise EvaluatorError(f"the test interpreter {self.python} does not exist or is not executable")
            probe = sandbox.run(["python", "-m", "pytest", "--version"], cwd, self.limits, env, writable=writable)
            if not probe.ok:
                raise EvaluatorError(f"the test interpreter {self.python} cannot run pytest in the sandbox "
                                     f"({probe.describe()}): " + (" ".join(probe.tail(300).split()) or "no output"))
            self._checked.add(self.python)


class VerdictStore:
    """The feature verdicts this process has reached (:class:`FeatureResult` by the run's key), the
    ``capacity`` most recently used kept (``cachetools``' LRU); thread-safe (a pair's two runs go side by side).

    Attributes:
        hits: Verdicts answered from the store.
    """

    def __init__(self, capacity: int):
        self._items: cachetools.LRUCache[tuple[Any, ...], FeatureResult] = cachetools.LRUCache(capacity)
        self._lock = threading.Lock()
        self.hits = 0

    def get(self, key: tuple[Any, ...]) -> FeatureResult | None:
        """The verdict stored under ``key`` (counted in :attr:`hits`), or None."""
        with self._lock:
            found = self._items.get(key)
            self.hits += found is not None
            return found

    def put(self, key: tuple[Any, ...], result: FeatureResult) -> None:
        """Keep ``result`` under ``key`` (the least recently used verdict goes when the store is full)."""
        with self._lock:
            self._items[key] = result

    def clear(self) -> None:
        """Forget every verdict and the hit count."""
        with self._lock:
            self._items.clear()
            self.hits = 0

    def __len__(self) -> int:
        """How many verdicts are kept."""
        return len(self._items)


#: The verdicts reused by every :class:`Evaluator` of this process (``reuse_verdicts``).
VERDICTS = VerdictStore(capacity=512)


def guard_verdict(record: str) -> tuple[int, int, list[str]]:
    """(passed, failed + errors, problems) from the pytest guard's record of one script run.

    Problems: no pytest session ran, a session did not finish or exited non-zero, or the guard
    saw tampering (see :mod:`simpop.envs.cooperbench.pytest_guard`).
    """
    passed = failed = 0
    problems: list[str] = []
    open_sessions: dict[Any, int] = {}
    sessions = 0
    for line in record.splitlines():
        try:
            event = json.loads(line)
            kind, pid = event["event"], event["pid"]
        except (ValueError, TypeError, KeyError):
            problems.append("the pytest guard's record was tampered with")
            continue
        if kind == "start":
            sessions += 1
            open_sessions[pid] = open_sessions.get(pid, 0) + 1
        elif kind == "finish":
            open_sessions[pid] = open_sessions.get(pid, 0) - 1
            if event.get("exitstatus") != 0:
                problems.append(f"pytest exited with status {event.get('exitstatus')}")
        elif kind == "test":
            outcome = event.get("outcome")
            passed += outcome == "passed"
            failed += outcome in ("failed", "error", "not run")
        elif kind == "tamper":
            problems.append(f"tampering: {event.get('what')}")
    if sessions == 0:
        problems.append("no pytest session ran")
    if any(count != 0 for count in open_sessions.values()):
        problems.append("a pytest session did not finish (the process exited early)")
    return passed, failed, problems


# --------------------------------------------------------------------- workspace and base repos
class _Workspace:
    """A fresh temporary directory for one evaluation, with git helpers; removed on exit."""

    def __init__(self, task: Task):
        task.require_runnable()
        self.source, self.base_sha = _base_repo(task)
        self._counter = itertools.count()  # unique names; next() is atomic, and runs may share a workspace

    def __enter__(self) -> _Workspace:
        self.root = Path(tempfile.mkdtemp(prefix="simpop-cooperbench-"))
        (self.root / "patches").mkdir(mode=0o700)
        self.env = _git_env(self.root / "patches")
        return self

    def __exit__(self, *exc) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def git(self, repo: Path, *args: str, check: bool = False) -> sandbox.ProcessResult:
        result = sandbox.run(["git", *args], repo, GIT_LIMITS, self.env)
        if check and not result.ok:
            raise RuntimeError(f"git {' '.join(args)} failed in {repo}: {result.describe()}\n{result.tail(1000)}")
        return result

    def clone(self, name: str) -> Path:
        """A clone of the base repository with the base commit checked out."""
        dest = self.root / f"{name}-{next(self._counter)}"
        self.git(self.root, "clone", "-q", "--shared", "--no-checkout", str(self.source), str(dest), check=True)
        self.git(dest, "checkout", "-q", "--detach", self.base_sha, check=True)
        return dest

    def apply(self, repo: Path, patch: str, first_try: tuple[str, ...]) -> bool:
        """``git apply`` (with the ``first_try`` options), falling back to ``git apply --3way``."""
        path = self._scratch("patch")
        path.write_text(patch, encoding="utf-8", errors="surrogateescape")
        if self.git(repo, "apply", "--whitespace=nowarn", *first_try, str(path)).ok:
            return True
        return self.git(repo, "apply", "--3way", "--whitespace=nowarn", str(path)).ok

    def diff(self, repo: Path, *args: str) -> str:
        """``git diff --binary <args>`` against the base, read from a file (stderr stays out of it)."""
        out = self._scratch("diff")
        self.git(repo, "diff", "--binary", f"--output={out}", *args, self.base_sha, check=True)
        return out.read_text(encoding="utf-8", errors="surrogateescape")

    def _scratch(self, suffix: str) -> Path:
        return self.root / "patches" / f"{next(self._counter)}.{suffix}"

    def tools(self, python: str) -> Path:
        """The folder put first on a test script's ``PATH``: ``python``/``python3`` (the evaluator's
        interpreter), offline ``pip``/``pip3``/``uv`` shims, and the pytest guard module."""
        tools = self.root / "tools"
        with _TOOLS_LOCK:
            if not tools.exists():
                with atomic_folder(tools) as staging:
                    for name in ("python", "python3"):
                        (staging / name).symlink_to(python)
                    for name, body in (("pip", _SHIMS["pip"]), ("pip3", _SHIMS["pip"]), ("uv", _SHIMS["uv"])):
                        (staging / name).write_text("#!/bin/bash\n" + body)
                        (staging / name).chmod(0o755)
                    shutil.copyfile(Path(__file__).with_name("pytest_guard.py"), staging / f"{GUARD_MODULE}.py")
        return tools

    def socket_guard(self) -> Path:
        guard = self.root / "netguard"
        if not guard.exists():
            sandbox.write_socket_guard(guard)
        return guard


_BASES: dict[str, tuple[Path, str]] = {}
_BASES_LOCK = threading.Lock()
_TOOLS_LOCK = threading.Lock()
_CHECK_LOCK = threading.Lock()
_BASE_ROOT: Path | None = None


def _base_repo(task: Task) -> tuple[Path, str]:
    """(git repository, base commit) for a task; plain-file checkouts are committed once per process."""
    assert task.checkout is not None
    key = f"{task.checkout.resolve()}@{task.base_commit}"
    with _BASES_LOCK:
        if key not in _BASES:
            _BASES[key] = _prepare_base(task.checkout, task.base_commit)
        return _BASES[key]


def _prepare_base(checkout: Path, base_commit: str | None) -> tuple[Path, str]:
    global _BASE_ROOT
    env = _git_env(Path(tempfile.gettempdir()))
    if (checkout / ".git").exists():
        rev = sandbox.run(["git", "rev-parse", "--verify", f"{base_commit or 'HEAD'}^{{commit}}"], checkout,
                          GIT_LIMITS, env)
        if not rev.ok:
            raise RuntimeError(f"{checkout}: base commit {base_commit or 'HEAD'} not found ({rev.tail(300).strip()}); "
                               "run the task's setup.sh to fetch it")
        return checkout, rev.output.strip()
    if _BASE_ROOT is None:
        _BASE_ROOT = Path(tempfile.mkdtemp(prefix="simpop-cooperbench-bases-"))
        atexit.register(shutil.rmtree, _BASE_ROOT, True)
    repo = Path(tempfile.mkdtemp(dir=_BASE_ROOT))
    shutil.copytree(checkout, repo, dirs_exist_ok=True, symlinks=True,
                    ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "base"]):
        result = sandbox.run(["git", *args], repo, GIT_LIMITS, env)
        if not result.ok:
            raise RuntimeError(f"could not commit {checkout} as a git base: git {args[0]}: {result.tail(500)}")
    sha = sandbox.run(["git", "rev-parse", "HEAD"], repo, GIT_LIMITS, env)
    return repo, sha.output.strip()


def _git_env(home: Path) -> dict[str, str]:
    """A fixed environment for git: no user or system config, fixed identity and dates."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "LANG": "C",
            "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_TERMINAL_PROMPT": "0",
            "GIT_AUTHOR_NAME": "CooperBench Eval", "GIT_AUTHOR_EMAIL": "eval@cooperbench.local",
            "GIT_COMMITTER_NAME": "CooperBench Eval", "GIT_COMMITTER_EMAIL": "eval@cooperbench.local",
            "GIT_AUTHOR_DATE": _EPOCH, "GIT_COMMITTER_DATE": _EPOCH}


def _with_newline(patch: str) -> str:
    """Patches must end with a newline for git; also undo shell-escaped quotes (as upstream does)."""
    patch = patch.replace("'\\''", "'")
    return patch if not patch or patch.endswith("\n") else patch + "\n"


def patched_files(task: Task, patch: str) -> dict[str, str | None]:
    """The files ``patch`` touches, as they read after applying it to the base (None: deleted)."""
    with _Workspace(task) as ws:
        repo = ws.clone("apply")
        if patch.strip() and not ws.apply(repo, _with_newline(patch), first_try=()):
            raise ValueError(f"the patch does not apply to the base of {task.key}")
        files: dict[str, str | None] = {}
        for path in touched_paths(patch):
            target = repo / path
            files[path] = target.read_text(encoding="utf-8", errors="replace") if target.is_file() else None
        return files
