"""Any OpenAI-compatible chat-completions server as a backend (vLLM, llama.cpp, ``simpop serve``, APIs).

A batch of chats becomes concurrent HTTP requests (at most ``max_concurrency`` in flight per call).
Connection errors, timeouts, HTTP 429 and 5xx are retried with exponential back-off; 401/403 and other
4xx fail at once with the server's message. Token ids and log-probabilities are filled when the server
returns them (``simpop serve`` always does; vLLM does with ``return_token_ids=True``).
``SamplingParams.json_schema`` is sent as an OpenAI structured-output ``response_format``::

    backend = OpenAIBackend("http://127.0.0.1:8000/v1", "smollm2")
    backend.generate([[{"role": "user", "content": "Hi"}]], SamplingParams(max_new_tokens=16))
"""

from __future__ import annotations

import asyncio
import os
import random
import re
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from simpop.agents.base import Chat, Generation, SamplingParams
from simpop.agents.chat import check_chat

if TYPE_CHECKING:
    import httpx


class RemoteBackendError(RuntimeError):
    """A request to a remote model server failed; ``status`` is the HTTP status, if one came back."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


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
        """One completion per chat; requests run concurrently. Works inside a running event loop too."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self.agenerate(chats, params))
        # A caller already inside an event loop (a notebook, an async trainer) cannot block it with
        # asyncio.run; a worker thread gets a loop of its own.
        with ThreadPoolExecutor(max_workers=1) as pool:
            return pool.submit(asyncio.run, self.agenerate(chats, params)).result()

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
        async with httpx.AsyncClient(timeout=self.timeout_s, headers=headers) as client:
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
        import httpx

        url = f"{self.base_url}/chat/completions"
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
                        return _parse_completion(response.json(), params)
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
                    raise RemoteBackendError(
                        f"{url} failed after {attempt + 1} attempts; last error: {failure}"
                    )
                delay = min(self.max_backoff_s, self.backoff_s * 2**attempt) * random.uniform(0.5, 1.0)
                await asyncio.sleep(max(delay, retry_after or 0.0))
                attempt += 1


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
