"""The OpenEnv server at training scale, side by side in one run (``simpop openenv serve`` in child processes on
loopback, driven by OpenEnv's own client, :class:`~simpop.integrations.openenv_client.SimpopEnvClient`, one
WebSocket session per concurrent episode stream). Steps/s count policy steps (resets excluded): at the act level over
a fixed wall time; with a text user each session plays a fixed number of seeded episodes (``--episodes``,
``--served-episodes``), so both servers of a comparison do the same work, and steps/s is steps over the time to the
last reply. Four parts (``--parts``):

- ``overhead``: act level (``simpop/PersuasionAct-v0``, native persuadee, a fixed cycle of acts): seconds per step
  over the network with one session minus in process (:class:`~simpop.envs.wrappers.UserSeat` stepped directly;
  goal <= 2 ms), with the CPU time the client and server processes spend per step beside it (load-independent);
  steps/s at 1, 8 and 32 sessions.
- ``text``: ``simpop/Persuasion-v0`` (3 turns) with a SmolLM2 user in process (``frozen:smollm2``, 24 new tokens),
  steps/s at 1, 8 and 32 sessions: batched across sessions with the model's prefix cache (the default) vs one reply
  at a time reading each prompt whole (``--max-batch 1 --prefix-cache-mb 0``, the server before batching).
- ``served``: the same env with a served user (``frozen:openai:...``): a loopback OpenAI-compatible server that
  answers every request after a fixed 200 ms; concurrent calls (the default) vs one at a time (``--max-inflight 1``,
  the server's former global lock).
- ``scale``: act level with 1,024 concurrent sessions, each waiting ``--think`` seconds (a policy generating) before
  each step: the share of sessions that completed an episode, refusals, and the median and p99 latency a step
  call adds to the in-process step; then 64 sessions without think time (the server's throughput). With 1 and
  2 worker processes (``--workers``).

::

    nice -n 19 .venv/bin/python benchmarks/openenv_server.py [--parts overhead text served scale] [--seconds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

ACT_ENV, TEXT_ENV = "simpop/PersuasionAct-v0", "simpop/Persuasion-v0"
ACTS = [3, 5, 1, 13, 2, 0, 7, 9, 4, 6, 8, 10, 11, 12]
MESSAGE = "Hello! Children in need could use your help. Would you donate part of your payment to Save the Children?"
SMOLLM2_USER = "frozen:smollm2?max_new_tokens=24"


def in_process(seconds: float) -> float:
    """Seconds per policy step of the act-level UserSeat view, stepped directly."""
    import simpop.envs  # noqa: F401
    from simpop.envs.registration import make
    from simpop.envs.wrappers import UserSeat
    from simpop.simulators.registry import build_simulator

    env = make(ACT_ENV)
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


class Run:
    """What one measurement saw: steps, step-call latencies, sessions that finished an episode, errors, and the
    server's CPU seconds meanwhile (where measured)."""

    def __init__(self) -> None:
        self.steps, self.latencies, self.finished, self.errors, self.elapsed, self.cpu = 0, [], 0, [], 0.0, 0.0

    @property
    def rate(self) -> float:
        return self.steps / self.elapsed


async def over_network(url: str, sessions: int, seconds: float, act: bool = True, think_s: float = 0.0,
                       wait: bool = True, episodes: int | None = None, first_seed: int = 0) -> Run:
    """``sessions`` concurrent streams of episodes for ``seconds`` (or exactly ``episodes`` each, however long they
    take); with ``think_s``, each waits about that long before each step (a random phase first). ``wait``: each
    finishes the step under way (else they are dropped at the deadline, and only steps answered by then count)."""
    from simpop.integrations.openenv_client import SimpopEnvClient

    run, start = Run(), time.perf_counter()
    deadline = start + seconds

    async def stream(i: int) -> None:
        try:
            if think_s:
                await asyncio.sleep(random.uniform(0, think_s))
            async with SimpopEnvClient(base_url=url, message_timeout_s=600.0) as env:
                episode = 0
                # seconds=0 (and no episodes): one reset and step
                while (episode < episodes) if episodes else (episode == 0 or time.perf_counter() < deadline):
                    result = await env.reset(seed=first_seed + i * 100_000 + episode)
                    k = 0
                    while not result.done and (episodes or k == 0 or time.perf_counter() < deadline):
                        if think_s:
                            await asyncio.sleep(think_s * random.uniform(0.5, 1.5))
                        t0 = time.perf_counter()
                        result = await env.step(ACTS[k % len(ACTS)] if act else MESSAGE)
                        run.latencies.append(time.perf_counter() - t0)
                        run.steps, k = run.steps + (wait or time.perf_counter() <= deadline), k + 1
                    run.finished += result.done and episode == 0
                    episode += 1
        except Exception as error:  # noqa: BLE001 - counted: a refused or failed session
            run.errors.append(f"{type(error).__name__}: {error}"[:200])

    tasks = [asyncio.ensure_future(stream(i)) for i in range(sessions)]
    if wait:
        await asyncio.gather(*tasks)
    else:
        await asyncio.wait(tasks, timeout=seconds)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    run.elapsed = time.perf_counter() - start if wait else seconds
    return run


def start_server(env: str, simulator: str, *flags: str, threads: int | None = None) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "simpop.cli", "openenv", "serve", "--env", env, "--simulator", simulator,
           "--port", "0", *flags]
    extra = {} if threads is None else {"OMP_NUM_THREADS": str(threads)}
    process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={**os.environ, **extra})
    assert process.stdout is not None
    for line in process.stdout:
        match = re.search(r"at (http://\S+) ", line)
        if match:
            threading.Thread(target=process.stdout.read, daemon=True).start()  # keep its pipe drained
            return process, match.group(1)
    raise RuntimeError(f"the server did not start: {process.wait()}")


def measure(env: str, simulator: str, flags: list[str], sessions: list[int], episodes: int,
            label: str, threads: int | None = None) -> dict[int, Run]:
    """Steps/s with each number of sessions on one server, after a warm-up step (a model's first call is slow): each
    session plays ``episodes`` episodes, seeded by its index and the episode's, so another server given the same
    arguments answers the same dialogues. The server's CPU seconds in the measurement give steps per CPU-second,
    which a machine shared with other work slows less than steps/s."""
    runs = {}
    process, url = start_server(env, simulator, "--max-sessions", str(max(sessions) + 1), *flags, threads=threads)
    try:
        asyncio.run(over_network(url, 1, 0.0, act=False, first_seed=10**8))  # one reset and step, none measured
        for n in sessions:
            cpu = cpu_seconds(process.pid)
            runs[n] = asyncio.run(over_network(url, n, 0.0, act=False, episodes=episodes))
            runs[n].cpu = cpu_seconds(process.pid) - cpu
            print(f"    {label}, {n} sessions: {runs[n].rate:.2f} steps/s ({runs[n].steps} steps in {runs[n].elapsed:.0f} s, "
                  f"{runs[n].steps / max(runs[n].cpu, 0.01):.2f} per server CPU-second)", flush=True)
    finally:
        stop(process)
    return runs


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def fake_openai_server(latency_s: float) -> str:
    """A loopback OpenAI-compatible ``/v1/chat/completions`` that answers every request after ``latency_s``."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def complete(request):
        await request.body()
        await asyncio.sleep(latency_s)
        return JSONResponse({"choices": [{"index": 0, "finish_reason": "stop",
                                          "message": {"role": "assistant", "content": "I am not sure yet."}}]})

    sock = socket.create_server(("127.0.0.1", 0), backlog=1024)
    server = uvicorn.Server(uvicorn.Config(Starlette(routes=[Route("/v1/chat/completions", complete,
                                                                   methods=["POST"])]),
                                           log_level="warning", backlog=1024))
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    return f"http://127.0.0.1:{sock.getsockname()[1]}/v1"


def side_by_side(title: str, rows: dict[str, dict[int, Run]]) -> dict[str, dict[str, float]]:
    (new, new_rows), (old, old_rows) = rows.items()
    print(title)
    for n in new_rows:
        a, b = new_rows[n], old_rows[n]
        print(f"  {n:3d} sessions: {new} {a.rate:7.2f} steps/s, {old} {b.rate:7.2f} steps/s: {a.rate / b.rate if b.rate else float('nan'):5.2f}x"
              + (f"; per server CPU-second {a.steps / a.cpu / (b.steps / b.cpu):5.2f}x" if a.cpu and b.cpu and b.steps else "")
              + (f" (errors: {len(a.errors)} / {len(b.errors)})" if a.errors or b.errors else ""))
    return {name: {str(n): r.rate for n, r in runs.items()} for name, runs in rows.items()}


def main() -> None:
    from simpop.user_input import integer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", nargs="+", choices=["overhead", "text", "served", "scale"],
                        default=["overhead", "text", "served", "scale"])
    parser.add_argument("--seconds", type=float, default=3.0, help="wall time of each act-level measurement")
    parser.add_argument("--episodes", type=integer(1), default=2, help="episodes each session plays in the text part "
                        "(3 steps each)")
    parser.add_argument("--served-episodes", type=integer(1), default=6, help="episodes each session plays in the served "
                        "part (its steps are short: fewer leave the connections' start-up a large share)")
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--torch-threads", type=int, help="OMP_NUM_THREADS of the text servers (default: torch's)")
    parser.add_argument("--scale-sessions", type=int, default=1024)
    parser.add_argument("--think", type=float, default=4.0, help="seconds a scale session waits before each step")
    parser.add_argument("--scale-seconds", type=float, default=150.0, help="wall time of the 1,024 sessions (long "
                        "enough for each to finish an episode)")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # a terminated run stops its servers (their finally)
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the start (a shared CPU inflates the "
          f"wall-clock figures)", flush=True)
    report: dict[str, object] = {}
    local = in_process(args.seconds)
    if "overhead" in args.parts:
        process, url = start_server(ACT_ENV, "persuadee", "--max-sessions", str(max(args.sessions)), threads=1)
        try:
            cpu0, server0 = time.process_time(), cpu_seconds(process.pid)
            one = asyncio.run(over_network(url, 1, args.seconds))
            cpu_per_step = (time.process_time() - cpu0 + cpu_seconds(process.pid) - server0) / one.steps
            rows = {n: asyncio.run(over_network(url, n, args.seconds)) for n in args.sessions}
        finally:
            stop(process)
        one_step = statistics.fmean(one.latencies)
        print(f"act level ({ACT_ENV}, native persuadee): in process {local * 1e3:.3f} ms/step; over OpenEnv, 1 "
              f"session {one_step * 1e3:.3f} ms/step, overhead {(one_step - local) * 1e3:.3f} ms/step (goal <= 2 "
              f"ms); CPU {cpu_per_step * 1e3:.3f} ms/step (client + server), CPU overhead "
              f"{(cpu_per_step - local) * 1e3:.3f} ms/step")
        for n, run in rows.items():
            print(f"  {n:3d} sessions: {run.rate:8,.0f} steps/s")
        report["overhead"] = {"in_process_ms": local * 1e3, "overhead_ms": (one_step - local) * 1e3,
                              "cpu_overhead_ms": (cpu_per_step - local) * 1e3,
                              "steps_per_s": {str(n): r.rate for n, r in rows.items()}}
    if "text" in args.parts:
        report["text"] = side_by_side(
            f"text level ({TEXT_ENV}, 3 turns, {SMOLLM2_USER} in process, {args.episodes} episodes per session):",
            {name: measure(TEXT_ENV, SMOLLM2_USER, ["--env-arg", "max_turns=3", *flags], args.sessions,
                           args.episodes, name, args.torch_threads)
             for name, flags in (("batched", []), ("one at a time", ["--max-batch", "1", "--prefix-cache-mb", "0"]))})
    if "served" in args.parts:
        user = f"frozen:openai:{fake_openai_server(0.2)}#fake?max_new_tokens=24"
        report["served"] = side_by_side(
            f"served user (a loopback OpenAI-compatible server, 200 ms per request; {args.served_episodes} episodes "
            f"per session):",
            {name: measure(TEXT_ENV, user, ["--env-arg", "max_turns=3", *flags], args.sessions, args.served_episodes,
                           name)
             for name, flags in (("concurrent", []), ("one at a time", ["--max-inflight", "1"]))})
    if "scale" in args.parts:
        n, report["scale"] = args.scale_sessions, {}
        for workers in (1, 2):
            process, url = start_server(ACT_ENV, "persuadee", "--max-sessions", str(n), "--max-pending", str(n),
                                        "--workers", str(workers), threads=1)
            try:
                run = asyncio.run(over_network(url, n, args.scale_seconds, think_s=args.think))
                busy = asyncio.run(over_network(url, 64, args.seconds))  # no think time: the servers' throughput
            finally:
                stop(process)
            added = sorted(latency - local for latency in run.latencies)
            p50, p99 = added[len(added) // 2], added[min(len(added) - 1, int(len(added) * 0.99))]
            print(f"act level at scale, {workers} worker(s): {n} concurrent sessions, {args.think:g} s think time, "
                  f"{args.scale_seconds:g} s: {run.finished / n:.1%} completed an episode, {len(run.errors)} errors, "
                  f"{run.rate:,.0f} steps/s; added latency median {p50 * 1e3:.1f} ms, p99 {p99 * 1e3:.1f} ms; "
                  f"64 sessions without think time: {busy.rate:,.0f} steps/s")
            if run.errors:
                print(f"  first error: {run.errors[0]}")
            report["scale"][str(workers)] = {
                "completed": run.finished / n, "errors": len(run.errors), "steps_per_s": run.rate,
                "added_ms_median": p50 * 1e3, "added_ms_p99": p99 * 1e3, "saturated_steps_per_s": busy.rate}
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    print(json.dumps(report))


if __name__ == "__main__":
    main()
