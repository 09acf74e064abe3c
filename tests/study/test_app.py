"""The study's HTTP API on a real loopback server: token, limits, headers, blinding."""

from __future__ import annotations

import httpx
import pytest

from simpop.study.app import create_app
from simpop.study.storage import read_chats
from tests.study.conftest import TOKEN, Server


def join(url, key=None):
    return httpx.post(f"{url}/api/join", json={"token": TOKEN, "key": key, "consent": True}, timeout=30)


def test_joining_needs_the_study_token(served):
    url, _ = served
    assert httpx.post(f"{url}/api/join", json={"token": "wrong-token"}).status_code == 403
    assert httpx.post(f"{url}/api/join", json={}).status_code == 422
    response = join(url)
    assert response.status_code == 200
    view = response.json()
    assert view["participant"].startswith("p-") and view["turn"] == "you" and view["chats"] == 2
    assert "persona" not in view and "policy" not in view and "Who you are" in view["instructions"]


def test_a_chat_over_http_then_rating(served):
    url, study = served
    view = join(url).json()
    chat, participant, key = view["chat"], view["participant"], view["key"]
    while view["turn"] != "done":
        text = view["survey"]["options"][0] if view["survey"] else "Tell me more."
        response = httpx.post(f"{url}/api/chat/{chat}/message", json={"text": text}, timeout=30)
        assert response.status_code == 200, response.text
        view = response.json()
    assert httpx.post(f"{url}/api/chat/{chat}/message", json={"text": "again"}).status_code == 409
    assert httpx.post(f"{url}/api/chat/{chat}/rating", json={"naturalness": 9, "would_talk_again": True}
                      ).status_code == 422
    rated = httpx.post(f"{url}/api/chat/{chat}/rating", json={"naturalness": 3, "would_talk_again": False})
    assert rated.json() == {"saved": True, "remaining": 1}
    (record,) = read_chats(study.out)
    assert record.member == participant and record.extra["study"]["ratings"]["naturalness"] == 3
    next_view = join(url, key).json()
    assert next_view["number"] == 1 and next_view["participant"] == participant


def test_limits_and_headers(served):
    url, _ = served
    view = join(url).json()
    too_long = httpx.post(f"{url}/api/chat/{view['chat']}/message", json={"text": "x" * 1001})
    assert too_long.status_code == 422 and view["max_message_chars"] == 1000
    assert httpx.post(f"{url}/api/chat/nope/message", json={"text": "hi"}).status_code == 404
    big = httpx.post(f"{url}/api/join", content=b"{" + b" " * 70_000 + b"}",
                     headers={"content-type": "application/json"})
    assert big.status_code == 413
    page = httpx.get(f"{url}/")
    assert page.status_code == 200 and "script-src 'self'" in page.headers["content-security-policy"]
    assert page.headers["x-content-type-options"] == "nosniff" and page.headers["referrer-policy"] == "no-referrer"
    assert httpx.get(f"{url}/static/app.js").status_code == 200
    assert httpx.get(f"{url}/docs").status_code == 404 and httpx.get(f"{url}/openapi.json").status_code == 404


def test_messages_are_rate_limited(study):
    with Server(create_app(study, TOKEN, message_rate="2/minute")) as url:
        chat = join(url).json()["chat"]
        codes = [httpx.post(f"{url}/api/chat/{chat}/message", json={"text": "hi"}, timeout=30).status_code
                 for _ in range(3)]
        assert codes == [200, 200, 429]
    with pytest.raises(ValueError, match="bad rate limit"):
        create_app(study, TOKEN, message_rate="lots")
    with pytest.raises(ValueError, match="at least 8"):
        create_app(study, "short")
