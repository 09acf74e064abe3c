"""``simpop serve``: ``/v1/completions`` (token ids in and out), streaming, and ``top_logprobs``.

A scripted token backend (with a tiny torch "model" for top log-probabilities) stands in for a real model,
except in one round trip with SmolLM2.
"""

from __future__ import annotations

import concurrent.futures
import json
from types import SimpleNamespace

import httpx
import pytest
import torch

from simpop.agents.base import Generation
from simpop.serve.server import make_server
from tests.agents.fakes import EchoBackend

CHAT = [{"role": "user", "content": "hi"}]
VOCAB = 10


class TinyLM(torch.nn.Module):
    """Logits that ignore the input: token ``t`` always scores ``t / 2`` (so 9 is the most likely)."""

    def forward(self, input_ids: torch.Tensor) -> SimpleNamespace:
        scores = torch.arange(VOCAB, dtype=torch.float) / 2
        return SimpleNamespace(logits=scores.expand(*input_ids.shape, VOCAB))


class TokenEcho:
    """A token backend: a chat encodes as its messages' lengths then 1; a completion is the prompt's last id
    then 9, with log-probs -1 and -2; text encodes character by character (code point mod 10)."""

    name = "tok"

    def __init__(self) -> None:
        self.calls: list[int] = []
        self.model = TinyLM()
        self.tokenizer = lambda text: {"input_ids": [ord(c) % VOCAB for c in text]}

    def encode_chat(self, chat, add_generation_prompt=True):
        return [len(m["content"]) % VOCAB for m in chat] + [1]

    def generate(self, chats, params):
        return self.generate_ids([self.encode_chat(c) for c in chats], params)

    def generate_ids(self, prompts, params):
        self.calls.append(len(prompts))
        return [Generation(text=f"after {p[-1]}", token_ids=[p[-1], 9], prompt_ids=list(p),
                           logprobs=[-1.0, -2.0] if params.logprobs else None, finish_reason="length")
                for p in prompts]


@pytest.fixture
def served():
    backend = TokenEcho()
    with make_server(backend, port=0).start() as server:
        yield server, backend


def complete(server, **body):
    return httpx.post(f"{server.url}/completions", json={"model": "tok", **body})


def events(reply) -> list:
    """The JSON chunks of a server-sent-events reply; asserts it ends with [DONE]."""
    lines = [line.removeprefix("data: ") for line in reply.text.split("\n\n") if line]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def test_token_ids_in_token_ids_out(served):
    server, backend = served
    reply = complete(server, prompt=[5, 6, 7], max_tokens=2, n=2, logprobs=0)
    assert reply.status_code == 200
    body = reply.json()
    assert body["object"] == "text_completion" and [c["index"] for c in body["choices"]] == [0, 1]
    choice = body["choices"][0]
    assert (choice["text"], choice["token_ids"], choice["prompt_token_ids"]) == ("after 7", [7, 9], [5, 6, 7])
    assert choice["logprobs"] == {"tokens": ["token_id:7", "token_id:9"], "token_logprobs": [-1.0, -2.0],
                                  "top_logprobs": None, "text_offset": None}
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    assert backend.calls == [2]


def test_a_vllm_style_completion_request_is_served(served):
    server, _ = served  # what a client written for vLLM sends (its sampling extensions at neutral values)
    reply = complete(server, prompt=[5, 6], max_tokens=4, temperature=0.0, top_p=1.0, return_token_ids=True,
                     skip_special_tokens=True, logprobs=0, seed=3, stop=["\n"])
    assert reply.status_code == 200 and reply.json()["choices"][0]["token_ids"] == [6, 9]


def test_text_prompts_and_batches_of_prompts(served):
    server, backend = served
    text = complete(server, prompt="ab").json()  # 'a' = 97 -> 7, 'b' = 98 -> 8
    assert text["choices"][0]["prompt_token_ids"] == [7, 8] and text["choices"][0]["text"] == "after 8"
    batch = complete(server, prompt=[[1, 2], [3]], n=2).json()
    assert [c["prompt_token_ids"] for c in batch["choices"]] == [[1, 2], [1, 2], [3], [3]]
    assert [c["index"] for c in batch["choices"]] == [0, 1, 2, 3]
    assert batch["usage"]["prompt_tokens"] == 3
    texts = complete(server, prompt=["a", "b"]).json()
    assert [c["text"] for c in texts["choices"]] == ["after 7", "after 8"]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"prompt": []}, "invalid 'prompt'"),
        ({"prompt": [1, "a"]}, "invalid 'prompt': expected a non-empty string, a non-empty list of token ids"),
        ({"prompt": [[]]}, "invalid 'prompt'"),
        ({"prompt": "a", "echo": True}, "'echo' is not supported"),
        ({"prompt": "a", "suffix": "z"}, "'suffix' is not supported"),
        ({"prompt": "a", "best_of": 3}, "'best_of' is not supported"),
        ({"prompt": "a", "logprobs": 21}, "invalid 'logprobs'"),
        ({"prompt": "a", "logprobs": True}, "invalid 'logprobs'"),
        ({"prompt": "a", "messages": CHAT}, "'messages' is not a field this server knows"),
        ({"prompt": [[1]] * 129}, "at most 128 per request"),
    ],
)
def test_bad_completion_requests(served, body, message):
    server, backend = served
    reply = complete(server, **body)
    assert reply.status_code == 400 and message in reply.json()["error"]["message"]
    assert backend.calls == [] and complete(server, prompt=[1]).status_code == 200


def test_a_backend_without_tokens_cannot_complete():
    with make_server(EchoBackend(), port=0).start() as server:
        reply = httpx.post(f"{server.url}/completions", json={"model": "echo", "prompt": [1, 2]})
        assert reply.status_code == 400 and "use /v1/chat/completions" in reply.json()["error"]["message"]


def test_chat_and_text_completions_batch_together():
    backend = TokenEcho()
    with make_server(backend, port=0, batch_window_s=0.3).start() as server:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            chat = pool.submit(httpx.post, f"{server.url}/chat/completions",
                               json={"model": "tok", "messages": CHAT, "max_tokens": 16, "temperature": 1.0})
            text = pool.submit(complete, server, prompt=[2, 1], max_tokens=16)
            assert chat.result().json()["prompt_token_ids"] == [2, 1]
            assert text.result().json()["choices"][0]["token_ids"] == [1, 9]
        assert backend.calls == [2]  # one backend call: the chat was tokenised by the server


def test_top_logprobs_come_from_the_model(served):
    server, _ = served
    reply = httpx.post(f"{server.url}/chat/completions",
                       json={"model": "tok", "messages": CHAT, "logprobs": True, "top_logprobs": 3, "temperature": 0})
    content = reply.json()["choices"][0]["logprobs"]["content"]
    expected = torch.log_softmax(torch.arange(VOCAB, dtype=torch.float) / 2, -1)
    for entry in content:
        assert [t["token"] for t in entry["top_logprobs"]] == ["token_id:9", "token_id:8", "token_id:7"]
        assert [t["logprob"] for t in entry["top_logprobs"]] == pytest.approx(expected[[9, 8, 7]].tolist())
    # At temperature 2 the logits are halved first.
    hot = complete(server, prompt=[1], logprobs=2, temperature=2.0).json()["choices"][0]["logprobs"]
    halved = torch.log_softmax(torch.arange(VOCAB, dtype=torch.float) / 4, -1)
    assert hot["top_logprobs"][0] == pytest.approx({"token_id:9": halved[9].item(), "token_id:8": halved[8].item()})


def test_streamed_chat_matches_the_plain_answer(served):
    server, _ = served
    body = {"model": "tok", "messages": CHAT, "n": 2, "logprobs": True, "seed": 3}
    plain = httpx.post(f"{server.url}/chat/completions", json=body).json()
    reply = httpx.post(f"{server.url}/chat/completions",
                       json={**body, "stream": True, "stream_options": {"include_usage": True}})
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/event-stream")
    chunks = events(reply)
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    for index in (0, 1):
        mine = [c["choices"][0] for c in chunks if c["choices"] and c["choices"][0]["index"] == index]
        assert mine[0]["delta"]["role"] == "assistant"
        assert "".join(c["delta"].get("content", "") for c in mine) == plain["choices"][index]["message"]["content"]
        assert [c["finish_reason"] for c in mine][-1] == plain["choices"][index]["finish_reason"]
        assert sum((c.get("token_ids") or [] for c in mine), []) == plain["choices"][index]["token_ids"]
        logprobs = [e for c in mine if c["logprobs"] for e in c["logprobs"]["content"]]
        assert logprobs == plain["choices"][index]["logprobs"]["content"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == plain["usage"]


def test_streamed_text_completion(served):
    server, _ = served
    chunks = events(complete(server, prompt=[4], stream=True))
    assert all(c["object"] == "text_completion" for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in chunks) == "after 4"
    assert chunks[-1]["choices"][0]["finish_reason"] == "length" and "usage" not in chunks[-1]


def test_a_refused_stream_is_a_plain_json_error(served):
    server, _ = served
    reply = complete(server, prompt=[1], stream=True, n=0)
    assert reply.status_code == 400 and reply.headers["content-type"] == "application/json"


def test_real_model_completions_and_top_logprobs(smollm2, one_torch_thread):
    model = smollm2
    ids = model.encode_chat(CHAT)
    with make_server(model, port=0).start() as server:
        chat = httpx.post(f"{server.url}/chat/completions", json={
            "model": "smollm2", "messages": CHAT, "max_tokens": 4, "temperature": 0, "logprobs": True,
            "top_logprobs": 2}).json()
        text = httpx.post(f"{server.url}/completions", json={
            "model": "smollm2", "prompt": ids, "max_tokens": 4, "temperature": 0, "logprobs": 2}).json()
    choice = chat["choices"][0]
    assert chat["prompt_token_ids"] == ids == text["choices"][0]["prompt_token_ids"]
    assert choice["token_ids"] == text["choices"][0]["token_ids"] and len(choice["token_ids"]) == 4
    for entry in choice["logprobs"]["content"]:  # greedy: the chosen token is the most likely one
        assert entry["top_logprobs"][0]["token"] == entry["token"]
        assert entry["top_logprobs"][0]["logprob"] == pytest.approx(entry["logprob"], abs=1e-3)
    assert text["choices"][0]["logprobs"]["token_logprobs"] == pytest.approx(
        [e["logprob"] for e in choice["logprobs"]["content"]], abs=1e-4)
