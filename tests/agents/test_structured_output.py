"""Structured output: ``SamplingParams.json_schema`` through simpop serve and the OpenAI client (scripted
backends), and constrained decoding of the embedded SmolLM2 (slow)."""

from __future__ import annotations

import concurrent.futures
import json
import math
import re

import httpx
import pytest

from simpop.agents.base import Generation, SamplingParams, supports_json_schema
from simpop.agents.openai_backend import OpenAIBackend, RemoteBackendError, response_format
from simpop.serve.server import make_server
from simpop.simulators.verbalized import TEXT_PATTERN, parse_verbalized, verbalized_schema
from tests.agents.fakes import EchoBackend

CHAT = [{"role": "user", "content": "hi"}]
#: Every token of a text carries a character, so an answer takes at most 2 * (24 + 14) + 8 = 84 tokens:
#: with max_new_tokens=96 each one must end at end-of-turn.
SCHEMA = verbalized_schema(2, 24)


def follows(text: str, k: int, max_chars: int) -> bool:
    """Whether ``text`` is valid for ``verbalized_schema(k, max_chars)`` (checked independently of llguidance)."""
    try:
        value = json.loads(text)
    except ValueError:
        return False
    items = value.get("responses") if isinstance(value, dict) and set(value) == {"responses"} else None
    return isinstance(items, list) and len(items) == k and all(
        isinstance(item, dict) and set(item) == {"text", "probability"}
        and isinstance(item["text"], str) and 1 <= len(item["text"]) <= max_chars
        and re.fullmatch(TEXT_PATTERN, item["text"]) is not None
        and type(item["probability"]) in (int, float) and 0 <= item["probability"] <= 1
        and math.isclose(item["probability"] * 100, round(item["probability"] * 100), abs_tol=1e-6)
        for item in items)


class SchemaEcho(EchoBackend):
    """An :class:`EchoBackend` with structured output: under a schema it answers ``{"echo": <last message>}``
    and records each call's schema."""

    supports_json_schema = True

    def __init__(self) -> None:
        super().__init__()
        self.schemas: list[dict | None] = []

    def generate(self, chats, params):
        self.schemas.append(params.json_schema)
        if params.json_schema is None:
            return super().generate(chats, params)
        return [Generation(json.dumps({"echo": chat[-1]["content"]}), [3, 2], [0]) for chat in chats]


def test_sampling_params_take_a_json_schema():
    params = SamplingParams(json_schema=SCHEMA)
    assert params != SamplingParams() and params == SamplingParams(json_schema=verbalized_schema(2, 24))
    assert hash(params) == hash(SamplingParams())  # hashable although a dict is not
    with pytest.raises(ValueError, match="must be a JSON schema"):
        SamplingParams(json_schema='{"type": "object"}')
    with pytest.raises(ValueError, match="JSON-serialisable"):
        SamplingParams(json_schema={"type": "object", "default": object()})
    assert supports_json_schema(SchemaEcho()) and not supports_json_schema(EchoBackend())


def test_the_client_sends_the_schema_as_response_format():
    client = OpenAIBackend("http://127.0.0.1:9/v1", "m")
    payload = client._payload(CHAT, SamplingParams(json_schema=SCHEMA), 0)
    assert payload["response_format"] == {
        "type": "json_schema", "json_schema": {"name": "verbalized_responses", "schema": SCHEMA, "strict": True}}
    assert "response_format" not in client._payload(CHAT, SamplingParams(), 0)
    assert response_format({"type": "object", "title": "my schema: v2!"})["json_schema"]["name"] == "my_schema__v2_"
    assert response_format({"type": "object"})["json_schema"]["name"] == "response"
    plain = OpenAIBackend("http://127.0.0.1:9/v1", "m", structured_outputs=False)
    assert not supports_json_schema(plain) and supports_json_schema(client)
    assert "response_format" not in plain._payload(CHAT, SamplingParams(json_schema=SCHEMA), 0)


def test_serve_passes_response_format_to_a_constraining_backend():
    backend = SchemaEcho()
    with make_server(backend, port=0).start() as server:
        client = OpenAIBackend(server.url, "echo")
        constrained = client.generate([CHAT, CHAT], SamplingParams(max_new_tokens=8, json_schema=SCHEMA))
        free = client.generate([CHAT], SamplingParams(max_new_tokens=8))
        raw = [httpx.post(f"{server.url}/chat/completions", json={"model": "echo", "messages": CHAT,
                                                                  "response_format": fmt})
               for fmt in ({"type": "json_object"}, {"type": "text"})]
    assert [g.text for g in constrained] == ['{"echo": "hi"}'] * 2 and free[0].text == "echo: hi"
    assert backend.schemas[:2] == [SCHEMA, None] or backend.schemas[:3] == [SCHEMA, SCHEMA, None]
    assert backend.schemas[-2:] == [{"type": "object"}, None]
    assert [r.status_code for r in raw] == [200, 200]


def test_requests_with_different_schemas_are_not_batched_together():
    backend = SchemaEcho()
    other = {"type": "object", "properties": {"x": {"type": "integer"}}}
    with make_server(backend, port=0, batch_window_s=0.2).start() as server:
        client = OpenAIBackend(server.url, "echo")
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            jobs = [pool.submit(client.generate, [CHAT], SamplingParams(max_new_tokens=4, json_schema=schema))
                    for schema in (SCHEMA, other, SCHEMA, other)]
            assert all(job.result()[0].text == '{"echo": "hi"}' for job in jobs)
    assert sorted(map(json.dumps, backend.schemas)) == sorted(map(json.dumps, [SCHEMA, other]))


@pytest.mark.parametrize(("response_format", "message"), [
    ({"type": "json_schema", "json_schema": {"name": "x"}}, "needs 'json_schema'"),
    ({"type": "json_schema", "schema": {"type": "object"}}, "needs 'json_schema'"),
    ({"type": "xml"}, "'response_format' must be"),
    ("json", "'response_format' must be"),
])
def test_bad_response_formats_are_rejected(response_format, message):
    with make_server(SchemaEcho(), port=0).start() as server:
        reply = httpx.post(f"{server.url}/chat/completions",
                           json={"model": "echo", "messages": CHAT, "response_format": response_format})
    assert reply.status_code == 400 and message in reply.json()["error"]["message"]
    assert reply.json()["error"]["param"] == "response_format"


def test_a_backend_that_cannot_constrain_refuses_instead_of_answering_free_text():
    backend = EchoBackend()
    with make_server(backend, port=0).start() as server:
        with pytest.raises(RemoteBackendError, match="HTTP 400.*cannot constrain its output"):
            OpenAIBackend(server.url, "echo").generate([CHAT], SamplingParams(json_schema=SCHEMA))
        text = OpenAIBackend(server.url, "echo", structured_outputs=False).generate(
            [CHAT], SamplingParams(json_schema=SCHEMA))[0].text
    assert text == "echo: hi" and backend.calls == [(1, None)]


# ------------------------------------------------------------------------------ SmolLM2 (slow)
ASKS = [
    "Give two short replies to 'Will you donate?' with probabilities, as JSON.",
    "List two possible answers to 'How are you?' with their probabilities in JSON.",
    "Two ways to greet a stranger, with probabilities. JSON only.",
    "What might you say when asked for $1? Two options with probabilities, JSON.",
]


@pytest.mark.parametrize("params", [SamplingParams(max_new_tokens=96, json_schema=SCHEMA),
                                    SamplingParams(max_new_tokens=96, json_schema=SCHEMA, temperature=1.0,
                                                   top_p=0.9, seed=3, logprobs=True)],
                         ids=["greedy", "sampled-top-p"])
def test_a_batch_of_four_follows_the_schema(smollm2, params):
    generations = smollm2.generate([[{"role": "user", "content": ask}] for ask in ASKS], params)
    for g in generations:
        assert g.finish_reason == "stop" and g.token_ids[-1] in smollm2.eos_token_ids, g.text
        assert follows(g.text, 2, 24), g.text
        result = parse_verbalized(g.text, 2)
        assert result.ok and result.format_repairs == 0, result.repairs
        if params.logprobs:
            assert len(g.logprobs) == len(g.token_ids) and all(math.isfinite(x) and x <= 0 for x in g.logprobs)


def test_without_the_constraint_the_same_asks_do_not_all_follow_the_schema(smollm2):
    """What makes the answers above valid is the constraint, not the asks."""
    unconstrained = smollm2.generate([[{"role": "user", "content": ask}] for ask in ASKS],
                                     SamplingParams(max_new_tokens=96))
    assert not all(follows(g.text, 2, 24) for g in unconstrained)


def test_the_prefix_cache_composes_with_the_constraint(smollm2):
    params = SamplingParams(max_new_tokens=96, json_schema=SCHEMA)
    chats = [[{"role": "system", "content": "You answer in JSON."}, {"role": "user", "content": ask}] for ask in ASKS]
    uncached = smollm2.generate(chats, params)
    smollm2.prefix_cache = True
    try:
        smollm2.generate(chats, SamplingParams(max_new_tokens=4))  # caches the prompts
        hits = smollm2.prefix_hits
        cached = smollm2.generate(chats, params)
        assert smollm2.prefix_hits == hits + len(chats)
    finally:
        smollm2.prefix_cache = False
        smollm2.clear_prefix_cache()
    assert [g.text for g in cached] == [g.text for g in uncached]
    assert all(follows(g.text, 2, 24) for g in cached)


def test_the_mask_allows_the_schema_then_only_end_of_turn(smollm2):
    import torch

    from simpop.agents.json_mask import JSONSchemaMask

    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
              "additionalProperties": False}
    mask = JSONSchemaMask(smollm2._llg(), smollm2._grammar(schema), 2, smollm2.vocab_size)
    scores = mask(torch.zeros(2, 1, dtype=torch.long), torch.zeros(2, smollm2.vocab_size))
    allowed = [smollm2.tokenizer.decode([t]) for t in scores[0].isfinite().nonzero().flatten().tolist()]
    assert allowed and all(text.startswith("{") for text in allowed) and "{}" not in allowed
    doc = smollm2.tokenizer.encode('{"a": 12}', add_special_tokens=False)
    x = smollm2.tokenizer.encode("x", add_special_tokens=False)[0]
    history = torch.zeros(2, 1, dtype=torch.long)
    for token in doc:  # row 0 writes the document; row 1 writes "x..." (not JSON: generate() forced it)
        history = torch.cat([history, torch.tensor([[token], [x]])], dim=1)
        scores = mask(history, torch.zeros(2, smollm2.vocab_size))
    assert scores[0].isfinite().nonzero().flatten().tolist() == smollm2.eos_token_ids[:1]
    assert mask.errors and scores[1].isfinite().all()  # a row off the grammar is left to generate()
    with pytest.raises(ValueError, match="cannot be used for constrained decoding"):
        smollm2.generate([CHAT], SamplingParams(max_new_tokens=4, json_schema={"type": "no-such-type"}))


def test_simpop_serve_answers_structured_output_with_the_constrained_model(smollm2):
    with make_server(smollm2, port=0).start() as server:
        generations = OpenAIBackend(server.url, "smollm2").generate(
            [[{"role": "user", "content": ASKS[0]}]], SamplingParams(max_new_tokens=96, json_schema=SCHEMA))
    assert follows(generations[0].text, 2, 24) and generations[0].finish_reason == "stop"
