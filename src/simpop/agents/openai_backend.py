"""Any OpenAI-compatible chat-completions server as a backend (vLLM, llama.cpp, ``simpop serve``, APIs).

A batch of chats becomes concurrent HTTP requests (at most ``max_concurrency`` in flight per call).
Connection errors, timeouts, HTTP 429 and 5xx are retried with exponential back-off (then
:class:`BackendUnavailable`); 401/403 and other 4xx fail at once with the server's message. Token ids and log-probabilities are filled when the server
returns them (``simpop serve`` always does; vLLM does with ``return_token_ids=True``).
``SamplingParams.json_schema`` is sent as an OpenAI structured-output ``response_format``.
:meth:`OpenAIBackend.score_replies` scores fixed replies (a closing survey's options) from the server's
``prompt_logprobs`` (vLLM's extension of the API, which ``simpop serve`` implements too); a server without it
raises :class:`~simpop.agents.base.ScoringUnsupported`::

    backend = OpenAIBackend("http://127.0.0.1:8000/v1", "smollm2")
    backend.generate([[{"role": "user", "content": "Hi"}]], SamplingParams(max_new_tokens=16))
"""

from __future__ import annotations

import asyncio
import functools
import os
import random
import re
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from simpop.agents.base import Chat, Generation, SamplingParams, ScoringUnsupported
from simpop.agents.chat import check_chat

if TYPE_CHECKING:
    import httpx


class RemoteBackendError(RuntimeError):
    """A request to a remote model server failed; ``status`` is the HTTP status, if one came back."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class BackendUnavailable(RemoteBackendError):
    """The server stayed unreachable or failing (connection errors, timeouts, HTTP 429 / 5xx) through every retry:
    a failure of the infrastructure, not of the request, so callers stop (finished work kept) rather than record it
    as the model's answer."""


class OpenAIBackend:
    """Batched chat generation through an OpenAI-compatible ``/chat/completions`` endpoint.

    Args:
        base_url: The API root, e.g. ``http://127.0.0.1:8000/v1`` (``/chat/completions`` is appended).
        model: The served model's id (``GET {base_url}/models`` lists them).
        api_key: Bearer token; default ``$OPENAI_API_KEY``; none is sent when neither is set.
        max_concurrency: Most requests in flight at once per :meth:`generate` call.
        timeout_s: Seconds to wait for a connection and for each response.
        max_retries: Retries after a retryable failure (so at most ``max_retries + 1`` attempts).
        backoff_s: First retry delay; it doubles per attempt (with jitter), capped at ``max_backoff_s``.
        max_backoff_s: Longest delay between attempts (a server's ``Retry-After`` may ask for longer).
        return_token_ids: Ask for token ids with vLLM's ``return_token_ids`` extension (other servers may
            reject the unknown field; ``simpop serve`` returns them anyway).
        structured_outputs: Send :attr:`SamplingParams.json_schema` as the OpenAI structured-output
            request ``response_format={"type": "json_schema", "json_schema": {"name", "schema",
            "strict": true}}`` (vLLM, ``simpop serve`` and the OpenAI API constrain decoding to it). Set
            False for a server without structured output: the schema is then not sent, and callers
            parse the free text (:attr:`supports_json_schema` says which).

    With ``SamplingParams.seed`` set, chat ``i`` of a batch is sent with seed ``seed + i``, so repeated
    chats in one batch (a GRPO group) still differ while the batch stays reproducible.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        *,
        max_concurrency: int = 8,
        timeout_s: float = 120.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        max_backoff_s: float = 20.0,
        return_token_ids: bool = False,
        structured_outputs: bool = True,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {base_url!r}")
        if not model:
            raise ValueError("model must name the served model (see GET <base_url>/models)")
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        if backoff_s < 0 or max_backoff_s < backoff_s:
            raise ValueError(f"need 0 <= backoff_s <= max_backoff_s, got {backoff_s} and {max_backoff_s}")
        self.base_url = base_url.rstrip("/")
        self.name = model
        self.api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        self.max_concurrency = max_concurrency
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.return_token_ids = return_token_ids
        self.supports_json_schema = structured_outputs

    def generate(self, chats: list[Chat], params: SamplingParams) -> list[Generation]:
        """One completion per chat; requests run concurrently. Works inside a running event loop too (a
        notebook, an async trainer: the requests then run in a worker thread with a loop of its own)."""
        return self._run(self.agenerate(chats, params))

    async def agenerate(self, chats: list[Chat], params: SamplingParams) -> list[Generation]:
        """The async form of :meth:`generate`."""
        try:
            import httpx
        except ImportError as error:
            raise ImportError("OpenAIBackend needs httpx: pip install simpop[llm]") from error
        if not chats:
            raise ValueError("chats is empty; pass at least one chat")
        for chat in chats:
            check_chat(chat)
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        semaphore = asyncio.Semaphore(self.max_concurrency)
        async with httpx.AsyncClient(timeout=self.timeout_s, headers=headers, verify=_tls_context()) as client:
            try:
                async with asyncio.TaskGroup() as group:
                    tasks = [
                        group.create_task(
                            self._complete(client, semaphore, self._payload(chat, params, i), params)
                        )
                        for i, chat in enumerate(chats)
                    ]
            except BaseExceptionGroup as failures:
                raise failures.exceptions[0] from None  # the first failure; the others were cancelled
        return [task.result() for task in tasks]

    def _payload(self, chat: Chat, params: SamplingParams, index: int) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "model": self.name,
            "messages": chat,
            "max_tokens": params.max_new_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
        }
        if params.stop:
            payload["stop"] = list(params.stop)
        if params.seed is not None:
            payload["seed"] = params.seed + index
        if params.logprobs:
            payload["logprobs"] = True
        if self.return_token_ids:
            payload["return_token_ids"] = True
        if params.json_schema is not None and self.supports_json_schema:
            payload["response_format"] = response_format(params.json_schema)
        return payload

    async def _complete(
        self,
        client: httpx.AsyncClient,
        semaphore: asyncio.Semaphore,
        payload: dict[str, Any],
        params: SamplingParams,
    ) -> Generation:
        return _parse_completion(await self._request(client, semaphore, payload), params)

    async def _request(self, client: httpx.AsyncClient, semaphore: asyncio.Semaphore,
                       payload: dict[str, Any], path: str = "/chat/completions") -> dict[str, Any]:
        """POST ``payload`` to ``path`` (retried as the module docstring says); the JSON answer."""
        import httpx

        url = f"{self.base_url}{path}"
        async with semaphore:
            attempt = 0
            while True:
                retry_after = None
                try:
                    response = await client.post(url, json=payload)
                except httpx.TransportError as error:  # connection errors and timeouts
                    failure = f"{type(error).__name__} {error}".strip()
                else:
                    if response.status_code == 200:
                        return response.json()
                    status, message = response.status_code, _error_message(response)
                    if status in (401, 403):
                        hint = "check api_key / OPENAI_API_KEY"
                        raise RemoteBackendError(
                            f"{url} refused the request (HTTP {status}: {message}); {hint}", status
                        )
                    if status != 429 and status < 500:
                        raise RemoteBackendError(
                            f"{url} rejected the request (HTTP {status}): {message}", status
                        )
                    failure = f"HTTP {status}: {message}"
                    retry_after = _seconds(response.headers.get("retry-after"))
                if attempt == self.max_retries:
                    raise BackendUnavailable(
                        f"{url} failed after {attempt + 1} attempts; last error: {failure}"
                    )
                delay = min(self.max_backoff_s, self.backoff_s * 2**attempt) * random.uniform(0.5, 1.0)
                await asyncio.sleep(max(delay, retry_after or 0.0))
                attempt += 1

    # ------------------------------------------------------------------ scoring fixed replies
    def score_replies(self, items: list[tuple[Chat, list[str] | tuple[str, ...]]]) -> list[list[float]]:
        """Per ``(chat, replies)``, each reply's summed log-probability as the whole assistant message (its
        tokens and the template's end of turn), read from the server's ``prompt_logprobs``.

        One request renders the chat with the generation prompt (its length marks where a reply starts), one per
        reply renders the chat with the reply as the last assistant message; all run concurrently. Raises
        :class:`ScoringUnsupported` when the server returns no ``prompt_logprobs`` (OpenAI's own API, most
        servers other than vLLM and ``simpop serve``).
        """
        payloads = []
        for chat, replies in items:
            check_chat(chat)
            payloads.append(self._score_payload(chat, add_generation_prompt=True))
            payloads += [self._score_payload([*chat, {"role": "assistant", "content": r}], add_generation_prompt=False)
                         for r in replies]
        try:
            answers = self._run(self._requests(payloads))
        except RemoteBackendError as error:
            if error.status == 400 and "prompt_logprobs" in str(error):  # a server that refuses the extension
                raise ScoringUnsupported(str(error)) from error
            raise
        out, i = [], 0
        for _, replies in items:
            base, i = answers[i], i + 1
            start = len(_prompt_logprobs(base, self.base_url))
            scores = []
            for _ in replies:
                scores.append(_reply_logprob(answers[i], start, self.base_url))
                i += 1
            out.append(scores)
        return out

    def _score_payload(self, chat: Chat, add_generation_prompt: bool) -> dict[str, Any]:
        return {"model": self.name, "messages": chat, "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 0,
                "add_generation_prompt": add_generation_prompt, "return_token_ids": True}

    async def _requests(self, payloads: list[dict[str, Any]], path: str = "/chat/completions") -> list[dict[str, Any]]:
        """POST every payload to ``path`` concurrently (at most ``max_concurrency`` in flight); the answers."""
        import httpx

        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        semaphore = asyncio.Semaphore(self.max_concurrency)
        async with httpx.AsyncClient(timeout=self.timeout_s, headers=headers, verify=_tls_context()) as client:
            return list(await asyncio.gather(*(self._request(client, semaphore, p, path) for p in payloads)))

    @staticmethod
    def _run(coroutine: Any) -> Any:
        """Run ``coroutine`` to completion, also from inside a running event loop (in a worker thread)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(coroutine)
        with ThreadPoolExecutor(max_workers=1) as pool:
            return pool.submit(asyncio.run, coroutine).result()


@functools.cache
def _tls_context() -> Any:
    """httpx's default TLS context, built once: building one costs ~40 ms of CPU, and every call opens a client."""
    import httpx

    return httpx.create_ssl_context()


def _prompt_logprobs(data: dict[str, Any], url: str) -> list[Any]:
    found = data.get("prompt_logprobs")
    if not isinstance(found, list):
        raise ScoringUnsupported(f"{url} returned no prompt_logprobs (a vLLM extension of the chat API; `simpop "
                                 f"serve` has it too), so fixed replies cannot be scored there")
    return found


def _reply_logprob(data: dict[str, Any], start: int, url: str) -> float:
    """Sum of the prompt tokens' log-probabilities from position ``start`` on (the reply and its end of turn)."""
    entries, ids = _prompt_logprobs(data, url), data.get("prompt_token_ids")
    if len(entries) <= start:
        raise ValueError("the chat template does not render a reply as an extension of the prompt")
    total = 0.0
    for position in range(start, len(entries)):
        entry = entries[position]
        if not isinstance(entry, dict) or not entry:
            raise ScoringUnsupported(f"{url} gave no log-probability for prompt token {position}")
        if len(entry) == 1:
            (value,) = entry.values()
        elif ids is not None and str(ids[position]) in entry:
            value = entry[str(ids[position])]
        else:
            raise ScoringUnsupported(f"{url}: prompt_logprobs list several tokens at {position} and no "
                                     f"prompt_token_ids say which one the prompt has")
        total += float(value["logprob"] if isinstance(value, dict) else value)
    return total


def response_format(schema: dict[str, Any]) -> dict[str, Any]:
    """The OpenAI ``response_format`` that asks for output following ``schema`` (named by its ``title``,
    reduced to the name characters OpenAI accepts, else ``response``)."""
    name = re.sub(r"[^A-Za-z0-9_-]", "_", str(schema.get("title") or ""))[:64] or "response"
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


def _parse_completion(data: dict[str, Any], params: SamplingParams) -> Generation:
    choice = data["choices"][0]
    logprobs = None
    if params.logprobs and choice.get("logprobs") and choice["logprobs"].get("content") is not None:
        logprobs = [entry["logprob"] for entry in choice["logprobs"]["content"]]
    return Generation(
        text=choice["message"].get("content") or "",
        token_ids=list(choice.get("token_ids") or []),
        prompt_ids=list(data.get("prompt_token_ids") or []),
        logprobs=logprobs,
        finish_reason=choice.get("finish_reason") or "stop",
    )


def _error_message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:500] or response.reason_phrase
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and "message" in error:
        return str(error["message"])
    return str(error or body)[:500]


def _seconds(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:  # an HTTP date: fall back to our own back-off
        return None
