"""A litellm custom provider that routes ``model="simpop/<name>"`` to a simpop :class:`Backend`.

τ² makes every LLM call through ``litellm.completion(model=...)`` (its LLM user simulator and agent,
the NL-assertion judge, the repetition judge). Registering a backend here makes those calls run on a
simpop model in-process, with no network and no change to τ²::

    from simpop.envs.tau2.litellm_provider import register
    model = register("judge", backend)            # -> "simpop/judge"
    env = Tau2Env(domain="mock", nl_judge=model)

Requests carry τ²'s sampling settings (``temperature``, ``top_p``, ``max_tokens``, ``seed``, ``stop``),
which override the registered defaults. When a request offers tools, they are described in the
system prompt (:func:`~simpop.envs.tau2.tool_calls.tools_prompt`) and the reply's tagged tool calls
are returned as OpenAI tool calls; a reply whose tool call cannot be parsed is returned as text.
Tool calls and tool results already in the conversation are rendered the same way.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from simpop.agents.base import Backend, Chat, SamplingParams
from simpop.envs.tau2.tool_calls import ToolCallError, format_tool_call, parse_action, tools_prompt

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
try:
    import litellm
    from litellm import CustomLLM
    from litellm.llms.custom_llm import CustomLLMError
    from litellm.types.utils import ChatCompletionMessageToolCall, Function, Message, Usage
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError(f"routing τ²'s LLM calls needs litellm ({e}); install it with: pip install simpop[tau2]") from e

PROVIDER = "simpop"
_BACKENDS: dict[str, tuple[Backend, SamplingParams]] = {}


def register(name: str, backend: Backend, params: SamplingParams | None = None) -> str:
    """Route ``litellm.completion(model="simpop/<name>", ...)`` to ``backend``.

    Args:
        name: The model name after ``simpop/``; registering a name again replaces its backend.
        backend: The model that answers.
        params: Default decoding settings (default: greedy, 256 new tokens).

    Returns:
        The litellm model string, ``"simpop/<name>"``.
    """
    if not name or "/" in name:
        raise ValueError(f"backend name must be non-empty and contain no '/', got {name!r}")
    _install()
    _BACKENDS[name] = (backend, params or SamplingParams(max_new_tokens=256))
    return f"{PROVIDER}/{name}"


def unregister(name: str) -> None:
    """Forget the backend registered as ``name`` (no error if there is none)."""
    _BACKENDS.pop(name, None)


def _install() -> None:
    if not any(item.get("provider") == PROVIDER for item in litellm.custom_provider_map):
        litellm.custom_provider_map.append({"provider": PROVIDER, "custom_handler": SimpopLLM()})


class SimpopLLM(CustomLLM):
    """The litellm handler for the ``simpop`` provider (synchronous completions)."""

    def completion(self, model: str, messages: list, api_base: str, custom_prompt_dict: dict, model_response: Any,
                   print_verbose: Any, encoding: Any, api_key: Any, logging_obj: Any, optional_params: dict,
                   *args: Any, **kwargs: Any) -> Any:
        name = model.split("/", 1)[1] if model.startswith(PROVIDER + "/") else model
        if name not in _BACKENDS:
            raise CustomLLMError(status_code=404, message=f"no simpop backend registered as {name!r}; call "
                                 f"simpop.envs.tau2.litellm_provider.register({name!r}, backend) first")
        backend, defaults = _BACKENDS[name]
        tools = optional_params.get("tools") or None
        generation = backend.generate([to_chat(messages, tools)], _params(defaults, optional_params))[0]
        content, tool_calls = generation.text, None
        if tools:
            try:
                parsed = parse_action(generation.text)
            except ToolCallError:
                parsed = None  # not a valid call: the caller gets the text, as from any model
            if parsed is not None and parsed.tool_calls:
                content = parsed.content
                tool_calls = [ChatCompletionMessageToolCall(
                    id=f"call_{i}", type="function",
                    function=Function(name=c.name, arguments=json.dumps(c.arguments, ensure_ascii=False)))
                    for i, c in enumerate(parsed.tool_calls)]
        choice = model_response.choices[0]
        choice.message = Message(role="assistant", content=content, tool_calls=tool_calls)
        choice.finish_reason = "tool_calls" if tool_calls else generation.finish_reason
        model_response.model = f"{PROVIDER}/{name}"
        model_response.usage = Usage(prompt_tokens=len(generation.prompt_ids),
                                     completion_tokens=len(generation.token_ids),
                                     total_tokens=len(generation.prompt_ids) + len(generation.token_ids))
        return model_response


def _params(defaults: SamplingParams, request: dict[str, Any]) -> SamplingParams:
    """The registered settings, overridden by those the request carries."""
    changes: dict[str, Any] = {}
    for key, field in (("temperature", "temperature"), ("top_p", "top_p"), ("seed", "seed"),
                       ("max_tokens", "max_new_tokens"), ("max_completion_tokens", "max_new_tokens")):
        if request.get(key) is not None:
            changes[field] = request[key]
    stop = request.get("stop")
    if stop:
        changes["stop"] = (stop,) if isinstance(stop, str) else tuple(stop)
    return dataclasses.replace(defaults, **changes)


def to_chat(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> Chat:
    """OpenAI-format messages as a plain chat (tool calls as tagged text; tools in the system prompt)."""
    chat: Chat = []
    for m in messages:
        role, content = m["role"], _text(m.get("content"))
        calls = m.get("tool_calls") or []
        if calls:
            rendered = "".join(format_tool_call(c["function"]["name"], _arguments(c["function"].get("arguments")))
                               for c in calls)
            content = f"{content}\n{rendered}" if content else rendered
        chat.append({"role": role, "content": content})
    if tools:
        section = tools_prompt(tools)
        if chat and chat[0]["role"] == "system":
            chat[0] = {"role": "system", "content": chat[0]["content"] + "\n\n" + section}
        else:
            chat.insert(0, {"role": "system", "content": section})
    return chat


def _text(content: Any) -> str:
    """Message content as text (OpenAI allows a list of parts)."""
    if content is None:
        return ""
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return str(content)


def _arguments(arguments: Any) -> dict[str, Any]:
    if isinstance(arguments, str):
        return json.loads(arguments) if arguments.strip() else {}
    return dict(arguments or {})
