"""τ²'s own LLM calls routed into simpop backends through the litellm provider (fake backends, no network)."""

from __future__ import annotations

import ast
import json

import litellm
import pytest
from tau2.data_model.message import AssistantMessage, SystemMessage, UserMessage
from tau2.user.user_simulator import UserSimulator
from tau2.utils.llm_utils import generate

from simpop.agents.base import SamplingParams
from simpop.envs.tau2.env import Tau2Env
from simpop.envs.tau2.litellm_provider import register, to_chat, unregister
from tests.simulators.fakes import FakeBackend

TOOLS = [{"type": "function", "function": {"name": "get_user", "description": "Find a user.",
                                           "parameters": {"type": "object", "properties": {"user_id": {"type": "string"}}}}}]


def backend_saying(text: str) -> FakeBackend:
    return FakeBackend(respond=lambda chat, params, rng: text)


def test_completion_reaches_the_backend_with_the_requests_settings():
    backend = backend_saying("Hello there")
    model = register("fake", backend, SamplingParams(max_new_tokens=7))
    response = litellm.completion(model=model, messages=[{"role": "user", "content": "hi"}], temperature=0.5,
                                  max_tokens=12, seed=3)
    assert response.choices[0].message.content == "Hello there" and response.choices[0].message.tool_calls is None
    chats, params = backend.calls[-1]
    assert chats == [[{"role": "user", "content": "hi"}]]
    assert (params.temperature, params.max_new_tokens, params.seed) == (0.5, 12, 3)


def test_tool_calls_are_described_then_parsed_into_openai_tool_calls():
    backend = backend_saying('<tool_call>{"name": "get_user", "arguments": {"user_id": "u1"}}</tool_call>')
    register("tools", backend)
    message = generate(model="simpop/tools", messages=[SystemMessage(role="system", content="Be helpful."),
                                                       UserMessage(role="user", content="Who is u1?")], tools=None)
    assert message.content.startswith("<tool_call>")  # no tools offered: plain text
    response = litellm.completion(model="simpop/tools", messages=[{"role": "system", "content": "Be helpful."},
                                                                  {"role": "user", "content": "Who is u1?"}],
                                  tools=TOOLS)
    call = response.choices[0].message.tool_calls[0]
    assert call.function.name == "get_user" and json.loads(call.function.arguments) == {"user_id": "u1"}
    system = backend.calls[-1][0][0][0]
    assert system["role"] == "system" and system["content"].startswith("Be helpful.") and '"get_user"' in system["content"]


def test_unparsable_tool_call_comes_back_as_text():
    register("broken", backend_saying('<tool_call>{"name": "get_user"</tool_call>'))
    response = litellm.completion(model="simpop/broken", messages=[{"role": "user", "content": "x"}], tools=TOOLS)
    assert response.choices[0].message.tool_calls is None
    assert response.choices[0].message.content.startswith("<tool_call>")


def test_history_tool_calls_render_as_tagged_text():
    chat = to_chat([{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "get_user", "arguments": '{"user_id": "u1"}'}}]},
        {"role": "tool", "tool_call_id": "c", "content": "{}"}])
    assert chat == [{"role": "assistant", "content": '<tool_call>{"name": "get_user", "arguments": {"user_id": "u1"}}'
                                                     '</tool_call>'}, {"role": "tool", "content": "{}"}]


def test_unknown_backend_says_how_to_register():
    unregister("nobody")
    with pytest.raises(Exception, match="register"):
        litellm.completion(model="simpop/nobody", messages=[{"role": "user", "content": "x"}], num_retries=0)


def test_tau2s_own_user_simulator_runs_on_a_simpop_backend():
    env = Tau2Env("mock")
    scenario = env.load_scenario("create_task_1")
    backend = backend_saying("I need a task called 'Important Meeting'.")
    user = UserSimulator(instructions=str(scenario.task.user_scenario), llm=register("user", backend),
                         llm_args={"temperature": 0.0})
    state = user.get_init_state()
    reply, _ = user.generate_next_message(AssistantMessage(role="assistant", content="Hi! How can I help?"), state)
    assert reply.content == "I need a task called 'Important Meeting'."
    chat = backend.calls[-1][0][0]
    # τ²'s frozen user prompt is exactly the scenario's user_instructions() (mock users have no tools).
    assert chat[0] == {"role": "system", "content": scenario.user_instructions()}
    assert chat[1] == {"role": "user", "content": "Hi! How can I help?"}


def judge_reply(met: bool):
    def respond(chat, params, rng):
        outcomes = chat[-1]["content"].split("expectedOutcomes:")[1].strip()
        results = [{"expectedOutcome": o, "reasoning": "checked", "metExpectation": met}
                   for o in ast.literal_eval(outcomes)]  # τ² writes the list with Python's repr
        return json.dumps({"results": results})
    return respond


@pytest.mark.parametrize("met", [True, False])
def test_nl_assertions_are_judged_by_a_simpop_backend(met):
    judge = register("judge", FakeBackend(respond=judge_reply(met)))
    env = Tau2Env("mock", nl_judge=judge)
    env.reset(seed=0, options={"scenario_id": "create_task_1"})
    env.step({"user": "Create 'Important Meeting' for user_1."})
    env.step({"agent": '{"name": "create_task", "arguments": {"user_id": "user_1", "title": "Important Meeting"}}'})
    env.step({"agent": "Created."})
    *_, infos = env.step({"user": "###STOP###"})
    info = infos["agent"]
    assert info["nl_assertions_met"] == [met] and "nl_judge_error" not in info
    assert info["reward"] == 1.0  # NL assertions are not in this task's reward basis: reported, not multiplied
    assert litellm.model_alias_map.get("gpt-4o-mini") is None  # the routing is undone after judging


def test_a_judge_that_answers_garbage_falls_back_to_the_default_evaluation():
    env = Tau2Env("mock", nl_judge=register("garbage", backend_saying("I think so")))
    env.reset(seed=0, options={"scenario_id": "create_task_1"})
    env.step({"user": "hi"})
    *_, infos = env.step({"agent": "Bye. ###STOP###"})
    info = infos["agent"]
    assert "JSONDecodeError" in info["nl_judge_error"] and info["nl_assertions_met"] is None
    assert info["termination_reason"] == "agent_stop" and info["reward"] == 0.0
