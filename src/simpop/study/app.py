"""The study's web app: FastAPI routes, pydantic request models, the page, limits and security headers.

Routes (JSON unless said otherwise):

- ``GET /``: the page (``static/index.html``; ``?token=...`` joins). ``GET /static/*``: its script and style.
- ``POST /api/join`` ``{token, participant?}``: the study token is required (403 otherwise); returns the
  participant id (kept by the page) and the chat's view. Limited per client address.
- ``GET /api/chat/{id}?wait=1``: the chat's view, waiting up to ``reply_timeout_s`` for the person's turn.
- ``POST /api/chat/{id}/message`` ``{text}``: the person's message (or survey answer); returns the view once
  the policy has answered. At most ``max_message_chars`` characters; rate-limited per chat.
- ``POST /api/chat/{id}/rating`` ``{naturalness: 1..5, would_talk_again: bool}``: saves the chat.

A chat id (144 random bits) is the capability for its chat. Responses carry a strict Content-Security-Policy
(scripts only from this server, no inline script), ``X-Content-Type-Options: nosniff``, ``Referrer-Policy:
no-referrer`` and ``Cache-Control: no-store``; the page builds the chat with ``textContent`` only, so chat text is
never parsed as HTML. Rate limits use the ``limits`` package (moving windows, in memory).
"""

# No ``from __future__ import annotations``: FastAPI reads the route signatures, one of which names a class
# defined inside create_app (its length limit is a setting).
import secrets
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from limits import parse
from limits.storage import MemoryStorage
from limits.strategies import MovingWindowRateLimiter
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from simpop.study.study import Study, StudyError

STATIC = Path(__file__).with_name("static")
#: Requests with a larger body are refused before they are read (413).
MAX_BODY_BYTES = 64 * 1024
SECURITY_HEADERS = {
    "Content-Security-Policy": ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
                                "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}
ParticipantId = Annotated[str, StringConstraints(pattern=r"^p-[0-9a-f]{8}$")]


class JoinRequest(BaseModel):
    """``POST /api/join``: the study token, and the participant id when rejoining."""
    model_config = ConfigDict(extra="forbid")
    token: Annotated[str, StringConstraints(min_length=1, max_length=200)]
    participant: ParticipantId | None = None


class RatingRequest(BaseModel):
    """``POST /api/chat/{chat_id}/rating``: the participant's ratings of a finished chat."""
    model_config = ConfigDict(extra="forbid")
    naturalness: int = Field(ge=1, le=5, description="How natural the agent sounded, 1 (not at all) to 5 (very)")
    would_talk_again: bool = Field(description="Would talk to this agent again")


def create_app(study: Study, token: str, *, max_message_chars: int = 1000, message_rate: str = "1/second;20/minute",
               join_rate: str = "20/minute", reply_timeout_s: float = 120.0) -> FastAPI:
    """The app serving ``study`` to people who hold ``token``.

    Args:
        study: The running study.
        token: The study token a participant needs to join.
        max_message_chars: Longest message accepted (longer: 422).
        message_rate: Messages allowed per chat (``limits`` syntax, e.g. ``"1/second;20/minute"``; more: 429).
        join_rate: Joins allowed per client address.
        reply_timeout_s: Longest a request waits for the policy's reply (the page then asks again).
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

    def limit(rates: list[Any], *key: str) -> None:
        if not all(limiter.hit(rate, *key) for rate in rates):
            raise HTTPException(429, "too many requests: slow down a little")

    def chat_view(chat) -> dict[str, Any]:
        return {**chat.view(), "max_message_chars": max_message_chars}

    @app.get("/", include_in_schema=False)
    def page() -> FileResponse:
        return FileResponse(STATIC / "index.html", media_type="text/html")

    @app.post("/api/join")
    def join(body: JoinRequest, request: Request) -> dict[str, Any]:
        limit(join_limits, "join", request.client.host if request.client else "?")
        if not secrets.compare_digest(body.token.encode(), token.encode()):
            raise HTTPException(403, "wrong study token: use the link the researcher gave you")
        chat = study.join(body.participant)
        chat.wait_turn(reply_timeout_s)
        return {"participant": chat.participant, "chats": study.settings["chats_per_participant"], **chat_view(chat)}

    @app.get("/api/chat/{chat_id}")
    def show(chat_id: str, wait: bool = False) -> dict[str, Any]:
        chat = study.chat(chat_id)
        if wait:
            chat.wait_turn(reply_timeout_s)
        return chat_view(chat)

    @app.post("/api/chat/{chat_id}/message")
    def message(chat_id: str, body: MessageRequest) -> dict[str, Any]:
        chat = study.chat(chat_id)
        limit(message_limits, "message", chat_id)
        try:
            chat.send(body.text, reply_timeout_s)
        except RuntimeError as error:
            raise StudyError(str(error)) from None
        return chat_view(chat)

    @app.post("/api/chat/{chat_id}/rating")
    def rating(chat_id: str, body: RatingRequest) -> dict[str, Any]:
        chat = study.chat(chat_id)
        study.rate(chat, body.model_dump())
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

    uvicorn.run(app, host=host, port=port, log_level="warning")
