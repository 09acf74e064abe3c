"""LLM simulators answer a closing survey as a constrained choice (scored options), or in counted free text."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch

import simpop
from simpop.agents.base import Chat, SamplingParams
from simpop.rollout import RolloutEngine
from simpop.seat import SURVEY_KEY, Player, Scores, Simulator, Survey, SurveyAnswerer, Trainable, survey_of
from simpop.simulators.llm import DialogueFormat, LLMSimulator
from simpop.simulators.verbalized import VerbalizedSimulator, renormalise
from tests.simulators.fakes import FakeBackend, FakeScenario, observation, verbalized_json

OPTIONS = ("$0.00", "$0.50", "$1.00", "$2.00")
SURVEY = Survey("How much of your $2 do you donate? Answer with one of: " + ", ".join(OPTIONS) + ".", OPTIONS)
STATED = {"$0.00": 0.1, "$0.50": 0.2, "$1.00": 0.6, "$2.00": 0.1}


def survey_observation(*texts: str, survey: Survey = SURVEY) -> str:
    view = json.loads(observation(*texts))
    view[SURVEY_KEY] = survey.as_dict()
    return json.dumps(view)


def rngs(n: int, seed: int = 0) -> list[np.random.Generator]:
    return [np.random.default_rng([seed, i]) for i in range(n)]


@dataclass
class FakeScores:
    logprobs: torch.Tensor
    mask: torch.Tensor


def stated(prompt: str, option: str) -> float:
    """Default preferences: log of :data:`STATED` whatever the prompt."""
    return math.log(STATED[option])


@dataclass
class ScoringBackend(FakeBackend):
    """A :class:`FakeBackend` that can score: one token per character, and a reply's log-probability is
    ``prefs(prompt text, reply text)`` (all of it on the reply's first token)."""

    prefs: Callable[[str, str], float] = stated
    score_calls: list[int] = field(default_factory=list)
    fail: bool = False

    def encode_chat(self, chat: Chat, add_generation_prompt: bool = True) -> list[int]:
        ids: list[int] = []
        for message in chat:
            ids += [{"system": 1, "user": 2, "assistant": 3}[message["role"]]]
            ids += [ord(c) + 10 for c in message["content"]] + [4]
        return ids + ([3] if add_generation_prompt else [])

    def token_logprobs(self, sequences: list[list[int]], masks: list[list[int]], temperature: float = 1.0):
        if self.fail:
            raise RuntimeError("out of memory")
        self.score_calls.append(len(sequences))
        width = max(map(len, sequences))
        logprobs, mask = torch.zeros(len(sequences), width), torch.zeros(len(sequences), width)
        for row, (seq, m) in enumerate(zip(sequences, masks)):
            start = m.index(1)
            prompt = "".join(chr(t - 10) for t in seq[:start] if t >= 10)
            reply = "".join(chr(t - 10) for t, bit in zip(seq, m) if bit and t >= 10)
            logprobs[row, start] = self.prefs(prompt, reply)
            mask[row, start:len(seq)] = 1.0
        return FakeScores(logprobs, mask)


def test_the_survey_protocol_and_reading_observations():
    assert isinstance(LLMSimulator(FakeBackend()), SurveyAnswerer)
    assert survey_of(survey_observation("hi")) == SURVEY
    for bad in [observation("hi"), "not json", '{"survey": 3}', '{"survey": {"question": "q", "options": [1]}}',
                '{"survey": {"question": "", "options": ["a"]}}', '["survey"]', None, 7,
                '{"survey": {"question": "q", "options": []}}']:
        assert survey_of(bad) is None
    with pytest.raises(ValueError, match="option"):
        Survey("q", ())


def test_the_dialogue_format_asks_the_question_last():
    chat = DialogueFormat().chat(survey_observation("Hello!", "Hi."), FakeScenario())
    assert chat[-1] == {"role": "user", "content": SURVEY.question}
    assert [m["role"] for m in chat] == ["system", "user", "assistant", "user"]
    assert DialogueFormat().chat(observation("Hello!"), FakeScenario())[-1]["content"] == "Hello!"


def test_greedy_answer_is_the_most_likely_option_whatever_the_seed():
    answers = set()
    for seed in range(5):
        backend = ScoringBackend()
        sim = LLMSimulator(backend)
        sim.reset(FakeScenario(), np.random.default_rng(seed))
        state = sim._rngs[0].bit_generator.state
        answers.add(sim.act(survey_observation("Would you donate?", "Maybe.")))
        assert sim._rngs[0].bit_generator.state == state  # greedy draws nothing
        assert backend.calls == [] and backend.score_calls == [len(OPTIONS)]
    assert answers == {"$1.00"}
    assert sim.stats["surveys"] == sim.stats["survey_scored"] == 1 and sim.stats["replies"] == 0


def test_the_scored_reply_follows_persona_dialogue_and_question():
    seen: list[str] = []

    def prefs(prompt: str, option: str) -> float:
        seen.append(prompt)
        generous = "nurse" in prompt and "hungry" in prompt
        return 0.0 if option == ("$2.00" if generous else "$0.00") else -5.0

    sim = LLMSimulator(ScoringBackend(prefs=prefs))
    sim.reset_batch([FakeScenario(persona="a nurse"), FakeScenario(), FakeScenario(persona="a nurse")], rngs(3))
    answers = sim.act_batch([survey_observation("Kids are hungry."), survey_observation("Kids are hungry."),
                             survey_observation("Nice weather.")], [0, 1, 2])
    assert answers == ["$2.00", "$0.00", "$0.00"]
    assert all(SURVEY.question in p and "You are" in p for p in seen)
    assert sim.survey_distribution([survey_observation("Kids are hungry.")], [0], [SURVEY]) == [[0, 0, 0, 1.0]]


def test_sampled_answers_follow_the_tempered_softmax_and_the_slot_generators():
    def run(seed: int, temperature: float, n: int = 4000) -> list[str]:
        backend = ScoringBackend()
        sim = LLMSimulator(backend, SamplingParams(temperature=temperature))
        sim.reset_batch([FakeScenario()] * n, rngs(n, seed))
        answers = sim.act_batch([survey_observation("Would you donate?")] * n, list(range(n)))
        assert backend.score_calls == [len(OPTIONS)]  # one batched call; equal chats scored once
        return answers

    for temperature in (1.0, 0.5):
        answers = run(1, temperature)
        p = np.array([STATED[o] for o in OPTIONS]) ** (1 / temperature)
        freq = [answers.count(o) / len(answers) for o in OPTIONS]
        assert freq == pytest.approx(p / p.sum(), abs=0.03)
    assert run(2, 1.0, 50) == run(2, 1.0, 50) != run(3, 1.0, 50)
    sim = LLMSimulator(ScoringBackend(), SamplingParams(temperature=1.0))
    sim.reset(FakeScenario(), np.random.default_rng(0))
    assert sim.survey_distribution([survey_observation("hi")], [0], [SURVEY])[0] == pytest.approx(
        [STATED[o] for o in OPTIONS])


def test_distinct_chats_are_scored_in_one_call_and_dialogue_turns_still_generate():
    backend = ScoringBackend()
    sim = LLMSimulator(backend)
    sim.reset_batch([FakeScenario()] * 4, rngs(4))
    actions = sim.act_batch([observation("Hello!"), survey_observation("a"), survey_observation("b"),
                             observation("How are you?")], [0, 1, 2, 3])
    assert actions[1:3] == ["$1.00", "$1.00"] and actions[0] == actions[3] == "Sure, tell me more."
    assert backend.score_calls == [2 * len(OPTIONS)] and len(backend.calls) == 1 and len(backend.calls[0][0]) == 2
    assert sim.stats["surveys"] == 2 and sim.stats["replies"] == 2


def test_a_backend_that_cannot_score_answers_in_free_text_counted_and_warned_once(caplog):
    backend = FakeBackend(respond=lambda chat, params, rng: "I'd give $0.50.")
    sim = LLMSimulator(backend)
    sim.reset_batch([FakeScenario()] * 2, rngs(2))
    with caplog.at_level(logging.DEBUG, logger="simpop.simulators.llm"):
        assert sim.act_batch([survey_observation("a"), survey_observation("b")], [0, 1]) == ["I'd give $0.50."] * 2
        sim.act_batch([survey_observation("c")], [0])
    assert sim.stats["survey_unscored"] == 3 and sim.stats["survey_scored"] == 0 and sim.stats["surveys"] == 3
    assert backend.calls[0][0][0][-1] == {"role": "user", "content": SURVEY.question}  # the question was asked
    assert [r.levelno for r in caplog.records] == [logging.WARNING, logging.DEBUG]
    assert "cannot score" in caplog.records[0].getMessage()
    assert sim.survey_distribution([survey_observation("a")], [0], [SURVEY]) == [None]


def test_a_scoring_error_falls_back_to_free_text(caplog):
    sim = LLMSimulator(ScoringBackend(fail=True))
    sim.reset(FakeScenario(), np.random.default_rng(0))
    with caplog.at_level(logging.WARNING, logger="simpop.simulators.llm"):
        assert sim.act(survey_observation("hi")) == "Sure, tell me more."
    assert sim.stats["survey_errors"] == 1 and "out of memory" in caplog.text


def test_empty_free_text_answers_are_replaced_like_replies():
    sim = LLMSimulator(FakeBackend(respond=lambda chat, params, rng: "  "))
    sim.reset(FakeScenario(), np.random.default_rng(0))
    assert sim.act(survey_observation("hi")) == sim.fallback_reply and sim.stats["empty_replies"] == 1


class RecordingSimulator(LLMSimulator, Trainable):
    """An LLM simulator that is :class:`Trainable` (its replies must be generated to be trained)."""

    episodes: list[Any] = []

    def parameters(self):
        return []

    def score(self, episodes):
        return Scores(torch.zeros(len(episodes)), torch.zeros(len(episodes)))

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass

    def snapshot(self):
        return self


def test_trainable_simulators_generate_their_survey_answer():
    backend = ScoringBackend(respond=lambda chat, params, rng: "$2.00")
    sim = RecordingSimulator(backend)
    sim.reset(FakeScenario(), np.random.default_rng(0))
    assert sim.act(survey_observation("hi")) == "$2.00"
    assert backend.score_calls == [] and backend.calls[0][0][0][-1]["content"] == SURVEY.question


# ------------------------------------------------------------------ in the P4G env
class NeverAsks(Player):
    """A scripted persuader that never asks for a donation."""

    def act_batch(self, observations: list[Any], slots: list[int]) -> list[str]:
        return ["Children in need would be so grateful for any help." for _ in observations]


def test_verbalized_survey_answers_from_the_stated_distribution_over_the_options():
    def respond(chat: Chat, params: SamplingParams, rng: np.random.Generator) -> str:
        # Options are matched up to case and whitespace; a repeated option adds up; an unknown text is ignored.
        return verbalized_json(("$1.00", 0.5), (" $2.00", 0.2), ("$1.00 ", 0.1), ("a hundred", 0.2))

    backend = FakeBackend(respond=respond)
    sim = VerbalizedSimulator(backend, k=3, floor=0.01, tau=1.0)
    sim.reset_batch([FakeScenario()] * 2000, rngs(2000))
    (probs,) = sim.survey_distribution([survey_observation("Would you donate?")], [0], [SURVEY])
    assert probs == pytest.approx(renormalise([0.0, 0.0, 0.6 / 0.8, 0.2 / 0.8], 0.01, 1.0))
    chats, params = backend.calls[-1]
    assert params.json_schema["properties"]["responses"]["items"]["properties"]["text"]["enum"] == list(OPTIONS)
    assert params.json_schema["properties"]["responses"]["minItems"] == 3
    assert chats[0][-1]["content"] == SURVEY.question and all(json.dumps(o) in chats[0][0]["content"] for o in OPTIONS)
    answers = sim.act_batch([survey_observation("Would you donate?")] * 2000, list(range(2000)))
    freq = [answers.count(o) / len(answers) for o in OPTIONS]
    assert freq == pytest.approx(probs, abs=0.03)
    assert sim.stats["survey_calls"] == 2001 and sim.stats["survey_fallbacks"] == 0 and sim.stats["surveys"] == 2000
    unconstrained = VerbalizedSimulator(FakeBackend(respond=respond), constrained=False)
    unconstrained.reset(FakeScenario(), np.random.default_rng(0))
    unconstrained.survey_distribution([survey_observation("hi")], [0], [SURVEY])
    assert unconstrained.backend.calls[-1][1].json_schema is None


def test_a_verbalized_survey_answer_naming_no_option_falls_back_to_scoring_or_free_text():
    backend = ScoringBackend(respond=lambda chat, params, rng: "I am not sure, maybe something.")
    sim = VerbalizedSimulator(backend, fallback_temperature=1.0)
    sim.reset(FakeScenario(), np.random.default_rng(0))
    (probs,) = sim.survey_distribution([survey_observation("hi")], [0], [SURVEY])
    assert probs == pytest.approx([STATED[o] for o in OPTIONS])  # the options' log-probs at temperature 1
    assert sim.stats["survey_fallbacks"] == 1 and sim.stats["survey_scored"] == 1
    free = VerbalizedSimulator(FakeBackend(respond=lambda chat, params, rng: "" if params.json_schema else "$2"))
    free.reset(FakeScenario(), np.random.default_rng(0))
    assert free.act(survey_observation("hi")) == "$2"  # cannot score: a plain free-text answer, not JSON
    assert free.stats["survey_fallbacks"] == 1 and free.stats["survey_unscored"] == 1


def near_a_dollar(prompt: str, option: str) -> float:
    from simpop.envs.persuasion.outcome import read_survey_answer

    return -abs(read_survey_answer(option).amount - 1.0)


@pytest.mark.parametrize("simulator, source", [
    (lambda: LLMSimulator(ScoringBackend(respond=lambda c, p, r: "Sure, tell me more.", prefs=near_a_dollar),
                          SamplingParams(temperature=1.0)), "strict"),
    (lambda: LLMSimulator(FakeBackend(respond=lambda c, p, r: "Hmm." if "Closing survey" in c[-1]["content"]
                                      else "Sure, tell me more.")), "fallback"),
])
def test_rollouts_end_every_undecided_dialogue_with_the_survey(simulator, source):
    sim: Simulator = simulator()
    engine = RolloutEngine("simpop/Persuasion-v1", NeverAsks(), sim, env_kwargs={"max_turns": 2})
    trajectories = engine.collect(3, group_size=2, seed=0)
    for t in trajectories:
        info = t.infos[-1]
        assert t.terminated and not t.truncated and info["outcome_source"] == "survey"
        assert info["survey_parse"] == source and t.policy_turns == 2 and len(t.actions["persuadee"]) == 3
        assert survey_of(t.observations["persuadee"][-1]) is not None
        assert t.total_reward == float(info["donation"] > 0)
    if source == "strict":
        assert {t.infos[-1]["survey_answer"] for t in trajectories} <= set(simpop.envs.persuasion.outcome.SURVEY_OPTIONS)
        assert sim.stats["survey_scored"] == 6
    else:
        assert all(t.infos[-1]["survey_fallback"] for t in trajectories) and sim.stats["survey_unscored"] == 6


# ------------------------------------------------------------------ SmolLM2 (slow; the session's `smollm2`)
def _p4g_survey_observation(scenario: str = "p4g-0001") -> tuple[Any, str]:
    env = simpop.make("simpop/Persuasion-v1", max_turns=1)
    env.reset(seed=0, options={"scenario_id": scenario})
    env.step({"persuader": "Hi! Would you give some of your $2 to Save the Children?"})
    obs, *_ = env.step({"persuadee": "Hmm, let me think about it."})
    assert env.phase == "survey"
    return env.scenario, obs["persuadee"]


def test_smollm2_survey_greedy_is_deterministic_and_temperature_one_is_not(smollm2):
    scenario, obs = _p4g_survey_observation()
    survey = survey_of(obs)
    n = 16
    # Seeds 0 and 1 as two halves of one batch: each slot answers with its own generator, and the equal chats
    # are scored once (one read of the persona prompt per simulator).
    slots = list(range(2 * n))
    greedy = LLMSimulator(smollm2)
    sampled = LLMSimulator(smollm2, SamplingParams(temperature=1.0))
    greedy.reset_batch([scenario] * 2 * n, rngs(n, 0) + rngs(n, 1))
    greedy_answers = set(greedy.act_batch([obs] * 2 * n, slots))
    sampled.reset_batch([scenario] * 2 * n, rngs(n, 0) + rngs(n, 1))
    answers = sampled.act_batch([obs] * 2 * n, slots)
    sampled_answers = [answers[:n], answers[n:]]
    (logprobs,) = greedy.option_logprobs([obs], [0], [survey])
    assert np.isfinite(logprobs).all() and (logprobs < 0).all()
    assert greedy_answers == {survey.options[int(np.argmax(logprobs))]}
    assert greedy.stats["survey_scored"] == 2 * n + 1 and greedy.stats["backend_calls"] == 0
    (probs,) = sampled.survey_distribution([obs], [0], [survey])
    assert probs == pytest.approx(np.exp(logprobs) / np.exp(logprobs).sum())
    assert max(probs) < 0.9 and len(set(sampled_answers[0])) > 1 and sampled_answers[0] != sampled_answers[1]
    assert set(sampled_answers[0]) <= set(survey.options)


def test_smollm2_kv_cache_scores_equal_full_sequence_scores(smollm2):
    """The one-read-then-options scorer gives the same log-probs as ``token_logprobs`` over whole sequences."""
    from simpop.simulators.llm import _score_options

    class TokenLogprobsOnly:  # the backend without its HF model: scored through token_logprobs
        encode_chat = staticmethod(smollm2.encode_chat)
        token_logprobs = staticmethod(smollm2.token_logprobs)

    chat = [{"role": "system", "content": "You are a thrifty student."},
            {"role": "user", "content": "How much of your $2 do you donate? Answer with one of: $0.00, $0.50, $2.00."}]
    options = ("$0.00", "$0.50", "$2.00")
    cached, = _score_options(smollm2, [(chat, options)])
    full, = _score_options(TokenLogprobsOnly(), [(chat, options)])
    assert cached == pytest.approx(full, abs=2e-3)


def test_smollm2_verbalized_survey_answers_vary_where_greedy_ones_do_not(smollm2):
    """The acceptance check: the frozen-greedy simulator answers a survey one way, the verbalized one does not."""
    scenario, obs = _p4g_survey_observation()
    n = 8
    greedy, verbalized = LLMSimulator(smollm2), VerbalizedSimulator(smollm2, k=3)
    slots = list(range(2 * n))  # seeds 0 and 1 as two halves of one batch (equal chats: one read each)
    greedy.reset_batch([scenario] * 2 * n, rngs(n, 0) + rngs(n, 1))
    greedy_answers = set(greedy.act_batch([obs] * 2 * n, slots))
    verbalized.reset_batch([scenario] * 2 * n, rngs(n, 0) + rngs(n, 1))
    verbalized_answers = set(verbalized.act_batch([obs] * 2 * n, slots))
    survey = survey_of(obs)
    assert len(greedy_answers) == 1 and len(verbalized_answers) > 1 and verbalized_answers <= set(survey.options)
    assert verbalized.stats["survey_fallbacks"] == 0 and verbalized.stats["survey_calls"] == 2 * n
    (probs,) = verbalized.survey_distribution([obs], [0], [survey])
    assert max(probs) < 1.0 and sum(p > 0.05 for p in probs) >= 2


# ------------------------------------------------------------------ scoring over HTTP (prompt_logprobs)
@dataclass
class TokenScorer(FakeBackend):
    """Scores like a model would, token by token: one token per character, log p(token t) = -(t mod 7) / 10."""

    def encode_chat(self, chat: Chat, add_generation_prompt: bool = True) -> list[int]:
        return ScoringBackend.encode_chat(self, chat, add_generation_prompt)

    def token_logprobs(self, sequences: list[list[int]], masks: list[list[int]], temperature: float = 1.0):
        width = max(map(len, sequences))
        logprobs, mask = torch.zeros(len(sequences), width), torch.zeros(len(sequences), width)
        for row, (seq, m) in enumerate(zip(sequences, masks)):
            for t in range(1, len(seq)):
                mask[row, t] = float(m[t])
                logprobs[row, t] = -(seq[t] % 7) / 10 * m[t]
        return FakeScores(logprobs, mask)


class NoPromptLogprobs:
    """An OpenAI-compatible server that ignores ``prompt_logprobs`` (as most do): plain completions only."""

    def __enter__(self):
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        import threading

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                self.rfile.read(int(self.headers["Content-Length"]))
                body = json.dumps({"choices": [{"message": {"content": "$1.00"}, "finish_reason": "stop"}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        return self

    def __exit__(self, *exc):
        self.server.shutdown()


def test_a_server_with_prompt_logprobs_scores_options_like_the_model_in_process():
    from simpop.agents.openai_backend import OpenAIBackend
    from simpop.serve.server import make_server
    from simpop.simulators.llm import _score_options

    chat = LLMSimulator(FakeBackend()).text_format.chat(survey_observation("Kids are hungry."), FakeScenario())
    items = [(chat, OPTIONS), (chat[:1] + [{"role": "user", "content": "How much?"}], ("$0.00", "$2.00"))]
    local = _score_options(TokenScorer(), items)
    with make_server(TokenScorer(name="scorer"), port=0).start() as server:
        client = OpenAIBackend(server.url, "scorer")
        remote = client.score_replies(items)
        sim = LLMSimulator(client)
        sim.reset_batch([FakeScenario()] * 2, rngs(2))
        answers = sim.act_batch([survey_observation("Kids are hungry.")] * 2, [0, 1])
    assert [list(r) for r in remote] == [pytest.approx(list(x), abs=1e-5) for x in local]
    assert answers == [OPTIONS[int(np.argmax(local[0]))]] * 2 and sim.stats["survey_scored"] == 2


def test_a_server_without_prompt_logprobs_is_said_once_and_answers_in_free_text(caplog):
    from simpop.agents.base import ScoringUnsupported
    from simpop.agents.openai_backend import OpenAIBackend
    from simpop.serve.server import make_server

    with NoPromptLogprobs() as stub, caplog.at_level("WARNING"):
        client = OpenAIBackend(stub.url, "m")
        with pytest.raises(ScoringUnsupported, match="no prompt_logprobs"):
            client.score_replies([([{"role": "user", "content": "q"}], ("a", "b"))])
        sim = LLMSimulator(client)
        sim.reset_batch([FakeScenario()] * 2, rngs(2))
        assert sim.act_batch([survey_observation("hi")] * 2, [0, 1]) == ["$1.00", "$1.00"]
        sim.act_batch([survey_observation("hi")], [0])
    assert sim.stats["survey_unscored"] == 3 and sim.stats["survey_errors"] == 0
    assert caplog.text.count("returned no prompt_logprobs") == 1  # a warning once, then counted quietly
    with make_server(FakeBackend(name="plain"), port=0).start() as server:  # simpop serve, a backend that cannot
        with pytest.raises(ScoringUnsupported, match="cannot score prompts"):
            OpenAIBackend(server.url, "plain").score_replies([([{"role": "user", "content": "q"}], ("a",))])


def test_stating_the_verbalized_survey_distribution_draws_nothing_from_the_slots():
    sim = VerbalizedSimulator(FakeBackend(respond=lambda c, p, r: verbalized_json(("$1.00", 0.7), ("$0.00", 0.3))),
                              params=SamplingParams(max_new_tokens=256, temperature=0.7))
    sim.reset(FakeScenario(), np.random.default_rng(0))
    state = sim._rngs[0].bit_generator.state
    first = sim.survey_distribution([survey_observation("hi")], [0], [SURVEY])
    assert sim._rngs[0].bit_generator.state == state
    assert sim.survey_distribution([survey_observation("hi")], [0], [SURVEY]) == first  # same chat, same seed
    assert sim.backend.calls[0][1].seed == sim.backend.calls[1][1].seed
