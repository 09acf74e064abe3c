"""The request bodies ``simpop serve`` accepts (pydantic models) and the limits it enforces on them.

Every field a model does not declare is refused (HTTP 400) rather than ignored; OpenAI fields the server
knows but cannot honour (tools, penalties, ``logit_bias``, ``echo``, ...) are refused with a message that
names them, unless they carry their neutral value (``"tools": []``, ``"frequency_penalty": 0``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, model_validator
from pydantic_core import PydanticCustomError

from simpop.agents.base import SamplingParams

MAX_STOP_CHARS = 256  # longest stop string; stop matching re-decodes the tail of every row at every step
MAX_TOP_LOGPROBS = 20  # vLLM's and OpenAI's bound

#: Known OpenAI (and vLLM) fields the server cannot honour -> the values it accepts (those that ask for
#: nothing, or for what the server does anyway).
UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "tools": (None, []),
    "tool_choice": (None, "none", "auto"),
    "functions": (None, []),
    "function_call": (None, "none", "auto"),
    "parallel_tool_calls": (None,),
    "logit_bias": (None, {}),
    "frequency_penalty": (None, 0),
    "presence_penalty": (None, 0),
    "audio": (None,),
    "modalities": (None, ["text"]),
    "prediction": (None,),
    "web_search_options": (None,),
    "reasoning_effort": (None,),
    "verbosity": (None,),
    "store": (None, False),
    "metadata": (None, {}),
    "service_tier": (None, "auto", "default"),
    "echo": (None, False),
    "suffix": (None, ""),
    "best_of": (None, 1),
    # vLLM's sampling extensions, at the values that match what simpop's backends do.
    "skip_special_tokens": (None, True),
    "spaces_between_special_tokens": (None, True),
    "return_tokens_as_token_ids": (None, True),
    "include_stop_str_in_output": (None, False),
    "ignore_eos": (None, False),
    "min_tokens": (None, 0),
    "top_k": (None, 0, -1),
    "min_p": (None, 0),
    "repetition_penalty": (None, 1),
}


def _same(value: Any, neutral: Any) -> bool:
    return value == neutral and isinstance(value, bool) == isinstance(neutral, bool)


Temperature = Annotated[float, Field(strict=True, ge=0, le=2)]
TopP = Annotated[float, Field(strict=True, gt=0, le=1)]
PositiveInt = Annotated[StrictInt, Field(ge=1)]
StopString = Annotated[StrictStr, Field(min_length=1, max_length=MAX_STOP_CHARS)]


class _Request(BaseModel):
    """Fields and checks shared by chat and text completions."""

    model_config = ConfigDict(extra="forbid")

    model: StrictStr
    n: PositiveInt = 1
    temperature: Temperature = 1.0
    top_p: TopP = 1.0
    stop: StopString | list[StopString] | None = None
    seed: StrictInt | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    user: StrictStr | None = None  # an end-user id for the caller's logs; it changes nothing here
    return_token_ids: StrictBool | None = None  # vLLM's switch; token ids are always returned

    @model_validator(mode="before")
    @classmethod
    def _refuse_unsupported(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name, neutral in UNSUPPORTED.items():
                if name in data:
                    if not any(_same(data[name], value) for value in neutral):
                        allowed = " or ".join(json.dumps(value) for value in neutral if value is not None)
                        raise PydanticCustomError("unsupported", "'{field}' is not supported by this server; send it "
                                                  "unset (or as {allowed})", {"field": name, "allowed": allowed})
                    data = {k: v for k, v in data.items() if k != name}
        return data

    @model_validator(mode="after")
    def _streaming(self) -> _Request:
        if self.stream_options is not None and not self.stream:
            raise ValueError("'stream_options' needs 'stream': true")
        return self

    @property
    def stops(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())

    def sampling(self, max_tokens: int, logprobs: bool, json_schema: dict[str, Any] | None = None) -> SamplingParams:
        return SamplingParams(max_new_tokens=max_tokens, temperature=self.temperature, top_p=self.top_p,
                              stop=self.stops, seed=self.seed, logprobs=logprobs, json_schema=json_schema)


class StreamOptions(BaseModel):
    """``stream_options``: ``include_usage`` adds a final chunk with token counts."""
    model_config = ConfigDict(extra="forbid")
    include_usage: StrictBool = False


class TextPart(BaseModel):
    """One ``{"type": "text", "text": ...}`` part of a message's content."""
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: StrictStr


class Message(BaseModel):
    """One chat message: ``system``, ``user`` or ``assistant`` (tool messages are refused), text or text parts."""
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "user", "assistant"]  # no tool messages: this server does not call tools
    content: StrictStr | list[TextPart]

    @property
    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(part.text for part in self.content)


class JSONSchemaSpec(BaseModel):
    """``response_format.json_schema``: the schema a structured answer must follow, and its name."""
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    name: StrictStr = "response"
    description: StrictStr | None = None
    json_schema: dict[str, Any] = Field(alias="schema")
    strict: StrictBool | None = None


class ResponseFormat(BaseModel):
    """``response_format``: free ``text``, any ``json_object``, or a ``json_schema``."""
    model_config = ConfigDict(extra="forbid")
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaSpec | None = None

    @model_validator(mode="before")
    @classmethod
    def _shape(cls, data: Any) -> Any:
        kind = data.get("type") if isinstance(data, dict) else None
        if kind not in ("text", "json_object", "json_schema"):
            raise ValueError("'response_format' must be {'type': 'text' | 'json_object' | 'json_schema', ...}")
        spec = data.get("json_schema")
        if (kind == "json_schema") != (isinstance(spec, dict) and isinstance(spec.get("schema"), dict)):
            raise ValueError("response_format json_schema needs 'json_schema': {'name': ..., 'schema': {...}} "
                             "(and only then)")
        return data

    @property
    def schema_(self) -> dict[str, Any] | None:
        """The JSON schema the output must follow (None for free text)."""
        if self.type == "json_object":
            return {"type": "object"}
        return self.json_schema.json_schema if self.json_schema is not None else None


class ChatCompletionRequest(_Request):
    """``POST /v1/chat/completions``; ``prompt_logprobs`` / ``add_generation_prompt`` are vLLM's extensions."""

    messages: list[Message] = Field(min_length=1)
    max_tokens: PositiveInt | None = None
    max_completion_tokens: PositiveInt | None = None
    logprobs: StrictBool = False
    top_logprobs: Annotated[StrictInt, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    response_format: ResponseFormat | None = None
    prompt_logprobs: StrictInt | None = None
    add_generation_prompt: StrictBool = True

    @model_validator(mode="after")
    def _consistent(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            raise ValueError("'top_logprobs' needs 'logprobs': true")
        if self.prompt_logprobs not in (None, 0):
            raise ValueError("only prompt_logprobs: 0 (each prompt token's own log-probability) is supported")
        if self.prompt_logprobs is not None and (self.n != 1 or self.stream or self.response_format is not None):
            raise ValueError("a prompt_logprobs request scores its prompt and generates nothing: send it with n = 1, "
                             "no stream and no response_format")
        return self

    @property
    def chat(self) -> list[dict[str, str]]:
        return [{"role": m.role, "content": m.text} for m in self.messages]

    def max_new_tokens(self, default: int) -> int:
        """The token budget asked for: ``max_completion_tokens``, else ``max_tokens``, else ``default``."""
        return self.max_completion_tokens or self.max_tokens or default


class CompletionRequest(_Request):
    """``POST /v1/completions``: a text prompt, a list of token ids, or a list of either (one batch)."""

    prompt: Annotated[StrictStr, Field(min_length=1)] | Annotated[list[StrictInt], Field(min_length=1)] | Annotated[
        list[Annotated[StrictStr, Field(min_length=1)]], Field(min_length=1)
    ] | Annotated[list[Annotated[list[StrictInt], Field(min_length=1)]], Field(min_length=1)]
    max_tokens: PositiveInt = 16  # OpenAI's default for this endpoint
    logprobs: Annotated[StrictInt, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None

    @property
    def prompts(self) -> list[str | list[int]]:
        """One entry per prompt of the batch."""
        if isinstance(self.prompt, str) or isinstance(self.prompt[0], int):
            return [self.prompt]  # type: ignore[list-item]
        return list(self.prompt)  # type: ignore[arg-type]


_Request.model_rebuild()
ChatCompletionRequest.model_rebuild()
CompletionRequest.model_rebuild()


@dataclass(frozen=True)
class Limits:
    """What one request may ask of the server; each is a ``simpop serve`` flag (named in the error message).

    Attributes:
        max_body_bytes: Largest request body (``--max-body-bytes``); larger ones get HTTP 413 unread.
        max_n: Most completions per request (``--max-n``).
        max_stop: Most ``stop`` strings per request (``--max-stop``).
        max_request_compute: Largest ``n × prompt tokens × max_tokens`` (``--max-request-compute``): the
            attention work of a request.
        max_request_tokens: Largest ``n × (prompt tokens + max_tokens)`` (``--max-request-tokens``): what
            the KV cache of a request holds, so its memory.
        default_max_tokens: ``max_tokens`` of a chat request that sends none (``--default-max-tokens``).
        read_timeout_s: Seconds a client has to send a whole request, head and body (``--read-timeout``).
        keep_alive_s: Seconds an idle keep-alive connection stays open (``--keep-alive-timeout``).
        shutdown_grace_s: Seconds a stopping server (Ctrl-C, SIGTERM) lets requests in flight finish before it
            cancels them, stopping the model at its next token (``--shutdown-grace``).
    """

    max_body_bytes: int = 8 * 2**20
    max_n: int = 128
    max_stop: int = 16
    max_request_compute: int = 2**25
    max_request_tokens: int = 2**17
    default_max_tokens: int = 512
    read_timeout_s: float = 30.0
    keep_alive_s: float = 5.0
    shutdown_grace_s: float = 5.0

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_n", "max_stop", "max_request_compute", "max_request_tokens",
                     "default_max_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.read_timeout_s <= 0 or self.keep_alive_s <= 0:
            raise ValueError("read_timeout_s and keep_alive_s must be > 0")
        if not self.shutdown_grace_s >= 0:
            raise ValueError(f"shutdown_grace_s must be >= 0, got {self.shutdown_grace_s}")

    def check(self, request: _Request, prompt_tokens: int, max_tokens: int, prompts: int = 1) -> None:
        """Raise :class:`LimitExceeded` if ``request`` asks for more than these limits allow."""
        if request.n * prompts > self.max_n:
            raise LimitExceeded(f"this request asks for {request.n * prompts} completions; this server gives at "
                                f"most {self.max_n} per request (start it with a larger --max-n to raise that)", "n")
        if len(request.stops) > self.max_stop:
            raise LimitExceeded(f"'stop' has {len(request.stops)} entries; this server takes at most "
                                f"{self.max_stop} (start it with a larger --max-stop to raise that)", "stop")
        tokens = request.n * (prompt_tokens + prompts * max_tokens)
        if tokens > self.max_request_tokens:
            raise LimitExceeded(
                f"this request asks for n × (prompt tokens + max_tokens) = {request.n} × ({prompt_tokens} + "
                f"{prompts * max_tokens}) = {tokens} tokens, over this server's cap of {self.max_request_tokens}; "
                f"lower n, max_tokens or the prompt, or start the server with a larger --max-request-tokens",
                "max_tokens")
        compute = request.n * prompt_tokens * max_tokens
        if compute > self.max_request_compute:
            raise LimitExceeded(
                f"this request asks for n × prompt tokens × max_tokens = {request.n} × {prompt_tokens} × "
                f"{max_tokens} = {compute}, over this server's cap of {self.max_request_compute}; lower n, "
                f"max_tokens or the prompt, or start the server with a larger --max-request-compute", "max_tokens")


class LimitExceeded(ValueError):
    """A request over one of the server's :class:`Limits` (HTTP 400)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


#: What a field with several accepted shapes takes (pydantic reports one error per shape).
SHAPES = {
    "stop": f"a non-empty string or a list of them (each at most {MAX_STOP_CHARS} characters)",
    "prompt": "a non-empty string, a non-empty list of token ids, or a non-empty list of either",
    "content": "a string or a list of {'type': 'text', 'text': ...} parts",
}


def describe(errors: Sequence[Any]) -> tuple[str, str | None]:
    """A one-line message and the offending top-level field for the first error of a pydantic validation."""
    fields = _field_names()

    def where(error: Any) -> list[str]:  # drop the union members' tags ("str", "list[int]", ...)
        return [str(p) for p in error.get("loc", ()) if isinstance(p, int) or p in fields]

    first = errors[0]
    loc, kind = where(first), first.get("type")
    name, param = ".".join(loc), (loc[0] if loc else None)
    message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    if kind == "unsupported":
        return message, first["ctx"]["field"]
    if kind == "extra_forbidden":
        name = ".".join(loc if first["loc"] and loc[-1:] == [str(first["loc"][-1])] else [*loc, str(first["loc"][-1])])
        return f"'{name}' is not a field this server knows; remove it", name.split(".")[0]
    if not loc:
        return message, None
    if kind == "missing":
        return f"'{name}' is required", param
    shaped = [i for i, part in enumerate(loc) if part in SHAPES]
    if shaped and len(loc) < len(first["loc"]):  # a member of a union failed: say what the union takes
        loc = loc[: shaped[-1] + 1]
        name, message = ".".join(loc), f"expected {SHAPES[loc[-1]]}"
        return f"invalid '{name}': {message}", param
    return f"invalid '{name}': {message} (got {repr(first.get('input'))[:80]})", param


def _field_names() -> set[str]:
    models = (ChatCompletionRequest, CompletionRequest, Message, TextPart, ResponseFormat, JSONSchemaSpec,
              StreamOptions)
    return {name for model in models for name in model.model_fields} | {"schema"}
