"""The study's web app: FastAPI routes, pydantic request models, the page, limits and security headers.

Routes (JSON unless said otherwise):

- ``GET /``: the page (``static/index.html``; ``?token=...`` joins, with the platform's ids in the query too).
  ``GET /static/*``: its script and style.
- ``POST /api/study`` ``{token}``: what the page shows before the chats: the consent text, the participant mode,
  the questionnaire's items (and whether the chat partner sees the answers), the attention item.
  ``POST /api/decline`` ``{token}``: the visitor declined consent; only a count is kept.
- ``POST /api/join`` ``{token, key?, consent, params?}``: the study token is required (403 otherwise); a new
  participant must have consented (428 otherwise); ``params`` is the join URL's query, from which the platform
  ids are read (:data:`~simpop.study.study.ID_PARAMS`). Returns the participant's id, their secret key (kept
  by the page, sent to join again) and either ``stage: "questionnaire"`` or the chat's view. Limited per
  client address.
- ``POST /api/questionnaire`` ``{key, answers}``: the questionnaire's answers (before the first chat).
- ``GET /api/chat/{id}?wait=1``: the chat's view, waiting up to ``reply_timeout_s`` for the person's turn
  (at most ``max_waits_per_chat`` such waits per chat at once; more: 429).
- ``POST /api/chat/{id}/message`` ``{text}``: the person's message (or survey answer); returns the view once
  the policy has answered. At most ``max_message_chars`` characters; rate-limited per chat. In self mode a
  message that pledges more than the bonus is refused (422, to restate; counted in the chat's effort).
- ``POST /api/chat/{id}/rating`` ``{naturalness: 1..5, would_talk_again: bool, attention?: 1..5}``: saves the
  chat (``attention``, the instructed-response item, is required when the study asks it).
- ``POST /api/finish`` ``{key}``: after the last chat, the debrief text, the completion code and the redirect.

A chat id (144 random bits) is the capability for its chat, a participant key (144 random bits) for the
participant's chats; the pseudonymous participant id (32 bits) grants nothing. Responses carry a strict
Content-Security-Policy (scripts only from this server, no inline script), ``X-Content-Type-Options: nosniff``,
``Referrer-Policy: no-referrer`` and ``Cache-Control: no-store``; the page builds the chat with ``textContent``
only, so chat text is never parsed as HTML. Rate limits use the ``limits`` package (moving windows, in memory).

Limits: a body over 64 KiB is refused with 413 before it is read beyond the cap, chunked or not, and a body must
arrive within 30 s (408) (:class:`~simpop.serve.http.RequestGate`, shared with ``simpop serve``); a 422 names
the fields and the rule, never echoes the input (pydantic refuses text that is not valid Unicode, such as a lone
UTF-16 surrogate: a 422 too). Requests that wait for the policy wait on the event loop, not in a thread, so the
page, its script and every other chat stay answered while a policy is slow.
"""

# No ``from __future__ import annotations``: FastAPI reads the route signatures, one of which names a class
# defined inside create_app (its length limit is a setting).
import asyncio
import contextlib
import secrets
import time
from collections import Counter
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from limits import parse
from limits.storage import MemoryStorage
from limits.strategies import MovingWindowRateLimiter
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from simpop.serve.http import RequestGate
from simpop.study.modes import QUESTIONS
from simpop.study.study import ATTENTION_ITEM, Study, StudyError

STATIC = Path(__file__).with_name("static")
#: Requests with a larger body are refused before they are read (413).
MAX_BODY_BYTES = 64 * 1024
#: Seconds a request body may take to arrive (408 after).
BODY_TIMEOUT_S = 30.0
SECURITY_HEADERS = {
    "Content-Security-Policy": ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
                                "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}
ParticipantKey = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{24}$")]


Token = Annotated[str, StringConstraints(min_length=1, max_length=200)]
QueryName = Annotated[str, StringConstraints(min_length=1, max_length=64)]
QueryValue = Annotated[str, StringConstraints(max_length=200)]


class TokenRequest(BaseModel):
    """``POST /api/study``, ``POST /api/decline``: the study token."""
    model_config = ConfigDict(extra="forbid")
    token: Token


class JoinRequest(BaseModel):
    """``POST /api/join``: the study token, the participant's key when rejoining, consent, the join URL's query."""
    model_config = ConfigDict(extra="forbid")
    token: Token
    key: ParticipantKey | None = None
    consent: bool = False
    params: Annotated[dict[QueryName, QueryValue], Field(max_length=20)] = {}


class KeyRequest(BaseModel):
    """``POST /api/finish``: the participant's key."""
    model_config = ConfigDict(extra="forbid")
    key: ParticipantKey


class QuestionnaireRequest(KeyRequest):
    """``POST /api/questionnaire``: the participant's key and answers (item -> option, or age as a number)."""
    answers: Annotated[dict[QueryName, str | float | None], Field(max_length=20)]


class RatingRequest(BaseModel):
    """``POST /api/chat/{chat_id}/rating``: the participant's ratings of a finished chat."""
    model_config = ConfigDict(extra="forbid")
    naturalness: int = Field(ge=1, le=5, description="How natural the agent sounded, 1 (not at all) to 5 (very)")
    would_talk_again: bool = Field(description="Would talk to this agent again")
    attention: int | None = Field(None, ge=1, le=5, description="The instructed-response item's answer")


def create_app(study: Study, token: str, *, max_message_chars: int = 1000, message_rate: str = "1/second;20/minute",
               join_rate: str = "20/minute", reply_timeout_s: float = 120.0, max_waits_per_chat: int = 2) -> FastAPI:
    """The app serving ``study`` to people who hold ``token``.

    Args:
        study: The running study.
        token: The study token a participant needs to join.
        max_message_chars: Longest message accepted (longer: 422).
        message_rate: Messages allowed per chat (``limits`` syntax, e.g. ``"1/second;20/minute"``; more: 429).
        join_rate: Joins allowed per client address.
        reply_timeout_s: Longest a request waits for the policy's reply (the page then asks again).
        max_waits_per_chat: Requests of one chat that may wait for the policy at once (more: 429).
    """
    if len(token) < 8:
        raise ValueError("the study token must have at least 8 characters")
    limiter = MovingWindowRateLimiter(MemoryStorage())
    message_limits, join_limits = _rates(message_rate), _rates(join_rate)

    class MessageRequest(BaseModel):
        model_config = ConfigDict(extra="forbid")
        text: Annotated[str, StringConstraints(min_length=1, max_length=max_message_chars)]

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        study.close()

    app = FastAPI(title="simpop study", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    # Chunked bodies too: counted while read, refused at the cap (the guard below adds the headers).
    app.add_middleware(RequestGate, api_key=None, max_body_bytes=MAX_BODY_BYTES, read_timeout_s=BODY_TIMEOUT_S)
    waiting: Counter[str] = Counter()

    @app.middleware("http")
    async def guard(request: Request, call_next):
        length = request.headers.get("content-length", "0")
        if not length.isdigit() or int(length) > MAX_BODY_BYTES:
            response = JSONResponse({"detail": "request too large"}, status_code=413)
        else:
            response = await call_next(request)
        response.headers.update(SECURITY_HEADERS)
        return response

    @app.exception_handler(StudyError)
    async def refused(request: Request, error: StudyError):
        return JSONResponse({"detail": str(error)}, status_code=error.status)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, error: RequestValidationError):
        # FastAPI's default echoes each bad input back (a whole oversized or undecodable body): names only.
        errors = [{"loc": list(e.get("loc", ())), "msg": str(e.get("msg", ""))[:200], "type": e.get("type")}
                  for e in error.errors()[:10]]
        return JSONResponse({"detail": errors}, status_code=422)

    def check_waits(chat) -> None:
        if waiting[chat.id] >= max_waits_per_chat:
            raise HTTPException(429, "this chat is already waiting for the agent in other requests")

    async def wait_turn(chat, after: int = -1) -> None:
        """Wait on the event loop (no thread held) until the person's turn or the end, or the timeout."""
        check_waits(chat)
        loop, changed = asyncio.get_running_loop(), asyncio.Event()

        def wake() -> None:  # in the dialogue's thread
            with contextlib.suppress(RuntimeError):  # the loop closed (server shutdown): nobody waits
                loop.call_soon_threadsafe(changed.set)

        waiting[chat.id] += 1
        stop = chat.seat.listen(wake)
        try:
            deadline = time.monotonic() + reply_timeout_s
            while True:
                changed.clear()  # before the check: a change after it sets the event again
                left = deadline - time.monotonic()
                if chat.ready(after) or left <= 0:
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), left)
        finally:
            stop()
            waiting[chat.id] -= 1
            if not waiting[chat.id]:
                del waiting[chat.id]

    def limit(rates: list[Any], *key: str) -> None:
        if not all(limiter.hit(rate, *key) for rate in rates):
            raise HTTPException(429, "too many requests: slow down a little")

    def chat_view(chat) -> dict[str, Any]:
        return {**chat.view(), "max_message_chars": max_message_chars}

    def check_token(given: str, request: Request) -> None:
        limit(join_limits, "join", request.client.host if request.client else "?")
        if not secrets.compare_digest(given.encode(), token.encode()):
            raise HTTPException(403, "wrong study token: use the link the researcher gave you")

    def external_ids(params: dict[str, str]) -> dict[str, str]:
        names = study.settings["id_params"]
        return {kind: value for kind in names
                if (value := next((params[n].strip() for n in names[kind] if params.get(n, "").strip()), None))}

    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(STATIC / "index.html", media_type="text/html")

    @app.post("/api/study")
    async def describe(body: TokenRequest, request: Request) -> dict[str, Any]:
        check_token(body.token, request)
        settings = study.settings
        return {"consent": settings["consent"] or "", "mode": settings["participant_mode"],
                "chats": settings["chats_per_participant"],
                "questionnaire": [{"name": name, "question": QUESTIONS[name][0], "options": list(QUESTIONS[name][1])}
                                  for name in settings["questionnaire"]],
                "questionnaire_to_policy": bool(settings["questionnaire_to_policy"]),
                "attention": ATTENTION_ITEM[0] if settings["attention_check"] else None}

    @app.post("/api/decline")
    async def decline(body: TokenRequest, request: Request) -> dict[str, Any]:
        check_token(body.token, request)
        study.decline()
        return {"declined": True}

    @app.post("/api/join")
    async def join(body: JoinRequest, request: Request) -> dict[str, Any]:
        check_token(body.token, request)
        key = body.key
        if study.participant_of(key) is None:
            if not body.consent:
                raise HTTPException(428, "please read the consent page and agree before you start")
            _, key = await run_in_threadpool(study.register, external_ids(body.params))
        participant = study.participant_of(key)
        chats = study.settings["chats_per_participant"]
        if study.needs_questionnaire(participant):
            return {"participant": participant, "key": key, "chats": chats, "stage": "questionnaire"}
        chat = await run_in_threadpool(study.join, key)  # saves swept chats, builds an env: brief
        await wait_turn(chat)
        return {"participant": chat.participant, "key": chat.key, "chats": chats, "stage": "chat", **chat_view(chat)}

    @app.post("/api/questionnaire")
    def questionnaire(body: QuestionnaireRequest) -> dict[str, Any]:
        study.answer(body.key, body.answers)
        return {"saved": True}

    @app.post("/api/finish")
    def finish(body: KeyRequest) -> dict[str, Any]:
        return study.finish(body.key)

    @app.get("/api/chat/{chat_id}")
    async def show(chat_id: str, wait: bool = False) -> dict[str, Any]:
        chat = study.chat(chat_id)
        if wait:
            await wait_turn(chat)
        return chat_view(chat)

    @app.post("/api/chat/{chat_id}/message")
    async def message(chat_id: str, body: MessageRequest) -> dict[str, Any]:
        chat = study.chat(chat_id)
        limit(message_limits, "message", chat_id)
        check_waits(chat)  # before the message is handed over: a refused request changes nothing
        try:
            asked = chat.post(body.text)
        except RuntimeError as error:
            raise StudyError(str(error)) from None
        except ValueError as error:  # self mode: a pledge above the bonus, to restate
            raise StudyError(str(error), 422) from None
        await wait_turn(chat, asked)
        return chat_view(chat)

    @app.post("/api/chat/{chat_id}/rating")
    def rating(chat_id: str, body: RatingRequest) -> dict[str, Any]:
        chat = study.chat(chat_id)
        ratings = body.model_dump()
        if not study.settings["attention_check"]:
            del ratings["attention"]
        elif ratings["attention"] is None:
            raise StudyError("please answer every question", 422)
        study.rate(chat, ratings)
        return {"saved": True, "remaining": study.settings["chats_per_participant"] - chat.number - 1}

    return app


def _rates(text: str) -> list[Any]:
    try:
        return [parse(part.strip()) for part in text.split(";") if part.strip()]
    except ValueError as error:
        raise ValueError(f"bad rate limit {text!r} ({error}); write e.g. '1/second;20/minute'") from None


def serve(app: FastAPI, host: str, port: int) -> None:
    """Run ``app`` with uvicorn until interrupted."""
    import uvicorn

    # Requests waiting for a policy are cancelled 5 s into a shutdown: Ctrl-C stops the study promptly.
    uvicorn.run(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=5)
