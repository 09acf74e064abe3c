"""``simpop serve``'s limits: each bad request gets its 4xx, and the server answers the next request.

Raw sockets stand in for clients that misbehave at the HTTP level (a huge announced body, a stalled head).
"""

from __future__ import annotations

import socket
import time

import httpx
import pytest

from simpop.serve.server import make_server
from simpop.serve.requests import Limits
from tests.agents.fakes import EchoBackend

CHAT = [{"role": "user", "content": "hi"}]
OK = {"model": "echo", "messages": CHAT}


def serve(api_key=None, **limits):
    return make_server(EchoBackend(), port=0, limits=Limits(**limits), api_key=api_key).start()


def post(server, body, **kwargs):
    return httpx.post(f"{server.url}/chat/completions", json=body, **kwargs)


def still_serves(server, **kwargs):
    reply = post(server, OK, **kwargs)
    return reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"] == "echo: hi"


def raw(server, data: bytes, timeout_s: float = 5.0) -> bytes:
    """Send ``data`` on a fresh connection; everything the server answers until it closes or goes quiet."""
    host, port = server.socket.getsockname()[:2]
    with socket.create_connection((host, port), timeout=timeout_s) as conn:
        conn.sendall(data)
        chunks = []
        try:
            while chunk := conn.recv(65536):
                chunks.append(chunk)
        except TimeoutError:
            pass
    return b"".join(chunks)


def test_a_body_over_the_cap_is_refused_from_its_content_length():
    with serve(max_body_bytes=2000) as server:
        reply = post(server, {**OK, "messages": [{"role": "user", "content": "x" * 5000}]})
        assert reply.status_code == 413
        assert "at most 2000 bytes" in reply.json()["error"]["message"]
        assert "--max-body-bytes" in reply.json()["error"]["message"]
        assert still_serves(server)


def test_a_chunked_body_over_the_cap_is_refused_while_reading():
    def chunks():
        yield b'{"model": "echo", "messages": [{"role": "user", "content": "'
        for _ in range(10):
            yield b"x" * 500
        yield b'"}]}'

    with serve(max_body_bytes=2000) as server:
        reply = httpx.post(f"{server.url}/chat/completions", content=chunks())  # no Content-Length: chunked
        assert reply.status_code == 413 and "--max-body-bytes" in reply.json()["error"]["message"]
        assert still_serves(server)


def test_the_compute_cap_counts_n_prompt_and_max_tokens():
    with serve(max_request_compute=100) as server:
        # EchoBackend has no tokenizer: the prompt counts as its UTF-8 bytes (2 for "hi").
        reply = post(server, {**OK, "n": 10, "max_tokens": 10})
        assert reply.status_code == 400
        message = reply.json()["error"]["message"]
        assert "10 × 2 × 10 = 200" in message and "cap of 100" in message and "--max-request-compute" in message
        assert reply.json()["error"]["code"] == "limit_exceeded"
        assert post(server, {**OK, "n": 5, "max_tokens": 10}).status_code == 200  # exactly the cap: served


def test_the_token_cap_bounds_what_a_request_holds_in_memory():
    with serve(max_request_tokens=50) as server:
        reply = post(server, {**OK, "n": 4, "max_tokens": 12})
        assert reply.status_code == 400
        message = reply.json()["error"]["message"]
        assert "4 × (2 + 12) = 56 tokens" in message and "--max-request-tokens" in message
        assert post(server, {**OK, "n": 2, "max_tokens": 12}).status_code == 200


def test_the_default_max_tokens_counts_towards_the_compute_cap():
    with serve(max_request_compute=100, default_max_tokens=51) as server:
        assert post(server, OK).status_code == 400
        assert post(server, {**OK, "max_tokens": 50}).status_code == 200


def test_stop_and_n_caps():
    with serve(max_stop=3, max_n=4) as server:
        reply = post(server, {**OK, "stop": ["a", "b", "c", "d"]})
        assert reply.status_code == 400 and "'stop' has 4 entries" in reply.json()["error"]["message"]
        assert "--max-stop" in reply.json()["error"]["message"]
        assert still_serves(server)
        reply = post(server, {**OK, "n": 5})
        assert reply.status_code == 400 and "at most 4" in reply.json()["error"]["message"]
        assert "--max-n" in reply.json()["error"]["message"]
        assert still_serves(server)
        too_long = post(server, {**OK, "stop": "x" * 257})
        assert too_long.status_code == 400 and "at most 256 characters" in too_long.json()["error"]["message"]
        assert post(server, {**OK, "stop": ["a", "b", "c"], "n": 4}).status_code == 200


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("tools", [{"type": "function", "function": {"name": "f"}}], "'tools' is not supported"),
        ("tool_choice", "required", "'tool_choice' is not supported"),
        ("functions", [{"name": "f"}], "'functions' is not supported"),
        ("logit_bias", {"50": 100}, "'logit_bias' is not supported"),
        ("frequency_penalty", 0.5, "'frequency_penalty' is not supported"),
        ("presence_penalty", True, "'presence_penalty' is not supported"),
        ("store", True, "'store' is not supported"),
        ("modalities", ["text", "audio"], "'modalities' is not supported"),
        ("top_k", 5, "'top_k' is not supported by this server; send it unset (or as 0 or -1)"),
        ("skip_special_tokens", False, "'skip_special_tokens' is not supported"),
        ("best_of", 2, "'best_of' is not supported"),
        ("guided_json", {"type": "object"}, "'guided_json' is not a field this server knows"),
        ("response_format", {"type": "json_object"}, "cannot constrain its output"),
    ],
)
def test_unsupported_fields_are_refused_not_ignored(field, value, message):
    backend = EchoBackend()
    with make_server(backend, port=0).start() as server:
        reply = post(server, {**OK, field: value})
        assert reply.status_code == 400 and message in reply.json()["error"]["message"]
        assert reply.json()["error"]["param"] == field
        assert backend.calls == [] and still_serves(server)


def test_neutral_values_of_unsupported_fields_are_accepted():
    with serve() as server:
        neutral = {"tools": [], "tool_choice": "none", "frequency_penalty": 0, "presence_penalty": 0.0,
                   "logit_bias": {}, "store": False, "user": "someone", "return_token_ids": True,
                   "skip_special_tokens": True, "top_k": -1, "repetition_penalty": 1.0}
        assert post(server, {**OK, **neutral}).status_code == 200


def test_bad_json_and_wrong_types_are_400_never_500():
    with serve() as server:
        for content in (b"{not json", b"", b"[1, 2]", b'"text"', b"\xff\xfe"):
            reply = httpx.post(f"{server.url}/chat/completions", content=content)
            assert reply.status_code == 400, content
            assert reply.json()["error"]["type"] == "invalid_request_error"
        for body in ({**OK, "messages": "hi"}, {**OK, "messages": [["user", "hi"]]}, {**OK, "stream": "yes"},
                     {**OK, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}]},
                     {**OK, "n": 1e9}, {**OK, "seed": 1.5}, {**OK, "stream_options": {"include_usage": 1}}):
            reply = post(server, body)
            assert reply.status_code == 400, body
        assert still_serves(server)


def test_a_wrong_key_is_refused_before_the_body_is_read():
    with serve(api_key="secret") as server:
        # A gigabyte announced and none of it sent: the answer comes from the headers alone.
        head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer wrong\r\n"
                b"Content-Type: application/json\r\nContent-Length: 1000000000\r\n\r\n")
        start = time.monotonic()
        answer = raw(server, head)
        assert answer.startswith(b"HTTP/1.1 401") and b"invalid or missing API key" in answer
        assert time.monotonic() - start < 3
        # With the right key, the same announcement is refused as too large, again unread.
        answer = raw(server, head.replace(b"Bearer wrong", b"Bearer secret"))
        assert answer.startswith(b"HTTP/1.1 413") and b"--max-body-bytes" in answer
        assert still_serves(server, headers={"Authorization": "Bearer secret"})
        assert server.stats()["rejected"] == 2


def test_health_and_models_need_the_key():
    with serve(api_key="secret") as server:
        root = server.url.removesuffix("/v1")
        assert httpx.get(f"{root}/health").status_code == 401
        assert httpx.get(f"{server.url}/models").status_code == 401
        assert httpx.get(f"{root}/health", headers={"Authorization": "Bearer nope"}).status_code == 401
        health = httpx.get(f"{root}/health", headers={"Authorization": "Bearer secret"})
        assert health.status_code == 200 and health.json()["status"] == "ok"


def test_a_client_that_stalls_in_its_head_is_dropped():
    with serve(read_timeout_s=0.5) as server:
        start = time.monotonic()
        answer = raw(server, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")  # never ends its head
        assert answer == b"" and time.monotonic() - start < 3  # closed by the server, not by our 5 s timeout
        assert still_serves(server)


def test_a_client_that_stalls_in_its_body_gets_408():
    with serve(read_timeout_s=0.5) as server:
        start = time.monotonic()
        answer = raw(server, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"mo")
        assert answer.startswith(b"HTTP/1.1 408") and b"--read-timeout" in answer
        assert time.monotonic() - start < 3
        assert still_serves(server)


def test_an_idle_keep_alive_connection_is_closed():
    with serve(keep_alive_s=0.3, read_timeout_s=10) as server:
        start = time.monotonic()
        answer = raw(server, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")  # keep-alive: HTTP/1.1's default
        assert answer.startswith(b"HTTP/1.1 200") and time.monotonic() - start < 3
        assert still_serves(server)


def test_limits_must_be_positive():
    with pytest.raises(ValueError, match="max_n must be >= 1"):
        Limits(max_n=0)
    with pytest.raises(ValueError, match="must be > 0"):
        Limits(read_timeout_s=0)
