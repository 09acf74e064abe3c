"""CooperBench scenarios: a :class:`FeaturePair` is two features of one :class:`Task`, one per seat.

It is made of a :class:`Task` (a repository at a base commit), two of the task's features
(:class:`Feature`: request, gold patch, hidden tests) and the task's :class:`TestCommand` (its own test script).
:mod:`~simpop.envs.cooperbench.dataset` reads them from a dataset folder and lists its pairs and subsets.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from simpop.envs.cooperbench.actions import ACTIONS_HELP


@dataclass(frozen=True)
class Feature:
    """One feature of a task: the request, the gold patch and the hidden tests."""

    id: int
    description: str
    patch: str
    tests_patch: str


_DOCKER_PATHS_RE = re.compile(r"(?<![\w./-])(/workspace/repo|/patches/|/tmp/)")


@dataclass(frozen=True)
class TestCommand:
    """A task's own test script (``run_tests.sh`` or ``runner.sh``), run as it is in the sandbox.

    Attributes:
        script: The script's text.
        name: Its file name.
        style: ``"args"``: ``<script> <repo_path> <tests.patch> [feature.patch]`` (the mini set,
            upstream's ``run_tests.sh``); ``"docker"``: ``<script> <tests.patch> [feature.patch]``
            with the repository at ``/workspace/repo`` and the patches in ``/patches/`` (upstream's
            ``runner.sh`` for its Docker images).
    """

    script: str
    name: str = "run_tests.sh"
    style: str = "args"

    def prepared(self, repo: Path, patches: Path, tmp: Path) -> str:
        """The script as it runs here: for ``docker`` scripts, the image's fixed paths
        (``/workspace/repo``, ``/patches/``, ``/tmp/``) are replaced by this run's folders."""
        if self.style != "docker":
            return self.script
        where = {"/workspace/repo": str(repo), "/patches/": f"{patches}/", "/tmp/": f"{tmp}/"}
        return _DOCKER_PATHS_RE.sub(lambda m: where[m.group(1)], self.script)

    def args(self, repo: Path, tests_patch: Path, feature_patch: Path | None) -> list[str]:
        """The script's arguments (patch files as the style expects them)."""
        if self.style == "docker":
            return [tests_patch.name] + ([feature_patch.name] if feature_patch else [])
        return [str(repo), str(tests_patch)] + ([str(feature_patch)] if feature_patch else [])


@dataclass(frozen=True)
class Task:
    """One task: a repository at a base commit and its features.

    Attributes:
        repo: Repository name without the ``_task`` suffix (``"dspy"``).
        task_id: The task number.
        path: The task folder.
        features: Feature id -> feature.
        combined_patch: All features at once (None if the dataset has none).
        tests: The task's test script, or None if it has none that runs pytest.
        checkout: The repository at its base (a git checkout, or plain files), or None if absent.
        base_commit: The commit to evaluate against (``setup.sh``'s BASE_COMMIT; None: HEAD, or a
            fresh commit of plain files).
    """

    repo: str
    task_id: int
    path: Path
    features: dict[int, Feature]
    combined_patch: str | None
    tests: TestCommand | None
    checkout: Path | None
    base_commit: str | None

    @property
    def key(self) -> str:
        return f"{self.repo}/task{self.task_id}"

    def require_runnable(self) -> None:
        """Raise a clear error if this task cannot be evaluated here."""
        if self.checkout is None:
            raise FileNotFoundError(
                f"no repository checkout for {self.key}: run {self.path / 'setup.sh'} inside your repos "
                f"directory (or put the checkout at <repos>/{self.repo}_task/task{self.task_id}) and pass repos=...")
        if self.tests is None:
            raise ValueError(f"{self.key}: no run_tests.sh/runner.sh that runs pytest; only pytest-based tasks "
                             "can be evaluated")


@dataclass(frozen=True)
class FeaturePair:
    """A scenario: two features of one task; the lower feature id goes to ``agent1``.

    Attributes:
        id: ``<repo>/task<id>/f<a>-f<b>``.
    """

    id: str
    task: Task
    first: Feature
    second: Feature

    def feature(self, seat: str) -> Feature:
        """The feature assigned to ``seat`` (``agent1`` or ``agent2``)."""
        if seat not in ("agent1", "agent2"):
            raise KeyError(f"seats are 'agent1' and 'agent2', got {seat!r}")
        return self.first if seat == "agent1" else self.second

    def instructions(self, seat: str) -> str:
        """The system prompt for whoever plays ``seat``: role, feature, action format."""
        other = "agent2" if seat == "agent1" else "agent1"
        feature = self.feature(seat)
        return (
            f"You are {seat}, a software engineer working on the repository {self.task.repo!r}. Your teammate "
            f"{other} implements a different feature in the same repository at the same time. Each of you edits "
            "your own copy; when both of you have submitted, your two patches are merged with git and both "
            "features' hidden tests run on the merged code. You succeed only if both features pass, so agree "
            "on who changes which files and lines, and avoid editing the same lines.\n\n"
            f"Your feature (feature {feature.id}):\n{feature.description.strip()}\n\n{ACTIONS_HELP}"
        )

    def user_instructions(self) -> str:
        """The prompt for an LLM teammate in the user seat (``agent2``)."""
        return self.instructions("agent2")
