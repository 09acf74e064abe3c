"""``--ray-address`` joins a real two-node Ray cluster on loopback (a head and a second node started here with
``ray start``, shared by the tests in this order): a killed driver takes its workers with it and ``--resume``
finishes the run; asking for more workers than the cluster holds is a clear error, not a hang; and a run whose
worker node dies mid-run finishes with every update: the lost wave runs in the driver, the node's slot is dropped
when no replacement can start, and the metrics count it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

pytest.importorskip("ray")

RAY = str(Path(sys.executable).with_name("ray"))
SRC = str(Path(__file__).resolve().parents[1] / "src")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pids(*markers: str) -> list[int]:
    """Processes whose command line holds one of ``markers`` (this cluster's temp dir and ports)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if any(m in cmdline for m in markers):
                found.append(int(entry.name))
    return found


def _kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@contextlib.contextmanager
def _cluster():
    """A head (1 CPU) and a second node (1 CPU, its own node-manager port) on 127.0.0.1; stopped by killing exactly
    the processes of this cluster (``ray stop`` would stop every Ray on the machine)."""
    temp = f"/tmp/ray-{uuid.uuid4().hex[:8]}"
    port, node_port = _free_port(), _free_port()
    env = {**os.environ, "PYTHONPATH": SRC, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
           "OMP_NUM_THREADS": "1"}
    markers = (temp, f":{port} ", f"node_manager_port={node_port}", f"--gcs-address=127.0.0.1:{port}")
    common = ["--node-ip-address", "127.0.0.1", "--num-cpus", "1", "--disable-usage-stats"]
    try:
        subprocess.run([RAY, "start", "--head", "--port", str(port), "--include-dashboard", "false",
                        "--dashboard-port", str(_free_port()), "--ray-client-server-port", str(_free_port()),
                        "--temp-dir", temp, *common], env=env, check=True, capture_output=True, timeout=120)
        subprocess.run([RAY, "start", "--address", f"127.0.0.1:{port}", "--node-manager-port", str(node_port),
                        *common], env=env, check=True, capture_output=True, timeout=120)
        yield env, f"127.0.0.1:{port}", node_port
    finally:
        _kill(_pids(*markers))


@pytest.fixture(scope="module")
def two_nodes():
    """One cluster for the tests that leave it whole."""
    with _cluster() as cluster:
        yield cluster


def test_a_killed_driver_takes_its_workers_with_it_and_the_run_resumes(two_nodes, tmp_path):
    env, address, _ = two_nodes
    run = tmp_path / "run"
    argv = [sys.executable, "-m", "simpop.cli", "train", "grpo", "--env", "simpop/PersuasionAct-v0", "--updates", "8",
            "--out", str(run), "--no-progress", "--threads", "1", "--ray", "--ray-address", address,
            "--ray-workers", "2", "--ray-worker-cpus", "1"]
    before = set(_pids("ray::RolloutWorker"))
    driver = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    metrics = run / "metrics.jsonl"
    deadline = time.monotonic() + 180
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
        assert driver.poll() is None and time.monotonic() < deadline, "the run did not start on the cluster"
        time.sleep(0.1)
    mine = set(_pids("ray::RolloutWorker")) - before
    assert mine, "no rollout workers started on the cluster"
    driver.kill()  # SIGKILL: no cleanup runs in the driver
    driver.wait()
    deadline = time.monotonic() + 60
    while mine & set(_pids("ray::RolloutWorker")):  # Ray ends the actors a dead driver owned
        assert time.monotonic() < deadline, "the killed driver's Ray workers are still running"
        time.sleep(0.5)
    done = subprocess.run([*argv, "--resume"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
    assert steps == list(range(1, 9))  # resumed from the last checkpoint: every update once


def test_more_workers_than_the_cluster_holds_is_a_clear_error(two_nodes, tmp_path):
    env, address, _ = two_nodes
    # The third worker never starts: the run waits WORKER_START_S for it (5 s, not 60). On a machine too busy to
    # start even the first two in 5 s the error is the same one.
    code = ("import sys, simpop.rollout_ray as r; r.WORKER_START_S = 5.0; from simpop.cli import main; "
            "sys.exit(main(sys.argv[1:]))")
    done = subprocess.run([sys.executable, "-c", code, "train", "grpo", "--env", "simpop/PersuasionAct-v0",
                           "--updates", "1", "--out", str(tmp_path / "run"), "--no-progress", "--ray", "--ray-address",
                           address, "--ray-workers", "3", "--ray-worker-cpus", "1"],
                          env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("simpop train grpo: error: the Ray cluster started ") and "of 3 rollout workers" in line
    assert "lower --ray-workers" in line and not (tmp_path / "run" / "metrics.jsonl").exists()


def test_training_joins_the_cluster_and_survives_a_dead_worker_node(tmp_path):
    with _cluster() as cluster:  # its own: the node it kills stays dead
        _train_through_a_dead_node(*cluster, tmp_path)


def _train_through_a_dead_node(env, address, node_port, tmp_path):
    run = tmp_path / "run"
    # The driver is its own process (it joins the cluster); workers may take 15 s to start, not 60. Each update
    # waits 1 s before its rollouts, so the node dies while updates remain however fast this machine steps.
    code = ("import sys, time, simpop.rollout_ray as r; r.WORKER_START_S = 15.0; run = r.RayRolloutEngine.run_waves; "
            "r.RayRolloutEngine.run_waves = lambda self, waves: (time.sleep(1.0), run(self, waves))[1]; "
            "from simpop.cli import main; sys.exit(main(sys.argv[1:]))")
    driver = subprocess.Popen([sys.executable, "-c", code, "train", "grpo", "--env", "simpop/PersuasionAct-v0",
                               "--updates", "12", "--out", str(run), "--no-progress", "--threads", "1",
                               "--ray", "--ray-address", address, "--ray-workers", "2", "--ray-worker-cpus", "1"],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        metrics = run / "metrics.jsonl"
        deadline = time.monotonic() + 180
        while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 2):
            assert driver.poll() is None and time.monotonic() < deadline, "the run did not start on the cluster"
            time.sleep(0.2)
        # The second node dies: its raylet and the worker processes it started.
        raylet = [p for p in _pids(f"node_manager_port={node_port}") if "raylet" in Path(f"/proc/{p}/comm").read_text()]
        assert raylet, "the second node's raylet is not running"
        children = [int(p) for r in raylet for p in Path(f"/proc/{r}/task/{r}/children").read_text().split()]
        _kill(raylet + children)
        assert len(metrics.read_text().splitlines()) < 12, "the run ended before the node died"
        output, _ = driver.communicate(timeout=240)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert driver.returncode == 0, output[-3000:]
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, 13))  # no update lost or repeated
    assert records[-1]["ray_fallback_waves"] >= 1, output[-3000:]  # the lost wave ran in the driver, counted
    assert "Ray worker 1 failed" in output and "could not be replaced" in output
