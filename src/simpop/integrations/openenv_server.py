"""Serve any registered simpop env as an OpenEnv environment (``pip install simpop[openenv]``).

`OpenEnv <https://github.com/huggingface/OpenEnv>`_ is the environment interface TRL, torchforge, SkyRL,
ART and others consume. :func:`make_app` builds the server with OpenEnv's own ``create_app``; the
environment behind each session is a :class:`SimpopEnvironment`: a fresh simpop env with its own
simulator in the user seat (:class:`~simpop.envs.wrappers.UserSeat`), so the client plays the policy
seat only and never sees the simulator's turns except as the user's replies.

- **Sessions** are WebSocket-only: OpenEnv's ``/ws`` gives each connection its own environment, which lives
  exactly as long as the connection (at most ``max_sessions``; more are refused with OpenEnv's
  ``CAPACITY_REACHED`` error; :class:`SessionGate` refuses OpenEnv's HTTP MCP sessions, which no connection
  holds, and closes idle sockets). HTTP ``/reset`` is stateless in OpenEnv (a throwaway environment per
  request); HTTP ``/step`` therefore has no episode and is answered 409.
- **The user seat**: simulator specs (one: that simulator; several: a uniform population whose member is
  drawn per episode), or a named held-out panel (``panel=``) for evaluation sessions, whose member is chosen
  per episode by ``reset(member=...)``, else ``seed % len(panel)``, else in turn (each session its own turn).
  The member that played is ``metadata["simulator"]``.
- **Observations** (:class:`SimpopObservation`): ``text`` (the env's own observation of the policy seat
  as text: the JSON chat view for text envs, the vector as a JSON list for act-level ones), ``messages``
  (the chat so far from the policy's side), ``reply`` (the user's latest message) and ``invalid_action``
  (why the env rejected the last action, as the env answers it: the same seat acts again); ``reward`` and
  ``done`` are the env's; ``metadata`` holds the env id, scenario, simulator member, step, the env's info
  and, with co-training, the simulators' versions.
- **Limits** (:class:`ServerLimits`), with ``simpop serve``'s guards (:mod:`simpop.serve.http`):
  body size (HTTP 413, and WebSocket frames above it are refused by closing that connection), read deadline
  (408), an API key if set (401), HTTP requests being answered at once (429 beyond ``max_pending``), sessions
  closed after ``session_idle_s`` idle, sessions over HTTP (400, :class:`SessionGate`). Bad requests get a 4xx
  in ``simpop serve``'s error shape, never echoing what a response cannot carry (or an error frame on a
  WebSocket), and the server keeps serving. ``docs/limits.md`` lists every bound.

- **Model calls** (:class:`ModelCalls`). Sessions whose simulators use a model step in worker threads. In-process
  models (``smollm2``, ``transformers:...``): the replies that concurrent sessions wait for are gathered into one
  batched backend call (``simpop serve``'s :class:`~simpop.serve.batching.MicroBatcher`: at most ``max_batch``
  rows; a batch starts once every open session's reply waits in it, else when the oldest has waited
  ``batch_window_s`` with the model free); greedy replies equal the unbatched ones, and a seeded
  sampling reply is the one its session would get alone (each row draws with its own generator). The model keeps each dialogue's
  keys and values between its turns (its prefix cache, at most ``prefix_cache_mb``), so a session's next reply reads
  only the tokens new since its last one. Other in-process model work
  (survey scoring, LoRA simulators' adapters) runs one session at a time, beside the batches. Served models (``openai:``,
  ``vllm:``) are called concurrently, at most ``max_inflight`` calls per server. A session that disconnects, or
  whose call fails, leaves its batch mates' replies alone.

- **Token ids**, for text envs on a server started with a tokenizer (``--tokenizer MODEL``, the policy's
  model): ``reset`` returns the policy's first prompt as ``token_ids`` (system prompt = the env's
  instructions); a step that sends the ids the policy generated (``SimpopAction.token_ids``; the message
  defaults to their decoding) gets back ``token_ids``: what to append to the policy's context before it
  generates again (the turn's closing template tokens, the user's reply, the generation prompt), built by
  simpop's token-in/token-out bookkeeping (:class:`~simpop.agents.policy.TokenLedger`), so the policy's own tokens
  are never re-tokenised. A text-only step ends the token view for that episode. Without a server tokenizer,
  clients build token ids themselves from ``messages`` (:mod:`simpop.integrations.openenv_trl` does).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import json
import re
import socket
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from concurrent.futures import ThreadPoolExecutor
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
from simpop.serve.batching import MicroBatcher
from simpop.serve.http import HeadTimeoutProtocol, RequestGate, UvicornThread, error_body, replay_body
from simpop.envs.registration import make
from simpop.envs.wrappers import UserSeat
from simpop.envs.dialogue import is_unicode, parse_observation
from simpop.evaluation.panel import json_safe
from simpop.agents.policy import ChatDelta, TokenLedger
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


class SessionClosed(RuntimeError):
    """A reset or step on a session OpenEnv has closed while its socket lives on (OpenEnv's
    ``openenv/session/close`` sent from another connection): its slot has gone to another session."""


# ================================================================================ model calls
class ModelCalls:
    """How concurrent sessions share the simulators' backends (the module docstring's "Model calls").

    A session's step runs in a worker thread holding :attr:`lock`, so in-process model work outside batches (survey
    scoring, LoRA adapters) is one session's at a time; the thread lets the lock go while it waits for a batched
    generation (run on the batcher's model thread, beside such work: inference only reads the weights) or a served
    model's answer.

    Args:
        max_batch: Most rows in one batched in-process generation.
        batch_window_s: How long the oldest waiting generation waits for batch mates with the model free (none once
            every open session waits: :attr:`sessions`).
        max_inflight: Most calls in flight at once to one model server (``base_url``).
        prefix_cache_mb: Memory an in-process model's prefix cache may take (MiB); 0 leaves the model's own setting.
    """

    def __init__(self, max_batch: int = 32, batch_window_s: float = 0.1, max_inflight: int = 64,
                 prefix_cache_mb: float = 512.0):
        if max_batch < 1 or max_inflight < 1 or batch_window_s < 0 or prefix_cache_mb < 0:
            raise ValueError(f"need max_batch >= 1, max_inflight >= 1, batch_window_s >= 0 and prefix_cache_mb >= 0, "
                             f"got {max_batch}, {max_inflight}, {batch_window_s} and {prefix_cache_mb}")
        self.max_batch, self.batch_window_s, self.max_inflight = max_batch, batch_window_s, max_inflight
        self.prefix_cache_mb = prefix_cache_mb
        self.max_threads = 32  # sessions stepping at once (the server sets its --max-sessions)
        self.sessions = 0  # open sessions (SimpopEnvironment): the most replies a batch can expect (count_session)
        self.lock = threading.Lock()
        self._local = threading.local()  # whether this thread holds the lock for a session's step
        self._loop: asyncio.AbstractEventLoop | None = None
        self._threads: ThreadPoolExecutor | None = None
        self._batchers: dict[int, MicroBatcher] = {}  # id(backend) -> its batcher on the server's loop
        self._servers: dict[str, threading.BoundedSemaphore] = {}  # base_url -> its in-flight bound
        self._servers_lock = threading.Lock()

    def wrap(self, key: str, backend: Any) -> Any:
        """What sessions' simulators get for the backend loaded under ``key``: in-process models batched, served
        ones bounded; LoRA backends (``trainable:...``, whose active adapter is shared state) as they are."""
        if key.startswith("trainable:") or not callable(getattr(backend, "generate", None)):
            return backend
        if self.prefix_cache_mb and hasattr(backend, "prefixes"):  # an in-process model (TransformersBackend)
            backend.prefix_cache, backend.prefixes.max_bytes = True, int(self.prefix_cache_mb * 2**20)
        return SharedBackend(backend, self)

    def count_session(self, change: int) -> None:
        """A session opened (+1) or closed (-1)."""
        with self._servers_lock:
            self.sessions += change

    async def run(self, work: Callable[[], SimpopObservation]) -> SimpopObservation:
        """``work()`` (a session's reset or step) in a worker thread holding :attr:`lock`."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # a new server loop: batchers bind to the loop they run on
            for batcher in self._batchers.values():
                batcher.close()
            if self._threads is not None:
                self._threads.shutdown(wait=False)
            self._loop, self._batchers = loop, {}
            self._threads = ThreadPoolExecutor(self.max_threads, thread_name_prefix="simpop-openenv-session")
        return await loop.run_in_executor(self._threads, self._holding_lock, work)

    def _holding_lock(self, work: Callable[[], SimpopObservation]) -> SimpopObservation:
        with self.lock:
            self._local.held = True
            try:
                return work()
            finally:
                self._local.held = False

    @contextlib.contextmanager
    def _released(self) -> Iterator[None]:
        """Let this session thread's lock go for the duration (a no-op outside a session's step)."""
        if not getattr(self._local, "held", False):
            yield
            return
        self._local.held = False
        self.lock.release()
        try:
            yield
        finally:
            self.lock.acquire()
            self._local.held = True

    def generate(self, backend: Any, method: str, inputs: list[Any], params: Any) -> list[Generation]:
        """``backend.<method>(inputs, params)``: batched with other sessions' calls from a session's step, else
        directly, holding the lock."""
        loop = self._loop
        if not getattr(self._local, "held", False) or loop is None or loop.is_closed():
            with self.lock if not getattr(self._local, "held", False) else contextlib.nullcontext():
                return getattr(backend, method)(inputs, params)
        with self._released():
            return asyncio.run_coroutine_threadsafe(self._batched(backend, method, inputs, params), loop).result()

    async def _batched(self, backend: Any, method: str, inputs: list[Any], params: Any) -> list[Generation]:
        batcher = self._batchers.get(id(backend))
        if batcher is None:
            batcher = self._batchers[id(backend)] = MicroBatcher(backend, self.max_batch, self.batch_window_s,
                                                                 expected=lambda: self.sessions)
        return await batcher.generate(method, inputs, params)

    def served(self, base_url: str, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``call(*args, **kwargs)`` on a model server: without the lock, at most ``max_inflight`` per server."""
        with self._servers_lock:
            bound = self._servers.setdefault(base_url, threading.BoundedSemaphore(self.max_inflight))
        with self._released(), bound:
            return call(*args, **kwargs)

    @property
    def batches(self) -> int:
        """Batched in-process generations made on the current server loop."""
        return sum(batcher.batches for batcher in self._batchers.values())


class SharedBackend:
    """A backend as the sessions' simulators see it (:meth:`ModelCalls.wrap`): generation of an in-process model
    joins a batch, every call to a served model (it has a ``base_url``) goes out concurrently within the server's
    bound; other attributes are the backend's own."""

    def __init__(self, backend: Any, calls: ModelCalls):
        self.backend, self.calls = backend, calls
        self.__wrapped__ = backend  # the backend that logs name
        self.base_url: str | None = getattr(backend, "base_url", None)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.backend, name)
        if self.base_url is not None:
            if callable(value) and not name.startswith("_") and not asyncio.iscoroutinefunction(value):
                return functools.partial(self.calls.served, self.base_url, value)
        elif name in ("generate", "generate_ids"):
            return functools.partial(self.calls.generate, self.backend, name)
        return value


class SharedBackends(dict):
    """The model spec -> backend cache of a :class:`UserSeatSource`: what it holds is wrapped for the sessions
    (:meth:`ModelCalls.wrap`) as it is loaded."""

    def __init__(self, calls: ModelCalls, loaded: Mapping[str, Any]):
        super().__init__()
        self.calls = calls
        for key, backend in loaded.items():
            self[key] = backend

    def __setitem__(self, key: str, backend: Any) -> None:
        super().__setitem__(key, self.calls.wrap(key, backend))


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
        calls: How sessions share the backends (default :class:`ModelCalls()`).
    """

    def __init__(self, env_id: str, simulators: Sequence[str] = (), panel: str | None = None,
                 env_kwargs: dict[str, Any] | None = None, backends: Mapping[str, Any] | None = None,
                 tokenizer: Any = None, calls: ModelCalls | None = None):
        if (panel is None) == (not simulators):
            raise ValueError("give simulator specs or a panel, not both or neither")
        self.env_id, self.simulators, self.panel = env_id, tuple(simulators), panel
        self.env_kwargs = dict(env_kwargs or {})
        self.calls = calls or ModelCalls()
        self.backends: MutableMapping[str, Any] = SharedBackends(self.calls, backends or {})
        if tokenizer is not None and not hasattr(tokenizer, "tokenizer"):
            raise ValueError(f"the server tokenizer must be a token backend with a tokenizer (e.g. load_backend("
                             f"'smollm2')), got {type(tokenizer).__name__}")
        self.chat_delta = None if tokenizer is None else ChatDelta(tokenizer)
        self.decoder: Any = None if tokenizer is None else tokenizer.tokenizer  # decodes a step's token_ids
        self.build_lock = threading.Lock()  # backends load once even when sessions start together
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

    def __init__(self, source: UserSeatSource):
        super().__init__()
        self.source = source
        self.panel_turn = itertools.count()  # this session's turn through the panel members
        self.closed = False
        self.env = make(source.env_id, **source.env_kwargs)
        with source.build_lock:
            self.seat_filler = source.build(self.env)
        self.seat: UserSeat | None = None
        self.member: str | None = None
        self.episode_id: str | None = None
        self.steps = 0
        self.episode_return = 0.0
        self.ledger: TokenLedger | None = None
        source.calls.count_session(1)

    def reset(self, seed: int | None = None, episode_id: str | None = None, scenario_id: str | None = None,
              member: str | None = None, **kwargs: Any) -> SimpopObservation:
        """Start an episode: the env reset with ``seed`` (and ``scenario_id``, else the env's draw), the user seat
        filled by the session's simulator, or by panel member ``member`` (default: the seed's turn through the
        members). Returns the policy seat's first observation (with its token ids when the server tokenizes).
        Unknown arguments, a bad seed, episode id, scenario or member are a ``BadRequest``, named without
        echoing the value (it may be text no response can carry)."""
        self._check_open()
        if kwargs:
            raise BadRequest(f"unknown reset argument(s) {sorted(kwargs)}; valid: seed, episode_id, scenario_id, "
                             f"member (panel sessions)")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise BadRequest(f"seed must be a non-negative integer, got {repr(seed)[:40]}")
        for name, value in (("episode_id", episode_id), ("scenario_id", scenario_id), ("member", member)):
            if value is None or (isinstance(value, str) and len(value) <= 255 and is_unicode(value)):
                continue
            got = (type(value).__name__ if not isinstance(value, str) else f"{len(value)} characters"
                   if len(value) > 255 else "a lone surrogate escape")
            raise BadRequest(f"{name} must be a string of valid Unicode of at most 255 characters, got {got}")
        simulator = self._simulator_for(seed, member)
        options = None if scenario_id is None else {"scenario_id": scenario_id}
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
        self._check_open()
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

    def close(self) -> None:
        """OpenEnv ends the session: later resets and steps are refused (``SessionClosed``)."""
        if not self.closed:
            self.source.calls.count_session(-1)
        self.closed = True

    def _check_open(self) -> None:
        if self.closed:
            raise SessionClosed("this session was closed on the server (openenv/session/close) and its slot given "
                                "up: open a new WebSocket for a new session")

    # OpenEnv awaits these when a subclass overrides them. Without a model backend (native and act-level
    # simulators) a step takes well under a millisecond: it runs on the event loop, sparing the thread
    # hand-off of OpenEnv's sync path. Model-backed simulators run in a worker thread (ModelCalls), so one
    # session's generation never holds up the event loop, and concurrent sessions' generations batch.
    async def reset_async(self, seed: int | None = None, episode_id: str | None = None,
                          **kwargs: Any) -> SimpopObservation:
        """:meth:`reset`, in a worker thread when the simulators use a model (:class:`ModelCalls`)."""
        return await self._run(self.reset, seed=seed, episode_id=episode_id, **kwargs)

    async def step_async(self, action: SimpopAction, timeout_s: float | None = None,
                         **kwargs: Any) -> SimpopObservation:
        """:meth:`step`, in a worker thread when the simulators use a model (:class:`ModelCalls`)."""
        return await self._run(self.step, action, timeout_s, **kwargs)

    async def _run(self, method: Callable[..., SimpopObservation], *args: Any, **kwargs: Any) -> SimpopObservation:
        if not self.source.backends:
            return method(*args, **kwargs)
        return await self.source.calls.run(functools.partial(method, *args, **kwargs))

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
            member = names[seed % len(names)] if seed is not None else names[next(self.panel_turn) % len(names)]
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
    return _gated_app(source, limits or ServerLimits(), api_key, on_reject or (lambda status: None), environment)[0]


def _gated_app(source: UserSeatSource, limits: ServerLimits, api_key: str | None, on_reject: Callable[[int], None],
               environment: Callable[[], SimpopEnvironment] | None) -> tuple[Any, HTTPEnvServer]:
    """:func:`make_app`'s app, and the ``HTTPEnvServer`` holding its sessions."""
    from fastapi import Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException

    factory = environment or functools.partial(SimpopEnvironment, source)
    source.calls.max_threads = limits.max_sessions  # each session has at most one step under way
    # OpenEnv's idle reaper is off (session_timeout=None): it freed a quiet WebSocket session's slot but left its
    # socket stepping, so the cap did not hold. SessionGate closes the idle socket instead, and its session with it.
    app = create_app(factory, SimpopAction, SimpopObservation, env_name=source.env_id, state_cls=SimpopState,
                     concurrency_config=ConcurrencyConfig(max_concurrent_envs=limits.max_sessions,
                                                          session_timeout=None))
    sessions = _session_registry(app)

    def refused(status: int, message: str, param: str | None = None,
                headers: Mapping[str, str] | None = None) -> JSONResponse:
        if status < 500:
            on_reject(status)
        return JSONResponse(error_body(status, message, param), status_code=status, headers=headers)

    async def bad_request(_: Request, exc: Exception) -> JSONResponse:
        return refused(409 if isinstance(exc, NoEpisode) else 400, str(exc))

    async def invalid(request: Request, exc: Exception) -> JSONResponse:
        """Validation errors (of the body, or of the action: OpenEnv raises those as a 422 HTTPException) and
        HTTP errors, in the error shape both servers share; never the input, which may not render."""
        if isinstance(exc, RequestValidationError):
            return refused(422, *_invalid("request", exc.errors()))
        assert isinstance(exc, HTTPException)
        if isinstance(exc.detail, list):
            return refused(exc.status_code, *_invalid("action", exc.detail))
        return refused(exc.status_code, f"{exc.detail}: {request.method} {request.url.path}", headers=exc.headers)

    app.add_exception_handler(BadRequest, bad_request)
    app.add_exception_handler(NoEpisode, bad_request)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(HTTPException, invalid)
    gated = PendingGate(SessionGate(app, limits.session_idle_s, on_reject), limits.max_pending, on_reject)
    return _WebSocketKey(RequestGate(gated, api_key, limits.max_body_bytes, limits.read_timeout_s,
                                     on_reject=on_reject), api_key), sessions


def _invalid(what: str, errors: Sequence[Any]) -> tuple[str, str | None]:
    """A one-line message naming each failed field and rule of a pydantic validation, and the first field."""
    fields = [".".join(str(part) for part in error.get("loc", ()) if part != "body") for error in errors]
    rules = dict.fromkeys(f"'{field}': {error.get('msg', 'invalid')}" if field else str(error.get("msg", "invalid"))
                          for field, error in zip(fields, errors))
    return f"invalid {what}: " + "; ".join(list(rules)[:4]), (fields[0].split(".")[0] or None) if fields else None


def _session_registry(app: Any) -> HTTPEnvServer:
    """The ``HTTPEnvServer`` that ``create_app`` registered on ``app`` (it owns the session registry).

    ``create_app`` returns only the app; its routes are closures over the server, which is found there."""
    for route in app.routes:
        if getattr(route, "path", None) == "/ws":
            for cell in getattr(route.endpoint, "__closure__", None) or ():
                if isinstance(cell.cell_contents, HTTPEnvServer):
                    return cell.cell_contents
    raise RuntimeError("OpenEnv's /ws route does not hold its HTTPEnvServer: unsupported openenv version")


#: Why HTTP cannot hold sessions here (answered to ``POST /mcp`` session calls and ``/ws?session_id=...``).
WEBSOCKET_ONLY = ("sessions are WebSocket-only on this server: connect to /ws, and that connection is its own "
                  "session until it closes (HTTP /mcp cannot create, close or name sessions)")


class SessionGate:
    """ASGI middleware: a session lives exactly as long as its WebSocket, so live sessions never exceed the cap.

    OpenEnv 0.10 also opens sessions over HTTP (``POST /mcp`` ``openenv/session/create``), which no connection
    holds: each kept a slot until the idle timeout, and ``--max-sessions`` of them locked every WebSocket client
    out. Here:

    - ``POST /mcp`` that creates, closes or names a session (``openenv/session/create``, ``openenv/session/close``,
      a ``session_id`` param) gets HTTP 400 with the JSON-RPC error; other MCP calls pass to OpenEnv.
    - ``/ws?session_id=...`` (attaching a WebSocket to such a session) is refused at the handshake: HTTP 400
      (ASGI's ``websocket.http.response``; a server without it closes the handshake, HTTP 403).
    - A WebSocket (``/ws``, ``/mcp``) that sends nothing for ``idle_s`` seconds while the server waits on it is
      closed with code 1001 and a reason naming ``--session-idle-timeout``; its session ends with it.
    - A ``/ws`` frame OpenEnv cannot answer and keep the session (binary, not a JSON object, nested too deeply,
      text that is not valid Unicode) gets an ``INVALID_JSON`` error frame here; the session plays on.
    """

    def __init__(self, app: Any, idle_s: float, on_reject: Callable[[int], None]) -> None:
        self.app, self.idle_s, self.on_reject = app, idle_s, on_reject

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "websocket":
            from urllib.parse import parse_qs

            if parse_qs(scope.get("query_string", b"").decode("latin-1")).get("session_id"):
                await self._refuse_attach(scope, send)
                return
            await self._websocket(scope, receive, send)
        elif scope["type"] == "http" and scope["path"] == "/mcp" and scope["method"] == "POST":
            await self._mcp(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    async def _websocket(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        closed, checked = False, scope["path"] == "/ws"
        reason = f"session closed: idle for {self.idle_s:g} s (--session-idle-timeout); reconnect for a new one"

        async def waiting() -> dict[str, Any]:
            nonlocal closed
            while not closed:
                try:
                    async with asyncio.timeout(self.idle_s):
                        message = await receive()
                except TimeoutError:
                    closed = True
                    await send({"type": "websocket.close", "code": 1001, "reason": reason[:123]})
                    break
                problem = _frame_problem(message) if checked else None
                if problem is None:
                    return message
                await send({"type": "websocket.send", "text": json.dumps(
                    {"type": "error", "data": {"message": problem, "code": "INVALID_JSON"}})})
            return {"type": "websocket.disconnect", "code": 1001}

        async def sending(message: dict[str, Any]) -> None:
            if not closed:  # after the idle close, OpenEnv's own close has nothing left to close
                await send(message)

        await self.app(scope, waiting, sending)

    async def _refuse_attach(self, scope: dict[str, Any], send: Any) -> None:
        self.on_reject(400)
        if "websocket.http.response" in scope.get("extensions", {}):
            body = json.dumps(error_body(400, WEBSOCKET_ONLY, param="session_id", code="websocket_only")).encode()
            await send({"type": "websocket.http.response.start", "status": 400,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(body)).encode())]})
            await send({"type": "websocket.http.response.body", "body": body})
        else:
            await send({"type": "websocket.close", "code": 1008, "reason": WEBSOCKET_ONLY[:123]})

    async def _mcp(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        chunks, more = [], True
        while more:  # RequestGate, in front, has bounded the body's size and arrival
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        try:
            request = json.loads(body)
        except (ValueError, RecursionError):  # OpenEnv answers what is not JSON (a parse error)
            request = None
        if isinstance(request, dict):
            if not _valid_unicode(body, request):  # OpenEnv would echo it (the method's name, say) in an unrenderable answer
                await self._refuse_rpc(send, request, "the request holds text that is not valid Unicode (a lone "
                                                      "surrogate escape such as \\ud800)")
                return
            if _names_a_session(request):
                await self._refuse_rpc(send, request, WEBSOCKET_ONLY)
                return
        await self.app(scope, replay_body(body, receive), send)

    async def _refuse_rpc(self, send: Any, request: dict[str, Any], message: str) -> None:
        """HTTP 400 carrying the JSON-RPC error."""
        self.on_reject(400)
        request_id = request.get("id")
        request_id = request_id if isinstance(request_id, int | str) and is_unicode(str(request_id)) else None
        data = json.dumps({"jsonrpc": "2.0", "id": request_id, "error": {"code": -32600, "message": message}}).encode()
        await send({"type": "http.response.start", "status": 400,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
        await send({"type": "http.response.body", "body": data})


def _frame_problem(message: dict[str, Any]) -> str | None:
    """Why OpenEnv could not answer a WebSocket message and keep the session (None: it can)."""
    if message["type"] != "websocket.receive":
        return None
    if message.get("text") is None:
        return "binary frames are not read: send text frames, each a JSON object"
    try:
        frame = json.loads(message["text"])
    except (ValueError, RecursionError) as error:
        return f"the frame is not JSON: {str(error)[:200]}"
    if not isinstance(frame, dict):
        return 'a frame must be a JSON object, such as {"type": "reset", "data": {"seed": 0}}'
    if not _valid_unicode(message["text"], frame):
        return "the frame holds text that is not valid Unicode (a lone surrogate escape such as \\ud800)"
    return None


#: A JSON escape of a surrogate (``\ud800``-``\udfff``): the only way parsed JSON text can hold a lone surrogate.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _valid_unicode(raw: str | bytes, parsed: Any) -> bool:
    """Whether JSON ``parsed`` (read from ``raw``) holds only text a UTF-8 response can carry (no lone
    surrogates). Only a frame with a surrogate escape is serialised again to check: every frame passes here."""
    if not _SURROGATE_ESCAPE.search(raw if isinstance(raw, str) else raw.decode("latin-1")):
        return True
    try:
        return is_unicode(json.dumps(parsed, ensure_ascii=False))
    except RecursionError:
        return False


def _names_a_session(request: dict[str, Any]) -> bool:
    """Whether a JSON-RPC request creates, closes or names an OpenEnv session."""
    params = request.get("params")
    return (request.get("method") in ("openenv/session/create", "openenv/session/close")
            or (isinstance(params, dict) and bool(params.get("session_id"))))


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
    sessions: HTTPEnvServer | None = field(default=None, repr=False)
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
    def active_sessions(self) -> int:
        """Sessions open now (each held by its WebSocket; at most ``limits.max_sessions``)."""
        return 0 if self.sessions is None else self.sessions.active_sessions

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
                environment: Callable[[], SimpopEnvironment] | None = None, reuse_port: bool = False) -> OpenEnvServer:
    """Bind an OpenEnv server for ``source`` (port 0 picks a free port); call ``serve_forever`` or ``start``.
    ``reuse_port``: share the port with other processes' servers (``SO_REUSEPORT``; the kernel spreads new
    connections over them, ``simpop openenv serve --workers``)."""
    limits = limits or ServerLimits()
    holder: list[OpenEnvServer] = []

    def count(status: int) -> None:
        holder[0].rejected += 1

    app, sessions = _gated_app(source, limits, api_key, count, environment)
    sock = socket.create_server((host, port), family=_family(host), backlog=4096, reuse_port=reuse_port)
    holder.append(OpenEnvServer(app, sock, limits, log_requests, sessions))
    return holder[0]


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def reserve_port(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` with ``SO_REUSEPORT`` but not listening: it holds the port (port 0: a free
    one) for workers that serve it (``make_server(..., reuse_port=True)``) and receives no connections itself."""
    sock = socket.socket(_family(host), socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock
