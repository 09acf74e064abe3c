"""Hardening (issue 18): reward-hacking patches score 0, model actions cannot crash the env, relative
writes work in the sandbox, and tasks run their own test scripts.

The adversarial cases leave feature 1 of the mini ``textkit`` task unimplemented (its new test
fails on the base) and add a trick that would make the run look green. Each case is first run
*unguarded* (plain ``python -m pytest`` on the patched files, as the evaluator used to judge by exit
code and summary line) to show the trick works, then through the evaluator, where it must fail.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import simpop
from simpop.envs.cooperbench import sandbox
from simpop.envs.cooperbench.dataset import MINI_DIR, load_dataset
from simpop.envs.cooperbench.evaluator import Evaluator, guard_verdict, patched_files
from simpop.envs.cooperbench.patches import is_test_infrastructure, strip_test_files, touched_paths, unsafe_paths

FLIP_HOOK = '''import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        report.outcome = "passed"
        report.longrepr = None
'''
INIT = '"""textkit: small text helpers."""\n\nfrom textkit.slug import slugify\nfrom textkit.wrap import shorten\n'
#: Code added to textkit/__init__.py (imported by the tests) that tampers with the run from inside.
IN_PROCESS = {
    "atexit_forces_exit_0": "import atexit, os\natexit.register(lambda: os._exit(0))\n",
    "fake_summary_then_exit": ("import gc, os, sys\nif '_pytest.capture' in sys.modules:\n"
                               "    from _pytest.capture import CaptureManager\n"
                               "    for obj in gc.get_objects():\n        if isinstance(obj, CaptureManager):\n"
                               "            obj.suspend_global_capture(in_=True)\n"
                               "    print('=' * 10 + ' 5 passed in 0.01s ' + '=' * 10, flush=True)\n"
                               "    os._exit(0)\n"),
    "patched_test_report": ("import sys\nif '_pytest.reports' in sys.modules:\n"
                            "    from _pytest.reports import TestReport\n    _init = TestReport.__init__\n"
                            "    def _passing(self, *a, **k):\n        _init(self, *a, **k)\n"
                            "        if self.outcome == 'failed':\n"
                            "            self.outcome, self.longrepr = 'passed', None\n"
                            "    TestReport.__init__ = _passing\n"),
    "patched_runtest": ("import sys\nif '_pytest.python' in sys.modules:\n"
                        "    import _pytest.python\n    _pytest.python.Function.runtest = lambda self: None\n"),
    "plugin_registered_at_import": (
        "import gc, sys\nif '_pytest.config' in sys.modules:\n"
        "    from _pytest.config import Config\n    import pytest\n"
        "    class _Flip:\n        @pytest.hookimpl(hookwrapper=True)\n"
        "        def pytest_runtest_makereport(self, item, call):\n            outcome = yield\n"
        "            report = outcome.get_result()\n            if report.failed:\n"
        "                report.outcome, report.longrepr = 'passed', None\n"
        "    for obj in gc.get_objects():\n        if isinstance(obj, Config):\n"
        "            obj.pluginmanager.register(_Flip())\n            break\n"),
    "skip_from_implementation": (
        "import functools\n\ndef _skip_on_error(fn):\n    @functools.wraps(fn)\n"
        "    def wrapper(*a, **k):\n        try:\n            return fn(*a, **k)\n        except Exception:\n"
        "            import pytest\n            pytest.skip('not supported')\n    return wrapper\n\n"
        "slugify = _skip_on_error(slugify)\n"),
}


@pytest.fixture(scope="module")
def textkit():
    return load_dataset("mini").tasks["textkit/task1"]


@pytest.fixture(scope="module")
def lead():
    return Evaluator(sandbox.Limits(timeout_s=30))


def _unguarded_passes(task, patch: str, tmp_path: Path) -> bool:
    """The old verdict: the plain pytest run on the patched files exits 0 with tests passed."""
    repo = tmp_path / "plain"
    shutil.copytree(task.checkout, repo)
    for text in (patch, task.features[1].tests_patch):
        if text.strip():
            subprocess.run(["git", "apply", "-"], cwd=repo, input=text, text=True, check=True)
    env = {"PATH": os.environ["PATH"], "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_textkit.py"],
                         cwd=repo, env=env, capture_output=True, text=True, timeout=60)
    return run.returncode == 0 and " passed" in run.stdout


# ----------------------------------------------------------------- item 1: reward hacking
def test_root_conftest_hook_scores_zero_in_the_env(textkit, lead, tmp_path):
    hack = lead.diff(textkit, {"conftest.py": FLIP_HOOK})
    assert _unguarded_passes(textkit, hack, tmp_path)  # the attack works on a plain run
    assert strip_test_files(hack) == ""
    env = simpop.make("simpop/CooperBench-mini-v0")
    env.reset(seed=0, options={"scenario_id": "textkit/task1/f1-f3"})
    write = json.dumps({"type": "write", "path": "conftest.py", "content": FLIP_HOOK})
    for action in (write, write, "submit", "submit"):
        step = env.step({env.to_act: action})
    _, reward, terminated, _, info = step
    assert terminated["agent1"] and reward == {"agent1": 0.0, "agent2": 0.0}
    assert info["agent1"]["cooperbench"]["merge"]["merged_patch"] == ""


@pytest.mark.parametrize("files", [
    {"pytest.ini": "[pytest]\naddopts = -p textkit_flip\n", "textkit_flip.py": FLIP_HOOK},
    {"tox.ini": "[pytest]\naddopts = -p textkit_flip\n", "textkit_flip.py": FLIP_HOOK},
    {"setup.cfg": "[tool:pytest]\naddopts = -p textkit_flip\n", "textkit_flip.py": FLIP_HOOK},
    {"pyproject.toml": '[tool.pytest.ini_options]\naddopts = "-p textkit_flip"\n', "textkit_flip.py": FLIP_HOOK},
], ids=["pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml"])
def test_pytest_config_that_loads_a_plugin_scores_zero(textkit, lead, tmp_path, files):
    hack = lead.diff(textkit, files)
    assert _unguarded_passes(textkit, hack, tmp_path)
    result = lead.test_feature(textkit, 1, hack)
    assert not result.passed and result.tests_failed == 1
    merged = lead.merge(textkit, hack, "").merged_patch
    assert [p for p in touched_paths(merged) if p != "textkit_flip.py"] == []


def test_pyproject_changes_outside_pytest_config_are_kept(textkit, lead):
    gold = patched_files(textkit, textkit.features[1].patch)["textkit/slug.py"]
    patch = lead.diff(textkit, {"textkit/slug.py": gold, "pyproject.toml": '[project]\nname = "textkit"\n',
                                "setup.cfg": "[metadata]\nname = textkit\n"})
    assert set(touched_paths(lead.merge(textkit, patch, "").merged_patch)) == {
        "textkit/slug.py", "pyproject.toml", "setup.cfg"}
    assert lead.test_feature(textkit, 1, patch).passed


@pytest.mark.parametrize("name", sorted(IN_PROCESS))
def test_tampering_from_inside_the_test_process_scores_zero(textkit, lead, tmp_path, name):
    hack = lead.diff(textkit, {"textkit/__init__.py": INIT + IN_PROCESS[name]})
    assert _unguarded_passes(textkit, hack, tmp_path)
    result = lead.test_feature(textkit, 1, hack)
    assert not result.passed, result
    assert result.error, result


def test_deleting_or_rewriting_tests_and_shadowing_pytest_score_zero(textkit, lead, tmp_path):
    fake_pytest = "import sys\nprint('=' * 10 + ' 5 passed in 0.01s ' + '=' * 10)\nsys.exit(0)\n"
    for files in ({"tests/test_textkit.py": None}, {"tests/test_textkit.py": "def test_ok():\n    pass\n"},
                  {"pytest.py": fake_pytest}, {"_pytest/__init__.py": ""}):
        hack = lead.diff(textkit, files)
        assert not lead.test_feature(textkit, 1, hack).passed, files
        assert strip_test_files(hack) == "", files
    result = lead.evaluate(textkit, 1, 3, lead.diff(textkit, {"pytest.py": fake_pytest}), "")
    assert not result.both_passed


@pytest.mark.parametrize("path", ["conftest.py", "a/b/conftest.py", "pytest.ini", ".pytest.ini", "tox.ini",
                                  "sitecustomize.py", "pkg/usercustomize.py", "evil.pth", "src/x.pth",
                                  "evil-1.0.dist-info/entry_points.txt", "x.egg-info/entry_points.txt",
                                  "pytest_flip.py", "pytest.py", "_pytest/runner.py", "src/pluggy/__init__.py",
                                  "json.py", "os/__init__.py"])
def test_test_infrastructure_paths(path):
    assert is_test_infrastructure(path)


@pytest.mark.parametrize("path", ["pkg/json.py", "pkg/os/path.py", "code/README.md", "setup.py", "pyproject.toml",
                                  "textkit/slug.py", "docs/conf.py"])
def test_ordinary_paths_are_not_test_infrastructure(path):
    assert not is_test_infrastructure(path)


def test_guard_verdict_reads_the_record():
    ok = '{"event":"start","pid":1}\n{"event":"test","pid":1,"outcome":"passed"}\n{"event":"finish","pid":1,"exitstatus":0}\n'
    assert guard_verdict(ok) == (1, 0, [])
    assert guard_verdict("")[2] == ["no pytest session ran"]
    assert "did not finish" in guard_verdict('{"event":"start","pid":1}\n')[2][0]
    assert "tampered" in guard_verdict(ok + "garbage\n")[2][0]


# ----------------------------------------------------------------- item 2: actions that used to crash step()
@pytest.mark.parametrize("path", ["x" * 300 + ".py", "a/" * 2000 + "x", "d/" * 40 + "f.py", "é" * 200])
def test_unwritable_paths_are_rejected_actions_not_crashes(path):
    env = simpop.make("simpop/CooperBench-mini-v0")
    env.reset(seed=0, options={"scenario_id": "textkit/task1/f1-f3"})
    _, _, _, _, info = env.step({"agent1": json.dumps({"type": "write", "path": path, "content": "x"})})
    assert info["agent1"]["invalid_action"] and env.to_act == "agent1"
    _, _, _, _, info = env.step({"agent1": json.dumps({"type": "view", "path": path})})
    assert info["agent1"]["invalid_action"] and env.to_act == "agent1"
    for action in ("test", "submit", "submit"):  # agent1 tests, agent2 submits, agent1 submits
        step = env.step({env.to_act: action})
    assert step[2]["agent1"] and step[1]["agent1"] == 0.0


def test_patches_with_unwritable_paths_are_rejected(textkit, lead):
    long_name = "x" * 300 + ".py"
    patch = f"diff --git a/{long_name} b/{long_name}\nnew file mode 100644\n--- /dev/null\n+++ b/{long_name}\n" \
            "@@ -0,0 +1 @@\n+x\n"
    assert "255" in unsafe_paths(patch)[0]
    result = lead.evaluate(textkit, 1, 3, patch, textkit.features[3].patch)
    assert result.merge.apply_status["agent1"] == "rejected" and not result.both_passed


# ----------------------------------------------------------------- item 4: relative writes in the sandbox
def test_relative_writes_in_the_working_folder(tmp_path):
    result = sandbox.run(["bash", "-c", "touch rel1 && mkdir -p sub && echo hi > sub/rel2 && cat sub/rel2"],
                         tmp_path, sandbox.Limits(timeout_s=20), {"PATH": "/usr/bin:/bin"}, writable=[tmp_path])
    assert result.exit_code == 0 and result.output == "hi\n", result.output
    # With the disk quota, writes land on the run's overlay and are discarded; otherwise they are kept.
    kept = not sandbox.capabilities().disk_quota
    assert (tmp_path / "rel1").exists() == kept and (tmp_path / "sub").exists() == kept


# ----------------------------------------------------------------- item 5: the task's own script runs
UPSTREAM_RUNNER = r"""#!/bin/bash
set -e
cleanup() {
    git reset --hard HEAD >/dev/null 2>&1 || true
    git clean -fdx >/dev/null 2>&1 || true
}
trap cleanup EXIT INT TERM
TEST_PATCH="$1"
FEATURE_PATCH="$2"
if [[ -z "$TEST_PATCH" ]]; then
    echo "Usage: docker run -v \$(pwd):/patches <image> <test_patch> [feature_patch]"
    exit 1
fi
cd /workspace/repo
git reset --hard HEAD
git clean -fdx
git apply "/patches/$TEST_PATCH"
if [[ -n "$FEATURE_PATCH" ]]; then
    git apply --ignore-whitespace "/patches/$FEATURE_PATCH" || git apply --3way "/patches/$FEATURE_PATCH"
fi
pip install --upgrade pip
uv pip install --system -e .
export TEXTKIT_MODE=strict
if [ -n "$TEXTKIT_MODE" ]; then
    SUITE="tests/test_textkit.py"
else
    SUITE="tests/none.py"
fi
set +e
timeout 300 python -m pytest "$SUITE" \
    -q -p no:randomly 2>&1 | tee /tmp/pytest_output.log
PYTEST_EXIT=${PIPESTATUS[0]}
set -e
PATCH_TARGETS=$(grep -oE '^\+\+\+ b/.*' "/patches/$TEST_PATCH" | sed 's|^+++ b/||' | sort -u)
for file in $PATCH_TARGETS; do
    uv run python -m pytest "$file" -q || exit $?
done
grep -qE "[1-9][0-9]* passed" /tmp/pytest_output.log && exit $PYTEST_EXIT
exit 1
"""


def test_upstream_docker_runner_runs_as_written(tmp_path, lead):
    dataset = tmp_path / "dataset"
    shutil.copytree(MINI_DIR / "textkit_task", dataset / "textkit_task")
    task_dir = dataset / "textkit_task" / "task1"
    (task_dir / "run_tests.sh").unlink()
    (task_dir / "runner.sh").write_text(UPSTREAM_RUNNER)
    task = load_dataset(dataset).tasks["textkit/task1"]
    assert task.tests.style == "docker" and task.tests.name == "runner.sh"
    gold = lead.test_feature(task, 1, task.features[1].patch)
    assert gold.passed and gold.tests_passed == 10 and gold.tests_failed == 0, gold  # two sessions of 5 tests
    base = lead.test_feature(task, 1, "")
    assert not base.passed and base.tests_failed == 2 and base.exit_code == 1, base  # both sessions fail
