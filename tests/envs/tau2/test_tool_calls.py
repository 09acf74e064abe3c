"""Parsing tool calls from a seat's text (no τ² needed)."""

from __future__ import annotations

import json

import pytest

from simpop.envs.tau2.tool_calls import ToolCall, ToolCallError, format_tool_call, parse_action, tools_prompt

CALL = ToolCall("get_user", {"user_id": "u1"})


@pytest.mark.parametrize("text", [
    '{"name": "get_user", "arguments": {"user_id": "u1"}}',
    '  {"name": "get_user", "parameters": {"user_id": "u1"}}\n',
    '{"name": "get_user", "arguments": "{\\"user_id\\": \\"u1\\"}"}',
    '{"type": "function", "function": {"name": "get_user", "arguments": "{\\"user_id\\": \\"u1\\"}"}}',
    '{"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", '
    '"function": {"name": "get_user", "arguments": "{\\"user_id\\": \\"u1\\"}"}}]}',
    '<tool_call>{"name": "get_user", "arguments": {"user_id": "u1"}}</tool_call>',
    '<tool_call>\n{"name": "get_user", "arguments": {"user_id": "u1"}}\n</tool_call>',
    '```json\n{"name": "get_user", "arguments": {"user_id": "u1"}}\n```',
])
def test_tool_call_forms(text):
    assert parse_action(text).tool_calls == [CALL]
    assert parse_action(text).content is None


def test_text_around_tags_is_content_and_several_calls_are_kept():
    text = ('Let me check.\n<tool_call>{"name": "get_user", "arguments": {"user_id": "u1"}}</tool_call>'
            '<tool_call>{"name": "done", "arguments": {}}</tool_call>')
    parsed = parse_action(text)
    assert parsed.content == "Let me check."
    assert parsed.tool_calls == [CALL, ToolCall("done", {})]


def test_openai_message_keeps_content_and_all_calls():
    message = {"role": "assistant", "content": "Checking", "tool_calls": [
        {"type": "function", "function": {"name": "get_user", "arguments": json.dumps({"user_id": "u1"})}},
        {"type": "function", "function": {"name": "done", "arguments": ""}}]}
    parsed = parse_action(json.dumps(message))
    assert parsed.content == "Checking" and parsed.tool_calls == [CALL, ToolCall("done", {})]


@pytest.mark.parametrize("text", ["Hello, I need to change my flight.", "I paid {50} dollars", "[1, 2] are my ids",
                                  "get_user(user_id='u1')"])
def test_plain_text_is_a_message(text):
    assert parse_action(text) == parse_action(text).__class__(content=text)


@pytest.mark.parametrize("text, why", [
    ('{"name": "get_user", "arguments": {"user_id": ', "not valid JSON"),
    ('{"tool": "get_user"}', '"name"'),
    ('{"name": "get_user", "arguments": ["u1"]}', "must be a JSON object"),
    ('{"name": "get_user", "arguments": "{user_id: u1}"}', "arguments of 'get_user' are not valid JSON"),
    ('<tool_call>{"name": "get_user"</tool_call>', "block is not valid JSON"),
    ('<tool_call>{"name": "get_user", "arguments": {}}', "unbalanced"),
    ('<tool_call>"get_user"</tool_call>', "must be a JSON object"),
    ('{"tool_calls": []}', "non-empty list"),
])
def test_malformed_tool_calls_raise_with_a_fix(text, why):
    with pytest.raises(ToolCallError, match=why) as e:
        parse_action(text)
    assert "<tool_call>" in str(e.value) or "content" in str(e.value) or "list" in str(e.value)


def test_format_round_trips_and_prompt_lists_tools():
    assert parse_action(format_tool_call("get_user", {"user_id": "u1"})).tool_calls == [CALL]
    schema = {"type": "function", "function": {"name": "get_user", "description": "Find a user.",
                                               "parameters": {"type": "object", "properties": {}}}}
    prompt = tools_prompt([schema])
    assert '"name": "get_user"' in prompt and "<tool_call>" in prompt
