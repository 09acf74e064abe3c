"""The OpenEnv server against the real openenv package and its own client (loopback only)."""

from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("openenv", reason="the OpenEnv server needs pip install simpop[openenv]")

import httpx  # noqa: E402
from websockets.asyncio.client import connect  # noqa: E402
from websockets.exceptions import ConnectionClosed  # noqa: E402

import simpop.envs  # noqa: E402,F401
from simpop.cli import main  # noqa: E402
from simpop.envs.registration import make  # noqa: E402
from simpop.envs.wrappers import UserSeat  # noqa: E402
from simpop.integrations.openenv_client import SimpopEnvClient  # noqa: E402
from simpop.integrations.openenv_server import (  # noqa: E402
    PendingGate, ServerLimits, SimpopAction, SimpopEnvironment, UserSeatSource, make_server)
from simpop.simulators.registry import build_simulator  # noqa: E402
from tests.integrations.conftest import doc_example  # noqa: E402

ACT = "simpop/PersuasionAct-v0"
# The read deadline is long: a machine busy with other tests must not turn a slow read into a 408 (the deadline
# has its own tests in tests/agents/test_serve_limits.py).
LIMITS = ServerLimits(max_sessions=4, max_pending=8, max_body_bytes=16_384, read_timeout_s=30.0)


@pytest.fixture(scope="module")
def act_server():
    with make_server(UserSeatSource(ACT, ["persuadee"]), port=0, limits=LIMITS).start() as server:
        yield server


def client(server) -> SimpopEnvClient:
    return SimpopEnvClient(base_url=server.url, message_timeout_s=30.0)


def play(env, actions):
    """Reset with seed 7, then the actions in turn until the episode ends; every result."""
    results = [env.reset(seed=7)]
    for action in actions:
        if results[-1].done:
            break
        results.append(env.step(action))
    return results


def test_an_episode_over_the_network_is_the_in_process_episode(act_server):
    actions = [3, 5, 1, 13, 2, 0, 7, 9, 4, 6, 8, 10, 11, 12] * 2
    with client(act_server).sync() as env:
        remote = play(env, actions)
    assert remote[-1].done
    local_env = make(ACT)
    seat = UserSeat(local_env, build_simulator("persuadee", env=local_env))
    observation, _ = seat.reset(seed=7)
    assert json.loads(remote[0].observation.text) == pytest.approx(observation.tolist())
    for action, result in zip(actions, remote[1:]):
        observation, reward, terminated, truncated, info = seat.step(action)
        assert json.loads(result.observation.text) == pytest.approx(observation.tolist())
        assert (result.reward, result.done) == (reward, terminated or truncated)
        assert result.metadata["info"]["scenario_id"] == info["scenario_id"]
    assert remote[-1].observation.messages == local_env.chat_view(local_env.policy_seat)
    assert remote[-1].observation.reply == local_env.chat_view(local_env.policy_seat)[-1]["content"]
    assert remote[-1].metadata["simulator"] == "persuadee"


def test_sessions_are_isolated_and_state_is_typed(act_server):
    with client(act_server).sync() as one, client(act_server).sync() as two:
        one.reset(seed=1, scenario_id="p4g-0003")
        two.reset(seed=2)
        one.step(0)
        state = one.state()
        assert (state.env_id, state.scenario_id, state.step_count, state.done) == (ACT, "p4g-0003", 1, False)
        assert two.state().step_count == 0


def test_invalid_actions_are_answered_as_the_env_answers_them(act_server):
    with client(act_server).sync() as env:
        env.reset(seed=3)
        result = env.step("not an act")
        assert result.observation.invalid_action == "action must be an int in [0, 14), got 'not an act'"
        assert not result.done and result.observation.messages == []
        assert env.step(99).observation.invalid_action.startswith("action must be an int in [0, 14)")
        assert env.step(2).observation.invalid_action is None  # the same seat acts again


def test_text_env_population_and_replies():
    source = UserSeatSource("simpop/Persuasion-v1", ["persuadee?temperature=0.5", "persuadee?decoding=greedy"])
    with make_server(source, port=0, limits=LIMITS).start() as server, client(server).sync() as env:
        members = set()
        for seed in range(6):
            result = env.reset(seed=seed)
            members.add(result.metadata["simulator"])
            assert json.loads(result.observation.text)["instructions"]
            rejected = env.step("").observation  # empty text: the env's own rejection, shown in its observation
            assert rejected.invalid_action and json.loads(rejected.text)["error"] == rejected.invalid_action
            result = env.step("Hello! Would you donate some of your payment to Save the Children?")
            assert result.observation.messages[0]["role"] == "assistant"
            assert result.observation.reply == result.observation.messages[-1]["content"]
        assert members == {"persuadee?temperature=0.5", "persuadee?decoding=greedy"}


def test_panel_sessions_pick_members():
    with make_server(UserSeatSource(ACT, panel="p4g-act-v1"), port=0, limits=LIMITS).start() as server, \
            client(server).sync() as env:
        assert env.reset(seed=0, member="heldout-1-T0.9").metadata["simulator"] == "heldout-1-T0.9"
        assert env.reset(seed=5).metadata["simulator"] == "heldout-2-T1.2"  # seed % 3
        with pytest.raises(RuntimeError, match="unknown panel member 'nobody'"):
            env.reset(member="nobody")
        assert env.reset(seed=3).metadata["simulator"] == "heldout-0-T0.8"


# ------------------------------------------------------------------------------------------ bad input
def test_reset_arguments_get_clear_errors(act_server):
    """Unknown reset arguments and scenarios get 400, a negative seed 422; a session survives its bad request."""
    assert httpx.post(act_server.url + "/reset", json={"seed": 1, "bogus": 2}).status_code == 400
    assert httpx.post(act_server.url + "/reset", json={"scenario_id": "nope"}).status_code == 400
    assert httpx.post(act_server.url + "/reset", json={"seed": -1}).status_code == 422
    with client(act_server).sync() as env:
        with pytest.raises(RuntimeError, match="unknown reset argument"):
            env.reset(bogus=1)
        assert not env.reset(seed=1).done  # the session survives its bad request


@pytest.mark.filterwarnings("ignore:Pydantic serializer warnings")  # the client sends the wrong type on purpose
def test_wrong_action_types_get_4xx_and_the_session_survives(act_server):
    for bad in ({"message": [1, 2]}, {"message": 1.5}, {"text": "hi"}, {}, {"token_ids": ["a"]}, {"message": None}):
        response = httpx.post(act_server.url + "/step", json={"action": bad})
        assert response.status_code == 422, bad
    response = httpx.post(act_server.url + "/step", json={"action": {"message": 3}})
    assert response.status_code == 409 and "reset first" in response.json()["error"]["message"]
    assert httpx.post(act_server.url + "/step", content=b"{not json").status_code == 422
    with client(act_server).sync() as env:
        env.reset(seed=0)
        with pytest.raises(RuntimeError, match="VALIDATION_ERROR|Invalid message|validation"):
            env.step(SimpopAction.model_construct(message=[1, 2]))
        assert env.step(1).observation.invalid_action is None
        with pytest.raises(RuntimeError, match="token_ids need a text env, a server started with a tokenizer"):
            env.step(SimpopAction(token_ids=[1, 2]))
        assert env.step(2).observation.token_ids is None


def test_oversized_bodies_are_refused_unread(act_server):
    big = json.dumps({"seed": 1, "episode_id": "x" * 20_000})
    response = httpx.post(act_server.url + "/reset", content=big, headers={"content-type": "application/json"})
    assert response.status_code == 413

    async def huge_frame() -> None:
        async with connect(act_server.url.replace("http", "ws") + "/ws") as ws:
            await ws.send(json.dumps({"type": "step", "data": {"message": "x" * 20_000}}))
            await ws.recv()

    with pytest.raises(ConnectionClosed) as closed:
        asyncio.run(huge_frame())
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009  # message too big
    with client(act_server).sync() as env:
        assert not env.reset(seed=2).done


def test_a_thousand_concurrent_resets_are_bounded_and_the_server_keeps_serving(act_server):
    async def storm() -> list[int]:
        limits = httpx.Limits(max_connections=1000, max_keepalive_connections=0)
        async with httpx.AsyncClient(limits=limits, timeout=60.0) as http:
            responses = await asyncio.gather(*(http.post(act_server.url + "/reset", json={"seed": i})
                                               for i in range(1000)), return_exceptions=True)
        return [r.status_code if isinstance(r, httpx.Response) else 0 for r in responses]

    rejected = act_server.rejected
    statuses = asyncio.run(storm())
    assert set(statuses) <= {200, 429}, sorted(set(statuses))  # served, or refused at once: nothing else
    assert statuses.count(200) >= 1 and act_server.rejected - rejected == statuses.count(429)
    assert httpx.get(act_server.url + "/health").status_code == 200
    with client(act_server).sync() as env:
        assert not env.reset(seed=4).done


def test_requests_beyond_max_pending_get_429_at_once():
    async def slow_app(scope, receive, send):
        await asyncio.sleep(0.05)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    refused: list[int] = []
    gate = PendingGate(slow_app, max_pending=3, on_reject=refused.append)

    async def call() -> int:
        sent: list[dict] = []

        async def send(message: dict) -> None:
            sent.append(message)

        await gate({"type": "http", "path": "/reset", "headers": []}, None, send)
        return sent[0]["status"]

    async def burst() -> list[int]:
        return await asyncio.gather(*(call() for _ in range(10)))

    statuses = asyncio.run(burst())
    assert sorted(statuses) == [200] * 3 + [429] * 7 and refused == [429] * 7 and gate.pending == 0
    assert asyncio.run(burst()).count(200) == 3  # the slots came back


def test_sessions_beyond_the_cap_are_refused(act_server):
    clients = [client(act_server).sync() for _ in range(LIMITS.max_sessions)]
    try:
        for c in clients:
            c.connect()
            c.reset(seed=0)
        with pytest.raises(RuntimeError, match="CAPACITY_REACHED"):
            extra = client(act_server).sync()
            try:
                extra.reset(seed=0)
            finally:
                extra.close()
    finally:
        for c in clients:
            c.close()
    with client(act_server).sync() as env:  # slots come back when sessions close
        assert not env.reset(seed=1).done


def test_api_key_guards_http_and_websockets():
    with make_server(UserSeatSource(ACT, ["persuadee"]), port=0, limits=LIMITS, api_key="k3y").start() as server:
        assert httpx.post(server.url + "/reset", json={}).status_code == 401
        with pytest.raises(ConnectionError):  # the websocket handshake is refused
            with client(server).sync() as env:
                env.reset(seed=0)
        keyed = SimpopEnvClient(base_url=server.url, headers={"Authorization": "Bearer k3y"})
        with keyed.sync() as env:
            assert not env.reset(seed=0).done


def test_stepping_without_an_episode_is_refused():
    environment = SimpopEnvironment(UserSeatSource(ACT, ["persuadee"]))
    with pytest.raises(RuntimeError, match="reset first"):
        environment.step(SimpopAction(message=1))
    assert environment.state.done and not environment.reset(seed=0).done


@pytest.mark.parametrize("argv, message", [
    (["--env", "simpop/Nope-v0", "--simulator", "persuadee"], "unknown env id 'simpop/Nope-v0'"),
    (["--env", ACT, "--panel", "no-panel"], "unknown panel 'no-panel'"),
    (["--env", ACT, "--simulator", "persuadee", "--max-sessions", "0"], "--max-sessions: must be an integer from 1"),
])
def test_cli_bad_input_is_one_line_and_exit_2(argv, message, capsys):
    assert main(["openenv", "serve", *argv, "--port", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_the_documented_client_example_runs(act_server, capsys):
    exec(doc_example("SimpopEnvClient(base_url=").replace("http://127.0.0.1:8000", act_server.url), {})
    reward, simulator = capsys.readouterr().out.split()[:2]
    assert float(reward) in (0.0, 1.0) and simulator == "persuadee"


def test_both_servers_declare_the_shared_http_flags_once():
    """simpop serve and simpop openenv serve get --host ... --log-requests from one helper, with their own defaults."""
    import argparse

    from simpop.integrations import openenv_cli
    from simpop.serve import server as serve_cli
    from simpop.serve.requests import Limits

    shared = ["--host", "0.0.0.0", "--port", "9", "--api-key", "k", "--max-body-bytes", "7", "--read-timeout", "3",
              "--keep-alive-timeout", "2", "--log-requests"]
    openenv_parser, serve_parser = argparse.ArgumentParser(), argparse.ArgumentParser()
    openenv_cli.configure(openenv_parser)
    serve_cli.configure(serve_parser)
    for args in (openenv_parser.parse_args(["serve", "--env", ACT, "--simulator", "persuadee", *shared]),
                 serve_parser.parse_args(shared)):
        assert (args.host, args.port, args.api_key, args.max_body_bytes, args.read_timeout, args.keep_alive_timeout,
                args.log_requests) == ("0.0.0.0", 9, "k", 7, 3.0, 2.0, True)
    openenv_defaults = openenv_parser.parse_args(["serve", "--env", ACT, "--simulator", "persuadee"])
    assert (openenv_defaults.max_body_bytes, openenv_defaults.keep_alive_timeout) == (ServerLimits().max_body_bytes,
                                                                                     ServerLimits().keep_alive_s)
    assert serve_parser.parse_args([]).max_body_bytes == Limits().max_body_bytes
