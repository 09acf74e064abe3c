"""The OpenEnv server under abuse: sessions only over WebSockets and never beyond the cap, idle sockets told why
they close, non-finite numbers and lone surrogates answered 4xx, per-session panel turns (issue 44)."""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path

import pytest

pytest.importorskip("openenv", reason="the OpenEnv server needs pip install simpop[openenv]")

import httpx  # noqa: E402
from websockets.asyncio.client import connect  # noqa: E402
from websockets.exceptions import ConnectionClosed, InvalidStatus  # noqa: E402

import simpop.envs  # noqa: E402,F401
from simpop.integrations.openenv_client import SimpopEnvClient  # noqa: E402
from simpop.integrations.openenv_server import ServerLimits, UserSeatSource, make_server  # noqa: E402
from simpop.serve.http import error_body  # noqa: E402

ACT = "simpop/PersuasionAct-v0"
ROOT = Path(__file__).resolve().parents[2]


def limits(**changes) -> ServerLimits:
    return ServerLimits(**{"max_sessions": 2, "max_pending": 8, "max_body_bytes": 16_384, "read_timeout_s": 30.0,
                           **changes})


@pytest.fixture(scope="module")
def server():
    with make_server(UserSeatSource(ACT, ["persuadee"]), port=0, limits=limits()).start() as running:
        yield running


def ws_url(server, query: str = "") -> str:
    return server.url.replace("http", "ws", 1) + "/ws" + query


async def ask(ws, message: dict) -> dict:
    await ws.send(json.dumps(message))
    return json.loads(await ws.recv())


def rpc(server, method: str, **params) -> httpx.Response:
    return httpx.post(server.url + "/mcp", json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params})


# ------------------------------------------------------------------------------------- 1: sessions over HTTP
def test_http_mcp_cannot_create_or_name_sessions_so_websockets_within_the_cap_are_served(server):
    rejected = server.rejected
    for _ in range(server.limits.max_sessions + 1):
        created = rpc(server, "openenv/session/create")
        assert created.status_code == 400 and "WebSocket" in created.json()["error"]["message"], created.text
    for method in ("openenv/session/close", "tools/list"):
        named = rpc(server, method, session_id="anything")
        assert named.status_code == 400 and "WebSocket" in named.json()["error"]["message"]
    assert server.rejected == rejected + server.limits.max_sessions + 3

    async def attach() -> None:
        async with connect(ws_url(server, "?session_id=anything")):
            pass

    with pytest.raises(InvalidStatus) as attach_refused:  # nothing to attach a WebSocket to
        asyncio.run(attach())
    assert attach_refused.value.response.status_code == 400
    assert "its own session" in json.loads(attach_refused.value.response.body)["error"]["message"]

    async def full_house() -> list[dict]:
        async with connect(ws_url(server)) as one, connect(ws_url(server)) as two:
            return [await ask(ws, {"type": "reset", "data": {"seed": 1}}) for ws in (one, two)]

    assert [frame["type"] for frame in asyncio.run(full_house())] == ["observation", "observation"]


# ------------------------------------------------------------------------------ 2: the cap and idle sessions
def test_an_idle_websocket_is_closed_with_its_reason_and_never_outlives_its_slot():
    with make_server(UserSeatSource(ACT, ["persuadee"]), port=0, limits=limits(session_idle_s=0.5)).start() as srv:
        async def scenario() -> None:
            idle = [await connect(ws_url(srv)) for _ in range(2)]
            for ws in idle:
                assert (await ask(ws, {"type": "reset", "data": {"seed": 0}}))["type"] == "observation"
            await asyncio.sleep(0.9)
            for ws in idle:  # the server closed them, saying why; they cannot step
                with pytest.raises(ConnectionClosed) as closed:
                    await ask(ws, {"type": "step", "data": {"message": 1}})
                assert closed.value.rcvd.code == 1001 and "--session-idle-timeout" in closed.value.rcvd.reason
            async with connect(ws_url(srv)) as one, connect(ws_url(srv)) as two, connect(ws_url(srv)) as three:
                assert (await ask(one, {"type": "reset", "data": {"seed": 1}}))["type"] == "observation"
                assert (await ask(two, {"type": "reset", "data": {"seed": 1}}))["type"] == "observation"
                refused = json.loads(await three.recv())  # sent as it connects, then closed
                assert refused["data"]["code"] == "CAPACITY_REACHED"
                busy_until = time.monotonic() + 0.9
                while time.monotonic() < busy_until:  # a session that keeps acting is never closed
                    assert (await ask(one, {"type": "state"}))["type"] == "state"
                    await asyncio.sleep(0.2)

        asyncio.run(scenario())
        with SimpopEnvClient(base_url=srv.url).sync() as env:  # the typed client says why, then starts afresh
            env.reset(seed=2)
            time.sleep(0.9)
            with pytest.raises(ConnectionError, match="--session-idle-timeout"):
                env.step(1)
            assert not env.reset(seed=2).done and env.step(1).observation.invalid_action is None


def test_a_session_closed_from_another_socket_cannot_step_on(server):
    async def scenario() -> tuple[dict, dict, dict]:
        async with connect(ws_url(server)) as victim, connect(ws_url(server)) as closer:
            await ask(victim, {"type": "reset", "data": {"seed": 0}})
            own = await ask(victim, {"type": "mcp", "data": {"jsonrpc": "2.0", "id": 1,
                                                              "method": "openenv/session/create"}})
            session_id = own["data"]["result"]["session_id"]
            closed = await ask(closer, {"type": "mcp", "data": {"jsonrpc": "2.0", "id": 2, "params": {
                "session_id": session_id}, "method": "openenv/session/close"}})
            async with connect(ws_url(server)) as newcomer:  # the slot went to another session
                served = await ask(newcomer, {"type": "reset", "data": {"seed": 0}})
                step = await ask(victim, {"type": "step", "data": {"message": 1}})
            return closed, served, step

    closed, served, step = asyncio.run(scenario())
    assert closed["data"].get("result", {}).get("closed") and served["type"] == "observation"
    assert step["type"] == "error" and "this session was closed" in step["data"]["message"]


# -------------------------------------------------------------------- 3 and 11: numbers, text and episode ids
@pytest.mark.parametrize("route, body", [
    ("/reset", b'{"seed": 1e400}'), ("/reset", b'{"seed": NaN}'), ("/reset", b'{"seed": -Infinity}'),
    ("/reset", b'{"episode_id": "\\ud800"}'), ("/reset", b'{"scenario_id": "\\ud800x"}'),
    ("/reset", b'{"member": [1]}'), ("/reset", b'{"\\ud800": 1}'),
    ("/step", b'{"action": {"message": NaN}}'), ("/step", b'{"action": {"message": 1e400}}'),
    ("/step", b'{"action": {"message": -Infinity}}'), ("/step", b'{"action": {"message": 1}, "timeout_s": NaN}'),
    ("/step", b'{"action": {"message": "\\ud800"}}'), ("/step", b'{"action": {"token_ids": [NaN]}}'),
])
def test_non_finite_numbers_and_lone_surrogates_over_http_get_a_4xx_on_a_kept_connection(server, route, body):
    with httpx.Client(base_url=server.url) as http:
        response = http.post(route, content=body, headers={"content-type": "application/json"})
        assert response.status_code in (400, 409, 422), response.text
        message = response.json()["error"]["message"]
        assert message and "\n" not in message and response.headers.get("connection") != "close"
        assert http.get("/health").status_code == 200  # the same connection serves on


def test_error_bodies_always_render():
    """Both servers' error responses go through error_body: text JSON cannot carry as UTF-8 is escaped."""
    body = error_body(400, "unknown scenario '\ud800'", param="\udfff")
    assert json.dumps(body, ensure_ascii=False, allow_nan=False).encode() and "\\ud800" in body["error"]["message"]


@pytest.mark.parametrize("episode_id, why", [(5, "episode_id must be"), (["x"], "episode_id must be"),
                                             ({"a": 1}, "episode_id must be"), ("x" * 256, "episode_id must be"),
                                             (float("nan"), "episode_id must be"), ("\ud800", "not valid Unicode")])
def test_a_websocket_reset_with_a_bad_episode_id_is_refused_and_the_session_plays_on(server, episode_id, why):
    async def scenario() -> tuple[dict, dict, dict]:
        async with connect(ws_url(server)) as ws:
            refused = await ask(ws, {"type": "reset", "data": {"seed": 1, "episode_id": episode_id}})
            started = await ask(ws, {"type": "reset", "data": {"seed": 1, "episode_id": "run-7/ep-1"}})
            return refused, started, await ask(ws, {"type": "step", "data": {"message": 2}})

    refused, started, stepped = asyncio.run(scenario())
    assert refused["type"] == "error" and why in refused["data"]["message"]
    assert started["data"]["observation"]["metadata"]["episode_id"] == "run-7/ep-1"
    assert stepped["type"] == "observation"


@pytest.mark.parametrize("frame", [b"\x00binary", "[1, 2]", "null", '"reset"', "[" * 5000 + "]" * 5000,
                                   '{"type": "reset", "data": {"seed": ' + "9" * 5000 + "}}",
                                   '{"type": "step", "data": {"token_ids": ["\\ud800"]}}',
                                   '{"type": "step", "data": {"message": {"\\ud800": 1}}}'],
                         ids=["binary", "list", "null", "string", "deep", "long-int", "surrogate", "surrogate-key"])
def test_junk_frames_get_an_error_frame_and_the_session_plays_on(server, frame):
    async def scenario() -> tuple[dict, dict]:
        async with connect(ws_url(server), max_size=None) as ws:
            await ask(ws, {"type": "reset", "data": {"seed": 4}})
            await ws.send(frame)
            return json.loads(await ws.recv()), await ask(ws, {"type": "step", "data": {"message": 3}})

    answer, stepped = asyncio.run(scenario())
    assert answer["type"] == "error" and answer["data"]["code"] == "INVALID_JSON" and answer["data"]["message"]
    assert stepped["type"] == "observation" and stepped["data"]["observation"]["metadata"]["step"] == 1


# ----------------------------------------------------------------------------------------- 9: panel turns
def test_panel_members_take_turns_per_session():
    source = UserSeatSource(ACT, panel="p4g-act-v1")
    with make_server(source, port=0, limits=limits()).start() as srv, \
            SimpopEnvClient(base_url=srv.url).sync() as one, SimpopEnvClient(base_url=srv.url).sync() as two:
        seen: dict[str, list[str]] = {"one": [], "two": []}
        for _ in range(3):
            for name, env in (("one", one), ("two", two)):
                seen[name].append(env.reset().metadata["simulator"])
        members = ["heldout-0-T0.8", "heldout-1-T0.9", "heldout-2-T1.2"]
        assert seen == {"one": members, "two": members}


# ------------------------------------------------------------------------------------- 15: the limits page
def test_the_limits_page_covers_the_openenv_server():
    page = (ROOT / "docs" / "limits.md").read_text()
    section = re.search(r"^## `simpop openenv serve`.*?(?=^## |\Z)", page, re.S | re.M)
    assert section, "docs/limits.md has no `simpop openenv serve` section"
    text = section.group(0)
    for flag in ("--max-sessions", "--session-idle-timeout", "--max-pending", "--max-body-bytes", "--read-timeout",
                 "--keep-alive-timeout", "--api-key", "/mcp", "session_id", "CAPACITY_REACHED"):
        assert flag in text, flag
    for cited in re.findall(r"`(tests/[\w/]+\.py)`", text):
        assert (ROOT / cited).is_file(), cited
