"""``simpop serve``: any simpop backend behind an OpenAI-compatible HTTP API (FastAPI on uvicorn).

Endpoints: ``GET /v1/models``, ``GET /health`` (request counters), ``POST /v1/chat/completions`` (``n``,
``temperature``, ``top_p``, ``max_tokens`` / ``max_completion_tokens``, ``stop``, ``seed``, ``logprobs``,
``top_logprobs``, ``response_format``, ``stream``) and ``POST /v1/completions`` (``prompt`` as text, as a list
of token ids, or a list of either: the token-in/token-out path; ``logprobs`` as a top-k count, ``stream``).
A chat request with ``prompt_logprobs: 0`` (vLLM's extension, with ``add_generation_prompt``) is answered
with every prompt token's log-probability and no generation (how
:meth:`~simpop.agents.openai_backend.OpenAIBackend.score_replies` scores a survey's options).

Concurrent requests with the same sampling settings are micro-batched (:mod:`simpop.serve.batching`):
the first request of a batch waits up to ``--batch-window-ms`` for others, then all run as one backend call
of at most ``--max-batch`` rows, so one process can host the simulators of many trainers. A sampling request that
carries a ``seed`` gets the answer it would alone: an in-process model draws each row with its own generator, so it
batches; on other backends it runs as a batch of its own (a greedy request's seed changes nothing: it batches).
A backend with a tokenizer (``encode_chat`` / ``generate_ids``) is called with token ids, so chat and text
completions batch together and the compute cap counts real prompt tokens.

Structured output: ``response_format`` ``{"type": "json_schema", "json_schema": {"schema": ...}}`` (or
``{"type": "json_object"}``) becomes ``SamplingParams.json_schema``; a backend that cannot constrain its
output (``supports_json_schema``) is answered with HTTP 400 rather than free text. ``top_logprobs`` need an
in-process model (one extra forward pass per choice, at the sampling temperature, before top-p).
Streaming (``stream: true``) sends OpenAI's chunk format as server-sent events and ends with ``[DONE]``;
backends generate whole completions, so each choice's text arrives as one chunk once its batch is done.

Beyond the OpenAI schema, every choice carries ``token_ids`` and the response ``prompt_token_ids`` (vLLM's
field names); log-prob entries name tokens as ``token_id:<id>`` (vLLM's ``return_tokens_as_token_ids``
form). ``simpop.agents.OpenAIBackend`` reads both.

Limits (each a flag, named in the error that enforces it; :class:`~simpop.serve.requests.Limits`):
body size (413, unread beyond ``Content-Length``), ``n``, ``stop`` entries, ``n × prompt tokens ×
max_tokens`` (work) and ``n × (prompt tokens + max_tokens)`` (memory), a read deadline for the request head
and body, an idle keep-alive timeout (:mod:`simpop.serve.http`). The API key is checked before the
body is read, on every route including ``/health``. Fields the server does not honour (``tools``,
penalties, unknown names) get HTTP 400; no client error is answered with 500.

    simpop serve --model smollm2 --port 8000
    curl -s localhost:8000/v1/chat/completions -d '{"model": "smollm2", "max_tokens": 16,
         "messages": [{"role": "user", "content": "Hi"}]}'
    simpop serve --engine vllm --model path/to/hf-folder --lora policy=runs/x/adapter   # vLLM's own server
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import socket
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

try:
    import uvicorn
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, StreamingResponse
    from pydantic import ValidationError
    from starlette.exceptions import HTTPException
except ImportError as missing:
    raise ImportError(f"simpop serve needs fastapi and uvicorn ({missing}): pip install simpop[llm]") from missing

from simpop.agents.base import Backend, Chat, Generation, SamplingParams, supports_json_schema
from simpop.serve.batching import MicroBatcher
from simpop.serve.http import HeadTimeoutProtocol, RequestGate, UvicornThread, add_http_arguments, error_body
from simpop.serve.requests import ChatCompletionRequest, CompletionRequest, LimitExceeded, Limits, describe
from simpop.user_input import THREADS, UsageError, integer, number

log = logging.getLogger(__name__)

#: token id -> log-probability, the top k at one completion position.
TopK = list[tuple[int, float]]


class RequestError(ValueError):
    """A request the server answers with an OpenAI-style error body."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.param, self.code = status, param, code


class SimpopServer:
    """An OpenAI-compatible server over one backend. Use :func:`make_server` to build one.

    Attributes:
        url: The API root for clients, e.g. ``http://127.0.0.1:8000/v1``.
        limits: What one request may ask (see :class:`~simpop.serve.requests.Limits`).
        requests: Completion requests received (refused ones too); ``in_flight`` / ``max_in_flight`` count
            those being answered, ``rejected`` every request answered with a 4xx.
    """

    def __init__(self, backend: Backend, model_name: str, batcher: MicroBatcher, api_key: str | None,
                 limits: Limits, sock: socket.socket, log_requests: bool = False) -> None:
        self.backend, self.model_name, self.batcher, self.api_key = backend, model_name, batcher, api_key
        self.limits, self.socket = limits, sock
        self.created = int(time.time())
        self.requests = self.in_flight = self.max_in_flight = self.rejected = 0
        app = RequestGate(_app(self), api_key, limits.max_body_bytes, limits.read_timeout_s, self._count_request,
                          self._count_rejection)
        config = uvicorn.Config(
            # uvicorn annotates `http` as a protocol class and the timeouts as int; it calls the factory and
            # uses the timeouts as float seconds (loop.call_later, asyncio.wait_for), so both work as given.
            app, http=functools.partial(HeadTimeoutProtocol, head_timeout_s=limits.read_timeout_s),  # type: ignore[arg-type]
            timeout_keep_alive=limits.keep_alive_s,  # type: ignore[arg-type]
            timeout_graceful_shutdown=limits.shutdown_grace_s,  # type: ignore[arg-type]
            lifespan="off", ws="none", log_config=None,
            access_log=log_requests, log_level="info" if log_requests else "warning",
        )
        self._uvicorn = UvicornThread(config, sock, "simpop serve")

    @property
    def url(self) -> str:
        host, port = self.socket.getsockname()[:2]
        return f"http://{host}:{port}/v1"

    def serve_forever(self) -> None:
        """Serve on this thread until Ctrl-C (uvicorn handles the signal)."""
        self._uvicorn.serve_forever()

    def start(self, timeout_s: float = 30.0) -> SimpopServer:
        """Serve from a daemon thread (for in-process use and tests); returns ``self`` once it accepts requests."""
        self._uvicorn.start(timeout_s)
        return self

    def close(self) -> None:
        """Stop serving and release the port."""
        self._uvicorn.stop()
        self.batcher.close()
        self.socket.close()

    def __enter__(self) -> SimpopServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def stats(self) -> dict[str, int]:
        """Request counters: received, in flight now and at most, rejected (4xx), and backend batches."""
        return {"requests": self.requests, "in_flight": self.in_flight, "max_in_flight": self.max_in_flight,
                "rejected": self.rejected, "batches": self.batcher.batches}

    @contextlib.contextmanager
    def counting_request(self) -> Iterator[None]:
        """Count one completion request in flight while it is being answered (called on the event loop only)."""
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            yield
        finally:
            self.in_flight -= 1

    def _count_request(self, scope: dict[str, Any]) -> None:
        if scope["path"].rstrip("/").endswith("completions"):
            self.requests += 1

    def _count_rejection(self, status: int) -> None:
        self.rejected += 1


def make_server(
    backend: Backend,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    model_name: str | None = None,
    max_batch: int = 32,
    batch_window_s: float = 0.01,
    api_key: str | None = None,
    limits: Limits | None = None,
    log_requests: bool = False,
) -> SimpopServer:
    """Bind an OpenAI-compatible server for ``backend`` (port 0 picks a free port); call ``serve_forever``
    or ``start``.

    Args:
        model_name: The model id clients must send; default ``backend.name``.
        api_key: If set, requests must carry ``Authorization: Bearer <api_key>`` (else HTTP 401).
        limits: Request caps and timeouts; default :class:`~simpop.serve.requests.Limits()`.
        log_requests: Log every HTTP request (uvicorn's access log).
    """
    sock = socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET)
    batcher = MicroBatcher(backend, max_batch=max_batch, window_s=batch_window_s)
    return SimpopServer(backend, model_name or backend.name, batcher, api_key, limits or Limits(), sock, log_requests)


# ------------------------------------------------------------------------------------------------ routes


def _app(server: SimpopServer) -> Any:
    app = FastAPI(title="simpop serve", docs_url=None, redoc_url=None)

    def error(status: int, message: str, param: str | None = None, code: str | None = None) -> JSONResponse:
        if status < 500:
            server.rejected += 1
        return JSONResponse(error_body(status, message, param, code), status_code=status)

    @app.exception_handler(RequestError)
    async def request_error(_: Request, exc: RequestError) -> JSONResponse:
        return error(exc.status, str(exc), exc.param, exc.code)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        hint = {404: "; the routes are /v1/models, /v1/chat/completions, /v1/completions and /health"}.get(
            exc.status_code, "")
        return error(exc.status_code, f"{exc.detail}: {request.method} {request.url.path}{hint}",
                     code="not_found" if exc.status_code == 404 else None)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = describe(exc.errors())
        return error(400, message, param)

    @app.exception_handler(Exception)
    async def crashed(_: Request, exc: Exception) -> JSONResponse:
        log.exception("request failed")
        return error(500, f"{type(exc).__name__}: {exc}", code="server_error")

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        model = {"id": server.model_name, "object": "model", "created": server.created, "owned_by": "simpop"}
        return {"object": "list", "data": [model]}

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": server.model_name, **server.stats()}

    async def parsed(request: Request, model: type[Any]) -> Any:
        """The JSON body as ``model``; with or without a JSON content type (curl sends none by default)."""
        try:
            data = json.loads(await request.body())
        except ValueError as exc:
            raise RequestError(400, f"the body is not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise RequestError(400, "the body must be a JSON object")
        try:  # JSON's \\ud800 escapes decode to lone surrogates, which no tokenizer or response can encode
            json.dumps(data, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise RequestError(400, "the body holds text that is not valid Unicode (a lone UTF-16 surrogate "
                                    "escape such as \\ud800)") from None
        try:
            return model.model_validate(data)
        except ValidationError as exc:
            message, param = describe(exc.errors())
            raise RequestError(400, message, param) from None

    def documented(model: type[Any]) -> dict[str, Any]:
        schema = model.model_json_schema()
        return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}

    @app.post("/v1/chat/completions", response_model=None, openapi_extra=documented(ChatCompletionRequest))
    async def chat_completions(request: Request) -> Any:
        body: ChatCompletionRequest = await parsed(request, ChatCompletionRequest)
        _check_model(body.model, server.model_name)
        with server.counting_request():
            chat = body.chat
            if body.prompt_logprobs is not None:
                return JSONResponse(await _in_thread(server, _prompt_logprobs_response, server.backend,
                                                     server.model_name, chat, body.add_generation_prompt))
            schema = body.response_format.schema_ if body.response_format is not None else None
            if schema is not None and not supports_json_schema(server.backend):
                raise RequestError(400, f"this server's backend ({type(server.backend).__name__}) cannot constrain "
                                        "its output: send no response_format", param="response_format")
            top_k = body.top_logprobs or 0
            if top_k:
                _check_top_logprobs(server.backend, schema)
            max_tokens = body.max_new_tokens(server.limits.default_max_tokens)
            row: Chat | list[int]
            method, row = "generate", chat
            if _takes_ids(server.backend):
                ids = await _tokenized(server.backend.encode_chat, chat)  # type: ignore[attr-defined]
                prompt_tokens = len(ids)
                if schema is None:  # structured output stays on the chat path (vLLM constrains chats only)
                    method, row = "generate_ids", ids
            else:  # bytes bound byte-level BPE tokens from above
                prompt_tokens = sum(len(m["content"].encode()) for m in chat)
            _check_limits(server.limits, body, prompt_tokens, max_tokens)
            params = _params(body, max_tokens, body.logprobs, schema)
            generations = await _generate(server, request, method, [row] * body.n, params)
            tops = None
            if top_k:
                tops = await _in_thread(server, _top_logprobs, server.backend, generations, top_k, params)
            if body.stream:
                usage = body.stream_options is not None and body.stream_options.include_usage
                return StreamingResponse(_sse(_chat_chunks(server.model_name, generations, params, tops, usage)),
                                         media_type="text/event-stream")
            # A response object skips FastAPI's jsonable_encoder pass: the dicts are JSON-ready already.
            return JSONResponse(_chat_response(server.model_name, generations, params, tops))

    @app.post("/v1/completions", response_model=None, openapi_extra=documented(CompletionRequest))
    async def completions(request: Request) -> Any:
        body: CompletionRequest = await parsed(request, CompletionRequest)
        _check_model(body.model, server.model_name)
        with server.counting_request():
            backend = server.backend
            if not callable(getattr(backend, "generate_ids", None)):
                raise RequestError(400, f"this server's backend ({type(backend).__name__}) cannot generate from a "
                                        "prompt (no generate_ids): use /v1/chat/completions", param="prompt")
            prompts = [await _tokenized(_encode_text, backend, p) if isinstance(p, str) else p for p in body.prompts]
            top_k = body.logprobs or 0
            if top_k:
                _check_top_logprobs(backend, None)
            _check_limits(server.limits, body, sum(map(len, prompts)), body.max_tokens, prompts=len(prompts))
            params = _params(body, body.max_tokens, body.logprobs is not None, None)
            generations = await _generate(server, request, "generate_ids", [p for p in prompts for _ in range(body.n)],
                                          params)
            tops = await _in_thread(server, _top_logprobs, backend, generations, top_k, params) if top_k else None
            if body.stream:
                usage = body.stream_options is not None and body.stream_options.include_usage
                return StreamingResponse(_sse(_text_chunks(server.model_name, generations, params, tops, usage)),
                                         media_type="text/event-stream")
            return JSONResponse(_text_response(server.model_name, generations, params, tops))

    return app


def _check_model(model: str, served: str) -> None:
    if model != served:
        raise RequestError(404, f"the model '{model}' does not exist; this server serves '{served}'", "model",
                           "model_not_found")


def _check_limits(limits: Limits, body: Any, prompt_tokens: int, max_tokens: int, prompts: int = 1) -> None:
    try:
        limits.check(body, prompt_tokens, max_tokens, prompts)
    except LimitExceeded as error:
        raise RequestError(400, str(error), error.param, "limit_exceeded") from None


def _params(body: Any, max_tokens: int, logprobs: bool, schema: dict[str, Any] | None) -> SamplingParams:
    try:
        return body.sampling(max_tokens, logprobs, schema)
    except ValueError as error:  # what SamplingParams itself rejects (an unserialisable schema)
        raise RequestError(400, str(error)) from None


def _takes_ids(backend: Any) -> bool:
    return callable(getattr(backend, "encode_chat", None)) and callable(getattr(backend, "generate_ids", None))


async def _tokenized(encode: Any, *args: Any) -> list[int]:
    """``encode(*args)`` off the event loop (a long prompt takes a while), as a list of token ids."""
    import anyio.to_thread

    try:
        return list(await anyio.to_thread.run_sync(encode, *args))
    except ValueError as error:  # e.g. a chat the template refuses
        raise RequestError(400, str(error)) from None


def _encode_text(backend: Any, text: str) -> list[int]:
    tokenizer = getattr(backend, "tokenizer", None)
    if tokenizer is None:
        raise RequestError(400, f"this server's backend ({type(backend).__name__}) has no tokenizer for a text "
                                "prompt: send the prompt as a list of token ids", param="prompt")
    return list(tokenizer(text)["input_ids"])


def _check_top_logprobs(backend: Any, schema: dict[str, Any] | None) -> None:
    if getattr(backend, "model", None) is None or not callable(getattr(backend, "model", None)):
        raise RequestError(400, f"top log-probabilities need an in-process model; this server's backend "
                                f"({type(backend).__name__}) has none: ask for logprobs only", param="top_logprobs")
    if schema is not None:
        raise RequestError(400, "top log-probabilities are not available with a response_format (they would not "
                                "see the schema's constraint)", param="top_logprobs")


async def _generate(server: SimpopServer, request: Request, method: str, rows: list[Any],
                    params: SamplingParams) -> list[Generation]:
    """The batcher's generations for ``rows``; if the client disconnects first, the job is cancelled (the model
    stops working on it, see :mod:`simpop.serve.batching`) and the request ends with 499."""
    import asyncio

    job = asyncio.ensure_future(server.batcher.generate(method, rows, params))
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait((job, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:  # also when this request itself is cancelled (a server shutting down)
        gone.cancel()
        if not job.done():
            job.cancel()
    if not job.done() or job.cancelled():
        raise RequestError(499, "the client closed the connection before the answer", code="client_closed")
    try:
        return job.result()
    except RequestError:
        raise
    except ValueError as error:  # the backend rejected the input (e.g. prompt too long)
        raise RequestError(400, str(error)) from None
    except Exception as error:
        raise RequestError(500, f"{type(error).__name__}: {error}", code="server_error") from None


async def _disconnected(request: Request) -> None:
    """Return once the client has gone (the ASGI ``http.disconnect``; the body was read before)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _in_thread(server: SimpopServer, function: Any, *args: Any) -> Any:
    """Run a model call off the event loop, holding the model lock (it never runs beside a batch)."""
    import anyio.to_thread

    def locked() -> Any:
        with server.batcher.model_lock:
            return function(*args)

    try:
        return await anyio.to_thread.run_sync(locked)
    except RequestError:
        raise
    except ValueError as error:
        raise RequestError(400, str(error)) from None
    except Exception as error:
        log.exception("model call failed")
        raise RequestError(500, f"{type(error).__name__}: {error}", code="server_error") from None


# ------------------------------------------------------------------------------------------ model calls


def _top_logprobs(backend: Any, generations: list[Generation], k: int, params: SamplingParams) -> list[list[TopK]]:
    """The ``k`` most likely tokens at every completion position of each generation (one forward pass each,
    logits divided by the sampling temperature; greedy reports the raw distribution)."""
    import torch

    model = backend.model
    device = getattr(backend, "device", None) or next(model.parameters(), torch.zeros(())).device
    out: list[list[TopK]] = []
    with torch.no_grad():
        for generation in generations:
            if not generation.token_ids or not generation.prompt_ids:
                out.append([[] for _ in generation.token_ids])
                continue
            sequence = generation.prompt_ids + generation.token_ids
            start = len(generation.prompt_ids) - 1
            logits = model(input_ids=torch.tensor([sequence], device=device)).logits[0, start:-1].float()
            if params.temperature > 0:
                logits = logits / params.temperature
            values, ids = logits.log_softmax(-1).topk(k, dim=-1)
            out.append([list(zip(row_ids, row_values)) for row_ids, row_values in zip(ids.tolist(), values.tolist())])
    return out


def _prompt_logprobs_response(backend: Any, model_name: str, chat: Chat, add_generation_prompt: bool) -> dict[str, Any]:
    """vLLM's ``prompt_logprobs`` extension (with ``prompt_logprobs: 0``): the log-probability of every prompt token
    after the first (``add_generation_prompt`` says whether the rendered prompt ends with the assistant's turn
    opening), ``prompt_token_ids``, and an empty completion: nothing is generated."""
    import torch

    if not (callable(getattr(backend, "encode_chat", None)) and callable(getattr(backend, "token_logprobs", None))):
        raise RequestError(400, f"this server's backend ({type(backend).__name__}) cannot score prompts: send no "
                                "prompt_logprobs", param="prompt_logprobs")
    ids = backend.encode_chat(chat, add_generation_prompt=add_generation_prompt)
    if len(ids) < 2:
        raise RequestError(400, "the prompt has fewer than two tokens: nothing to score")
    with torch.no_grad():
        scores = backend.token_logprobs([ids], [[1] * len(ids)])
    logprobs = [float(x) for x in scores.logprobs[0].float().tolist()]
    entries = [None] + [{str(token): {"logprob": lp, "rank": None}} for token, lp in zip(ids[1:], logprobs[1:])]
    return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": model_name, "prompt_token_ids": ids, "prompt_logprobs": entries,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": ""}, "finish_reason": "length",
                         "token_ids": []}],
            "usage": {"prompt_tokens": len(ids), "completion_tokens": 0, "total_tokens": len(ids)}}


# ------------------------------------------------------------------------------------------- responses


def _name(token: int) -> str:
    return f"token_id:{token}"


def _chat_logprobs(generation: Generation, params: SamplingParams, top: list[TopK] | None) -> dict[str, Any] | None:
    if not params.logprobs or generation.logprobs is None:
        return None
    return {"content": [
        {"token": _name(token), "logprob": value, "bytes": None,
         "top_logprobs": [] if top is None else [{"token": _name(t), "logprob": lp, "bytes": None} for t, lp in top[i]]}
        for i, (token, value) in enumerate(zip(generation.token_ids, generation.logprobs))
    ]}


def _text_logprobs(generation: Generation, params: SamplingParams, top: list[TopK] | None) -> dict[str, Any] | None:
    if not params.logprobs or generation.logprobs is None:
        return None
    return {"tokens": [_name(t) for t in generation.token_ids], "token_logprobs": list(generation.logprobs),
            "top_logprobs": None if top is None else [{_name(t): lp for t, lp in position} for position in top],
            "text_offset": None}


def _usage(generations: list[Generation], prompts: list[list[int]]) -> dict[str, int]:
    prompt_tokens = sum(map(len, prompts))
    completion_tokens = sum(len(g.token_ids) for g in generations)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def _chat_response(model: str, generations: list[Generation], params: SamplingParams,
                   tops: list[list[TopK]] | None) -> dict[str, Any]:
    choices = [{"index": i, "message": {"role": "assistant", "content": g.text}, "finish_reason": g.finish_reason,
                "logprobs": _chat_logprobs(g, params, None if tops is None else tops[i]), "token_ids": g.token_ids}
               for i, g in enumerate(generations)]
    return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": model, "choices": choices, "usage": _usage(generations, [generations[0].prompt_ids]),
            "prompt_token_ids": generations[0].prompt_ids}


def _text_response(model: str, generations: list[Generation], params: SamplingParams,
                   tops: list[list[TopK]] | None) -> dict[str, Any]:
    choices = [{"index": i, "text": g.text, "finish_reason": g.finish_reason,
                "logprobs": _text_logprobs(g, params, None if tops is None else tops[i]), "token_ids": g.token_ids,
                "prompt_token_ids": g.prompt_ids}
               for i, g in enumerate(generations)]
    prompts = list({tuple(g.prompt_ids): g.prompt_ids for g in generations}.values())
    return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": model, "choices": choices, "usage": _usage(generations, prompts)}


def _chat_chunks(model: str, generations: list[Generation], params: SamplingParams, tops: list[list[TopK]] | None,
                 usage: bool) -> Iterator[dict[str, Any]]:
    """OpenAI's ``chat.completion.chunk`` sequence for finished generations: per choice its role, its text (with
    log-probs and token ids), then its finish reason; optionally a last chunk with the usage."""
    head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion.chunk", "created": int(time.time()),
            "model": model}
    for i, g in enumerate(generations):
        yield {**head, "choices": [{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                    "finish_reason": None}]}
        yield {**head, "choices": [{"index": i, "delta": {"content": g.text}, "finish_reason": None,
                                    "logprobs": _chat_logprobs(g, params, None if tops is None else tops[i]),
                                    "token_ids": g.token_ids}],
               **({"prompt_token_ids": g.prompt_ids} if i == 0 else {})}
        yield {**head, "choices": [{"index": i, "delta": {}, "logprobs": None, "finish_reason": g.finish_reason}]}
    if usage:
        yield {**head, "choices": [], "usage": _usage(generations, [generations[0].prompt_ids])}


def _text_chunks(model: str, generations: list[Generation], params: SamplingParams, tops: list[list[TopK]] | None,
                 usage: bool) -> Iterator[dict[str, Any]]:
    """The ``text_completion`` chunk sequence for finished generations (see :func:`_chat_chunks`)."""
    head = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()), "model": model}
    for i, g in enumerate(generations):
        yield {**head, "choices": [{"index": i, "text": g.text, "finish_reason": None, "token_ids": g.token_ids,
                                    "prompt_token_ids": g.prompt_ids,
                                    "logprobs": _text_logprobs(g, params, None if tops is None else tops[i])}]}
        yield {**head, "choices": [{"index": i, "text": "", "logprobs": None, "finish_reason": g.finish_reason}]}
    if usage:
        prompts = list({tuple(g.prompt_ids): g.prompt_ids for g in generations}.values())
        yield {**head, "choices": [], "usage": _usage(generations, prompts)}


async def _sse(chunks: Iterator[dict[str, Any]]) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield f"data: {json.dumps(chunk)}\n\n".encode()
    yield b"data: [DONE]\n\n"


# ----------------------------------------------------------------------------------------------- CLI


def configure(parser: argparse.ArgumentParser) -> None:
    """Add ``simpop serve``'s arguments to ``parser``."""
    defaults = Limits()
    parser.add_argument("--engine", choices=("simpop", "vllm"), default="simpop",
                        help="simpop: this server over any simpop backend; vllm: vLLM's own OpenAI server "
                             "(needs vllm installed; --model is then a HF model folder or id)")
    parser.add_argument(
        "--model", default="smollm2", help="backend spec (see simpop.agents.load_backend); default smollm2"
    )
    parser.add_argument("--name", help="model id clients send (default: the backend's name)")
    parser.add_argument("--lora", action="append", default=[], metavar="NAME=PATH",
                        help="(--engine vllm) serve a LoRA adapter under NAME; repeatable")
    parser.add_argument("--vllm-arg", action="append", default=[], metavar="ARG",
                        help="(--engine vllm) one more argument for vLLM's server, e.g. "
                             "--vllm-arg=--max-model-len=4096; repeatable")
    simpop = parser.add_argument_group("--engine simpop")
    simpop.add_argument(
        "--dtype", choices=("float32", "bfloat16"), help="weights dtype of a transformers backend"
    )
    simpop.add_argument("--threads", type=THREADS, help="torch threads of a transformers backend")
    simpop.add_argument("--max-batch", type=integer(1, 4096), default=32, help="most chats per backend call")
    simpop.add_argument(
        "--batch-window-ms", type=number(0, 60_000), default=10.0, help="how long a request waits for batch mates"
    )
    simpop.add_argument("--max-n", type=integer(1, 4096), default=defaults.max_n, help="most completions per request")
    simpop.add_argument("--max-stop", type=integer(0, 1024), default=defaults.max_stop, help="most stop strings per request")
    simpop.add_argument("--max-request-compute", type=integer(1), default=defaults.max_request_compute,
                        help="largest n × prompt tokens × max_tokens of one request")
    simpop.add_argument("--max-request-tokens", type=integer(1), default=defaults.max_request_tokens,
                        help="largest n × (prompt tokens + max_tokens) of one request (its KV cache)")
    simpop.add_argument("--default-max-tokens", type=integer(1, 1_000_000), default=defaults.default_max_tokens,
                        help="max_tokens of a chat request that sends none")
    simpop.add_argument("--shutdown-grace", type=number(0, 86_400), default=defaults.shutdown_grace_s,
                        help="seconds a stopping server lets requests in flight finish before cancelling them")
    add_http_arguments(parser, simpop, max_body_bytes=defaults.max_body_bytes, read_timeout_s=defaults.read_timeout_s,
                       keep_alive_s=defaults.keep_alive_s)


def run(args: argparse.Namespace) -> int:
    """Run ``simpop serve`` with parsed arguments until interrupted; returns the exit code."""
    logging.basicConfig(
        level=logging.DEBUG if args.log_requests else logging.INFO, format="%(asctime)s %(message)s"
    )
    if args.engine == "vllm":
        return _run_vllm(args)
    if args.lora or args.vllm_arg:
        raise UsageError("--lora and --vllm-arg need --engine vllm")
    from simpop.agents import load_backend

    try:
        limits = Limits(max_body_bytes=args.max_body_bytes, max_n=args.max_n, max_stop=args.max_stop,
                        max_request_compute=args.max_request_compute, max_request_tokens=args.max_request_tokens,
                        default_max_tokens=args.default_max_tokens,
                        read_timeout_s=args.read_timeout, keep_alive_s=args.keep_alive_timeout,
                        shutdown_grace_s=args.shutdown_grace)
    except ValueError as error:
        raise UsageError(str(error)) from None
    options = {k: v for k, v in {"dtype": args.dtype, "threads": args.threads}.items() if v is not None}
    backend = load_backend(args.model, **options)
    server = make_server(backend, args.host, args.port, model_name=args.name, max_batch=args.max_batch,
                         batch_window_s=args.batch_window_ms / 1000, api_key=args.api_key, limits=limits,
                         log_requests=args.log_requests)
    print(f"simpop serve: model '{server.model_name}' at {server.url} (Ctrl-C stops)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:  # uvicorn shuts down gracefully, then re-raises the signal it caught
        pass
    finally:
        server.batcher.close()
        server.socket.close()
    return 0


def _run_vllm(args: argparse.Namespace) -> int:
    loras = {}
    for spec in args.lora:
        name, sep, path = spec.partition("=")
        if not (sep and name and path):
            raise UsageError(f"--lora takes NAME=PATH, got {spec!r}")
        loras[name] = path
    try:
        from simpop.agents.vllm_server import serve_forever
    except ImportError as error:
        raise UsageError(f"--engine vllm needs simpop's vLLM launcher and vLLM itself ({error}); "
                         "install vLLM with `pip install simpop[vllm]` (or `make vllm-env` on CPU), or use "
                         "--engine simpop") from None
    serve_forever(model=args.model, host=args.host, port=args.port, api_key=args.api_key, loras=loras,
                  extra_args=list(args.vllm_arg))
    return 0
