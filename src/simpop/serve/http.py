"""The connection-level guards of ``simpop serve``, in front of the FastAPI app.

:class:`RequestGate` (ASGI middleware) checks the API key from the headers before a byte of the body is
read, refuses a body over the size cap (from ``Content-Length``, and again while reading, for chunked
bodies) and a body that does not arrive within the read timeout. :class:`HeadTimeoutProtocol` (uvicorn's
h11 protocol) closes a connection whose request head does not arrive within that timeout: uvicorn's own
``timeout_keep_alive`` only covers idle time between requests, and any byte resets it. :class:`UvicornThread`
runs a uvicorn server on a bound socket, on the calling thread or a daemon thread (``simpop serve`` and the
OpenEnv server). :func:`add_http_arguments` declares both servers' shared flags (bind, API key, guards).
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import json
import socket
import threading
import time
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from simpop.user_input import PORT, SECONDS, integer

Scope = dict[str, Any]


def add_http_arguments(parser: argparse.ArgumentParser, guards: Any = None, *, max_body_bytes: int,
                       read_timeout_s: float, keep_alive_s: float) -> None:
    """Add the flags every simpop HTTP server shares (``simpop serve``, ``simpop openenv serve``).

    ``--host``, ``--port``, ``--api-key`` and ``--log-requests`` go on ``parser``; the request guards
    ``--max-body-bytes``, ``--read-timeout`` and ``--keep-alive-timeout`` (defaults given by the server's
    limits) on ``guards`` (an argument group; default ``parser``). Parsed as ``args.host``, ``args.port``,
    ``args.api_key``, ``args.log_requests``, ``args.max_body_bytes``, ``args.read_timeout``,
    ``args.keep_alive_timeout``.
    """
    guards = guards or parser
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (0.0.0.0 exposes it to the network)")
    parser.add_argument("--port", type=PORT, default=8000)
    parser.add_argument("--api-key", help="require 'Authorization: Bearer KEY' on every request (and WebSocket)")
    guards.add_argument("--max-body-bytes", type=integer(1, 2**30), default=max_body_bytes,
                        help="largest request body (or WebSocket message); larger ones get HTTP 413 unread")
    guards.add_argument("--read-timeout", type=SECONDS, default=read_timeout_s,
                        help="seconds a client has to send its request head, and again its body (408 after)")
    guards.add_argument("--keep-alive-timeout", type=SECONDS, default=keep_alive_s,
                        help="seconds an idle keep-alive connection stays open")
    parser.add_argument("--log-requests", action="store_true", help="log every HTTP request")


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """OpenAI's error shape, the one error path of both servers' responses. It always renders: text a UTF-8
    body cannot carry (lone surrogates, from a request's ``\\ud800`` escapes echoed in the message) is escaped."""
    kind = {401: "authentication_error", 404: "not_found_error", 413: "invalid_request_error"}.get(
        status, "invalid_request_error" if status < 500 else "server_error")
    return {"error": {"message": _renderable(message), "type": kind,
                      "param": None if param is None else _renderable(param), "code": code}}


def _renderable(text: str) -> str:
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


class RequestGate:
    """ASGI middleware: API key, then body size and read deadline; the app sees the buffered body.

    Args:
        app: The ASGI app behind the gate.
        api_key: If set, every request must carry ``Authorization: Bearer <api_key>`` (else HTTP 401).
        max_body_bytes: Largest body (HTTP 413 beyond it).
        read_timeout_s: Seconds the whole body may take to arrive (HTTP 408 after it).
        on_request: Called with the ``scope`` of every HTTP request as it arrives (for counters).
        on_reject: Called with the status of every request the gate refuses (for counters).
    """

    def __init__(self, app: Any, api_key: str | None, max_body_bytes: int, read_timeout_s: float,
                 on_request: Any = None, on_reject: Any = None) -> None:
        self.app, self.max_body_bytes, self.read_timeout_s = app, max_body_bytes, read_timeout_s
        self.expected = None if api_key is None else f"Bearer {api_key}".encode()
        self.on_request = on_request or (lambda scope: None)
        self.on_reject = on_reject or (lambda status: None)

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        self.on_request(scope)
        headers = dict(scope["headers"])
        if self.expected is not None and not hmac.compare_digest(headers.get(b"authorization", b""), self.expected):
            await self._refuse(send, 401, "invalid or missing API key (send 'Authorization: Bearer <key>')",
                               code="invalid_api_key")
            return
        declared = headers.get(b"content-length")
        if declared is not None:
            if not declared.isdigit():
                await self._refuse(send, 400, "the Content-Length header is not a number")
                return
            if int(declared) > self.max_body_bytes:
                await self._refuse(send, 413, self._too_large(int(declared)), code="body_too_large")
                return
        body = bytearray()
        try:
            async with asyncio.timeout(self.read_timeout_s):  # one deadline for the whole body
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        return
                    body += message.get("body", b"")
                    if len(body) > self.max_body_bytes:
                        await self._refuse(send, 413, self._too_large(None), code="body_too_large")
                        return
                    if not message.get("more_body", False):
                        break
        except TimeoutError:
            await self._refuse(send, 408, f"the request body did not arrive within {self.read_timeout_s:g} s "
                                          "(the server's --read-timeout)", code="request_timeout")
            return
        await self.app(scope, replay_body(bytes(body), receive), send)

    def _too_large(self, size: int | None) -> str:
        got = f"{size} bytes" if size is not None else "more"
        return (f"the request body is too large ({got}; this server takes at most {self.max_body_bytes} bytes: "
                f"start it with a larger --max-body-bytes to raise that)")

    async def _refuse(self, send: Any, status: int, message: str, code: str | None = None) -> None:
        """Answer and close the connection: an unread body must not be taken for the next request."""
        self.on_reject(status)
        data = json.dumps(error_body(status, message, code=code)).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": data})


def replay_body(body: bytes, receive: Any) -> Any:
    """An ASGI ``receive`` that yields ``body`` once, then waits on the real one (for disconnects)."""
    sent = False

    async def replay() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


class HeadTimeoutProtocol(H11Protocol):
    """uvicorn's h11 protocol, closing connections whose request head takes longer than ``head_timeout_s``
    (counted from the connection's start or the previous response): a slow or stalled client is dropped.

    It also turns Nagle's algorithm off: a response goes out as a head and a body write, and with Nagle on
    the body waits for the client's (delayed, ~40 ms) acknowledgement of the head.
    """

    def __init__(self, *args: Any, head_timeout_s: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.head_timeout_s = head_timeout_s
        self._head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Set TCP_NODELAY and start the deadline for the first request head."""
        super().connection_made(transport)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._arm_head_timer()

    def data_received(self, data: bytes) -> None:
        """Feed the bytes to h11; once a request head has arrived, its deadline is off."""
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:  # the head arrived; the body has its own deadline
            self._cancel_head_timer()

    def on_response_complete(self) -> None:
        """After a response on a kept-alive connection, start the deadline for the next head."""
        super().on_response_complete()
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
            self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        """Cancel the head deadline and close as uvicorn does."""
        self._cancel_head_timer()
        super().connection_lost(exc)

    def _arm_head_timer(self) -> None:
        self._cancel_head_timer()
        self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()


class UvicornThread:
    """A uvicorn server on a bound socket: :meth:`serve_forever` on this thread (Ctrl-C stops it), or
    :meth:`start` on a daemon thread (in-process use and tests) and :meth:`stop`."""

    def __init__(self, config: uvicorn.Config, sock: socket.socket, name: str) -> None:
        self.server, self.socket, self.name = uvicorn.Server(config), sock, name
        self._thread: threading.Thread | None = None

    def serve_forever(self) -> None:
        """Serve on this thread until Ctrl-C (uvicorn handles the signal)."""
        self.server.run(sockets=[self.socket])

    def start(self, timeout_s: float = 30.0) -> None:
        """Serve from a daemon thread; returns once it accepts connections (RuntimeError if it does not)."""
        self._thread = threading.Thread(target=self.serve_forever, name=self.name, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} did not start (see the log)")
            time.sleep(0.01)

    def stop(self) -> None:
        """Ask the server to exit and wait for its thread (a no-op unless :meth:`start` ran)."""
        if self._thread is not None:
            self.server.should_exit = True
            self._thread.join()
