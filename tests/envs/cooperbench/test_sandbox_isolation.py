"""Issue 18 item 3: what sandboxed test code can read, and how much it can write.

The original probes: test code read host files and every process's ``/proc/*/cmdline`` (the PID
namespace had no private ``/proc``) and that output went back to the model; 8 x 60 MB were
written in 3 s with no total quota. Where this machine refuses the private root, the tests check
that the refusal is explicit (``Capabilities.refused`` and ``describe()``).
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from simpop.envs.cooperbench import sandbox
from simpop.envs.cooperbench.evaluator import Evaluator
from tests.envs.cooperbench.test_containment import _agent_patch, task  # noqa: F401 (fixture)

CAPS = sandbox.capabilities()
ENV = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"}
QUOTA = 128 * 2**20
LIMITS = sandbox.Limits(timeout_s=30.0, memory_bytes=2 * 2**30, max_disk_bytes=QUOTA, max_processes=64)


@pytest.fixture(scope="module")
def evaluator() -> Evaluator:
    return Evaluator(LIMITS)


@pytest.fixture
def host_secret(tmp_path_factory):
    """A file outside every sandbox directory, and a host process with a secret on its command line."""
    token = f"SECRET-{uuid.uuid4().hex}"
    secret = tmp_path_factory.mktemp("host-only") / "secret.txt"
    secret.write_text(token)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", token])
    yield token, secret
    proc.kill()
    proc.wait()


def test_private_root_is_available_or_its_refusal_is_explicit():
    if not CAPS.private_root:
        assert CAPS.refused and "refused here" in CAPS.describe()
    else:
        assert "private read-only root" in CAPS.describe() and "its own /proc" in CAPS.describe()


def test_sandbox_cannot_read_host_files_or_other_processes(host_secret, tmp_path):
    token, secret = host_secret
    probe = (f"cat /proc/1/cmdline; cat /proc/[0-9]*/cmdline; cat /proc/[0-9]*/environ; cat {secret}; "
             "cat /etc/shadow; ls /root /home; ls /proc | grep -c '^[0-9]'")
    result = sandbox.run(["bash", "-c", probe], tmp_path, LIMITS, ENV, writable=[tmp_path])
    if CAPS.private_root:
        assert token not in result.output
        assert f"{secret}: No such file or directory" in result.output
        assert int(result.output.split()[-1]) < 10  # only the run's own processes
    else:  # the older guard: reads are not restricted, and describe() says so
        assert token in result.output and "reads not restricted" in CAPS.describe()


def test_model_written_tests_cannot_leak_host_files_or_command_lines(evaluator, task, host_secret):  # noqa: F811
    token, secret = host_secret
    code = ("import glob\n\n\ndef f():\n    found = []\n"
            "    for path in glob.glob('/proc/[0-9]*/cmdline') + [" + repr(str(secret)) + "]:\n"
            "        try:\n            found.append(open(path, 'rb').read().decode(errors='replace'))\n"
            "        except OSError as exc:\n            found.append(str(exc))\n"
            "    raise AssertionError(' | '.join(found))\n")
    result = evaluator.test_feature(task, 1, _agent_patch(evaluator, task, code))
    assert not result.passed and "AssertionError" in result.output_tail
    assert (token in result.output_tail) == (not CAPS.private_root)


def test_disk_quota_stops_eight_60mb_files(tmp_path):
    script = "for i in 1 2 3 4 5 6 7 8; do head -c 62914560 /dev/zero > big$i || exit 3; done"
    result = sandbox.run(["bash", "-c", script], tmp_path, LIMITS, ENV, writable=[tmp_path])
    if CAPS.disk_quota:
        assert result.exit_code == 3 and result.disk_full and not result.ok
        assert "No space left on device" in result.output and "disk quota" in result.describe()
        assert result.disk_used_bytes is not None and result.disk_used_bytes <= QUOTA
        assert list(tmp_path.iterdir()) == []  # the overlay was discarded: nothing reached the host
    else:
        assert "no total limit" in CAPS.describe()


def test_disk_quota_covers_tmp_and_dev_shm(tmp_path):
    script = ("head -c 100000000 /dev/zero > /tmp/a; head -c 100000000 /dev/zero > /dev/shm/b; "
              "head -c 100000000 /dev/zero > c; du -cb /tmp/a /dev/shm/b c | tail -1")
    result = sandbox.run(["bash", "-c", script], tmp_path, LIMITS, ENV, writable=[tmp_path])
    if CAPS.private_root:
        assert result.disk_full and int(result.output.split()[-2]) <= QUOTA


def test_quota_in_the_evaluator_fails_the_feature_and_says_so(evaluator, task):  # noqa: F811
    code = ("import os, tempfile\n\n\ndef f():\n    for i in range(8):\n"
            "        with open(os.path.join(tempfile.gettempdir(), f'big{i}'), 'wb') as fh:\n"
            "            fh.write(b'0' * 60 * 2**20)\n    return 1\n")
    result = evaluator.test_feature(task, 1, _agent_patch(evaluator, task, code))
    if CAPS.disk_quota:
        assert not result.passed and result.disk_full
        assert "disk quota" in result.error and "disk quota exhausted" in result.summary()
        assert "No space left on device" in result.output_tail


def test_quota_hit_that_the_test_swallows_still_fails(evaluator, task):  # noqa: F811
    code = ("import os\n\n\ndef f():\n    try:\n        for i in range(8):\n"
            "            with open(f'/tmp/big{i}', 'wb') as fh:\n                fh.write(b'0' * 60 * 2**20)\n"
            "    except OSError:\n        pass\n    return 1\n")
    result = evaluator.test_feature(task, 1, _agent_patch(evaluator, task, code))
    assert result.passed == (not CAPS.disk_quota)
    if CAPS.disk_quota:
        assert result.disk_full and result.tests_passed == 1


def test_outputs_are_written_through_and_the_rest_is_discarded(tmp_path):
    record = tmp_path / "record.txt"
    result = sandbox.run(["bash", "-c", "echo kept >> record.txt && echo gone > other && cat other"], tmp_path,
                         LIMITS, ENV, writable=[tmp_path], outputs=[record])
    assert result.exit_code == 0 and result.output == "gone\n"
    assert record.read_text() == "kept\n"
    assert (tmp_path / "other").exists() == (not CAPS.disk_quota)


def test_readable_paths_are_visible_read_only(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "data.txt").write_text("visible")
    work = tmp_path / "work"
    work.mkdir()
    result = sandbox.run(["bash", "-c", f"cat {shared}/data.txt; echo; echo x > {shared}/new"], work, LIMITS, ENV,
                         writable=[work], readable=[shared])
    assert result.output.startswith("visible\n") and "Read-only file system" in result.output
    assert not (shared / "new").exists()


def test_the_older_guard_is_used_and_described_when_the_private_root_is_refused(tmp_path, monkeypatch):
    older = sandbox.Capabilities(namespaces=True, pids_cgroup=None, refused="private root (mount proc: refused)")
    monkeypatch.setattr(sandbox, "capabilities", lambda: older)
    assert "reads not restricted" in older.describe() and "refused here: private root" in older.describe()
    result = sandbox.run(["bash", "-c", "echo hi > kept; touch /usr/x"], tmp_path, LIMITS, ENV, writable=[tmp_path])
    assert (tmp_path / "kept").read_text() == "hi\n" and "Read-only file system" in result.output
    assert result.disk_used_bytes is None and not result.disk_full
