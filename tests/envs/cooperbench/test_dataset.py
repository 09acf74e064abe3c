"""Loading the dataset layout: the mini set, test-script parsing, checkouts, subsets."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from simpop.envs.cooperbench.dataset import MINI_DIR, load_dataset, parse_test_script

# The shape of upstream's run_tests.sh (dspy_task/task8394): venv set-up, then pytest lines.
UPSTREAM_RUN_TESTS = """#!/bin/bash
set -e
REPO_PATH=""
UNIT_TEST_SPEC="tests/clients/test_cache.py"
SECONDARY_TEST_SPEC="tests/a.py tests/b.py"
if [[ -z "$REPO_PATH" && ${#POSITIONAL_ARGS[@]} -ge 1 ]]; then
    REPO_PATH="${POSITIONAL_ARGS[0]}"
fi
"$PYTHON_CMD" -m venv .venv
pip install -e ".[dev]"
export DSPY_CACHEDIR="/tmp/cache"
python -m pytest "$UNIT_TEST_SPEC" -v
    for file in "${TEST_FILES[@]}"; do
            python -m pytest "$file" -v
    done
"""


def test_mini_set_layout():
    ds = load_dataset("mini")
    assert sorted(ds.tasks) == ["calc/task3", "kvstore/task2", "textkit/task1"]
    assert all(sorted(t.features) == [1, 2, 3, 4] for t in ds.tasks.values())
    pairs = ds.pairs()
    assert len(pairs) == 18 and len({p.id for p in pairs}) == 18
    assert all(p.first.id < p.second.id for p in pairs)
    assert pairs[0].id == "calc/task3/f1-f2"
    assert [p.id for p in ds.pairs("lite")][:2] == ["textkit/task1/f1-f3", "textkit/task1/f2-f4"]
    task = ds.tasks["textkit/task1"]
    assert task.checkout == MINI_DIR / "textkit_task" / "task1" / "repo" and task.base_commit is None
    assert task.combined_patch and task.tests is not None


def test_upstream_run_tests_script_is_kept_whole():
    command = parse_test_script(UPSTREAM_RUN_TESTS)
    assert command is not None and command.script == UPSTREAM_RUN_TESTS and command.style == "args"
    assert command.args(Path("/r"), Path("/p/tests.patch"), None) == ["/r", "/p/tests.patch"]
    assert parse_test_script("go test ./...\n") is None
    docker = parse_test_script('cd /workspace/repo\ngit apply "/patches/$1"\ntimeout 300 python -m pytest x.py '
                               '| tee /tmp/out.log\ngrep -q passed /var/tmp/keep\n', "runner.sh")
    assert docker.style == "docker" and docker.name == "runner.sh"
    assert docker.prepared(Path("/w/tmp/repo"), Path("/w/p"), Path("/w/t")).splitlines() == [
        "cd /w/tmp/repo", 'git apply "/w/p/$1"', "timeout 300 python -m pytest x.py | tee /w/t/out.log",
        "grep -q passed /var/tmp/keep"]
    assert docker.args(Path("/r"), Path("/p/tests.patch"), Path("/p/feature.patch")) == ["tests.patch",
                                                                                          "feature.patch"]


def test_real_layout_with_a_repos_folder(tmp_path):
    # Upstream layout without repo/ folders; the checkout is a git repo found through setup.sh's REPO_NAME.
    dataset = tmp_path / "dataset"
    shutil.copytree(MINI_DIR / "calc_task", dataset / "calc_task", ignore=shutil.ignore_patterns("repo"))
    checkout = tmp_path / "repos" / "calc-checkout"
    shutil.copytree(MINI_DIR / "calc_task" / "task3" / "repo", checkout)
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
           "PATH": "/usr/bin:/bin"}
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "base"]):
        subprocess.run(["git", *args], cwd=checkout, env=env, check=True)
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=checkout, capture_output=True, text=True).stdout.strip()
    (dataset / "calc_task" / "task3" / "setup.sh").write_text(f'REPO_NAME="calc-checkout"\nBASE_COMMIT="{sha}"\n')
    (dataset / "subsets").mkdir()
    (dataset / "subsets" / "one.json").write_text(json.dumps({"tasks": [{"repo": "calc_task", "task_id": 3,
                                                                         "pairs": [[4, 2]]}]}))

    missing = load_dataset(dataset).tasks["calc/task3"]
    assert missing.checkout is None
    with pytest.raises(FileNotFoundError, match="setup.sh"):
        missing.require_runnable()

    ds = load_dataset(dataset, tmp_path / "repos")
    task = ds.tasks["calc/task3"]
    assert task.checkout == checkout and task.base_commit == sha
    assert [p.id for p in ds.pairs("one")] == ["calc/task3/f2-f4"]
    with pytest.raises(KeyError, match="unknown subset"):
        ds.pairs("nope")


def test_missing_dataset_says_what_to_pass(tmp_path):
    with pytest.raises(FileNotFoundError, match="dataset/ folder"):
        load_dataset(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="no tasks found"):
        load_dataset(tmp_path)
