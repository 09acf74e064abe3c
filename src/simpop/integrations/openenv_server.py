"""Serve any registered simpop env as an OpenEnv environment (``pip install simpop[openenv]``).

`OpenEnv <https://github.com/huggingface/OpenEnv>`_ is the environment interface TRL, torchforge, SkyRL,
ART and others consume. :func:`make_app` builds the server with OpenEnv's own ``create_app``; the
environment behind each session is a :class:`SimpopEnvironment`: a fresh simpop env with its own
simulator in the user seat (:class:`~simpop.envs.wrappers.UserSeat`), so the client plays the policy
seat only and never sees the simulator's turns except as the user's replies.

- **Sessions**: OpenEnv's WebSocket ``/ws`` gives each connection its own environment (at most
  ``max_sessions``; more are refused with OpenEnv's ``CAPACITY_REACHED`` error). HTTP ``/reset`` is
  stateless in OpenEnv (a throwaway environment per request); HTTP ``/step`` therefore has no episode and is
  answered 409.
- **The user seat**: simulator specs (one: that simulator; several: a uniform population whose member is
  drawn per episode), or a named held-out panel (``panel=``) for evaluation sessions, whose member is chosen
  per episode by ``reset(member=...)``, else ``seed % len(panel)``, else in turn. The member that played is
  ``metadata["simulator"]``.
- **Observations** (:class:`SimpopObservation`): ``text`` (the env's own observation of the policy seat
  as text: the JSON chat view for text envs, the vector as a JSON list for act-level ones), ``messages``
  (the chat so far from the policy's side), ``reply`` (the user's latest message) and ``invalid_action``
  (why the env rejected the last action, as the env answers it: the same seat acts again); ``reward`` and
  ``done`` are the env's; ``metadata`` holds the env id, scenario, simulator member, step, the env's info
  and, with co-training, the simulators' versions.
- **Limits** (:class:`ServerLimits`), with ``simpop serve``'s guards (:mod:`simpop.serve.http`):
  body size (HTTP 413, and WebSocket frames above it are refused by closing that connection), read deadline
  (408), an API key if set (401), HTTP requests being answered at once (429 beyond ``max_pending``), idle
  sessions reaped after ``session_idle_s``, a session id OpenEnv does not know (404,
  :class:`UnknownSessionGate`). Bad requests get a 4xx (or OpenEnv's error frame on a WebSocket) and the
  server keeps serving.

- **Token ids**, for text envs on a server started with a tokenizer (``--tokenizer MODEL``, the policy's
  model): ``reset`` returns the policy's first prompt as ``token_ids`` (system prompt = the env's
  instructions); a step that sends the ids the policy generated (``SimpopAction.token_ids``; the message
  defaults to their decoding) gets back ``token_ids``: what to append to the policy's context before it
  generates again (the turn's closing template tokens, the user's reply, the generation prompt), built by
  simpop's token-in/token-out bookkeeping (:class:`~simpop.rollout.TokenLedger`), so the policy's own tokens
  are never re-tokenised. A text-only step ends the token view for that episode. Without a server tokenizer,
  clients build token ids themselves from ``messages`` (:mod:`simpop.integrations.openenv_trl` does).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import socket
import threading
import uuid
from collections.abc import Callable, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from pydantic import Field, StrictInt, StrictStr, model_validator
from pydantic_core import PydanticCustomError

try:
    from openenv.core.env_server import (Action, ConcurrencyConfig, Environment, HTTPEnvServer, Observation, State,
                                         create_app)
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise ImportError("the OpenEnv server needs the openenv package: pip install simpop[openenv]") from error

from simpop.agents.base import Generation
from simpop.serve.http import HeadTimeoutProtocol, RequestGate, UvicornThread, error_body
from simpop.envs.registration import make
from simpop.envs.wrappers import UserSeat
from simpop.envs.dialogue import parse_observation
from simpop.evaluation.panel import json_safe
from simpop.rollout import ChatDelta, TokenLedger
from simpop.seat import Simulator


# ================================================================================ wire types
class SimpopAction(Action):
    """The policy seat's action: text for text envs, an act index for act-level envs; with a server tokenizer,
    the token ids the policy generated (the message, if not given, is their decoding)."""

    message: StrictStr | StrictInt | None = Field(default=None,
                                                  description="text (text envs) or an act index (act-level envs)")
    token_ids: list[StrictInt] | None = Field(default=None, description="the policy's generated token ids")

    @model_validator(mode="after")
    def _something(self) -> SimpopAction:
        if self.message is None and self.token_ids is None:  # a custom error: its details serialise into a 422
            raise PydanticCustomError("missing_action", "an action needs a message (text or act index) or token_ids")
        return self


class SimpopObservation(Observation):
    """What the policy seat sees after reset or a step (see the module docstring)."""

    text: str = Field(default="", description="the env's observation of the policy seat, as text")
    messages: list[dict[str, str]] = Field(default_factory=list,
                                           description="the chat so far; the policy's turns are 'assistant'")
    reply: str | None = Field(default=None, description="the user's latest message, if any")
    invalid_action: str | None = Field(default=None, description="why the env rejected the last action")
    token_ids: list[int] | None = Field(default=None, description="with a server tokenizer, when the client sends "
                                        "token ids: the tokens to append to the policy's context (mask 0)")


class SimpopState(State):
    """A session's episode: env, scenario, the simulator member in the user seat, whether it is over."""

    env_id: str = ""
    scenario_id: str | None = None
    simulator: str | None = None
    done: bool = True


class BadRequest(ValueError):
    """A request the client got wrong (unknown scenario, reset argument or panel member): HTTP 400."""


class NoEpisode(RuntimeError):
    """A step without a running episode (HTTP ``/step`` is stateless in OpenEnv): HTTP 409."""


# ================================================================================ the user seat
class UserSeatSource:
    """Builds what fills the user seat of each new session.

    Args:
        env_id: The registered env every session runs.
        simulators: Simulator specs: one, that simulator; several, a uniform population.
        panel: A named held-out panel instead (:func:`simpop.evaluation.panels.load_named_panel`).
        env_kwargs: Env constructor arguments.
        backends: Model -> backend cache shared by every session's simulators (an LLM loads once).
        tokenizer: A token backend (``encode_chat``, ``tokenizer``) whose chat template renders token ids for
            clients that send theirs (text envs; see :class:`SimpopObservation`).
    """

    def __init__(self, env_id: str, simulators: Sequence[str] = (), panel: str | None = None,
                 env_kwargs: dict[str, Any] | None = None, backends: MutableMapping[str, Any] | None = None,
                 tokenizer: Any = None):
        if (panel is None) == (not simulators):
            raise ValueError("give simulator specs or a panel, not both or neither")
        self.env_id, self.simulators, self.panel = env_id, tuple(simulators), panel
        self.env_kwargs = dict(env_kwargs or {})
        self.backends = backends if backends is not None else {}
        if tokenizer is not None and not hasattr(tokenizer, "tokenizer"):
            raise ValueError(f"the server tokenizer must be a token backend with a tokenizer (e.g. load_backend("
                             f"'smollm2')), got {type(tokenizer).__name__}")
        self.chat_delta = None if tokenizer is None else ChatDelta(tokenizer)
        self.decoder: Any = None if tokenizer is None else tokenizer.tokenizer  # decodes a step's token_ids
        self.build_lock = threading.Lock()  # backends load once even when sessions start together
        self.model_lock = threading.Lock()  # one model call at a time on the shared backends
        with self.build_lock:  # fail now (unknown env id or arguments, bad specs or panel), not in the first session
            self.build(make(env_id, **self.env_kwargs))

    def build(self, env: Any) -> Simulator | dict[str, Simulator]:
        """The simulator for a session's ``env``, or the panel's members by name."""
        from simpop.simulators.registry import build_simulator

        if self.panel is not None:
            from simpop.evaluation.panels import load_named_panel

            return dict(load_named_panel(self.panel, env, self.backends, env_id=self.env_id))
        spec: Any = self.simulators[0] if len(self.simulators) == 1 else list(self.simulators)
        return build_simulator(spec, env=env, backends=self.backends)


# ================================================================================ the environment
class SimpopEnvironment(Environment[SimpopAction, SimpopObservation, SimpopState]):
    """One OpenEnv session: a simpop env with its own simulator (or panel) in the user seat.

    Args:
        source: What fills the user seat.
    """

    SUPPORTS_CONCURRENT_SESSIONS = True
    _panel_turn = itertools.count()

    def __init__(self, source: UserSeatSource):
        super().__init__()
        self.source = source
        self.env = make(source.env_id, **source.env_kwargs)
        with source.build_lock:
            self.seat_filler = source.build(self.env)
        self.seat: UserSeat | None = None
        self.member: str | None = None
        self.episode_id: str | None = None
        self.steps = 0
        self.episode_return = 0.0
        self.ledger: TokenLedger | None = None

    def reset(self, seed: int | None = None, episode_id: str | None = None, scenario_id: str | None = None,
              member: str | None = None, **kwargs: Any) -> SimpopObservation:
        """Start an episode: the env reset with ``seed`` (and ``scenario_id``, else the env's draw), the user seat
        filled by the session's simulator, or by panel member ``member`` (default: the seed's turn through the
        members). Returns the policy seat's first observation (with its token ids when the server tokenizes).
        Unknown arguments, a bad seed, scenario or member are a ``BadRequest``."""
        if kwargs:
            raise BadRequest(f"unknown reset argument(s) {sorted(kwargs)}; valid: seed, episode_id, scenario_id, "
                             f"member (panel sessions)")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise BadRequest(f"seed must be a non-negative integer, got {seed!r}")
        simulator = self._simulator_for(seed, member)
        options = None if scenario_id is None else {"scenario_id": str(scenario_id)}
        seat = UserSeat(self.env, simulator)
        try:
            observation, info = seat.reset(seed=seed, options=options)
        except KeyError as error:
            raise BadRequest(str(error.args[0]) if error.args else str(error)) from None
        self.seat = seat
        if not isinstance(self.seat_filler, dict):  # a population drew its member in the reset
            self.member = simulator.member(0).name
        self.episode_id = episode_id or str(uuid.uuid4())
        self.steps, self.episode_return = 0, 0.0
        result = self._observation(observation, info, None, False, False)
        if self.source.chat_delta is not None and isinstance(observation, str):
            self.ledger = TokenLedger()
            result.token_ids = self._new_tokens(observation)
        return result

    def step(self, action: SimpopAction, timeout_s: float | None = None, **kwargs: Any) -> SimpopObservation:
        """Play the policy's ``action`` (its message, or token ids decoded by the server's tokenizer), then the
        simulator's replies until the policy is to act again or the episode ends; returns the policy seat's
        observation, reward and end flags. Without a running episode it raises ``NoEpisode``."""
        if self.seat is None or self.env.done:
            raise NoEpisode("no episode is running in this session: reset first (OpenEnv's HTTP /step is "
                            "stateless; play episodes over the WebSocket session, e.g. SimpopEnvClient)")
        message = action.message
        if action.token_ids is not None:
            if self.ledger is None or self.source.chat_delta is None:
                raise BadRequest("token_ids need a text env, a server started with a tokenizer (--tokenizer) and "
                                 "token ids on every step of the episode")
            if message is None:
                message = self.source.decoder.decode(action.token_ids, skip_special_tokens=True)
            elif not isinstance(message, str):
                raise BadRequest("token_ids go with a text message (or none: their decoding), got an act index")
            self.ledger.add_generation(Generation(message, list(action.token_ids),
                                                  logprobs=[0.0] * len(action.token_ids)))
        else:
            self.ledger = None  # a text-only step: the token view of this episode ends
        observation, reward, terminated, truncated, info = self.seat.step(message)
        self.steps += 1
        self.episode_return += reward
        result = self._observation(observation, info, reward, terminated, truncated)
        if self.ledger is not None and not (terminated or truncated):
            result.token_ids = self._new_tokens(observation)
        if terminated or truncated:
            self.episode_ended(info)
        return result

    def _new_tokens(self, observation: str) -> list[int]:
        """The tokens the policy has not seen of ``observation`` (its first prompt after a reset)."""
        assert self.ledger is not None and self.source.chat_delta is not None
        before = len(self.ledger.ids)
        self.ledger.extend(self.source.chat_delta, parse_observation(observation), lambda v: v.get("instructions"))
        return self.ledger.ids[before:]

    def episode_ended(self, info: dict[str, Any]) -> None:
        """Called once an episode ends, with the env's last info (co-training records it)."""

    # OpenEnv awaits these when a subclass overrides them. Without a model backend (native and act-level
    # simulators) a step takes well under a millisecond: it runs on the event loop, sparing the thread
    # hand-off of OpenEnv's sync path. Model-backed simulators run in a worker thread, one model call at a
    # time (sessions share the model, and a LoRA simulator switches its adapter on it), so one session's
    # generation never holds up the event loop.
    async def reset_async(self, seed: int | None = None, episode_id: str | None = None,
                          **kwargs: Any) -> SimpopObservation:
        """:meth:`reset`, in a worker thread when the simulators use a model (one model call at a time)."""
        return await self._run(self.reset, seed=seed, episode_id=episode_id, **kwargs)

    async def step_async(self, action: SimpopAction, timeout_s: float | None = None,
                         **kwargs: Any) -> SimpopObservation:
        """:meth:`step`, in a worker thread when the simulators use a model (one model call at a time)."""
        return await self._run(self.step, action, timeout_s, **kwargs)

    async def _run(self, method: Callable[..., SimpopObservation], *args: Any, **kwargs: Any) -> SimpopObservation:
        if not self.source.backends:
            return method(*args, **kwargs)

        def serialized() -> SimpopObservation:
            with self.source.model_lock:
                return method(*args, **kwargs)

        return await asyncio.to_thread(serialized)

    @property
    def state(self) -> SimpopState:
        return SimpopState(episode_id=self.episode_id, step_count=self.steps, env_id=self.source.env_id,
                           scenario_id=getattr(self.env.scenario, "id", None), simulator=self.member,
                           done=self.seat is None or self.env.done)

    def _simulator_for(self, seed: int | None, member: str | None) -> Simulator:
        if not isinstance(self.seat_filler, dict):
            if member is not None:
                raise BadRequest("reset(member=...) picks a panel member; this server is not serving a panel")
            return self.seat_filler
        names = list(self.seat_filler)
        if member is None:
            member = names[seed % len(names)] if seed is not None else names[next(self._panel_turn) % len(names)]
        elif member not in self.seat_filler:
            raise BadRequest(f"unknown panel member {member!r}; members: {', '.join(names)}")
        self.member = member
        return self.seat_filler[member]

    def extra_metadata(self) -> dict[str, Any]:
        """More ``metadata`` for every observation (co-training adds the simulators' versions)."""
        return {}

    def _observation(self, observation: Any, info: dict[str, Any], reward: float | None, terminated: bool,
                     truncated: bool) -> SimpopObservation:
        seat = self.env.policy_seat
        messages = self.env.chat_view(seat)
        reply = next((m["content"] for m in reversed(messages) if m["role"] == "user"), None)
        text = observation if isinstance(observation, str) else json.dumps(json_safe(observation))
        info = json_safe(info)
        metadata = {"env_id": self.source.env_id, "scenario_id": info.get("scenario_id"),
                    "simulator": self.member, "episode_id": self.episode_id, "step": self.steps,
                    "terminated": terminated, "truncated": truncated, "info": info}
        metadata.update(self.extra_metadata())
        return SimpopObservation(text=text, messages=messages, reply=reply, invalid_action=info.get("invalid_action"),
                                 reward=reward, done=terminated or truncated, metadata=metadata)


# ================================================================================ the server
@dataclass(frozen=True)
class ServerLimits:
    """What the server takes on at once and from one request.

    Attributes:
        max_sessions: Concurrent WebSocket sessions (``--max-sessions``); more are refused (CAPACITY_REACHED).
        max_pending: HTTP requests answered at once (``--max-pending``); more get HTTP 429 at once.
        max_body_bytes: Largest HTTP body or WebSocket message (``--max-body-bytes``); HTTP 413 beyond it.
        read_timeout_s: Seconds a client has to send a request's head and body (``--read-timeout``; 408).
        keep_alive_s: Seconds an idle keep-alive HTTP connection stays open.
        session_idle_s: Seconds a session may sit idle before it is closed (``--session-idle-timeout``).
    """

    max_sessions: int = 32
    max_pending: int = 64
    max_body_bytes: int = 2**20
    read_timeout_s: float = 30.0
    keep_alive_s: float = 5.0
    session_idle_s: float = 600.0

    def __post_init__(self) -> None:
        for name in ("max_sessions", "max_pending", "max_body_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("read_timeout_s", "keep_alive_s", "session_idle_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")


class PendingGate:
    """ASGI middleware: at most ``max_pending`` HTTP requests in the app at once; more get HTTP 429 at once."""

    def __init__(self, app: Any, max_pending: int, on_reject: Callable[[int], None]) -> None:
        self.app, self.max_pending, self.on_reject = app, max_pending, on_reject
        self.pending = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] == "/health":
            await self.app(scope, receive, send)
            return
        if self.pending >= self.max_pending:
            self.on_reject(429)
            data = json.dumps(error_body(429, f"the server is answering {self.pending} requests already (at most "
                                              f"{self.max_pending}, --max-pending); retry shortly",
                                         code="server_busy")).encode()
            await send({"type": "http.response.start", "status": 429,
                        "headers": [(b"content-type", b"application/json"), (b"retry-after", b"1"),
                                    (b"content-length", str(len(data)).encode())]})
            await send({"type": "http.response.body", "body": data})
            return
        self.pending += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.pending -= 1


def make_app(source: UserSeatSource, limits: ServerLimits | None = None, *, api_key: str | None = None,
             on_reject: Callable[[int], None] | None = None,
             environment: Callable[[], SimpopEnvironment] | None = None) -> Any:
    """The ASGI app: OpenEnv's ``create_app`` for ``source``'s env, behind ``simpop serve``'s request guards.

    Args:
        source: What each session runs and who fills its user seat.
        limits: Caps and timeouts (default :class:`ServerLimits()`).
        api_key: If set, every HTTP request and WebSocket must send ``Authorization: Bearer <api_key>``.
        on_reject: Called with the status of every request refused by a guard (counters).
        environment: The per-session factory (default: ``SimpopEnvironment(source)``; co-training adds hooks).
    """
    from fastapi import Request
    from fastapi.responses import JSONResponse

    limits = limits or ServerLimits()
    on_reject = on_reject or (lambda status: None)
    factory = environment or functools.partial(SimpopEnvironment, source)
    app = create_app(factory, SimpopAction, SimpopObservation, env_name=source.env_id, state_cls=SimpopState,
                     concurrency_config=ConcurrencyConfig(max_concurrent_envs=limits.max_sessions,
                                                          session_timeout=limits.session_idle_s))
    sessions = _session_registry(app)

    async def bad_request(_: Request, exc: Exception) -> JSONResponse:
        status = 409 if isinstance(exc, NoEpisode) else 400
        on_reject(status)
        return JSONResponse(error_body(status, str(exc)), status_code=status)

    app.add_exception_handler(BadRequest, bad_request)
    app.add_exception_handler(NoEpisode, bad_request)
    gated = PendingGate(UnknownSessionGate(app, sessions, on_reject), limits.max_pending, on_reject)
    return _WebSocketKey(RequestGate(gated, api_key, limits.max_body_bytes, limits.read_timeout_s,
                                     on_reject=on_reject), api_key)


def _session_registry(app: Any) -> HTTPEnvServer:
    """The ``HTTPEnvServer`` that ``create_app`` registered on ``app`` (it owns the session registry).

    ``create_app`` returns only the app; its routes are closures over the server, which is found there."""
    for route in app.routes:
        if getattr(route, "path", None) == "/ws":
            for cell in getattr(route.endpoint, "__closure__", None) or ():
                if isinstance(cell.cell_contents, HTTPEnvServer):
                    return cell.cell_contents
    raise RuntimeError("OpenEnv's /ws route does not hold its HTTPEnvServer: unsupported openenv version")


class UnknownSessionGate:
    """ASGI middleware: a request naming a session OpenEnv does not know gets HTTP 404, before the app.

    OpenEnv 0.10 names sessions in two places: ``/ws?session_id=...`` (attach a WebSocket to an HTTP MCP
    session), which it would accept and then answer with an error frame, and the ``session_id`` param of a
    JSON-RPC ``POST /mcp``, which it answers with HTTP 200 and a JSON-RPC error. Both get a 404 here: the
    WebSocket handshake is denied with an HTTP 404 response (ASGI's ``websocket.http.response``; a server
    without it closes the handshake, HTTP 403), and ``/mcp`` gets a 404 carrying the JSON-RPC error.
    """

    def __init__(self, app: Any, server: HTTPEnvServer, on_reject: Callable[[int], None]) -> None:
        self.app, self.server, self.on_reject = app, server, on_reject

    def _unknown(self, session_id: Any) -> bool:
        return isinstance(session_id, str) and bool(session_id) and self.server.get_session_info(session_id) is None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "websocket" and scope["path"] == "/ws":
            from urllib.parse import parse_qs

            session_id = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("session_id", [""])[0]
            if self._unknown(session_id):
                self.on_reject(404)
                message = f"Unknown session_id: {session_id} (no such OpenEnv session on this server)"
                if "websocket.http.response" in scope.get("extensions", {}):
                    body = json.dumps(error_body(404, message, param="session_id", code="unknown_session")).encode()
                    await send({"type": "websocket.http.response.start", "status": 404,
                                "headers": [(b"content-type", b"application/json"),
                                            (b"content-length", str(len(body)).encode())]})
                    await send({"type": "websocket.http.response.body", "body": body})
                else:
                    await send({"type": "websocket.close", "code": 1008, "reason": message[:120]})
                return
        elif scope["type"] == "http" and scope["path"] == "/mcp" and scope["method"] == "POST":
            chunks, more = [], True
            while more:
                message = await receive()
                chunks.append(message.get("body", b""))
                more = message.get("more_body", False)
            body = b"".join(chunks)
            try:
                request = json.loads(body)
                params = request.get("params") if isinstance(request, dict) else None
                session_id = params.get("session_id") if isinstance(params, dict) else None
            except ValueError:
                session_id = None
            if self._unknown(session_id):
                self.on_reject(404)
                data = json.dumps({"jsonrpc": "2.0", "id": request.get("id"),
                                   "error": {"code": -32602, "message": f"Unknown session_id: {session_id}"}}).encode()
                await send({"type": "http.response.start", "status": 404,
                            "headers": [(b"content-type", b"application/json"),
                                        (b"content-length", str(len(data)).encode())]})
                await send({"type": "http.response.body", "body": data})
                return
            replayed = False

            async def replay() -> dict[str, Any]:
                nonlocal replayed
                if replayed:
                    return await receive()
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}

            await self.app(scope, replay, send)
            return
        await self.app(scope, receive, send)


class _WebSocketKey:
    """The API key for WebSockets too (RequestGate checks HTTP only): refused before the handshake (HTTP 403)."""

    def __init__(self, app: Any, api_key: str | None) -> None:
        self.app = app
        self.expected = None if api_key is None else f"Bearer {api_key}".encode()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "websocket" and self.expected is not None:
            import hmac

            if not hmac.compare_digest(dict(scope["headers"]).get(b"authorization", b""), self.expected):
                await send({"type": "websocket.close", "code": 1008, "reason": "invalid or missing API key"})
                return
        await self.app(scope, receive, send)


@dataclass
class OpenEnvServer:
    """A bound OpenEnv server; :func:`make_server` builds one. ``rejected`` counts requests refused with a 4xx."""

    app: Any
    socket: socket.socket
    limits: ServerLimits
    log_requests: bool = False
    rejected: int = 0
    _uvicorn: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        config = uvicorn.Config(
            # uvicorn annotates `http` as a protocol class and the keep-alive as int; it calls the factory and
            # uses the timeout as float seconds (loop.call_later), so both work as given.
            self.app, http=functools.partial(HeadTimeoutProtocol, head_timeout_s=self.limits.read_timeout_s),  # type: ignore[arg-type]
            ws="websockets-sansio", ws_max_size=self.limits.max_body_bytes,
            timeout_keep_alive=self.limits.keep_alive_s, lifespan="on", log_config=None,  # type: ignore[arg-type]
            access_log=self.log_requests, log_level="info" if self.log_requests else "warning",
            backlog=4096)
        self._uvicorn = UvicornThread(config, self.socket, "the OpenEnv server")

    @property
    def url(self) -> str:
        host, port = self.socket.getsockname()[:2]
        return f"http://{host}:{port}"

    def serve_forever(self) -> None:
        """Serve on this thread until Ctrl-C."""
        self._uvicorn.serve_forever()

    def start(self, timeout_s: float = 30.0) -> OpenEnvServer:
        """Serve from a daemon thread (in-process use and tests); returns once it accepts connections."""
        self._uvicorn.start(timeout_s)
        return self

    def close(self) -> None:
        """Stop serving and release the port."""
        self._uvicorn.stop()
        self.socket.close()

    def __enter__(self) -> OpenEnvServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def make_server(source: UserSeatSource, host: str = "127.0.0.1", port: int = 8000, *,
                limits: ServerLimits | None = None, api_key: str | None = None, log_requests: bool = False,
                environment: Callable[[], SimpopEnvironment] | None = None) -> OpenEnvServer:
    """Bind an OpenEnv server for ``source`` (port 0 picks a free port); call ``serve_forever`` or ``start``."""
    limits = limits or ServerLimits()
    holder: list[OpenEnvServer] = []

    def count(status: int) -> None:
        holder[0].rejected += 1

    app = make_app(source, limits, api_key=api_key, on_reject=count, environment=environment)
    sock = socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET,
                                backlog=4096)
    holder.append(OpenEnvServer(app, sock, limits, log_requests))
    return holder[0]
