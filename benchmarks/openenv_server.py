"""OpenEnv server overhead per step vs ``env.step`` in process, and steps/s with 1, 8 and 32 sessions, one run.

The act-level P4G env (``simpop/PersuasionAct-v0``) with the native persuadee in the user seat, a fixed
cycle of acts for the policy. In process: the single-agent view (:class:`~simpop.envs.wrappers.UserSeat`)
stepped directly, the same work the server does per step (the env, then the simulator's reply). Over the
network: ``simpop openenv serve`` in a child process on loopback, driven by OpenEnv's own client
(:class:`~simpop.integrations.openenv_client.SimpopEnvClient`), one WebSocket session per concurrent
episode stream. Overhead = (seconds per step over the network with one session) - (seconds per step in
process); the goal is <= 2 ms. On a shared, oversubscribed CPU the wall-clock figure mostly measures waiting for
a core, so the CPU time the client and server processes spend per step (load-independent; on an idle machine
the wall time per step is about that) is printed beside it. Steps/s count policy steps (resets excluded) over
a fixed wall time::

    nice -n 19 .venv/bin/python benchmarks/openenv_server.py [--seconds 3] [--sessions 1 8 32]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import time

ENV = "simpop/PersuasionAct-v0"
ACTS = [3, 5, 1, 13, 2, 0, 7, 9, 4, 6, 8, 10, 11, 12]


def in_process(seconds: float) -> float:
    """Seconds per policy step of the UserSeat view, stepped directly."""
    import simpop.envs  # noqa: F401
    from simpop.envs.registration import make
    from simpop.envs.wrappers import UserSeat
    from simpop.simulators.registry import build_simulator

    env = make(ENV)
    seat = UserSeat(env, build_simulator("persuadee", env=env))
    steps, busy, episode = 0, 0.0, 0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        seat.reset(seed=episode)
        done, k = False, 0
        while not done:
            t0 = time.perf_counter()
            _, _, terminated, truncated, _ = seat.step(ACTS[k % len(ACTS)])
            busy += time.perf_counter() - t0
            done, k, steps = terminated or truncated, k + 1, steps + 1
        episode += 1
    return busy / steps


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far (Linux /proc)."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def over_network(url: str, sessions: int, seconds: float) -> tuple[float, float]:
    """(policy steps/s over all sessions, mean seconds per step of one session's step calls)."""
    from simpop.integrations.openenv_client import SimpopEnvClient

    counts, busy = [0] * sessions, [0.0] * sessions
    deadline = time.perf_counter() + seconds

    async def stream(i: int) -> None:
        async with SimpopEnvClient(base_url=url, message_timeout_s=120.0) as env:
            episode = 0
            while time.perf_counter() < deadline:
                result = await env.reset(seed=i * 100_000 + episode)
                k = 0
                while not result.done:
                    t0 = time.perf_counter()
                    result = await env.step(ACTS[k % len(ACTS)])
                    busy[i] += time.perf_counter() - t0
                    counts[i] += 1
                    k += 1
                episode += 1

    start = time.perf_counter()
    await asyncio.gather(*(stream(i) for i in range(sessions)))
    elapsed = time.perf_counter() - start
    return sum(counts) / elapsed, sum(busy) / max(1, sum(counts))


def start_server(max_sessions: int) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "simpop.cli", "openenv", "serve", "--env", ENV, "--simulator", "persuadee",
           "--port", "0", "--max-sessions", str(max_sessions)]
    process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={**os.environ, "OMP_NUM_THREADS": "1"})
    for line in process.stdout:
        match = re.search(r"at (http://\S+) ", line)
        if match:
            return process, match.group(1)
    raise RuntimeError(f"the server did not start: {process.wait()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="wall time of each measurement")
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 8, 32])
    args = parser.parse_args()
    local = in_process(args.seconds)
    process, url = start_server(max(args.sessions))
    try:
        cpu0, server0 = time.process_time(), cpu_seconds(process.pid)
        t0 = time.perf_counter()
        rate, _ = asyncio.run(over_network(url, 1, args.seconds))
        steps = rate * (time.perf_counter() - t0)
        cpu_per_step = (time.process_time() - cpu0 + cpu_seconds(process.pid) - server0) / steps
        rows = {n: asyncio.run(over_network(url, n, args.seconds)) for n in args.sessions}
    finally:
        process.terminate()
        process.wait()
    one_step = rows[args.sessions[0]][1] if args.sessions[0] == 1 else asyncio.run(over_network(url, 1, 1.0))[1]
    print(f"{ENV}, native persuadee, {args.seconds:g} s per measurement, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f} (a shared CPU inflates the network figures)")
    print(f"in process (UserSeat.step): {local * 1e3:.3f} ms/step = {1 / local:,.0f} steps/s")
    print(f"over OpenEnv, 1 session:    {one_step * 1e3:.3f} ms/step; server overhead "
          f"{(one_step - local) * 1e3:.3f} ms/step (goal <= 2 ms)")
    print(f"over OpenEnv, CPU time:     {cpu_per_step * 1e3:.3f} ms/step (client + server processes); CPU "
          f"overhead {(cpu_per_step - local) * 1e3:.3f} ms/step")
    for n, (rate, per_step) in rows.items():
        print(f"  {n:3d} concurrent sessions: {rate:8,.0f} steps/s ({rate * local:.2f}x one in-process stream); "
              f"{per_step * 1e3:.2f} ms per step call")
    print(json.dumps({"in_process_ms": local * 1e3, "overhead_ms": (one_step - local) * 1e3,
                      "cpu_overhead_ms": (cpu_per_step - local) * 1e3,
                      "steps_per_s": {str(n): r for n, (r, _) in rows.items()}}))


if __name__ == "__main__":
    main()
