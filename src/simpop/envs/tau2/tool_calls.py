"""Tool calls as text: parsing what a seat wrote, and describing tools to a model without a tool template.

A seat's action is one string. It is a tool call when it is

- a JSON object ``{"name": <tool>, "arguments": {...}}`` (``"parameters"`` is accepted for
  ``"arguments"``, and ``arguments`` may be a JSON-encoded string, as OpenAI sends it),
- an OpenAI-style tool call ``{"type": "function", "function": {"name": ..., "arguments": "..."}}`` or
  message ``{"role": "assistant", "content": ..., "tool_calls": [...]}``,
- or text with one or more tagged blocks ``<tool_call>{...}</tool_call>`` (how a model without a
  tool-aware chat template is asked to call tools, see :func:`tools_prompt`); text outside the blocks
  is kept as the message's content.

A JSON object may be wrapped in a Markdown code fence. Anything else is a plain message. Text that
tries to be a tool call but is not one (invalid JSON, a JSON object of another shape, arguments that
are not an object) raises :class:`ToolCallError`, whose message says how to write a valid call.
This module does not import τ².
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

TAG_OPEN, TAG_CLOSE = "<tool_call>", "</tool_call>"
_TAGGED = re.compile(re.escape(TAG_OPEN) + r"(.*?)" + re.escape(TAG_CLOSE), re.DOTALL)
_FENCED = re.compile(r"^```[a-zA-Z]*\s*(.*?)\s*```$", re.DOTALL)
_HOW = f'write {TAG_OPEN}{{"name": "<tool name>", "arguments": {{...}}}}{TAG_CLOSE}'


class ToolCallError(ValueError):
    """Text that attempts a tool call but is not a valid one."""


@dataclass(frozen=True)
class ToolCall:
    """One requested tool call: the tool's name and its keyword arguments."""

    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ParsedAction:
    """A seat's action: text for the other seat, tool calls for the environment, or both."""

    content: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)


def parse_action(text: str) -> ParsedAction:
    """Split ``text`` into message content and tool calls (see the module docstring for the forms).

    Raises:
        ToolCallError: ``text`` attempts a tool call that cannot be parsed.
    """
    if TAG_OPEN in text or TAG_CLOSE in text:
        return _parse_tagged(text)
    stripped = text.strip()
    fenced = _FENCED.match(stripped)
    body = fenced.group(1) if fenced else stripped
    if not body.startswith("{"):
        return ParsedAction(content=text)
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as e:
        raise ToolCallError(f"this looks like a JSON tool call but is not valid JSON ({e}); {_HOW}") from None
    content, calls = _from_object(obj)
    return ParsedAction(content=content, tool_calls=calls)


def _parse_tagged(text: str) -> ParsedAction:
    if text.count(TAG_OPEN) != text.count(TAG_CLOSE):
        raise ToolCallError(f"unbalanced {TAG_OPEN} / {TAG_CLOSE} tags; {_HOW}")
    calls: list[ToolCall] = []
    for block in _TAGGED.findall(text):
        try:
            obj = json.loads(block.strip())
        except json.JSONDecodeError as e:
            raise ToolCallError(f"the {TAG_OPEN} block is not valid JSON ({e}); {_HOW}") from None
        content, more = _from_object(obj)
        if content:
            raise ToolCallError(f"a {TAG_OPEN} block must hold a tool call only; {_HOW}")
        calls += more
    rest = _TAGGED.sub("", text).strip()
    return ParsedAction(content=rest or None, tool_calls=calls)


def _from_object(obj: Any) -> tuple[str | None, list[ToolCall]]:
    """(content, tool calls) of a parsed JSON value; raises ToolCallError for other shapes."""
    if isinstance(obj, dict) and "tool_calls" in obj:  # an OpenAI-style assistant message
        calls = obj["tool_calls"]
        if not isinstance(calls, list) or not calls:
            raise ToolCallError(f'"tool_calls" must be a non-empty list of tool calls; {_HOW}')
        content = obj.get("content")
        if content is not None and not isinstance(content, str):
            raise ToolCallError('"content" of a tool-call message must be a string or null')
        return (content or None), [_one_call(c) for c in calls]
    return None, [_one_call(obj)]


def _one_call(obj: Any) -> ToolCall:
    if not isinstance(obj, dict):
        raise ToolCallError(f"a tool call must be a JSON object, got {type(obj).__name__}; {_HOW}")
    if obj.get("type") == "function" or isinstance(obj.get("function"), dict):  # OpenAI tool call
        obj = obj.get("function")
        if not isinstance(obj, dict):
            raise ToolCallError(f'an OpenAI-style tool call needs a "function" object; {_HOW}')
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ToolCallError(f'a tool call needs a "name" (the tool to call); {_HOW}')
    arguments = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as e:
            raise ToolCallError(f"the arguments of {name!r} are not valid JSON ({e}); {_HOW}") from None
    if not isinstance(arguments, dict):
        raise ToolCallError(f'the arguments of {name!r} must be a JSON object of named arguments, '
                            f'got {type(arguments).__name__}; {_HOW}')
    return ToolCall(name=name.strip(), arguments=arguments)


def format_tool_call(name: str, arguments: dict[str, Any]) -> str:
    """The tagged text form of one tool call (what :func:`tools_prompt` asks a model to write)."""
    return f"{TAG_OPEN}{json.dumps({'name': name, 'arguments': arguments}, ensure_ascii=False)}{TAG_CLOSE}"


def tools_prompt(tools: list[dict[str, Any]]) -> str:
    """A system-prompt section listing ``tools`` (OpenAI function schemas) and how to call them as text."""
    lines = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return ("# Tools\n\nYou can call the following tools (JSON schemas):\n<tools>\n" + lines + "\n</tools>\n\n"
            "To call a tool, reply with only the call, in this form:\n"
            + format_tool_call("<tool name>", {"<argument>": "<value>"}) + "\n"
            "The result comes back in the next message. To talk instead, reply with plain text.")
