"""The frozen LLM simulator on a fake backend."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from simpop.agents.base import Generation, SamplingParams
from simpop.simulators.llm import FALLBACK_REPLY, LLMSimulator
from simpop.seat import SimulatorSpec
from tests.simulators.fakes import PHRASES, FakeBackend, FakeScenario, observation


def rngs(n: int, seed: int = 0) -> list[np.random.Generator]:
    return [np.random.default_rng([seed, i]) for i in range(n)]


def test_prompt_is_the_scenarios_instructions_and_the_chat_is_the_observation():
    backend = FakeBackend()
    sim = LLMSimulator(backend)
    sim.reset(FakeScenario(), np.random.default_rng(0))
    assert sim.act(observation("Hello!", "Hi.", "Would you donate?")) == PHRASES[0]
    chat = backend.calls[0][0][0]
    assert chat[0] == {"role": "system", "content": FakeScenario().user_instructions()}
    assert [m["role"] for m in chat[1:]] == ["user", "assistant", "user"]
    assert chat[-1]["content"] == "Would you donate?"


def test_a_rejected_message_is_explained_to_the_model():
    backend = FakeBackend()
    sim = LLMSimulator(backend)
    sim.reset(FakeScenario(), np.random.default_rng(0))
    sim.act(observation("Hello!", error="message too long"))
    assert "message too long" in backend.calls[0][0][0][-1]["content"]


def test_one_backend_call_per_batch_and_greedy_sends_each_distinct_chat_once():
    backend = FakeBackend()
    sim = LLMSimulator(backend)
    sim.reset_batch([FakeScenario()] * 4, rngs(4))
    obs = [observation("a"), observation("a"), observation("b"), observation("a")]
    assert sim.act_batch(obs, [0, 1, 2, 3]) == [PHRASES[0]] * 4
    assert len(backend.calls) == 1 and len(backend.calls[0][0]) == 2
    assert sim.stats == {"backend_calls": 1, "replies": 4, "empty_replies": 0, "backend_errors": 0, "surveys": 0,
                         "survey_scored": 0, "survey_unscored": 0, "survey_errors": 0}


@pytest.mark.parametrize("answer, fault", [
    (lambda chats: [Generation(None)] * len(chats), "generations without text"),         # text=None
    (lambda chats: [Generation(3)] * len(chats), "generations without text"),            # not a string
    (lambda chats: [Generation("Sure.")] * (len(chats) - 1), "generations for"),         # one missing
    (lambda chats: [Generation("Sure.")] * (len(chats) + 2), "generations for"),         # extra ones
    (lambda chats: None, "0 generations for"),                                          # nothing at all
])
def test_a_faulty_backend_answer_is_repaired_counted_and_logged(answer, fault, caplog):
    class Faulty(FakeBackend):
        def generate(self, chats, params):
            return answer(chats)

    for params in (SamplingParams(), SamplingParams(temperature=1.0)):  # greedy (deduplicating) and sampled paths
        sim = LLMSimulator(Faulty(), params)
        sim.reset_batch([FakeScenario()] * 3, rngs(3))
        with caplog.at_level("WARNING"):
            replies = sim.act_batch([observation("a"), observation("b"), observation("c")], [0, 1, 2])
        assert len(replies) == 3 and all(isinstance(r, str) and r for r in replies)
        assert sim.stats["backend_errors"] == 1 and sim.stats["replies"] == 3
        assert fault in caplog.text


def test_sampling_is_reproducible_from_the_slot_generators():
    def run(seed: int) -> list[str]:
        sim = LLMSimulator(FakeBackend(), SamplingParams(temperature=1.0))
        sim.reset_batch([FakeScenario()] * 8, rngs(8, seed))
        return sim.act_batch([observation("hi")] * 8, list(range(8))) + sim.act_batch([observation("hi")], [3])

    assert run(1) == run(1)
    assert run(1) != run(2)
    assert len(set(run(1))) > 1


def test_empty_replies_are_replaced_and_counted():
    backend = FakeBackend(respond=lambda chat, params, rng: "   \n" if "empty" in chat[-1]["content"] else "ok")
    sim = LLMSimulator(backend, SamplingParams(temperature=1.0))
    sim.reset_batch([FakeScenario()] * 2, rngs(2))
    assert sim.act_batch([observation("empty"), observation("fine")], [0, 1]) == [FALLBACK_REPLY, "ok"]
    assert sim.stats["empty_replies"] == 1


def test_a_persona_set_replaces_the_scenarios_persona_with_the_slot_generator():
    backend = FakeBackend()
    sim = LLMSimulator(backend, personas=["a pirate", "a nurse", "a judge"], persona_set="heldout")
    sim.reset_batch([FakeScenario()] * 6, rngs(6))
    chosen = [sim.scenario(i).persona for i in range(6)]
    assert set(chosen) <= {"a pirate", "a nurse", "a judge"} and len(set(chosen)) > 1
    again = LLMSimulator(backend, personas=["a pirate", "a nurse", "a judge"], persona_set="heldout")
    again.reset_batch([FakeScenario()] * 6, rngs(6))
    assert [again.scenario(i).persona for i in range(6)] == chosen
    sim.act_batch([observation("hi")], [0])
    assert chosen[0] in backend.calls[-1][0][0][0]["content"]

    @dataclass
    class NoPersona:
        id: str = "x"

        def user_instructions(self) -> str:
            return "hi"

    with pytest.raises(TypeError, match="persona"):
        sim.reset(NoPersona(), np.random.default_rng(0))
    with pytest.raises(ValueError, match="persona_set"):
        LLMSimulator(backend, personas=["a"])


def test_spec_describes_the_decoding_and_matches_the_parsed_string():
    sim = LLMSimulator(FakeBackend(), SamplingParams(max_new_tokens=64, temperature=0.7))
    assert sim.spec == SimulatorSpec.parse("frozen:fake?temperature=0.7")
    assert sim.name == "frozen:fake"


def test_snapshot_shares_the_backend_but_not_the_slots():
    sim = LLMSimulator(FakeBackend())
    sim.reset(FakeScenario(), np.random.default_rng(0))
    sim.act(observation("hi"))
    clone = sim.snapshot()
    assert clone.backend is sim.backend and clone.stats["replies"] == 0
    with pytest.raises(IndexError, match="reset_batch"):
        clone.act(observation("hi"))
    assert sim.act(observation("hi")) == PHRASES[0]
