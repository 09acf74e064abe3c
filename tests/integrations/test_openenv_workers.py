"""``simpop openenv serve --workers N``: N processes on one port, each session pinned to the one that accepted it."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys

import psutil
import pytest

pytest.importorskip("openenv", reason="the OpenEnv server needs pip install simpop[openenv]")

import simpop.envs  # noqa: E402,F401
from simpop.cli import main  # noqa: E402
from simpop.envs.registration import make  # noqa: E402
from simpop.envs.wrappers import UserSeat  # noqa: E402
from simpop.integrations.openenv_client import SimpopEnvClient  # noqa: E402
from simpop.simulators.registry import build_simulator  # noqa: E402

ACT = "simpop/PersuasionAct-v0"
ACTS = [3, 5, 1, 13, 2, 0, 7, 9, 4, 6, 8, 10, 11, 12]


def in_process(seed: int) -> list[list[float]]:
    env = make(ACT)
    seat = UserSeat(env, build_simulator("persuadee", env=env))
    observation, _ = seat.reset(seed=seed)
    observations, done, k = [observation.tolist()], False, 0
    while not done:
        observation, _, terminated, truncated, _ = seat.step(ACTS[k % len(ACTS)])
        observations.append(observation.tolist())
        done, k = terminated or truncated, k + 1
    return observations


@pytest.fixture(scope="module")
def two_workers():
    process = subprocess.Popen([sys.executable, "-m", "simpop.cli", "openenv", "serve", "--env", ACT, "--simulator",
                                "persuadee", "--port", "0", "--workers", "2", "--max-sessions", "16"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={**os.environ, "OMP_NUM_THREADS": "1"})
    for line in process.stdout:
        if match := re.search(r"at (http://\S+) .*2 worker processes", line):
            break
    else:
        raise RuntimeError(f"the server did not start: {process.wait()}")
    yield process, match.group(1)
    process.terminate()
    process.wait(timeout=30)


@pytest.mark.slow
def test_sessions_spread_over_the_workers_and_each_plays_its_whole_episode_in_one(two_workers):
    process, url = two_workers
    workers = psutil.Process(process.pid).children()  # the workers (and multiprocessing's resource tracker)
    port = int(url.rsplit(":", 1)[1])

    async def play(seed: int, opened: asyncio.Event, hold: asyncio.Barrier) -> list[list[float]]:
        async with SimpopEnvClient(base_url=url, message_timeout_s=60.0) as env:
            result = await env.reset(seed=seed)
            await hold.wait()  # every session open at once: where do they live?
            opened.set()
            observations, k = [json.loads(result.observation.text)], 0
            while not result.done:
                result = await env.step(ACTS[k % len(ACTS)])
                observations.append(json.loads(result.observation.text))
                k += 1
            return observations

    async def run():
        opened, hold = asyncio.Event(), asyncio.Barrier(17)
        games = [asyncio.ensure_future(play(seed, opened, hold)) for seed in range(16)]
        await hold.wait()
        await opened.wait()
        held = [sum(c.status == psutil.CONN_ESTABLISHED and c.laddr.port == port for c in w.net_connections("tcp"))
                for w in workers]
        return held, await asyncio.gather(*games)

    held, episodes = asyncio.run(run())
    assert sum(held) == 16 and len([n for n in held if n]) == 2, held  # both workers hold sessions
    for seed, observations in enumerate(episodes):
        local = in_process(seed)
        assert len(observations) == len(local) and all(a == pytest.approx(b) for a, b in zip(observations, local))


def test_cotrain_needs_one_worker(capsys):
    assert main(["openenv", "serve", "--env", ACT, "--simulator", "trainable:persuadee", "--cotrain",
                 "--workers", "2", "--port", "0"]) == 2
    assert "use --workers 1" in capsys.readouterr().err


@pytest.mark.slow
def test_a_worker_that_cannot_start_is_a_one_line_error(capsys):
    assert main(["openenv", "serve", "--env", "simpop/NoSuchEnv-v0", "--simulator", "persuadee", "--workers", "2",
                 "--port", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("simpop openenv serve: error:") and "\n" not in err
