"""The study under abuse and carelessness: restarts with gaps, participant takeover, oversized and odd bodies,
long polls against a slow policy."""

from __future__ import annotations

import httpx

from simpop.study.app import create_app
from tests.study.conftest import TOKEN, Server, make_study
from tests.study.policies import Slow
from tests.study.test_study import play


def test_a_restart_never_repeats_a_participants_assignment(tmp_path):
    s = make_study(tmp_path / "s")
    chats = [s.join(None) for _ in range(3)]
    for chat in (chats[0], chats[2]):  # the middle participant never saves a chat before the kill
        play(chat, ["No thanks, I'll pass."])
        s.rate(chat, {"naturalness": 3, "would_talk_again": True})
    for chat in chats:  # a kill: nothing more is saved
        chat.close()
    again = make_study(tmp_path / "s")
    new = again.join(None)
    assert new.participant_index == 3
    assert new.seed not in {c.seed for c in chats}
    again.close()


def test_a_participant_id_and_the_study_token_do_not_take_over_a_chat(served):
    url, _ = served
    view = httpx.post(f"{url}/api/join", json={"token": TOKEN, "consent": True}, timeout=30).json()
    assert len(view["key"]) == 24 and view["key"] != view["participant"]
    stolen = httpx.post(f"{url}/api/join", json={"token": TOKEN, "participant": view["participant"]}, timeout=30)
    assert stolen.status_code == 422
    guessed = httpx.post(f"{url}/api/join", json={"token": TOKEN, "key": "x" * 24, "consent": True},
                        timeout=30).json()
    assert guessed["participant"] != view["participant"] and guessed["chat"] != view["chat"]
    again = httpx.post(f"{url}/api/join", json={"token": TOKEN, "key": view["key"]}, timeout=30).json()
    assert again["chat"] == view["chat"] and again["participant"] == view["participant"]


def test_a_chunked_body_over_the_cap_is_refused_unread(served):
    url, _ = served
    sent = []

    def chunks():  # 2 MiB, chunked (no Content-Length)
        for _ in range(32):
            sent.append(1)
            yield b" " * 65536

    response = httpx.post(f"{url}/api/join", content=chunks(), headers={"content-type": "application/json"},
                          timeout=30)
    assert response.status_code == 413 and len(response.content) < 1000
    assert "content-security-policy" in response.headers


def test_invalid_input_is_described_not_echoed(served):
    url, _ = served
    response = httpx.post(f"{url}/api/join", json={"token": "t" * 5000}, timeout=30)
    assert response.status_code == 422 and "ttttt" not in response.text


def test_lone_surrogates_are_refused_with_422(served):
    url, _ = served
    view = httpx.post(f"{url}/api/join", json={"token": TOKEN, "consent": True}, timeout=30).json()
    body = b'{"text": "hi \\ud800 there"}'
    response = httpx.post(f"{url}/api/chat/{view['chat']}/message", content=body,
                          headers={"content-type": "application/json"}, timeout=30)
    assert response.status_code == 422 and "unicode" in response.text
    joined = httpx.post(f"{url}/api/join", content=b'{"token": "\\udfff"}',
                        headers={"content-type": "application/json"}, timeout=30)
    assert joined.status_code == 422
    assert httpx.get(f"{url}/api/chat/{view['chat']}", timeout=30).json()["messages"][-1]["from"] == "agent"


def test_long_polls_against_a_slow_policy_stall_no_one(tmp_path):
    import concurrent.futures

    Slow.done.clear()
    study = make_study(tmp_path / "s", policies={"S": "tests.study.policies:Slow"})
    try:
        with Server(create_app(study, TOKEN, reply_timeout_s=4.0)) as url:
            chat = study.join(None)  # the slow persuader is thinking: every poll waits
            with concurrent.futures.ThreadPoolExecutor(45) as pool:
                polls = [pool.submit(httpx.get, f"{url}/api/chat/{chat.id}?wait=1", timeout=30) for _ in range(45)]
                page = httpx.get(f"{url}/", timeout=2.0)  # answered at once, not after the polls
                codes = [p.result().status_code for p in polls]
            assert page.status_code == 200
            assert codes.count(200) == 2 and codes.count(429) == 43
    finally:
        Slow.done.set()
        study.close()


def test_the_study_salt_is_private_made_once_and_never_half_written(tmp_path):
    from simpop.study import storage

    first = storage.salt(tmp_path)
    assert len(first) == 32 and storage.salt(tmp_path) == first
    assert (tmp_path / storage.SALT).stat().st_mode & 0o777 == 0o600
    assert [p.name for p in tmp_path.iterdir()] == [storage.SALT]  # no temporary file left beside it
