"""OpenAIBackend end to end against a real ``simpop serve`` on 127.0.0.1.

A scripted backend sits behind the server, except in one round trip with the real model.
"""

from __future__ import annotations

import asyncio
import socket

import pytest

from simpop.agents import load_backend
from simpop.agents.base import SamplingParams
from simpop.agents.openai_backend import OpenAIBackend, RemoteBackendError
from simpop.serve.server import make_server
from tests.agents.fakes import EchoBackend


def chats(n: int) -> list[list[dict[str, str]]]:
    return [[{"role": "user", "content": f"hello {i}"}] for i in range(n)]


def test_round_trip_keeps_order_ids_and_logprobs():
    with make_server(EchoBackend(), port=0).start() as server:
        client = load_backend(f"openai:{server.url}#echo")
        assert isinstance(client, OpenAIBackend) and client.name == "echo"
        generations = client.generate(chats(5), SamplingParams(max_new_tokens=3, logprobs=True))
    assert [g.text for g in generations] == [f"echo: hello {i}" for i in range(5)]
    assert all(g.token_ids == [3, 4, 2] and g.prompt_ids == [0] for g in generations)
    assert all(g.logprobs == [-0.5, -0.25, -0.125] and g.finish_reason == "stop" for g in generations)


def test_seeds_differ_per_chat_so_repeated_chats_still_sample():
    backend = EchoBackend()
    with make_server(backend, port=0).start() as server:
        OpenAIBackend(server.url, "echo").generate(chats(3), SamplingParams(max_new_tokens=2, temperature=1.0, seed=10))
    assert sorted(seed for _, seed in backend.calls) == [10, 11, 12]


def test_concurrency_limit_is_respected():
    with make_server(EchoBackend(delay_s=0.05), port=0, max_batch=1).start() as server:
        OpenAIBackend(server.url, "echo", max_concurrency=3).generate(
            chats(9), SamplingParams(max_new_tokens=2)
        )
        stats = server.stats()
    assert stats["requests"] == 9 and stats["max_in_flight"] == 3


def test_timeouts_are_retried_then_reported():
    with make_server(EchoBackend(delay_s=0.6), port=0).start() as server:
        client = OpenAIBackend(server.url, "echo", timeout_s=0.2, max_retries=1, backoff_s=0.01)
        with pytest.raises(RemoteBackendError, match="failed after 2 attempts; last error: ReadTimeout"):
            client.generate(chats(1), SamplingParams(max_new_tokens=2))
        assert server.stats()["requests"] == 2


def test_server_errors_are_retried():
    backend = EchoBackend(fail_first=2)
    with make_server(backend, port=0).start() as server:
        client = OpenAIBackend(server.url, "echo", max_retries=2, backoff_s=0.01)
        assert client.generate(chats(1), SamplingParams(max_new_tokens=2))[0].text == "echo: hello 0"
        assert server.stats()["requests"] == 3


def test_refused_connections_are_retried_then_reported():
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = OpenAIBackend(f"http://127.0.0.1:{port}/v1", "echo", max_retries=2, backoff_s=0.01)
    with pytest.raises(RemoteBackendError, match="failed after 3 attempts; last error: ConnectError"):
        client.generate(chats(1), SamplingParams(max_new_tokens=2))


def test_bad_api_key_fails_at_once(monkeypatch):
    with make_server(EchoBackend(), port=0, api_key="secret").start() as server:
        wrong = OpenAIBackend(server.url, "echo", api_key="wrong", max_retries=3)
        with pytest.raises(RemoteBackendError, match=r"HTTP 401.*check api_key / OPENAI_API_KEY") as error:
            wrong.generate(chats(1), SamplingParams(max_new_tokens=2))
        assert error.value.status == 401 and server.stats()["requests"] == 1  # not retried
        monkeypatch.setenv("OPENAI_API_KEY", "secret")
        assert OpenAIBackend(server.url, "echo").generate(chats(1), SamplingParams(max_new_tokens=2))[0].text


def test_client_errors_surface_the_server_message():
    with make_server(EchoBackend(reject=("hello 0",)), port=0).start() as server:
        with pytest.raises(
            RemoteBackendError, match="HTTP 404.*the model 'gpt-4' does not exist; this server serves 'echo'"
        ):
            OpenAIBackend(server.url, "gpt-4").generate(chats(1), SamplingParams(max_new_tokens=2))
        with pytest.raises(RemoteBackendError, match="HTTP 400.*too long for the model"):
            OpenAIBackend(server.url, "echo").generate(chats(1), SamplingParams(max_new_tokens=2))
        assert server.stats()["requests"] == 2


def test_generate_works_inside_a_running_event_loop():
    with make_server(EchoBackend(), port=0).start() as server:
        client = OpenAIBackend(server.url, "echo")

        async def caller() -> list[str]:
            return [g.text for g in client.generate(chats(2), SamplingParams(max_new_tokens=2))]

        assert asyncio.run(caller()) == ["echo: hello 0", "echo: hello 1"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"base_url": "127.0.0.1:8000"}, "must start with http"),
        ({"model": ""}, "model must name the served model"),
        ({"max_concurrency": 0}, "max_concurrency must be >= 1"),
        ({"timeout_s": 0}, "timeout_s must be > 0"),
        ({"max_retries": -1}, "max_retries must be >= 0"),
        ({"backoff_s": 5.0, "max_backoff_s": 1.0}, "backoff_s <= max_backoff_s"),
    ],
)
def test_bad_settings(kwargs, message):
    settings = {"base_url": "http://127.0.0.1:8000/v1", "model": "m", **kwargs}
    with pytest.raises(ValueError, match=message):
        OpenAIBackend(**settings)


def test_bad_chats_and_specs():
    client = OpenAIBackend("http://127.0.0.1:9/v1", "m")
    with pytest.raises(ValueError, match="chats is empty"):
        client.generate([], SamplingParams())
    with pytest.raises(ValueError, match="message 0 is"):
        client.generate([[{"content": "no role"}]], SamplingParams())
    with pytest.raises(ValueError, match="unknown backend spec 'llama'; use one of"):
        load_backend("llama")
    with pytest.raises(ValueError, match="openai:<base_url>#<model>"):
        load_backend("openai:http://127.0.0.1:8000/v1")


def test_real_model_round_trip_matches_the_in_process_backend(one_torch_thread):
    model = load_backend("smollm2")
    params = SamplingParams(max_new_tokens=4, logprobs=True)
    with make_server(model, port=0).start() as server:
        remote = load_backend(f"openai:{server.url}#smollm2").generate(chats(2), params)
    local = model.generate(chats(2), params)
    for near, far in zip(local, remote):
        assert (far.text, far.token_ids, far.prompt_ids, far.finish_reason) == (
            near.text,
            near.token_ids,
            near.prompt_ids,
            near.finish_reason,
        )
        assert far.logprobs == pytest.approx(near.logprobs, abs=1e-4)
