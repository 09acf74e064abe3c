"""``simpop serve``: OpenAI-compatible routes, error bodies and micro-batching, over a scripted backend."""

from __future__ import annotations

import concurrent.futures

import httpx
import pytest

from simpop.serve.server import make_server
from simpop.cli import main
from tests.agents.fakes import EchoBackend

CHAT = [{"role": "user", "content": "hi"}]


@pytest.fixture
def served():
    backend = EchoBackend()
    with make_server(backend, port=0).start() as server:
        yield server, backend


def post(server, body, **kwargs):
    return httpx.post(f"{server.url}/chat/completions", json=body, **kwargs)


def test_models_and_health(served):
    server, _ = served
    models = httpx.get(f"{server.url}/models").json()
    assert [m["id"] for m in models["data"]] == ["echo"] and models["object"] == "list"
    health = httpx.get(f"{server.url.removesuffix('/v1')}/health").json()
    assert health["status"] == "ok" and health["requests"] == 0


def test_chat_completion_with_n_logprobs_and_usage(served):
    server, backend = served
    reply = post(
        server, {"model": "echo", "messages": CHAT, "n": 3, "max_tokens": 5, "logprobs": True, "seed": 4}
    )
    assert reply.status_code == 200
    body = reply.json()
    assert body["object"] == "chat.completion" and body["model"] == "echo"
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    choice = body["choices"][0]
    assert (
        choice["message"] == {"role": "assistant", "content": "echo: hi"}
        and choice["finish_reason"] == "stop"
    )
    assert choice["token_ids"] == [3, 4, 2] and body["prompt_token_ids"] == [0]
    assert [e["logprob"] for e in choice["logprobs"]["content"]] == [-0.5, -0.25, -0.125]
    assert choice["logprobs"]["content"][0]["token"] == "token_id:3"
    assert body["usage"] == {"prompt_tokens": 1, "completion_tokens": 9, "total_tokens": 10}
    assert backend.calls == [(3, 4)]  # n samples are one backend call


def test_text_content_parts_are_joined(served):
    server, _ = served
    parts = [{"type": "text", "text": "h"}, {"type": "text", "text": "i"}]
    reply = post(server, {"model": "echo", "messages": [{"role": "user", "content": parts}]})
    assert reply.json()["choices"][0]["message"]["content"] == "echo: hi"


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (
            {"model": "gpt-4", "messages": CHAT},
            404,
            "the model 'gpt-4' does not exist; this server serves 'echo'",
        ),
        ({"messages": CHAT}, 400, "'model' is required"),
        ({"model": "echo"}, 400, "'messages' is required"),
        ({"model": "echo", "messages": []}, 400, "invalid 'messages'"),
        ({"model": "echo", "messages": [{"role": "user"}]}, 400, "'messages.0.content' is required"),
        ({"model": "echo", "messages": [{"role": "narrator", "content": "x"}]}, 400, "invalid 'messages.0.role'"),
        ({"model": "echo", "messages": CHAT, "n": True}, 400, "invalid 'n': Input should be a valid integer"),
        ({"model": "echo", "messages": CHAT, "n": 0}, 400, "invalid 'n': Input should be greater than or equal to 1"),
        ({"model": "echo", "messages": CHAT, "temperature": -1}, 400, "invalid 'temperature'"),
        ({"model": "echo", "messages": CHAT, "top_p": 0}, 400, "invalid 'top_p': Input should be greater than 0"),
        ({"model": "echo", "messages": CHAT, "max_tokens": 0}, 400, "invalid 'max_tokens'"),
        ({"model": "echo", "messages": CHAT, "max_completion_tokens": 1.5}, 400, "invalid 'max_completion_tokens'"),
        ({"model": "echo", "messages": CHAT, "stop": [""]}, 400, "invalid 'stop'"),
        ({"model": "echo", "messages": CHAT, "seed": "1"}, 400, "invalid 'seed'"),
        ({"model": "echo", "messages": CHAT, "logprobs": "yes"}, 400, "invalid 'logprobs'"),
        ({"model": "echo", "messages": CHAT, "top_logprobs": 2}, 400, "'top_logprobs' needs 'logprobs': true"),
        ({"model": "echo", "messages": CHAT, "logprobs": True, "top_logprobs": 2}, 400,
         "top log-probabilities need an in-process model"),
        ({"model": "echo", "messages": CHAT, "response_format": {"type": "json_object"}}, 400,
         "cannot constrain its output"),
        ({"model": "echo", "messages": CHAT, "prompt_logprobs": 0}, 400, "cannot score prompts"),
        ({"model": "echo", "messages": CHAT, "prompt_logprobs": 3}, 400, "only prompt_logprobs: 0"),
        ({"model": "echo", "messages": CHAT, "prompt_logprobs": 0, "n": 2}, 400, "generates nothing"),
        ({"model": "echo", "messages": CHAT, "stream_options": {"include_usage": True}}, 400,
         "'stream_options' needs 'stream': true"),
        ([1, 2], 400, "the body must be a JSON object"),
    ],
)
def test_bad_requests_get_json_errors(served, body, status, message):
    server, backend = served
    reply = post(server, body)
    assert reply.status_code == status
    assert message in reply.json()["error"]["message"]
    assert reply.json()["error"]["type"] in {"invalid_request_error", "not_found_error"}
    assert backend.calls == []
    assert post(server, {"model": "echo", "messages": CHAT}).status_code == 200  # still serving


def test_unknown_routes_and_invalid_json(served):
    server, _ = served
    assert httpx.get(f"{server.url}/nothing").status_code == 404
    assert httpx.get(f"{server.url}/completions").status_code == 405  # a POST route
    assert httpx.post(f"{server.url}/embeddings", json={}).status_code == 404
    reply = httpx.post(f"{server.url}/chat/completions", content=b"{not json")
    assert reply.status_code == 400 and "not valid JSON" in reply.json()["error"]["message"]


def test_api_key_is_required_when_set():
    with make_server(EchoBackend(), port=0, api_key="secret").start() as server:
        assert post(server, {"model": "echo", "messages": CHAT}).status_code == 401
        assert httpx.get(f"{server.url}/models").status_code == 401
        ok = post(server, {"model": "echo", "messages": CHAT}, headers={"Authorization": "Bearer secret"})
        assert ok.status_code == 200


def test_concurrent_requests_are_micro_batched():
    backend = EchoBackend(delay_s=0.05)
    with make_server(backend, port=0, batch_window_s=0.3, max_batch=64).start() as server:
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            replies = list(
                pool.map(
                    lambda i: post(
                        server, {"model": "echo", "messages": [{"role": "user", "content": str(i)}]}
                    ),
                    range(8),
                )
            )
        assert [r.json()["choices"][0]["message"]["content"] for r in replies] == [
            f"echo: {i}" for i in range(8)
        ]
        assert sum(rows for rows, _ in backend.calls) == 8 and len(backend.calls) < 8
        assert server.stats()["batches"] == len(backend.calls)


def test_seeded_requests_and_different_settings_are_not_merged():
    backend = EchoBackend()
    with make_server(backend, port=0, batch_window_s=0.3).start() as server:
        bodies = [{"model": "echo", "messages": CHAT, "seed": s} for s in (1, 2)] + [
            {"model": "echo", "messages": CHAT, "max_tokens": m} for m in (3, 4)
        ]
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            assert all(r.status_code == 200 for r in pool.map(lambda b: post(server, b), bodies))
        assert sorted(backend.calls, key=str) == sorted([(1, 1), (1, 2), (1, None), (1, None)], key=str)


def test_max_batch_splits_batches():
    backend = EchoBackend()
    with make_server(backend, port=0, batch_window_s=0.3, max_batch=2).start() as server:
        with concurrent.futures.ThreadPoolExecutor(5) as pool:
            list(pool.map(lambda _: post(server, {"model": "echo", "messages": CHAT}), range(5)))
        assert max(rows for rows, _ in backend.calls) <= 2 and sum(rows for rows, _ in backend.calls) == 5


def test_one_rejected_request_does_not_fail_its_batch_mates():
    backend = EchoBackend(reject=("too long",))
    with make_server(backend, port=0, batch_window_s=0.3).start() as server:
        contents = ["fine", "too long", "also fine"]
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            replies = list(
                pool.map(
                    lambda c: post(server, {"model": "echo", "messages": [{"role": "user", "content": c}]}),
                    contents,
                )
            )
        assert [r.status_code for r in replies] == [200, 400, 200]
        assert "too long for the model" in replies[1].json()["error"]["message"]


def test_backend_crash_is_a_500_and_the_server_keeps_serving():
    with make_server(EchoBackend(fail_first=1), port=0).start() as server:
        crashed = post(server, {"model": "echo", "messages": CHAT})
        assert crashed.status_code == 500 and "the model crashed" in crashed.json()["error"]["message"]
        assert post(server, {"model": "echo", "messages": CHAT}).status_code == 200


def test_serve_is_a_cli_command(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--help"])
    assert exit_info.value.code == 0
    assert "--max-batch" in capsys.readouterr().out


def test_serve_flags_become_limits(monkeypatch, capsys):
    import simpop.agents
    from simpop.serve.server import SimpopServer

    seen = {}
    monkeypatch.setattr(simpop.agents, "load_backend", lambda spec, **options: EchoBackend())
    monkeypatch.setattr(SimpopServer, "serve_forever", lambda self: seen.update(server=self))
    assert main(["serve", "--model", "echo", "--port", "0", "--max-n", "3", "--max-stop", "2",
                 "--max-body-bytes", "999", "--max-request-compute", "77", "--max-request-tokens", "66",
                 "--read-timeout", "4", "--keep-alive-timeout", "2", "--default-max-tokens", "9", "--api-key", "k"]) == 0
    server = seen["server"]
    assert (server.limits.max_n, server.limits.max_stop, server.limits.max_body_bytes) == (3, 2, 999)
    assert (server.limits.max_request_compute, server.limits.read_timeout_s, server.limits.keep_alive_s) == (77, 4, 2)
    assert server.limits.default_max_tokens == 9 and server.limits.max_request_tokens == 66
    assert server.api_key == "k"
    assert main(["serve", "--model", "echo", "--max-n", "0"]) == 2
    assert "--max-n: must be an integer from 1" in capsys.readouterr().err
    assert main(["serve", "--model", "echo", "--lora", "a=b"]) == 2
    assert "need --engine vllm" in capsys.readouterr().err


def test_engine_vllm_delegates_to_the_vllm_launcher(monkeypatch, capsys):
    import sys
    import types

    calls = []
    launcher = types.ModuleType("simpop.agents.vllm_server")
    launcher.serve_forever = lambda **kwargs: calls.append(kwargs)
    monkeypatch.setitem(sys.modules, "simpop.agents.vllm_server", launcher)
    assert main(["serve", "--engine", "vllm", "--model", "/m", "--port", "9", "--api-key", "k",
                 "--lora", "policy=/a/p", "--lora", "sim@v2=/a/s", "--vllm-arg=--max-model-len=512"]) == 0
    assert calls == [{"model": "/m", "host": "127.0.0.1", "port": 9, "api_key": "k",
                      "loras": {"policy": "/a/p", "sim@v2": "/a/s"}, "extra_args": ["--max-model-len=512"]}]
    assert main(["serve", "--engine", "vllm", "--lora", "nopath"]) == 2
    assert "--lora takes NAME=PATH" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "simpop.agents.vllm_server", None)  # as if vLLM support were missing
    assert main(["serve", "--engine", "vllm", "--model", "/m"]) == 2
    assert "needs simpop's vLLM launcher and vLLM itself" in capsys.readouterr().err
