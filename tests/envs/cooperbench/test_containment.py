"""Containment: model-written patches and code that misbehave are stopped and reported.

The evaluator cases use a one-file task whose hidden test calls ``box.f()``; the "agent patch"
replaces ``f`` with misbehaving code. Which mechanisms this machine allows is reported by
``sandbox.capabilities()``; assertions that depend on it say what happens either way.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

import pytest

from simpop.envs.cooperbench import sandbox
from simpop.envs.cooperbench.dataset import load_dataset
from simpop.envs.cooperbench.evaluator import VERDICTS, Evaluator
from simpop.envs.cooperbench.scenario import Task

CAPS = sandbox.capabilities()
LIMITS = sandbox.Limits(timeout_s=4.0, memory_bytes=2 * 2**30, max_output_bytes=256 * 1024, max_processes=64)

TESTS_PATCH = """diff --git a/tests/test_box.py b/tests/test_box.py
new file mode 100644
--- /dev/null
+++ b/tests/test_box.py
@@ -0,0 +1,5 @@
+from box import f
+
+
+def test_f():
+    assert f() == 1
"""


# The mini set's calling convention: run_tests.sh <repo_path> <tests.patch> [feature.patch].
RUN_TESTS = """set -e
cd "$1"
if [ -n "$3" ]; then git apply "$3"; fi
git apply "$2"
export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
python -m pytest -q tests/test_box.py
"""


@pytest.fixture(scope="module")
def task(tmp_path_factory) -> Task:
    root = tmp_path_factory.mktemp("boxdata")
    task_dir = root / "box_task" / "task1"
    (task_dir / "repo" / "box").mkdir(parents=True)
    (task_dir / "repo" / "box" / "__init__.py").write_text("def f():\n    return 0\n")
    os.symlink(root, task_dir / "repo" / "box" / "outside")  # a checkout symlink that leads out of the repo
    for fid in (1, 2):
        (task_dir / f"feature{fid}").mkdir()
        (task_dir / f"feature{fid}" / "feature.md").write_text("Make f() return 1.")
        (task_dir / f"feature{fid}" / "tests.patch").write_text(TESTS_PATCH)
    (task_dir / "run_tests.sh").write_text(RUN_TESTS)
    return load_dataset(root).tasks["box/task1"]


@pytest.fixture(scope="module")
def evaluator() -> Evaluator:
    return Evaluator(LIMITS)


def _agent_patch(evaluator: Evaluator, task: Task, code: str) -> str:
    return evaluator.diff(task, {"box/__init__.py": code})


def _processes_with(token: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if token.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_well_behaved_patch_passes(evaluator, task):
    result = evaluator.test_feature(task, 1, _agent_patch(evaluator, task, "def f():\n    return 1\n"))
    assert result.passed and result.tests_passed == 1 and result.exit_code == 0


def test_patches_writing_outside_the_repo_are_rejected(evaluator, task, tmp_path):
    target = tmp_path / "escaped.py"
    absolute = f"--- /dev/null\n+++ {target}\n@@ -0,0 +1 @@\n+x\n"
    dotdot = "diff --git a/../../escaped.py b/../../escaped.py\nnew file mode 100644\n--- /dev/null\n" \
             "+++ b/../../escaped.py\n@@ -0,0 +1 @@\n+x\n"
    symlink = ("diff --git a/box/link b/box/link\nnew file mode 120000\n--- /dev/null\n+++ b/box/link\n"
               f"@@ -0,0 +1 @@\n+{tmp_path}\n\\ No newline at end of file\n")
    through = dotdot.replace("../../escaped.py", "box/outside/escaped.py")
    for patch in (absolute, dotdot, symlink, through):
        result = evaluator.test_feature(task, 1, patch)
        assert not result.passed and result.error.startswith("patch rejected"), result
    pair = evaluator.evaluate(task, 1, 2, dotdot, _agent_patch(evaluator, task, "def f():\n    return 1\n"))
    assert pair.merge.apply_status == {"agent1": "rejected", "agent2": "applied"}
    assert pair.merge.status == "missing_input" and "contains '..'" in pair.merge.rejected["agent1"][0]
    assert not pair.both_passed and not target.exists()


def test_infinite_loop_is_killed_at_the_time_limit(evaluator, task):
    start = time.monotonic()
    kept = len(VERDICTS)
    result = evaluator.test_feature(task, 1, _agent_patch(evaluator, task, "def f():\n    while True:\n        pass\n"))
    assert result.timed_out and not result.passed and result.exit_code is None
    assert len(VERDICTS) == kept  # a run the time limit stopped is no verdict on the code: never reused
    assert time.monotonic() - start < LIMITS.timeout_s + 10
    assert "killed at the time limit" in result.summary()


def test_children_left_behind_are_killed(evaluator, task):
    code = ("import os, subprocess\n\n\ndef f():\n"
            "    subprocess.Popen(['sleep', '41.25'], start_new_session=True)\n"
            "    if os.fork() == 0:\n"
            "        os.setsid()\n"
            "        os.execvp('sleep', ['sleep', '42.25'])\n"
            "    return 1\n")
    start = time.monotonic()
    result = evaluator.test_feature(task, 1, _agent_patch(evaluator, task, code))
    assert result.passed, result.output_tail
    assert time.monotonic() - start < LIMITS.timeout_s  # it did not wait for the children
    time.sleep(0.2)
    assert _processes_with("41.25") == [] and _processes_with("42.25") == []


def test_output_flood_is_cut_off(evaluator, task):
    # pytest captures the prints and replays them when the test fails: 20 MB onto the pipe.
    code = "def f():\n    for _ in range(20000):\n        print('x' * 1000)\n    return 0\n"
    result = evaluator.test_feature(task, 1, _agent_patch(evaluator, task, code))
    assert result.output_limited and not result.passed
    assert "killed: output limit" in result.summary()
    flood = sandbox.run(["yes"], Path("/tmp"), LIMITS, {"PATH": "/usr/bin:/bin"}, writable=[])
    assert flood.output_limited and len(flood.output) <= LIMITS.max_output_bytes


def test_network_is_unreachable_from_tests(evaluator, task):
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    accepted: list[object] = []
    server.settimeout(0.1)
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    socket.create_connection(("127.0.0.1", port), timeout=2).close()  # reachable from here
    time.sleep(0.3)
    accepted.clear()
    code = (f"import socket\n\n\ndef f():\n    socket.create_connection(('127.0.0.1', {port}), timeout=2).close()\n"
            "    return 1\n")
    result = evaluator.test_feature(task, 1, _agent_patch(evaluator, task, code))
    time.sleep(0.3)
    stop.set()
    thread.join()
    server.close()
    assert not result.passed and accepted == []
    reason = "Network is unreachable" if CAPS.namespaces else "network access is disabled"
    assert reason in result.output_tail


def test_memory_limit(evaluator, task):
    code = "def f():\n    block = bytearray(3 * 2**30)\n    return 1 if block else 1\n"
    result = evaluator.test_feature(task, 1, _agent_patch(evaluator, task, code))
    assert not result.passed and "MemoryError" in result.output_tail


def test_writes_outside_the_run_directories(evaluator, task, tmp_path):
    escaped = tmp_path / "written-by-test.txt"
    code = f"def f():\n    open({str(escaped)!r}, 'w').write('x')\n    return 1\n"
    result = evaluator.test_feature(task, 1, _agent_patch(evaluator, task, code))
    # With namespaces the filesystem is read-only outside the run's directories.
    assert escaped.exists() == (not CAPS.namespaces)
    assert result.passed == (not CAPS.namespaces)
    if CAPS.private_root:  # the host's folder is not even in the view
        assert "No such file or directory" in result.output_tail
    elif CAPS.namespaces:
        assert "Read-only file system" in result.output_tail


def test_process_count_limit(evaluator, task):
    code = ("import os, time\n\n\ndef f():\n    for _ in range(100):\n        if os.fork() == 0:\n"
            "            time.sleep(3)\n            os._exit(0)\n    return 1\n")
    result = evaluator.test_feature(task, 1, _agent_patch(evaluator, task, code))
    assert result.passed == (CAPS.pids_cgroup is None)
    if CAPS.pids_cgroup is not None:
        assert "Resource temporarily unavailable" in result.output_tail


def test_trusted_commands_lose_their_escaped_children_too(tmp_path):
    command = ["bash", "-c", "setsid sleep 44.25 & sleep 0.3; exit 0"]
    result = sandbox.run(command, tmp_path, LIMITS, {"PATH": os.environ["PATH"]})
    assert result.exit_code == 0 and result.leftovers_killed == 1
    time.sleep(0.2)
    assert _processes_with("44.25") == []


def test_capabilities_are_described():
    text = CAPS.describe()
    assert "network" in text and "filesystem" in text and "process count" in text


def test_fallbacks_without_namespaces(evaluator, task, monkeypatch):
    """Where namespaces are not permitted: a Python socket guard, and the /proc marker scan for children."""
    monkeypatch.setattr(sandbox, "capabilities", lambda: sandbox.Capabilities(namespaces=False, pids_cgroup=None))
    code = ("import socket\n\n\ndef f():\n    socket.create_connection(('192.0.2.1', 80), timeout=2).close()\n"
            "    return 1\n")
    result = evaluator.test_feature(task, 1, _agent_patch(evaluator, task, code))
    assert not result.passed and "network access is disabled in the simpop sandbox" in result.output_tail
    command = ["bash", "-c", "setsid sleep 45.25 & sleep 0.3; exit 0"]
    escaped = sandbox.run(command, Path("/tmp"), LIMITS, {"PATH": os.environ["PATH"]}, writable=[])
    assert escaped.exit_code == 0 and escaped.leftovers_killed == 1
    time.sleep(0.2)
    assert _processes_with("45.25") == []
