"""100 mixed clients against one OpenEnv server for a few seconds (issue 44): HTTP resets and junk, HTTP MCP
session creates, WebSockets that play, idle, drop or send junk. Legitimate WebSocket clients within the cap are
always served, live sessions never exceed ``--max-sessions``, and the server ends healthy."""

from __future__ import annotations

import asyncio
import json
import random
import time

import pytest

pytest.importorskip("openenv", reason="the OpenEnv server needs pip install simpop[openenv]")

import httpx  # noqa: E402
from websockets.asyncio.client import connect  # noqa: E402
from websockets.exceptions import ConnectionClosed, InvalidStatus  # noqa: E402

import simpop.envs  # noqa: E402,F401
from simpop.integrations.openenv_client import SimpopEnvClient  # noqa: E402
from simpop.integrations.openenv_server import ServerLimits, UserSeatSource, make_server  # noqa: E402

ACT = "simpop/PersuasionAct-v0"
CAP, IDLE_S = 10, 1.0
LIMITS = ServerLimits(max_sessions=CAP, max_pending=16, max_body_bytes=16_384, read_timeout_s=10.0,
                      session_idle_s=IDLE_S)
# WebSockets open at once: 4 legitimate + 4 others, a margin of 2 for sockets whose server side is still closing.
LEGIT_AT_ONCE, OTHERS_AT_ONCE, CLOSING_S = 4, 4, 0.2
JUNK_FRAMES = ["{not json", "[1, 2]", '{"type": "nope"}', '{"type": "step"}', '{"type": "step", "data": {"message": NaN}}',
               '{"type": "step", "data": {"token_ids": ["\\ud800"]}}', '{"type": "reset", "data": {"seed": 1e400}}',
               '{"type": "reset", "data": {"episode_id": "\\ud800"}}', '{"type": "reset", "data": {"seed": ' +
               "9" * 5000 + "}}", '{"type": "mcp", "data": {"jsonrpc": "2.0", "id": 1, "method": '
               '"openenv/session/create"}}', b"\x00\x01binary", "x" * 20_000]
HTTP_JUNK = [("POST", "/reset", b'{"seed": NaN}'), ("POST", "/reset", b'{"episode_id": "\\ud800"}'),
             ("POST", "/step", b'{"action": {"message": 1e400}}'), ("POST", "/reset", b'{"seed": 3}'),
             ("POST", "/mcp", b'{"jsonrpc": "2.0", "id": NaN, "method": "tools/list"}'), ("POST", "/mcp", b"[1e400]"),
             ("GET", "/state", b""), ("GET", "/nowhere", b""), ("POST", "/reset", b"\xff\xfe")]


@pytest.mark.slow
def test_a_hundred_mixed_clients_leave_the_cap_intact_and_the_server_healthy():
    with make_server(UserSeatSource(ACT, ["persuadee"]), port=0, limits=LIMITS).start() as server:
        report = asyncio.run(asyncio.wait_for(_crowd(server), timeout=25))
        assert report["legit_failures"] == [] and report["legit_served"] == 30
        assert report["sleepers_told"] == 10, report["sleeper_errors"]
        assert max(report["active_samples"]) <= CAP and _most_overlapping(report["live"]) <= CAP
        assert report["bad_statuses"] == [] and report["mcp_sessions"] == 0 and report["attached"] == 0
        deadline = time.monotonic() + 5
        while server.active_sessions and time.monotonic() < deadline:  # every slot comes back
            time.sleep(0.05)
        assert server.active_sessions == 0
        assert httpx.get(server.url + "/health").json()["status"] == "healthy"
        with SimpopEnvClient(base_url=server.url).sync() as env:  # a fresh client plays a whole episode
            result = env.reset(seed=99)
            for step in range(200):
                if result.done:
                    break
                result = env.step(step % 14)
            assert result.done


async def _crowd(server) -> dict:
    rng = random.Random(44)
    ws_url = server.url.replace("http", "ws", 1) + "/ws"
    legit_slots, other_slots = asyncio.Semaphore(LEGIT_AT_ONCE), asyncio.Semaphore(OTHERS_AT_ONCE)
    report: dict = {"legit_failures": [], "legit_served": 0, "sleepers_told": 0, "sleeper_errors": [], "live": [],
                    "bad_statuses": [], "mcp_sessions": 0, "attached": 0, "active_samples": []}

    async def later(delay: float, job) -> None:
        await asyncio.sleep(delay)
        await job

    async def legit(seed: int) -> None:
        async with legit_slots:
            times: list[float] = []
            try:
                async with SimpopEnvClient(base_url=server.url, message_timeout_s=20.0) as env:
                    result = await env.reset(seed=seed)
                    times.append(time.monotonic())
                    for _ in range(200):
                        if result.done:
                            break
                        result = await env.step(rng.randrange(14))
                        times.append(time.monotonic())
                    assert result.done
                report["legit_served"] += 1
            except Exception as error:  # noqa: BLE001 - reported below
                report["legit_failures"].append(repr(error)[:300])
            report["live"].append((times[0], times[-1]) if times else None)
            await asyncio.sleep(CLOSING_S)

    async def sleeper(seed: int) -> None:  # a slow client: idles past the timeout, then steps
        async with other_slots:
            async with SimpopEnvClient(base_url=server.url, message_timeout_s=20.0) as env:
                await env.reset(seed=seed)
                report["live"].append((time.monotonic(), time.monotonic()))
                await asyncio.sleep(IDLE_S * 1.6)
                try:
                    await env.step(1)
                    report["sleeper_errors"].append("stepped after its idle timeout")
                except ConnectionError as error:
                    told = "--session-idle-timeout" in str(error)
                    report["sleepers_told"] += told
                    if not told:
                        report["sleeper_errors"].append(str(error))
            await asyncio.sleep(CLOSING_S)

    async def dropper(seed: int) -> None:  # plays a little, then drops the TCP connection without a close
        async with other_slots:
            ws = await connect(ws_url)
            await ws.send(json.dumps({"type": "reset", "data": {"seed": seed}}))
            start = time.monotonic()
            await ws.recv()
            await ws.send(json.dumps({"type": "step", "data": {"message": 2}}))
            assert json.loads(await ws.recv())["type"] == "observation"
            report["live"].append((start, time.monotonic()))
            ws.transport.abort()
            await asyncio.sleep(CLOSING_S)

    async def junker() -> None:  # junk frames; answered with error frames, or the socket closed
        async with other_slots:
            try:
                async with connect(ws_url, max_size=None) as ws:
                    for frame in rng.sample(JUNK_FRAMES, 5):
                        await ws.send(frame)
                        answer = json.loads(await asyncio.wait_for(ws.recv(), 10))
                        assert answer["type"] in ("error", "mcp", "observation"), answer
            except ConnectionClosed as closed:  # only a frame over --max-body-bytes ends the session
                assert closed.rcvd is not None and closed.rcvd.code == 1009, closed
            await asyncio.sleep(CLOSING_S)

    async def attacher() -> None:
        try:
            async with connect(ws_url + "?session_id=anything"):
                report["attached"] += 1
        except InvalidStatus as refused:
            if refused.response.status_code != 400:
                report["bad_statuses"].append(("attach", refused.response.status_code))

    async def http(kind: str, http_client: httpx.AsyncClient) -> None:
        if kind == "mcp":
            response = await http_client.post("/mcp", json={"jsonrpc": "2.0", "id": 1,
                                                            "method": "openenv/session/create"})
            report["mcp_sessions"] += "result" in response.text
            allowed = {400, 429}
        else:
            method, path, body = rng.choice(HTTP_JUNK)
            response = await http_client.request(method, path, content=body,
                                                 headers={"content-type": "application/json"})
            allowed = {200, 400, 404, 409, 422, 429}
        if response.status_code not in allowed:
            report["bad_statuses"].append((kind, response.status_code, response.text[:200]))

    async def sample(stop: asyncio.Event) -> None:
        while not stop.is_set():
            report["active_samples"].append(server.active_sessions)
            await asyncio.sleep(0.01)

    async with httpx.AsyncClient(base_url=server.url, timeout=20.0) as http_client:
        jobs = ([legit(seed) for seed in range(30)] + [sleeper(seed) for seed in range(10)]
                + [dropper(seed) for seed in range(10)] + [junker() for _ in range(10)]
                + [attacher() for _ in range(5)] + [http("mcp", http_client) for _ in range(15)]
                + [http("junk", http_client) for _ in range(20)])
        assert len(jobs) == 100
        stop = asyncio.Event()
        sampler = asyncio.create_task(sample(stop))
        await asyncio.gather(*(later(rng.uniform(0, 6), job) for job in jobs))
        stop.set()
        await sampler
    report["live"] = [span for span in report["live"] if span is not None]
    return report


def _most_overlapping(spans: list[tuple[float, float]]) -> int:
    """The most sessions that had answered a request both before and after one moment."""
    events = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans], key=lambda e: (e[0], -e[1]))
    most = live = 0
    for _, change in events:
        live += change
        most = max(most, live)
    return most
