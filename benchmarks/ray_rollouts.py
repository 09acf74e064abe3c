"""Ray rollout workers vs the local rollout engine, side by side in one run.

1. **Act level**: one update's rollouts of the collapse experiment (P4G act level, 8 scenarios x 8
   dialogues, 10 turns, the verbalized persuadee; then a 4x larger batch) collected by the local engine (one
   wave, and two half waves) and by :class:`~simpop.rollout_ray.RayRolloutEngine` with 1 and 2 workers (half
   waves: the 2 workers run one each). Measurements are interleaved (engine after engine, round after round)
   so that a busy machine slows every engine alike; the median per engine is reported as updates/s (rollout
   collections of one update's batch per second), with ratios of medians and of best rounds (on a machine
   that other work keeps busy, the best round is the nearest to an idle one). The 2-worker and 1-worker
   engines and the local engine with the same waves return identical trajectories (checked).
2. **Text level**: P4G text dialogues whose policy is an OpenAI-compatible server (``simpop serve --model
   smollm2`` started here as a subprocess, or ``--server-url URL --server-model NAME``), with 1 and 2
   workers; every worker sends its wave's turns to the server concurrently.

Run: ``python benchmarks/ray_rollouts.py`` (``--rounds``, ``--batch``, ``--skip-text``, ``--server-url``).
The Ray cluster is local, ``--ray-cpus`` logical CPUs (enough for all actors at once; the machine's
cores are what they share).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import ray  # noqa: E402
import torch  # noqa: E402

import simpop  # noqa: E402
from simpop.agents.policy import ActPolicy  # noqa: E402
from simpop.experiments.conditions import CollapseConfig  # noqa: E402
from simpop.rollout import RolloutEngine  # noqa: E402
from simpop.rollout_ray import RayConfig, RayRolloutEngine  # noqa: E402
from simpop.simulators.registry import build_simulator  # noqa: E402

ACT_ENV, TEXT_ENV = "simpop/PersuasionAct-v0", "simpop/Persuasion-v1"


def _key(trajectories) -> list:
    return [(t.seed, t.simulator, t.actions, t.rewards) for t in trajectories]


def _interleaved(engines: dict, collect, rounds: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in engines}
    for r in range(rounds):
        for name, engine in engines.items():
            start = time.perf_counter()
            collect(engine, r)
            times[name].append(time.perf_counter() - start)
    return times


def _report(title: str, times: dict[str, list[float]], ratios: list[tuple[str, str, str]]) -> None:
    rate = {name: 1.0 / statistics.median(ts) for name, ts in times.items()}
    print(f"\n== {title}")
    for name, ts in times.items():
        print(f"  {name:<34} {rate[name]:7.3g} updates/s  (median {statistics.median(ts) * 1e3:7.1f} ms, "
              f"min {min(ts) * 1e3:7.1f} ms, {len(ts)} rounds)")
    best = {name: 1.0 / min(ts) for name, ts in times.items()}
    for label, a, b in ratios:
        print(f"  {label:<48} {rate[a] / rate[b]:5.2f}x median, {best[a] / best[b]:5.2f}x best round")


def act_level(rounds: int, batch: tuple[int, int], max_turns: int) -> None:
    scenarios, group = batch
    size = scenarios * group
    spec = f"verbalized:persuadee?temperature=1.0&floor={CollapseConfig().verbalized_floor!r}"
    env = simpop.make(ACT_ENV, max_turns=max_turns)
    policy = ActPolicy.for_env(env, seed=0)
    kwargs = {"max_turns": max_turns}
    half = -(-size // 2)

    def ray_engine(workers: int) -> RayRolloutEngine:
        return RayRolloutEngine(ACT_ENV, policy, build_simulator(spec, env), half, kwargs, simulator_spec=spec,
                                config=RayConfig(ray=True, ray_workers=workers, ray_worker_cpus=1.0))

    engines = {"local, one wave": RolloutEngine(ACT_ENV, policy, build_simulator(spec, env), None, kwargs),
               f"local, waves of {half}": RolloutEngine(ACT_ENV, policy, build_simulator(spec, env), half, kwargs),
               "ray, 1 worker": ray_engine(1), "ray, 2 workers": ray_engine(2)}
    same = {name: _key(e.collect(scenarios, group, seed=123)) for name, e in engines.items()}  # also warms up
    identical = same["ray, 1 worker"] == same["ray, 2 workers"] == same[f"local, waves of {half}"]
    times = _interleaved(engines, lambda e, r: e.collect(scenarios, group, seed=r), rounds)
    _report(f"act level: {size} dialogues per update ({scenarios} scenarios x {group}), {max_turns} turns, {spec}",
            times, [("ray 2 workers / ray 1 worker (target >= 1.6)", "ray, 2 workers", "ray, 1 worker"),
                    ("ray 2 workers / local one wave", "ray, 2 workers", "local, one wave"),
                    (f"ray 2 workers / local waves of {half}", "ray, 2 workers", f"local, waves of {half}")])
    print(f"  trajectories identical (ray 1 worker, ray 2 workers, local waves of {half}): {identical}")
    for e in engines.values():
        if isinstance(e, RayRolloutEngine):
            e.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: str, timeout_s: float = 300.0) -> tuple[subprocess.Popen, str]:
    """``simpop serve --model MODEL`` on a free loopback port; waits until it answers ``/v1/models``."""
    import httpx

    port = _free_port()
    log = open(Path(os.environ.get("TMPDIR", "/tmp")) / f"ray_rollouts_serve_{port}.log", "w")
    process = subprocess.Popen([sys.executable, "-m", "simpop.cli", "serve", "--model", model, "--port", str(port),
                                "--threads", "1"], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"simpop serve exited with {process.returncode}; see {log.name}")
        try:
            if httpx.get(f"{url}/models", timeout=2).status_code == 200:
                return process, url
        except httpx.HTTPError:
            pass
        time.sleep(1)
    process.terminate()
    raise RuntimeError(f"simpop serve did not answer within {timeout_s:.0f} s; see {log.name}")


def text_level(rounds: int, url: str | None, model: str, dialogues: int, max_turns: int, tokens: int) -> None:
    from simpop.agents.base import SamplingParams
    from simpop.evaluation.policies import load_policy

    server = None
    if url is None:
        print(f"\nstarting simpop serve --model {model} ...", flush=True)
        server, url = start_server(model)
    try:
        spec = "persuadee?temperature=1.0"
        env = simpop.make(TEXT_ENV, max_turns=max_turns)
        policy = load_policy(f"openai:{url}#{model}", env, env_id=TEXT_ENV,
                             sampling=SamplingParams(max_new_tokens=tokens, temperature=1.0))
        kwargs = {"max_turns": max_turns}
        half = -(-dialogues // 2)
        engines = {f"ray, {w} worker{'s' * (w > 1)}": RayRolloutEngine(
            TEXT_ENV, policy, build_simulator(spec, env), half, kwargs, simulator_spec=spec,
            config=RayConfig(ray=True, ray_workers=w, ray_worker_cpus=1.0)) for w in (1, 2)}
        for e in engines.values():
            e.collect(dialogues, 1, seed=0)  # warm up (model caches, connections)
        times = _interleaved(engines, lambda e, r: e.collect(dialogues, 1, seed=1 + r), rounds)
        _report(f"text level: {dialogues} dialogues per update, {max_turns} turns, policy openai:{url}#{model} "
                f"({tokens} new tokens a turn), simulator {spec}", times,
                [("ray 2 workers / ray 1 worker", "ray, 2 workers", "ray, 1 worker")])
        for name, e in engines.items():
            print(f"  {name}, last update: {e.stats.policy_s:.1f} s in policy calls (the server), "
                  f"{e.stats.simulator_s:.1f} s in simulator calls, summed over workers; {e.stats.total_s:.1f} s wall")
        print("  (one server generates for every worker: on a CPU-bound server the workers mostly wait on it)")
        for e in engines.values():
            e.close()
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15, help="timed collections per engine (act level)")
    parser.add_argument("--batch", type=int, nargs=2, action="append", metavar=("SCENARIOS", "GROUP"),
                        help="an update's batch, repeatable (default: the collapse experiment's act level, 8 x 8, "
                             "and a 4x larger one, 16 x 16)")
    parser.add_argument("--max-turns", type=int, default=10)
    parser.add_argument("--ray-cpus", type=int, default=3, help="logical CPUs of the local Ray cluster")
    parser.add_argument("--skip-text", action="store_true", help="only the act level")
    parser.add_argument("--server-url", help="an OpenAI-compatible server (e.g. vLLM) instead of starting simpop serve")
    parser.add_argument("--server-model", default="smollm2", help="the model to serve / the server's model id")
    parser.add_argument("--text-rounds", type=int, default=3)
    parser.add_argument("--text-dialogues", type=int, default=8)
    parser.add_argument("--text-max-turns", type=int, default=2)
    parser.add_argument("--text-tokens", type=int, default=24)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"{os.cpu_count()} CPU cores, load average {os.getloadavg()[0]:.1f}; ray {ray.__version__}, "
          f"local cluster of {args.ray_cpus} logical CPUs")
    ray.init(num_cpus=args.ray_cpus, include_dashboard=False, log_to_driver=False)
    try:
        for batch in args.batch or [(8, 8), (16, 16)]:
            act_level(args.rounds, tuple(batch), args.max_turns)
        if not args.skip_text:
            text_level(args.text_rounds, args.server_url, args.server_model, args.text_dialogues,
                       args.text_max_turns, args.text_tokens)
    finally:
        ray.shutdown()
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
