"""``simpop serve`` under abuse: abandoned requests stop the model, shutdown is prompt, lone surrogates are 400s."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from simpop.agents.base import Generation
from simpop.serve.server import make_server
from simpop.serve.requests import Limits

CHAT = [{"role": "user", "content": "hi"}]


class Stoppable:
    """A backend whose every call works for up to 15 s, in steps, unless its ``stop_event`` is set (as a
    TransformersBackend's generate stops at its next token)."""

    name = "slow"

    def __init__(self):
        self.stop_event = threading.Event()
        self.calls, self.stopped = 0, 0

    def generate(self, chats, params):
        self.calls += 1
        if chats[-1][-1]["content"] != "quick":
            for _ in range(300):
                if self.stop_event.is_set():
                    self.stopped += 1
                    break
                time.sleep(0.05)
        return [Generation(text="done", token_ids=[1], prompt_ids=[0]) for _ in chats]


def test_an_abandoned_request_stops_the_model_and_frees_the_server():
    backend = Stoppable()
    with make_server(backend, port=0).start() as server:
        with pytest.raises(httpx.TimeoutException):  # the client gives up and disconnects
            httpx.post(f"{server.url}/chat/completions", json={"model": "slow", "messages": CHAT, "n": 16},
                       timeout=1.0)
        reply = httpx.post(f"{server.url}/chat/completions", timeout=10.0,
                           json={"model": "slow", "messages": [{"role": "user", "content": "quick"}]})
        assert reply.status_code == 200 and backend.stopped == 1
        health = httpx.get(f"{server.url.removesuffix('/v1')}/health", timeout=5).json()
        assert health["in_flight"] == 0


def test_shutdown_with_a_request_in_flight_is_prompt():
    backend = Stoppable()
    server = make_server(backend, port=0, limits=Limits(shutdown_grace_s=0.5)).start()
    client = threading.Thread(target=lambda: httpx.post(f"{server.url}/chat/completions", timeout=90,
                                                        json={"model": "slow", "messages": CHAT}), daemon=True)
    client.start()
    deadline = time.monotonic() + 10
    while backend.calls == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    started = time.monotonic()
    closer = threading.Thread(target=server.close, daemon=True)
    closer.start()
    closer.join(15)
    assert not closer.is_alive() and time.monotonic() - started < 10 and backend.stopped == 1
    # the backend outlives the server: its next in-process call must run whole, not stop at once
    assert not backend.stop_event.is_set()


@pytest.mark.parametrize("body", [
    b'{"model": "slow", "messages": [{"role": "user", "content": "quick \\ud800"}]}',
    b'{"model": "s\\udfff", "messages": [{"role": "user", "content": "quick"}]}',
])
def test_lone_surrogates_are_400_not_500(body):
    with make_server(Stoppable(), port=0).start() as server:
        reply = httpx.post(f"{server.url}/chat/completions", content=body, timeout=10)
        assert reply.status_code == 400 and "not valid Unicode" in reply.json()["error"]["message"]


def test_a_transformers_backend_stops_at_the_next_token_when_asked(one_torch_thread):
    from simpop.agents.base import SamplingParams
    from simpop.agents.transformers_backend import TransformersBackend

    backend = TransformersBackend("smollm2")
    prompts = [backend.encode_chat([{"role": "user", "content": "Count to one hundred."}])] * 2
    backend.stop_event.set()
    stopped = backend.generate_ids(prompts, SamplingParams(max_new_tokens=64, temperature=1.0, seed=0))
    assert [len(g.token_ids) for g in stopped] == [1, 1]
    backend.stop_event.clear()
    full = backend.generate_ids(prompts, SamplingParams(max_new_tokens=8, temperature=1.0, seed=0))
    assert all(len(g.token_ids) > 1 for g in full)
