"""The study under abuse and carelessness: restarts with gaps, participant takeover, oversized and odd bodies,
long polls against a slow policy."""

from __future__ import annotations

import httpx

from simpop.study.app import create_app
from tests.study.conftest import TOKEN, Server, make_study
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
    view = httpx.post(f"{url}/api/join", json={"token": TOKEN}, timeout=30).json()
    assert len(view["key"]) == 24 and view["key"] != view["participant"]
    stolen = httpx.post(f"{url}/api/join", json={"token": TOKEN, "participant": view["participant"]}, timeout=30)
    assert stolen.status_code == 422
    guessed = httpx.post(f"{url}/api/join", json={"token": TOKEN, "key": "x" * 24}, timeout=30).json()
    assert guessed["participant"] != view["participant"] and guessed["chat"] != view["chat"]
    again = httpx.post(f"{url}/api/join", json={"token": TOKEN, "key": view["key"]}, timeout=30).json()
    assert again["chat"] == view["chat"] and again["participant"] == view["participant"]
