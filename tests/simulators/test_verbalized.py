"""Verbalized sampling: the robust parser (with property-based tests) and the simulator."""

from __future__ import annotations

import json
import math
import re
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simpop.agents.base import SamplingParams
from simpop.seat import Simulator, SimulatorSpec
from simpop.simulators.verbalized import FORMAT_REPAIRS, TEXT_PATTERN, VERBALIZED_INSTRUCTIONS, ParseResult, \
    Renormalised, VerbalizedSimulator, parse_verbalized, renormalise, text_budget, verbalized_schema
from tests.hypothesis_budget import examples
from tests.simulators.fakes import PHRASES, EchoSimulator, FakeBackend, FakeScenario, observation, verbalized_json


def assert_valid(result: ParseResult, k: int) -> None:
    if result.ok:
        texts = [t for t, _ in result.candidates]
        probs = [p for _, p in result.candidates]
        assert 1 <= len(texts) <= k
        assert all(isinstance(t, str) and t.strip() == t and t for t in texts)
        assert len({" ".join(t.split()).casefold() for t in texts}) == len(texts)
        assert all(math.isfinite(p) and p >= 0 for p in probs)
        assert math.isclose(sum(probs), 1.0, rel_tol=1e-9)
    else:
        assert result.candidates == [] and isinstance(result.error, str) and result.error


CASES = [
    # (model output, expected candidates or None for unusable, a repair that must be recorded)
    (verbalized_json(("Yes", 0.6), ("No", 0.4)), [("Yes", 0.6), ("No", 0.4)], None),
    ("```json\n" + verbalized_json(("Yes", 0.5), ("No", 0.5)) + "\n```", [("Yes", 0.5), ("No", 0.5)], "code_fence"),
    ("Here you go: " + verbalized_json(("Yes", 1.0)) + " Thanks!", [("Yes", 1.0)], "surrounding_text"),
    ("{'responses': [{'text': \"I'm in\", 'probability': 0.25}, {'text': 'no', 'probability': 0.75},]}",
     [("I'm in", 0.25), ("no", 0.75)], "relaxed_syntax"),
    ('{"responses": [{"text": "a", "probability": 0.5}, {"text": "b", "probability": 0.5},],}',
     [("a", 0.5), ("b", 0.5)], "relaxed_syntax"),
    ('{"responses": [{"text": "a", "probability": null}, {"text": "b", "probability": 0.2}, {"text": "c"}]}',
     [("a", 1 / 3), ("b", 1 / 3), ("c", 1 / 3)], "imputed_probabilities"),
    ('{"responses": [{"text": "a", "probability": "lots"}, {"text": "b", "probability": -1},'
     ' {"text": "c", "probability": 0.5}]}', [("a", 1 / 3), ("b", 1 / 3), ("c", 1 / 3)], "imputed_probabilities"),
    ('{"responses": [{"text": "a", "probability": "30%"}, {"text": "b", "probability": "70 %"}]}',
     [("a", 0.3), ("b", 0.7)], None),
    ('{"responses": [{"text": "a", "probability": 30}, {"text": "b", "probability": 90}]}',
     [("a", 0.25), ("b", 0.75)], "rescaled"),
    ('{"responses": [{"text": "a", "probability": 0}, {"text": "b", "probability": 0}]}',
     [("a", 0.5), ("b", 0.5)], None),
    ('{"responses": [{"text": "Yes!", "probability": 0.2}, {"text": " yes! ", "probability": 0.3},'
     ' {"text": "No", "probability": 0.5}]}', [("Yes!", 0.5), ("No", 0.5)], "merged_duplicates"),
    ('{"responses": []}', None, None),
    ('{"responses": [{"text": 3, "probability": 0.5}, {"text": ["x"]}, {"text": "  "}, 7, null]}', None,
     "dropped_items"),
    ('{"responses": [{"text": 3, "probability": 0.5}, {"text": "ok", "probability": 0.5}]}', [("ok", 1.0)],
     "dropped_items"),
    ('["a", "b", "c", "d", "e", "f"]', [(c, 0.2) for c in "abcde"], "truncated_to_k"),
    (verbalized_json(*[(c, p) for c, p in zip("abcdefg", [.05, .3, .05, .2, .1, .2, .1])]),
     [("b", 0.3 / 0.9), ("d", 0.2 / 0.9), ("e", 0.1 / 0.9), ("f", 0.2 / 0.9), ("g", 0.1 / 0.9)], "truncated_to_k"),
    ('{"responses": [{"text": "only one", "probability": 0.9}]}', [("only one", 1.0)], "rescaled"),
    ('{"candidates": [{"Reply": "a", "Prob": 0.5}, {"response": "b", "p": 0.5}]}', [("a", 0.5), ("b", 0.5)], None),
    ('{"text": "single", "probability": 1}', [("single", 1.0)], None),
    ('{"responses": [{"text": "one", "probability": 0.3}, {"text": "two", "probability": 0.7}, {"text": "thr',
     [("one", 0.3), ("two", 0.7)], "salvaged_objects"),
    # a cut constrained answer whose texts hold braces (seen with SmolLM2 at temperature 0.7)
    ('{"responses": [{"text": "Here. 45.}", "probability": 0.45}, {"text": "{x} 4}", "probability": 0.55}, '
     '{"text": "Here is JSON with a key. 16. 17. 19.', [("Here. 45.}", 0.45), ("{x} 4}", 0.55)], "salvaged_objects"),
    ('{"responses": [{"text": "a", "probability": true}, {"text": "b", "probability": 1e400}]}',
     [("a", 0.5), ("b", 0.5)], "imputed_probabilities"),
    ("", None, None), ("I would donate $1.", None, None), ("{}", None, None), ("[[[[" * 5000, None, None),
    ("null", None, None), ('{"responses": "a, b"}', None, None),
]


@pytest.mark.parametrize(("text", "expected", "repair"), CASES)
def test_parser_cases(text, expected, repair):
    result = parse_verbalized(text, k=5)
    assert_valid(result, 5)
    if expected is None:
        assert not result.ok
    else:
        assert result.ok, result.error
        assert [t for t, _ in result.candidates] == [t for t, _ in expected]
        assert [p for _, p in result.candidates] == pytest.approx([p for _, p in expected])
    if repair:
        assert result.repairs.get(repair, 0) > 0, result.repairs


@settings(max_examples=examples(400), deadline=None)
@given(st.text(), st.integers(1, 8))
def test_parser_never_raises_on_arbitrary_text(text, k):
    assert_valid(parse_verbalized(text, k), k)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8)
    | st.sampled_from(["30%", "0.5", " 1 ", "-2", "nan", "1e999"]),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.sampled_from(["text", "probability", "responses", "p", "Reply", "x"]) | st.text(max_size=4),
                      inner, max_size=4),
    max_leaves=20)
candidate = st.fixed_dictionaries({}, optional={"text": json_values | st.text(max_size=12),
                                                "probability": json_values, "extra": json_values})
payloads = json_values | st.fixed_dictionaries({"responses": st.lists(candidate | json_values, max_size=8)})


@st.composite
def jsonish(draw) -> str:
    text = json.dumps(draw(payloads), allow_nan=True)
    if draw(st.booleans()):
        text = text.replace('"', "'")
    if draw(st.booleans()):
        text = text.replace("}", ",}").replace("]", ",]")
    if draw(st.booleans()):
        text = text[: draw(st.integers(0, len(text)))]
    if draw(st.booleans()):
        text = "```json\n" + text + "\n```"
    return draw(st.text(max_size=5)) + text + draw(st.text(max_size=5))


@settings(max_examples=examples(600), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(jsonish(), st.integers(1, 8))
def test_parser_never_raises_on_jsonish_text(text, k):
    assert_valid(parse_verbalized(text, k), k)


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.tuples(st.text(min_size=1, max_size=10).filter(str.strip),
                          st.floats(0.001, 1e6)), min_size=1, max_size=5,
                unique_by=lambda c: " ".join(c[0].split()).casefold()))
def test_well_formed_answers_keep_their_texts_and_proportions(pairs):
    text = json.dumps({"responses": [{"text": t, "probability": p} for t, p in pairs]})
    result = parse_verbalized(text, k=5)
    assert [t for t, _ in result.candidates] == [t.strip() for t, _ in pairs]
    total = sum(p for _, p in pairs)
    assert [p for _, p in result.candidates] == pytest.approx([p / total for _, p in pairs])


@given(st.lists(st.floats(0, 1e300), min_size=1, max_size=8).filter(lambda ps: sum(ps) > 0),
       st.floats(0, 0.99), st.floats(0.01, 100))
def test_renormalise_is_a_distribution_with_the_floor(probs, floor, tau):
    q = renormalise(probs, floor, tau)
    assert all(math.isfinite(x) and x >= 0 for x in q) and math.isclose(sum(q), 1.0)
    if tau == 1.0:
        assert min(q) >= floor / (1 + len(q) * floor) - 1e-12


def test_renormalise_floor_and_temperature():
    assert renormalise([0.9, 0.1, 0.0], floor=0.0, tau=1.0) == pytest.approx([0.9, 0.1, 0.0])
    assert renormalise([0.9, 0.1, 0.0], floor=0.1, tau=1.0) == pytest.approx([0.9 / 1.1, 0.1 / 1.1, 0.1 / 1.1])
    sharp, flat = renormalise([0.6, 0.4], 0.0, 0.5), renormalise([0.6, 0.4], 0.0, 4.0)
    assert sharp[0] == pytest.approx(0.36 / 0.52) and 0.5 < flat[0] < 0.6
    for bad in [dict(floor=1.0, tau=1.0), dict(floor=0.0, tau=0.0)]:
        with pytest.raises(ValueError):
            renormalise([1.0], **bad)


def make(respond, n: int = 1, **kwargs) -> tuple[VerbalizedSimulator, FakeBackend]:
    backend = FakeBackend(respond=respond)
    sim = VerbalizedSimulator(backend, **kwargs)
    sim.reset_batch([FakeScenario()] * n, [np.random.default_rng([3, i]) for i in range(n)])
    return sim, backend


def test_samples_follow_the_renormalised_distribution():
    answer = verbalized_json(("Yes", 0.7), ("No", 0.2), ("Maybe", 0.1))
    sim, backend = make(lambda chat, params, rng: answer, n=400, floor=0.0)
    replies = sim.act_batch([observation("Donate?")] * 400, list(range(400)))
    counts = Counter(replies)
    assert set(counts) == {"Yes", "No", "Maybe"}
    assert counts["Yes"] / 400 == pytest.approx(0.7, abs=0.07) and counts["Maybe"] / 400 == pytest.approx(0.1, abs=0.05)
    assert len(backend.calls) == 1 and len(backend.calls[0][0]) == 1  # greedy: one distinct chat
    prompt = backend.calls[0][0][0][0]["content"]
    assert prompt.endswith(VERBALIZED_INSTRUCTIONS.format(k=5, max_chars=text_budget(256, 5)))
    assert sim.stats["calls"] == 400 and sim.stats["fallbacks"] == 0 and sim.fallback_rate == 0.0


def test_temperature_sharpens_the_choice():
    answer = verbalized_json(("Yes", 0.6), ("No", 0.4))
    sim, _ = make(lambda chat, params, rng: answer, n=300, floor=0.0, tau=0.1)
    assert Counter(sim.act_batch([observation("Donate?")] * 300, list(range(300))))["Yes"] > 290


def test_unusable_answers_fall_back_to_plain_sampling_and_are_counted():
    def respond(chat, params, rng):
        if "JSON" in chat[0]["content"]:
            return "I'm not sure what you mean." if "bad" in chat[-1]["content"] else verbalized_json(("Fine", 1.0))
        return PHRASES[int(rng.integers(len(PHRASES)))]

    sim, backend = make(respond, n=3)
    replies = sim.act_batch([observation("bad"), observation("good"), observation("bad")], [0, 1, 2])
    assert replies[1] == "Fine" and replies[0] in PHRASES and replies[2] in PHRASES
    fallback_chats, fallback_params = backend.calls[-1]
    assert len(fallback_chats) == 2 and fallback_params.temperature == 1.0
    assert "JSON" not in fallback_chats[0][0]["content"]
    assert sim.stats["fallbacks"] == 2 and sim.stats["calls"] == 3 and sim.fallback_rate == pytest.approx(2 / 3)


def test_distribution_is_the_renormalised_candidates_or_a_counted_fallback():
    sim, _ = make(lambda chat, params, rng: verbalized_json(("Yes", 0.75), ("No", 0.25)), floor=0.0)
    texts, probs = zip(*sim.distribution(observation("Donate?")))
    assert texts == ("Yes", "No") and probs == pytest.approx([0.75, 0.25])
    sim, _ = make(lambda chat, params, rng: "garbage" if "JSON" in chat[0]["content"] else "Hm.", k=4)
    assert sim.distribution(observation("Donate?")) == [("Hm.", 1.0)]
    assert sim.stats["fallbacks"] == 1


@settings(max_examples=examples(150), deadline=None)
@given(st.lists(st.text(max_size=60) | jsonish(), min_size=1, max_size=4))
def test_simulator_never_crashes_and_counts_every_fallback(answers):
    def respond(chat, params, rng):
        if "JSON" in chat[0]["content"]:
            return answers[int(chat[-1]["content"])]
        return ""  # even the fallback can fail: the empty reply is replaced

    n = len(answers)
    sim, _ = make(respond, n=n)
    replies = sim.act_batch([observation(str(i)) for i in range(n)], list(range(n)))
    assert all(isinstance(r, str) and r.strip() for r in replies)
    unusable = sum(not parse_verbalized(a, 5).ok for a in answers)
    assert sim.stats["fallbacks"] == unusable and sim.stats["empty_replies"] == unusable


def test_spec_and_validation():
    sim = VerbalizedSimulator(FakeBackend(), k=3, tau=0.7, floor=0.02,
                              params=SamplingParams(max_new_tokens=256))
    assert str(sim.spec) == ("verbalized:fake?constrained=True&fallback_max_new_tokens=64&fallback_temperature=1.0"
                             "&floor=0.02&k=3&max_new_tokens=256&personas=scenario&tau=0.7&temperature=0.0&top_p=1.0")
    assert not dict(VerbalizedSimulator(FakeBackend(), constrained=False).spec.decoding)["constrained"]
    for bad in [dict(k=0), dict(tau=0), dict(floor=1.5)]:
        with pytest.raises(ValueError):
            VerbalizedSimulator(FakeBackend(), **bad)


class Stated(Simulator):
    """A simulator stating a fixed distribution over three actions; it counts the commits per slot."""

    name = "stated"
    options = [("a", 0.7), ("b", 0.25), ("c", 0.05)]

    def reset_batch(self, scenarios, rngs):
        self.rngs, self.committed = list(rngs), [[] for _ in rngs]

    def act_batch(self, observations, slots):
        raise AssertionError("a renormalised simulator draws from the stated distribution; it never calls act")

    def distribution(self, observation, slot=0):
        return list(self.options)

    def commit(self, observation, slot, action):
        self.committed[slot].append((observation, action))

    def slot_rng(self, slot):
        return self.rngs[slot]

    @property
    def spec(self):
        return SimulatorSpec("stated", "table", "p", {"temperature": 1.0})


def test_renormalised_draws_from_the_renormalised_distribution_with_the_slot_generator():
    sim = Renormalised(Stated(), floor=0.1, tau=0.5)
    assert sim.name == "verbalized-stated"
    expected = renormalise([0.7, 0.25, 0.05], 0.1, 0.5)
    assert sim.distribution("obs") == list(zip("abc", expected))
    sim.reset_batch([FakeScenario()] * 300, [np.random.default_rng([1, i]) for i in range(300)])
    actions = sim.act_batch(["obs"] * 300, list(range(300)))
    assert actions == ["abc"[int(np.random.default_rng([1, i]).choice(3, p=expected))] for i in range(300)]
    assert Counter(actions)["c"] / 300 == pytest.approx(expected[2], abs=0.05)
    assert all(sim.inner.committed[i] == [("obs", a)] for i, a in enumerate(actions))
    assert sim.slot_rng(7) is sim.inner.rngs[7]
    assert sim.spec == SimulatorSpec("verbalized", "stated:table", "p", {"temperature": 1.0, "floor": 0.1, "tau": 0.5})
    with pytest.raises(TypeError, match="does not state its distribution"):
        Renormalised(EchoSimulator("e"))
    for bad in [dict(floor=1.0), dict(tau=0.0)]:
        with pytest.raises(ValueError):
            Renormalised(Stated(), **bad)


# ================================================================================ structured output
class SchemaBackend(FakeBackend):
    """A backend with structured output: under a ``json_schema`` it answers with a document valid for the
    verbalized schema (phrases drawn with the call's rng, probabilities in hundredths), else with prose
    (a small model that ignores the requested format)."""

    supports_json_schema = True

    def __init__(self):
        super().__init__(name="fake", respond=self.answer)

    @staticmethod
    def answer(chat, params, rng):
        if params.json_schema is None:
            return "Sure, here are some replies I might give: hello, maybe, no."
        responses = params.json_schema["properties"]["responses"]
        k, limit = responses["minItems"], responses["items"]["properties"]["text"]["maxLength"]
        return json.dumps({"responses": [{"text": PHRASES[int(rng.integers(len(PHRASES)))][:limit],
                                          "probability": int(rng.integers(101)) / 100} for _ in range(k)]})


def test_schema_and_text_budget():
    schema = verbalized_schema(3, 50)
    responses = schema["properties"]["responses"]
    assert responses["minItems"] == responses["maxItems"] == 3 and schema["required"] == ["responses"]
    item = responses["items"]
    assert item["required"] == ["text", "probability"] and item["additionalProperties"] is False
    assert item["properties"]["text"] == {"type": "string", "minLength": 1, "maxLength": 50, "pattern": TEXT_PATTERN}
    assert item["properties"]["probability"]["minimum"] == 0 and item["properties"]["probability"]["maximum"] == 1
    assert text_budget(256, 5) == 105 and text_budget(64, 2) == 42 and text_budget(12, 2) == 16
    for max_new_tokens in range(38, 1024, 7):  # the first candidate always fits (1+ character per token)
        for k in range(1, 9):
            assert 16 <= text_budget(max_new_tokens, k) <= max_new_tokens - 22
    assert text_budget(64, 1) == 42
    texts = ["Hi there! [DONATE $0.50]", "x", "It's {fine} ~ ok?", " x", "x ", "", "é", "a\nb", 'say "hi"', "a\\b"]
    assert [bool(re.fullmatch(TEXT_PATTERN, t)) for t in texts] == [True] * 3 + [False] * 7
    with pytest.raises(ValueError):
        verbalized_schema(0, 10)


def test_constrained_requests_carry_the_schema_and_need_no_repair():
    backend = SchemaBackend()
    sim = VerbalizedSimulator(backend, k=4, params=SamplingParams(max_new_tokens=128, temperature=0.7))
    sim.reset_batch([FakeScenario()] * 40, [np.random.default_rng([5, i]) for i in range(40)])
    replies = sim.act_batch([observation(f"Donate {i}?") for i in range(40)], list(range(40)))
    (chats, params), = backend.calls
    assert params.json_schema == sim.schema == verbalized_schema(4, text_budget(128, 4))
    assert chats[0][0]["content"].endswith(sim.suffix) and "JSON" in sim.suffix
    assert set(replies) <= set(PHRASES) and len(set(replies)) > 1
    assert sim.stats["calls"] == 40 and sim.stats["fallbacks"] == 0 and sim.stats["format_repairs"] == 0
    assert not any(sim.stats.get(f"repair:{key}") for key in FORMAT_REPAIRS)


def test_unconstrained_sends_the_same_prompt_without_schema_and_parses_robustly():
    backend = SchemaBackend()
    sim = VerbalizedSimulator(backend, k=4, constrained=False)
    sim.reset_batch([FakeScenario()] * 3, [np.random.default_rng(i) for i in range(3)])
    replies = sim.act_batch([observation("Donate?")] * 3, [0, 1, 2])
    (chats, params), (fallback_chats, fallback_params) = backend.calls
    assert params.json_schema is None and fallback_params.json_schema is None
    assert chats[0][0]["content"].endswith(VerbalizedSimulator(backend, k=4).suffix)
    assert sim.stats["fallbacks"] == 3 and replies == [SchemaBackend.answer(None, fallback_params, None)] * 3


printable = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), min_size=1, max_size=40)


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(st.tuples(printable.filter(lambda t: re.fullmatch(TEXT_PATTERN, t) is not None),
                          st.integers(0, 100)), min_size=1, max_size=6),
       st.sampled_from([(", ", ": "), (",", ":")]))
def test_any_document_valid_for_the_schema_parses_without_format_repair(pairs, separators):
    text = json.dumps({"responses": [{"text": t, "probability": p / 100} for t, p in pairs]}, separators=separators)
    result = parse_verbalized(text, k=len(pairs))
    assert result.ok and result.format_repairs == 0, result.repairs
    distinct = {" ".join(t.split()).casefold() for t, _ in pairs}
    assert len(result.candidates) == len(distinct)
    assert set(result.repairs) <= {"rescaled", "merged_duplicates"}


def test_renormalise_rows_is_renormalise_row_by_row():
    from simpop.simulators.verbalized import renormalise_rows

    rng = np.random.default_rng(0)
    for k in (1, 2, 5, 8, 17):
        p = rng.dirichlet(np.ones(k), size=50) * rng.uniform(0.5, 2.0, size=(50, 1))
        p[0, 0] = 0.0 if k > 1 else p[0, 0]  # a zero probability (a row of one keeps its mass)
        for floor, tau in ((0.0, 1.0), (0.01, 0.2), (0.3, 3.0)):
            rows = renormalise_rows(p, floor, tau)
            assert [r.tolist() for r in rows] == [renormalise(list(row), floor, tau) for row in p]
    with pytest.raises(ValueError, match="not all zero"):
        renormalise_rows(np.array([[0.5, 0.5], [0.0, 0.0]]), 0.0, 1.0)
