"""``simpop serve``: any simpop backend behind an OpenAI-compatible HTTP API (standard library only).

Endpoints: ``GET /v1/models``, ``POST /v1/chat/completions`` (``n``, ``temperature``, ``top_p``,
``max_tokens`` / ``max_completion_tokens``, ``stop``, ``seed``, ``logprobs``, ``response_format``) and ``GET /health``
(request counters); a request with ``prompt_logprobs: 0`` (vLLM's extension, with ``add_generation_prompt``)
is answered with every prompt token's log-probability and no generation (how
:meth:`~simpop.agents.openai_backend.OpenAIBackend.score_replies` scores a survey's options). Concurrent requests with the same sampling settings are micro-batched: the first
request of a batch waits up to ``--batch-window-ms`` for others, then all run as one backend call of at
most ``--max-batch`` rows, so one process can host the simulators of many trainers. Requests that carry
a ``seed`` run as a batch of their own, so that their answer does not depend on what else arrived.

Structured output: ``response_format`` ``{"type": "json_schema", "json_schema": {"schema": ...}}`` (or
``{"type": "json_object"}``, any JSON object) becomes ``SamplingParams.json_schema``, and a backend that
constrains decoding (``supports_json_schema``, e.g. the in-process transformers backend) answers with
JSON that follows the schema; a backend that cannot is answered with HTTP 400 rather than free text.

Beyond the OpenAI schema, every choice carries ``token_ids`` and the response ``prompt_token_ids``
(vLLM's field names); log-prob entries name tokens as ``token_id:<id>`` (vLLM's
``return_tokens_as_token_ids`` form). ``simpop.agents.OpenAIBackend`` reads both.

    simpop serve --model smollm2 --port 8000
    curl -s localhost:8000/v1/chat/completions -d '{"model": "smollm2", "max_tokens": 16,
         "messages": [{"role": "user", "content": "Hi"}]}'
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from simpop.agents.base import Backend, Chat, Generation, SamplingParams, supports_json_schema
from simpop.agents.chat import check_chat

log = logging.getLogger(__name__)

DEFAULT_MAX_TOKENS = 512
MAX_N = 128


class RequestError(ValueError):
    """A request the server answers with an OpenAI-style error body."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.param, self.code = status, param, code


@dataclass(eq=False)  # jobs are equal only to themselves (see key)
class _Job:
    chats: list[Chat]
    params: SamplingParams
    arrived: float = field(default_factory=time.monotonic)
    done: threading.Event = field(default_factory=threading.Event)
    result: list[Generation] | None = None
    error: BaseException | None = None

    @property
    def key(self) -> object:
        # Seeded jobs batch with nothing else: their output must not depend on their batch mates.
        return self.params if self.params.seed is None else self


class MicroBatcher:
    """Funnels generation jobs from many threads into batched calls of one backend, on one worker thread.

    Args:
        backend: The backend to call (only from the worker thread, so it need not be thread-safe).
        max_batch: Most chats (rows) per backend call; a single larger job still runs whole.
        window_s: How long the oldest pending job waits for batch mates.
    """

    def __init__(self, backend: Backend, max_batch: int = 32, window_s: float = 0.01) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if window_s < 0:
            raise ValueError(f"the batching window must be >= 0 seconds, got {window_s}")
        self.backend, self.max_batch, self.window_s = backend, max_batch, window_s
        self.batches = 0  # backend calls made
        self._pending: collections.deque[_Job] = collections.deque()
        self._cond = threading.Condition()
        #: Held around every model call: generation batches here, prompt scoring in request threads.
        self.model_lock = threading.Lock()
        self._closed = False
        self._worker = threading.Thread(target=self._loop, name="simpop-serve-batcher", daemon=True)
        self._worker.start()

    def submit(self, chats: list[Chat], params: SamplingParams) -> list[Generation]:
        """Generate for ``chats`` (blocking the calling thread); raises what the backend raised."""
        job = _Job(chats, params)
        with self._cond:
            if self._closed:
                raise RuntimeError("the server is shutting down")
            self._pending.append(job)
            self._cond.notify_all()
        job.done.wait()
        if job.error is not None:
            raise job.error
        assert job.result is not None
        return job.result

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop after the running batch; pending jobs fail with an error."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._worker.join(timeout_s)

    def _loop(self) -> None:
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            self._run(batch)

    def _next_batch(self) -> list[_Job] | None:
        with self._cond:
            while not self._pending and not self._closed:
                self._cond.wait()
            if self._closed:
                for job in self._pending:
                    job.error = RuntimeError("the server is shutting down")
                    job.done.set()
                self._pending.clear()
                return None
            first = self._pending[0]
            mates_possible = first.params.seed is None
            deadline = first.arrived + (self.window_s if mates_possible else 0.0)
            while not self._closed and self._rows(first.key) < self.max_batch and time.monotonic() < deadline:
                self._cond.wait(deadline - time.monotonic())
            batch, rows = [], 0
            for job in list(self._pending):
                if job.key == first.key and (not batch or rows + len(job.chats) <= self.max_batch):
                    batch.append(job)
                    rows += len(job.chats)
                    self._pending.remove(job)
            return batch

    def _rows(self, key: object) -> int:
        return sum(len(job.chats) for job in self._pending if job.key == key)

    def _run(self, batch: list[_Job]) -> None:
        self.batches += 1
        try:
            with self.model_lock:
                generations = self.backend.generate(
                    [chat for job in batch for chat in job.chats], batch[0].params
                )
        except ValueError as error:
            if len(batch) > 1:  # one bad request (e.g. too long) must not fail its batch mates
                for job in batch:
                    self._run([job])
                return
            batch[0].error = error
        except Exception as error:  # answered as HTTP 500; the server keeps serving
            log.exception("backend call failed")
            for job in batch:
                job.error = error
        else:
            start = 0
            for job in batch:
                job.result = generations[start : start + len(job.chats)]
                start += len(job.chats)
        for job in batch:
            job.done.set()


class SimpopServer(ThreadingHTTPServer):
    """An OpenAI-compatible server over one backend. Use :func:`make_server` to build one.

    Attributes:
        url: The API root for clients, e.g. ``http://127.0.0.1:8000/v1``.
        requests: Chat-completion requests received; ``in_flight`` / ``max_in_flight`` count them
            while they are being answered.
    """

    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        backend: Backend,
        model_name: str,
        batcher: MicroBatcher,
        api_key: str | None,
    ) -> None:
        super().__init__(address, _Handler)
        self.backend, self.model_name, self.batcher, self.api_key = backend, model_name, batcher, api_key
        self.created = int(time.time())
        self.requests = self.in_flight = self.max_in_flight = 0
        self._count_lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}/v1"

    def start(self) -> SimpopServer:
        """Serve from a daemon thread (for in-process use and tests); returns ``self``."""
        # A short poll interval makes close() quick (shutdown waits for the next poll).
        self._thread = threading.Thread(
            target=self.serve_forever, args=(0.05,), name="simpop-serve", daemon=True
        )
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving and release the port."""
        if self._thread is not None:
            self.shutdown()
            self._thread.join()
        self.batcher.close()
        self.server_close()

    def __enter__(self) -> SimpopServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def stats(self) -> dict[str, int]:
        with self._count_lock:
            return {
                "requests": self.requests,
                "in_flight": self.in_flight,
                "max_in_flight": self.max_in_flight,
                "batches": self.batcher.batches,
            }

    @contextlib.contextmanager
    def counting_request(self) -> Iterator[None]:
        """Count one chat-completion request while it is being answered."""
        with self._count_lock:
            self.requests += 1
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            yield
        finally:
            with self._count_lock:
                self.in_flight -= 1


def make_server(
    backend: Backend,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    model_name: str | None = None,
    max_batch: int = 32,
    batch_window_s: float = 0.01,
    api_key: str | None = None,
) -> SimpopServer:
    """Bind an OpenAI-compatible server for ``backend`` (port 0 picks a free port); call ``serve_forever``
    or ``start``.

    Args:
        model_name: The model id clients must send; default ``backend.name``.
        api_key: If set, requests must carry ``Authorization: Bearer <api_key>`` (else HTTP 401).
    """
    batcher = MicroBatcher(backend, max_batch=max_batch, window_s=batch_window_s)
    return SimpopServer((host, port), backend, model_name or backend.name, batcher, api_key)


class _Handler(BaseHTTPRequestHandler):
    server: SimpopServer
    protocol_version = "HTTP/1.1"  # keep-alive: clients reuse connections across requests

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        if self.path.rstrip("/") == "/v1/models":
            if self._authorized():
                model = {
                    "id": self.server.model_name,
                    "object": "model",
                    "created": self.server.created,
                    "owned_by": "simpop",
                }
                self._send(200, {"object": "list", "data": [model]})
        elif self.path.rstrip("/") == "/health":
            self._send(200, {"status": "ok", "model": self.server.model_name, **self.server.stats()})
        else:
            self._send_error(RequestError(404, f"no route GET {self.path}; try /v1/models", code="not_found"))

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path.rstrip("/") != "/v1/chat/completions":
            self._send_error(
                RequestError(404, f"no route POST {self.path}; try /v1/chat/completions", code="not_found")
            )
            return
        with self.server.counting_request():
            if not self._authorized():
                return
            try:
                if b'"prompt_logprobs"' in body:  # vLLM's extension: score the prompt, generate nothing
                    with self.server.batcher.model_lock:
                        self._send(200, _prompt_logprobs_response(self.server.backend, self.server.model_name, body))
                    return
                chats, params = _parse_request(body, self.server.model_name)
                if params.json_schema is not None and not supports_json_schema(self.server.backend):
                    raise RequestError(400, f"this server's backend ({type(self.server.backend).__name__}) "
                                            "cannot constrain its output: send no response_format",
                                       param="response_format")
                generations = self.server.batcher.submit(chats, params)
                self._send(200, _completion_response(self.server.model_name, generations, params))
            except RequestError as error:
                self._send_error(error)
            except ValueError as error:  # the backend rejected the input (e.g. prompt too long)
                self._send_error(RequestError(400, str(error)))
            except Exception as error:
                self._send_error(RequestError(500, f"{type(error).__name__}: {error}", code="server_error"))

    def _authorized(self) -> bool:
        key = self.server.api_key
        if key is None or self.headers.get("Authorization") == f"Bearer {key}":
            return True
        self._send_error(
            RequestError(
                401, "invalid or missing API key (send 'Authorization: Bearer <key>')", code="invalid_api_key"
            )
        )
        return False

    def _send_error(self, error: RequestError) -> None:
        kind = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error"}.get(
            error.status, "server_error"
        )
        self._send(
            error.status,
            {"error": {"message": str(error), "type": kind, "param": error.param, "code": error.code}},
        )

    def _send(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except ConnectionError:  # the client gave up (e.g. its timeout); nothing left to tell it
            self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server's signature)
        log.debug("%s %s", self.address_string(), format % args)


def _parse_request(body: bytes, model_name: str) -> tuple[list[Chat], SamplingParams]:
    """Validate a chat-completions body; returns ``n`` copies of the chat and the sampling settings."""
    try:
        request = json.loads(body)
    except ValueError as error:
        raise RequestError(400, f"the body is not valid JSON: {error}") from None
    if not isinstance(request, dict):
        raise RequestError(400, "the body must be a JSON object")
    model = request.get("model")
    if not isinstance(model, str):
        raise RequestError(400, "'model' (a string) is required", param="model")
    if model != model_name:
        raise RequestError(
            404,
            f"the model '{model}' does not exist; this server serves '{model_name}'",
            "model",
            "model_not_found",
        )
    if request.get("stream"):
        raise RequestError(400, "streaming is not supported; leave 'stream' unset", param="stream")
    if request.get("top_logprobs"):
        raise RequestError(
            400, "top_logprobs is not supported; only the chosen tokens' logprobs", param="top_logprobs"
        )
    chat = _parse_messages(request.get("messages"))
    n = _number(request, "n", int, 1, lower=1, upper=MAX_N)
    max_tokens_field = "max_completion_tokens" if "max_completion_tokens" in request else "max_tokens"
    stop = request.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and not (isinstance(stop, list) and all(isinstance(s, str) and s for s in stop)):
        raise RequestError(400, "'stop' must be a non-empty string or a list of them", param="stop")
    seed = request.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise RequestError(400, "'seed' must be an integer", param="seed")
    logprobs = request.get("logprobs", False)
    if not isinstance(logprobs, bool):
        raise RequestError(400, "'logprobs' must be true or false", param="logprobs")
    json_schema = _response_format(request.get("response_format"))
    try:
        params = SamplingParams(
            max_new_tokens=_number(request, max_tokens_field, int, DEFAULT_MAX_TOKENS, lower=1),
            temperature=_number(request, "temperature", float, 1.0, lower=0, upper=2),
            top_p=_number(request, "top_p", float, 1.0, lower=0, upper=1),
            stop=tuple(stop or ()),
            seed=seed,
            logprobs=logprobs,
            json_schema=json_schema,
        )
    except ValueError as error:  # what SamplingParams itself rejects (top_p = 0)
        raise RequestError(400, str(error)) from None
    return [chat] * n, params


def _prompt_logprobs_response(backend: Any, model_name: str, body: bytes) -> dict[str, Any]:
    """vLLM's ``prompt_logprobs`` extension (with ``prompt_logprobs: 0``): the log-probability of every prompt token
    after the first (``add_generation_prompt`` says whether the rendered prompt ends with the assistant's turn
    opening), ``prompt_token_ids``, and an empty completion: nothing is generated."""
    import torch

    try:
        request = json.loads(body)
    except ValueError as error:
        raise RequestError(400, f"the body is not valid JSON: {error}") from None
    if not isinstance(request, dict) or request.get("model") != model_name:
        raise RequestError(400, f"the body must be a JSON object for model '{model_name}'", param="model")
    if request.get("prompt_logprobs") != 0:
        raise RequestError(400, "only prompt_logprobs: 0 (each prompt token's own log-probability) is supported",
                           param="prompt_logprobs")
    add = request.get("add_generation_prompt", True)
    if not isinstance(add, bool):
        raise RequestError(400, "'add_generation_prompt' must be true or false", param="add_generation_prompt")
    if not (callable(getattr(backend, "encode_chat", None)) and callable(getattr(backend, "token_logprobs", None))):
        raise RequestError(400, f"this server's backend ({type(backend).__name__}) cannot score prompts: send no "
                                "prompt_logprobs", param="prompt_logprobs")
    chat = _parse_messages(request.get("messages"))
    ids = backend.encode_chat(chat, add_generation_prompt=add)
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


def _response_format(value: Any) -> dict[str, Any] | None:
    """The JSON schema an OpenAI ``response_format`` asks for (None for free text)."""
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        spec = value.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if isinstance(schema, dict):
            return schema
        raise RequestError(400, "response_format json_schema needs 'json_schema': {'name': ..., 'schema': {...}}",
                           param="response_format")
    raise RequestError(400, "'response_format' must be {'type': 'text' | 'json_object' | 'json_schema', ...}",
                       param="response_format")


def _parse_messages(messages: Any) -> Chat:
    if not isinstance(messages, list) or not messages:
        raise RequestError(
            400, "'messages' must be a non-empty list of {role, content} objects", param="messages"
        )
    chat = []
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):  # OpenAI content parts: only text parts carry meaning here
            if not all(
                isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                for p in content
            ):
                raise RequestError(
                    400,
                    "only text content parts ({'type': 'text', 'text': ...}) are supported",
                    param="messages",
                )
            content = "".join(part["text"] for part in content)
        chat.append({"role": message.get("role") if isinstance(message, dict) else None, "content": content})
    try:
        return check_chat(chat)
    except ValueError as error:
        raise RequestError(400, str(error), param="messages") from None


def _number(
    request: dict[str, Any], name: str, kind: type, default: Any, lower: float, upper: float | None = None
) -> Any:
    value = request.get(name)
    if value is None:
        return default
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or (kind is int and not isinstance(value, int))
    ):
        raise RequestError(400, f"'{name}' must be {'an integer' if kind is int else 'a number'}", param=name)
    if value < lower or (upper is not None and value > upper):
        bounds = f">= {lower}" if upper is None else f"in [{lower}, {upper}]"
        raise RequestError(400, f"'{name}' must be {bounds}, got {value}", param=name)
    return kind(value)


def _completion_response(
    model_name: str, generations: list[Generation], params: SamplingParams
) -> dict[str, Any]:
    choices = []
    for index, generation in enumerate(generations):
        logprobs = None
        if params.logprobs and generation.logprobs is not None:
            logprobs = {
                "content": [
                    {"token": f"token_id:{token}", "logprob": value, "bytes": None, "top_logprobs": []}
                    for token, value in zip(generation.token_ids, generation.logprobs)
                ]
            }
        choices.append(
            {
                "index": index,
                "message": {"role": "assistant", "content": generation.text},
                "finish_reason": generation.finish_reason,
                "logprobs": logprobs,
                "token_ids": generation.token_ids,
            }
        )
    prompt_tokens = len(generations[0].prompt_ids)
    completion_tokens = sum(len(g.token_ids) for g in generations)
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model_name,
        "choices": choices,
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
        "prompt_token_ids": generations[0].prompt_ids,
    }


# ----------------------------------------------------------------------------------------------- CLI


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", default="smollm2", help="backend spec (see simpop.agents.load_backend); default smollm2"
    )
    parser.add_argument("--name", help="model id clients send (default: the backend's name)")
    parser.add_argument(
        "--host", default="127.0.0.1", help="interface to bind (0.0.0.0 exposes it to the network)"
    )
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--dtype", choices=("float32", "bfloat16"), help="weights dtype of a transformers backend"
    )
    parser.add_argument("--threads", type=int, help="torch threads of a transformers backend")
    parser.add_argument("--max-batch", type=int, default=32, help="most chats per backend call")
    parser.add_argument(
        "--batch-window-ms", type=float, default=10.0, help="how long a request waits for batch mates"
    )
    parser.add_argument("--api-key", help="require this bearer token from clients")
    parser.add_argument("--log-requests", action="store_true", help="log every HTTP request")


def run(args: argparse.Namespace) -> int:
    from simpop.agents import load_backend

    logging.basicConfig(
        level=logging.DEBUG if args.log_requests else logging.INFO, format="%(asctime)s %(message)s"
    )
    options = {k: v for k, v in {"dtype": args.dtype, "threads": args.threads}.items() if v is not None}
    backend = load_backend(args.model, **options)
    server = make_server(
        backend,
        args.host,
        args.port,
        model_name=args.name,
        max_batch=args.max_batch,
        batch_window_s=args.batch_window_ms / 1000,
        api_key=args.api_key,
    )
    print(f"simpop serve: model '{server.model_name}' at {server.url} (Ctrl-C stops)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.batcher.close()
        server.server_close()
    return 0
