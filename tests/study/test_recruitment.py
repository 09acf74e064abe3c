"""A study run with real people: consent, platform ids, completion codes, self mode, questionnaire, quality."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from simpop.cli import main
from simpop.study import storage
from simpop.study.app import create_app
from simpop.study.report import write_report
from simpop.study.study import StudyError, verify_codes
from tests.study.conftest import TOKEN, make_study
from tests.study.test_study import play

PID = "5f1e0c9a2b3d4e5f6a7b8c9d"


def client_of(study, **kwargs):
    return TestClient(create_app(study, TOKEN, message_rate="1000/second", **kwargs))


def join(client, key=None, consent=True, **params):
    return client.post("/api/join", json={"token": TOKEN, "key": key, "consent": consent, "params": params})


def finish_chats(client, key, study, ratings=None):
    """Play every chat of the participant holding ``key`` over HTTP (survey: 4th option), rate each."""
    for _ in range(study.settings["chats_per_participant"]):
        view = join(client, key).json()
        while view["turn"] != "done":
            text = view["survey"]["options"][3] if view["survey"] else "Hmm, tell me more about it please."
            view = client.post(f"/api/chat/{view['chat']}/message", json={"text": text}).json()
        rated = client.post(f"/api/chat/{view['chat']}/rating",
                            json=ratings or {"naturalness": 3, "would_talk_again": True})
        assert rated.status_code == 200, rated.text


def test_declining_consent_stores_nothing_but_a_count(tmp_path):
    study = make_study(tmp_path / "s")
    with client_of(study) as client:
        page = client.post("/api/study", json={"token": TOKEN}).json()
        assert "Consent to take part" in page["consent"] and page["mode"] == "persona"
        assert join(client, consent=False, PROLIFIC_PID=PID).status_code == 428
        assert client.post("/api/decline", json={"token": TOKEN}).json() == {"declined": True}
        assert client.post("/api/decline", json={"token": "wrong-token"}).status_code == 403
    study.close()
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == ["counts.json", "salt", "study.json"]
    assert storage.read_counts(tmp_path / "s") == {"declined": 1}
    assert write_report(tmp_path / "s")["flow"] == {"declined": 1, "joined": 0, "completed": 0, "with_chats": 0}


def test_platform_ids_are_salted_hashes_and_join_once_across_restarts(tmp_path):
    study = make_study(tmp_path / "s")
    with client_of(study) as client:
        first = join(client, PROLIFIC_PID=PID, STUDY_ID="study-1", SESSION_ID="sess-1").json()
        assert first["stage"] == "chat"
        again = join(client, PROLIFIC_PID=PID)  # another browser, same person
        assert again.status_code == 409 and "already taken part" in again.json()["detail"]
        assert join(client, first["key"], PROLIFIC_PID=PID).json()["chat"] == first["chat"]  # same browser: goes on
        finish_chats(client, first["key"], study)
    study.close()
    folder = tmp_path / "s"
    for name in ("episodes.jsonl", "participants.jsonl", "study.json"):
        text = (folder / name).read_text()
        assert PID not in text and "sess-1" not in text and (folder / "salt").read_text().strip() not in text
    (event, *_) = storage.read_ledger(folder)
    secret = storage.salt(folder)
    assert event["external"]["participant"] == storage.keyed_hash(secret, "participant", PID)
    assert set(event["external"]) == {"participant", "study", "session"}
    record = storage.read_chats(folder)[0]
    assert record.extra["study"]["external"] == event["external"]
    restarted = make_study(folder)
    with client_of(restarted) as client:
        response = join(client, workerId=PID)  # the same id under MTurk's name is the same id
        assert response.status_code == 409
    restarted.close()


def test_a_missing_platform_id_is_refused_when_required(tmp_path):
    study = make_study(tmp_path / "s", require_external_id=True)
    with client_of(study) as client:
        response = join(client, other="x")
        assert response.status_code == 400 and "PROLIFIC_PID" in response.json()["detail"]
        assert join(client, **{f"p{i}": "x" for i in range(21)}).status_code == 422  # at most 20 query parameters
        assert join(client, participant_id="lab-7").json()["stage"] == "chat"
    study.close()
    assert len(storage.read_ledger(tmp_path / "s")) == 1


def test_completion_code_and_redirect_and_a_forged_code_is_detected(tmp_path, capsys):
    study = make_study(tmp_path / "s", completion_url="https://app.prolific.com/submissions/complete?cc={code}")
    with client_of(study) as client:
        view = join(client, PROLIFIC_PID=PID).json()
        early = client.post("/api/finish", json={"key": view["key"]})
        assert early.status_code == 409 and "2 chat(s) left" in early.json()["detail"]
        finish_chats(client, view["key"], study)
        end = client.post("/api/finish", json={"key": view["key"]}).json()
        assert end == client.post("/api/finish", json={"key": view["key"]}).json()  # asked twice: the same
        assert end["redirect"] == f"https://app.prolific.com/submissions/complete?cc={end['code']}"
        assert "computer programs" in end["debrief"]
        assert join(client, view["key"]).status_code == 410  # every chat done
        assert client.post("/api/finish", json={"key": "y" * 24}).status_code == 403
    study.close()
    code = end["code"]
    forged = code[:-1] + ("A" if code[-1] != "A" else "B")
    assert verify_codes(tmp_path / "s", [code, forged, code.lower()]) == {
        code: view["participant"], forged: None, code.lower(): view["participant"]}
    assert main(["study", "verify", str(tmp_path / "s"), code]) == 0
    assert main(["study", "verify", str(tmp_path / "s"), code, forged]) == 1
    out = capsys.readouterr().out
    assert f"{forged}: NOT VALID" in out and f"{code}: valid (participant {view['participant']})" in out
    assert write_report(tmp_path / "s")["flow"]["completed"] == 1


def test_leaving_at_each_page_leaves_consistent_records(tmp_path):
    study = make_study(tmp_path / "s", questionnaire=["age", "sex"])
    with client_of(study) as client:
        client.post("/api/study", json={"token": TOKEN})  # left at the consent page: nothing at all
        at_questionnaire = join(client, PROLIFIC_PID="p1").json()  # consented, left at the questionnaire
        assert at_questionnaire["stage"] == "questionnaire"
        refused = join(client, at_questionnaire["key"])
        assert refused.json()["stage"] == "questionnaire"  # the chat waits for the questionnaire
        in_chat = join(client, PROLIFIC_PID="p2").json()
        assert client.post("/api/questionnaire", json={"key": in_chat["key"], "answers": {"age": 200}}
                           ).status_code == 422
        assert client.post("/api/questionnaire", json={"key": in_chat["key"],
                                                       "answers": {"age": 30, "sex": "Female"}}).json()["saved"]
        chat = join(client, in_chat["key"]).json()  # left mid-chat
        assert chat["stage"] == "chat"
        at_rating = join(client, PROLIFIC_PID="p3").json()
        client.post("/api/questionnaire", json={"key": at_rating["key"], "answers": {}})
        view = join(client, at_rating["key"]).json()
        view = client.post(f"/api/chat/{view['chat']}/message", json={"text": "No thanks, I'll pass."}).json()
        assert view["turn"] == "done"  # left at the rating
    study.close()  # the server stops: the open chats are saved
    records = {r.member: r for r in storage.read_chats(tmp_path / "s")}
    assert at_questionnaire["participant"] not in records
    assert records[in_chat["participant"]].error.startswith("Abandoned")
    assert records[at_rating["participant"]].extra["study"]["ratings"] is None
    assert records[at_rating["participant"]].error is None and records[at_rating["participant"]].info["donation"] == 0
    summary = write_report(tmp_path / "s")
    assert summary["flow"] == {"declined": 0, "joined": 3, "completed": 0, "with_chats": 2}
    assert summary["questionnaire"]["sex"]["people"]["Female"] == 1.0 and summary["questionnaire"]["age"]["n"] == 1


def test_self_mode_shows_no_persona_and_scores_the_pledge_as_the_env_does(tmp_path):
    study = make_study(tmp_path / "s", participant_mode="self", bonus=1.0, primary_outcome="donation")
    chat = study.join(None)
    assert chat.wait_turn(10)
    card = chat.view()["instructions"]
    assert "bonus of $1.00" in card and "Who you are" not in card and "Save the Children" in card
    play(chat, ["Hi.", "Why this charity?", "Let me think."])
    assert chat.record.info["outcome_source"] == "survey"
    study.rate(chat, {"naturalness": 3, "would_talk_again": True})
    second = study.join(chat.key)
    assert second.wait_turn(10)
    second.send("Hello.", 10)
    second.send("Go on.", 10)
    second.send("Hmm.", 10)
    survey_view = second.view()["survey"]
    assert survey_view["options"][-1] == "I donate $1.00" and "I donate $1.50" not in survey_view["options"]
    assert "$1.00 bonus" in survey_view["question"]
    second.send("I donate $0.50", 10)
    assert second.record.info["donation"] == 0.5 and second.record.success  # the env's own reading and reward
    study.rate(second, {"naturalness": 3, "would_talk_again": True})
    study.close()
    summary = write_report(tmp_path / "s")
    arm = summary["arms"][second.arm.label]["primary"]
    assert arm["n"] == 1 and arm["mean"] == 0.5  # the pledged amount, as recorded
    assert "Primary outcome: `donation`" in (tmp_path / "s" / "report.md").read_text()
    with pytest.raises(ValueError, match="at most \\$2"):
        make_study(tmp_path / "b", participant_mode="self", bonus=5.0)


def test_a_pledge_above_the_bonus_is_refused_in_the_chat_to_be_restated(tmp_path):
    study = make_study(tmp_path / "s", participant_mode="self", bonus=1.0, primary_outcome="donation")
    with client_of(study) as client:
        view = join(client, PROLIFIC_PID=PID).json()
        key, chat = view["key"], view["chat"]
        over = client.post(f"/api/chat/{chat}/message", json={"text": "OK, I'll give $1.50 to them."})
        assert over.status_code == 422 and over.json()["detail"].startswith("Your bonus is $1.00")
        assert client.get(f"/api/chat/{chat}").json()["messages"] == view["messages"]  # the env never saw it
        done = client.post(f"/api/chat/{chat}/message", json={"text": "OK, I'll give $0.50 to them."}).json()
        assert done["turn"] == "done"
        client.post(f"/api/chat/{chat}/rating", json={"naturalness": 3, "would_talk_again": True})
        view = join(client, key).json()  # the second chat, to the closing survey
        while view["survey"] is None:
            view = client.post(f"/api/chat/{view['chat']}/message", json={"text": "Hmm, tell me more."}).json()
        over = client.post(f"/api/chat/{view['chat']}/message", json={"text": "I donate $2.00"})
        assert over.status_code == 422 and "not $2.00" in over.json()["detail"]
        assert client.post(f"/api/chat/{view['chat']}/message", json={"text": "I donate $1.00"}).json()["turn"] == "done"
        client.post(f"/api/chat/{view['chat']}/rating", json={"naturalness": 3, "would_talk_again": True})
    study.close()
    records = storage.read_chats(tmp_path / "s")
    assert [(r.info["donation"], r.info["outcome_source"]) for r in records] == [(0.5, "decided_in_dialogue"),
                                                                                (1.0, "survey")]
    assert [r.extra["study"]["effort"]["over_bonus"] for r in records] == [1, 1]
    summary = write_report(tmp_path / "s")
    assert summary["over_bonus"] == 2
    assert "(bonus $1.00; 2 pledge(s) above it refused in the chat and restated)" in (tmp_path / "s" / "report.md").read_text()


def test_self_mode_and_questionnaire_are_refused_where_the_task_is_the_card():
    from simpop.study.modes import check_mode

    class Tau2Like:  # any env but P4G's text env: its scenario card is the task
        pass

    with pytest.raises(ValueError, match="use persona"):
        check_mode(Tau2Like(), "self", 2.0, [])
    with pytest.raises(ValueError, match="persona attributes"):
        check_mode(Tau2Like(), "persona", 2.0, ["age"])
    check_mode(Tau2Like(), "persona", 2.0, [])


def test_exclusion_rules_are_applied_exactly_and_counted(tmp_path):
    study = make_study(tmp_path / "s", attention_check=True,
                       exclusions={"min_mean_chars": 12, "attention": True})
    with client_of(study) as client:
        page = client.post("/api/study", json={"token": TOKEN}).json()
        assert page["attention"].endswith("please choose 2.")
        careful, careless, short = (join(client, PROLIFIC_PID=f"p{i}").json()["key"] for i in range(3))
        view = join(client, careful).json()
        missing = client.post(f"/api/chat/{view['chat']}/rating", json={"naturalness": 3, "would_talk_again": True})
        assert missing.status_code in (409, 422)  # still running, or the attention item missing
        finish_chats(client, careful, study, {"naturalness": 3, "would_talk_again": True, "attention": 2})
        finish_chats(client, careless, study, {"naturalness": 3, "would_talk_again": True, "attention": 4})
        for _ in range(2):  # short messages, attentive
            view = join(client, short).json()
            while view["turn"] != "done":
                text = view["survey"]["options"][3] if view["survey"] else "ok"
                view = client.post(f"/api/chat/{view['chat']}/message", json={"text": text}).json()
            client.post(f"/api/chat/{view['chat']}/rating",
                        json={"naturalness": 3, "would_talk_again": True, "attention": 2})
    study.close()
    summary = write_report(tmp_path / "s")
    assert summary["exclusions"]["removed"] == {"min_mean_chars": 1, "attention": 1}
    assert summary["exclusions"]["participants"] == 2 and summary["exclusions"]["chats"] == 4
    assert summary["participants"] == 1 and summary["chats"] == 2
    effort = storage.read_chats(tmp_path / "s")[0].extra["study"]["effort"]
    assert effort["messages"] == 3 and effort["mean_chars"] == len("Hmm, tell me more about it please.")
    report = (tmp_path / "s" / "report.md").read_text()
    assert "| min_mean_chars | 12 | 1 |" in report and "| attention | True | 1 |" in report


def test_settings_are_fixed_once_the_first_participant_joins(tmp_path):
    make_study(tmp_path / "s", exclusions={"min_human_s": 10}).close()
    study = make_study(tmp_path / "s", exclusions={"min_human_s": 20})  # nobody joined yet: may still change
    assert json.loads((tmp_path / "s" / "study.json").read_text())["exclusions"] == {"min_human_s": 20}
    study.register({"participant": "someone"})
    study.close()
    with pytest.raises(ValueError, match="exclusions: .*fixed once the first participant joins"):
        make_study(tmp_path / "s", exclusions={"min_human_s": 5})
    with pytest.raises(ValueError, match="unknown exclusion rule"):
        make_study(tmp_path / "t", exclusions={"min_words": 5})


def test_the_study_refuses_bad_joins_clearly(tmp_path):
    study = make_study(tmp_path / "s", questionnaire=["sex"])
    participant, key = study.register(None)
    with pytest.raises(StudyError, match="questionnaire first"):
        study.join(key)
    with pytest.raises(StudyError, match="choose one of the options"):
        study.answer(key, {"sex": "Robot"})
    with pytest.raises(StudyError, match="unknown questionnaire item"):
        study.answer(key, {"shoe_size": 44})
    study.answer(key, {"sex": "Other"})
    with pytest.raises(StudyError, match="already answered"):
        study.answer(key, {"sex": "Other"})
    assert study.join(key).participant == participant
    study.close()


def test_the_cli_refuses_bad_study_settings_with_a_one_line_error(tmp_path, capsys):
    base = ["study", "serve", "--env", "simpop/Persuasion-v1", "--policy", "A=reference", "--out", str(tmp_path / "s")]
    cases = {("--exclude", "min_words=3"): "unknown exclusion rule",
             ("--exclude", "min_human_s=soon"): "takes a number",
             ("--exclude", "attention=true"): "needs --attention-check",
             ("--id-param", "user=uid"): "KIND=NAME",
             ("--completion-url", "ftp://x/{code}"): "http(s) URL",
             ("--consent", str(tmp_path / "missing.md")): "not a readable UTF-8 text file",
             ("--participant-mode", "self", "--bonus", "3"): "at most $2",
             ("--questionnaire", "shoe_size"): "unknown questionnaire item",
             ("--primary-outcome", "pledge"): "not success, reward or an info key",
             ("--questionnaire-to-policy",): "ask some with --questionnaire",
             ("--questionnaire", "age", "--questionnaire-to-policy"): "policy A=reference cannot be shown the answers"}
    for extra, message in cases.items():
        assert main([*base, *extra]) == 2, extra
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, (extra, err)
    assert not (tmp_path / "s").exists()

